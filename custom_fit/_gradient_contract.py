"""The gradient contract: what ``transform_gradients`` and ``apply_gradients`` receive.

On every precision, replica count and Keras, :meth:`CustomModel.minimize
<custom_fit.CustomModel.minimize>` hands the override points the **true gradient
of the global batch's loss**:

* **unscaled**: under ``mixed_float16`` the tape differentiates the scaled loss
  (so float16 gradients do not underflow); the gradients are divided by the
  loss scale before any override sees them;
* **summed over replicas**: under a multi-replica ``tf.distribute`` strategy
  each replica's gradient is all-reduced first, so every replica sees the
  number one device would see (the optimizer does not sum again);
* **finite**: on a step the loss-scale optimizer skips (an ``inf`` or ``nan``
  in the scaled gradient, common in the first steps) they are zeros, and the
  step is still skipped.

:class:`GradientPath` (one per optimizer per ``minimize()`` call) builds the
optimizer's state where needed, makes them from what the tape returned, and
gives the (transformed) pairs back to the optimizer in the form it expects:
multiplied by the loss scale again for Keras 3's
``LossScaleOptimizer`` (exact: the scale is a power of two), marked non-finite
on a skipped step, and not summed a second time. With an identity transform
the update equals ``keras.Model``'s bit for bit.

Why hand-written: Keras has no such contract. Keras 3 unscales inside
``LossScaleOptimizer.apply_gradients`` and sums inside the optimizer's update,
after its clipping; tf_keras unscales in ``compute_gradients`` and sums in
``apply_gradients``. A transform placed between them saw a different number
on each.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from collections.abc import Iterator
from typing import Any

import tensorflow as tf

from custom_fit._compat import version
from custom_fit._compat.common import replica_context_with_peers
from custom_fit._diagnostics import GradsAndVars
from custom_fit._optimizers import ensure_state
from custom_fit._per_replica import PerReplica

__all__ = [
    "GradientPath",
    "hand_over",
    "handing_over_to",
    "without_clip_after_aggregation",
]


@dataclasses.dataclass
class GradientPath:
    """One optimizer's gradients in one ``minimize()`` call: its state, the true gradients, the update.

    :meth:`CustomModel.minimize <custom_fit.CustomModel.minimize>` makes one
    per call (one optimizer, one step) and takes it along: it builds the
    optimizer's state where some variables got no gradient
    (:meth:`build_state`), makes the true gradients of the contract from what
    the tape returned (:meth:`true_gradients`), and, while the override points
    run (:meth:`handing_over`), applies what ``apply_gradients`` hands it
    (:meth:`apply`): undoing for the optimizer what the true gradients changed.
    Afterwards :meth:`check_handed_over` says whether an override bypassed it.

    Attributes:
        optimizer: The optimizer the gradients are for (resolved once, by ``minimize``).
        finite: Whether the step's scaled gradient is finite (a scalar
            boolean tensor), or ``None`` without loss scaling.
        summed: Whether the gradients were summed over replicas.
        used: Set by :meth:`apply` once the pairs reached the optimizer.
    """

    optimizer: Any
    finite: Any = None
    summed: bool = False
    used: bool = False

    def build_state(self, variables: list[Any]) -> None:
        """Creates the optimizer's state for every one of ``variables`` (through the one builder).

        ``minimize`` calls it when some variables got no gradient: Keras
        builds on those too before it leaves their update out, so the
        optimizer's state does not depend on which gradients exist.
        """
        ensure_state(self.optimizer, variables)

    def true_gradients(self, grads_and_vars: GradsAndVars) -> GradsAndVars:
        """The true gradient of the global batch's loss, from what the tape returned for the optimizer's loss.

        Args:
            grads_and_vars: ``(gradient, variable)`` pairs as the tape returned
                them, on this replica (the loss the tape differentiated was
                scaled by the optimizer's ``scale_loss``).

        Returns:
            The pairs unscaled, summed over replicas and zero on a non-finite
            step; this path records what :meth:`apply` must undo.
        """
        optimizer = self.optimizer
        variables = [v for _, v in grads_and_vars]
        gradients = version.unscale_gradients(optimizer, [g for g, _ in grads_and_vars])
        pairs = list(zip(gradients, variables, strict=True))
        context = replica_context_with_peers()
        if context is not None:
            pairs = version.sum_across_replicas(context, optimizer, pairs)
        self.summed = context is not None
        if isinstance(optimizer, version.LossScaleOptimizer):
            finite = self.finite = _all_finite([g for g, _ in pairs])
            pairs = [(_map_values(g, lambda t: tf.where(finite, t, tf.zeros((), t.dtype))), v) for g, v in pairs]
        return pairs

    @contextlib.contextmanager
    def handing_over(self) -> Iterator[GradientPath]:
        """While inside, :func:`hand_over` to this path's optimizer goes through :meth:`apply`."""
        stack = _pending.get()
        stack.append(self)
        try:
            yield self
        finally:
            stack.pop()
            if not stack:
                _pending.pop()

    def apply(self, grads_and_vars: GradsAndVars) -> None:
        """``optimizer.apply_gradients`` of true gradients, in the form the optimizer takes.

        Multiplied by the loss scale again where the optimizer divides by it
        (Keras 3), made ``nan`` on a step the loss-scale optimizer must skip,
        and applied without a second sum over replicas.
        """
        optimizer = self.optimizer
        self.used = True
        if self.finite is not None:
            finite = self.finite
            gradients = version.rescale_gradients(optimizer, [g for g, _ in grads_and_vars])
            gradients = [
                _map_values(g, lambda t: tf.where(finite, t, tf.constant(float("nan"), t.dtype))) for g in gradients
            ]
            grads_and_vars = list(zip(gradients, [v for _, v in grads_and_vars], strict=True))
        # Not summed again; an accumulating optimizer's update is conditional (every N-th step): under
        # several replicas it runs in one merge_call (docs/scaling.md, "Gradient accumulation").
        version.apply_gradients(optimizer, list(grads_and_vars), summed=self.summed)

    def check_handed_over(self, model: Any) -> None:
        """Raises if an ``apply_gradients`` override applied the gradients without :meth:`apply`.

        Without loss scaling and on one replica the pairs need nothing undone,
        so an override may call ``optimizer.apply_gradients`` itself. Otherwise
        the optimizer would divide by the loss scale a second time, or sum
        replicas that are summed already.

        Raises:
            ValueError: The gradients needed :meth:`apply` and did not get it.
        """
        if self.used or (self.finite is None and not self.summed):
            return
        needs = "the loss scale restored" if self.finite is not None else "no second sum over replicas"
        raise ValueError(
            f"{type(model).__name__}.apply_gradients() did not hand the gradients to the optimizer through "
            f"CustomModel.apply_gradients. Expected the true gradients minimize() passes to reach "
            f"{type(self.optimizer).__name__} with {needs}; received an override that applied them another way "
            "(e.g. optimizer.apply_gradients(...)). Fix: end the override with "
            "`super().apply_gradients(grads_and_vars, optimizer)`."
        )


def _map_values(gradient: Any, function: Any) -> Any:
    """``function`` applied to a dense gradient, or to the values of an ``IndexedSlices`` one."""
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(function(gradient.values), gradient.indices, gradient.dense_shape)
    return function(gradient)


def _all_finite(gradients: list[Any]) -> Any:
    values = [g.values if isinstance(g, tf.IndexedSlices) else g for g in gradients]
    return tf.reduce_all([tf.reduce_all(tf.math.is_finite(v)) for v in values])


# The paths of the minimize() calls running, innermost last, per replica (they trace at once).
_pending: PerReplica[list[GradientPath]] = PerReplica(list)


def _innermost() -> GradientPath | None:
    """The path of the innermost ``minimize()`` running on this replica, if any."""
    stack = _pending.get()
    if not stack:
        _pending.pop()  # keeps no empty entry for this replica
        return None
    return stack[-1]


def handing_over_to(optimizer: Any) -> bool:
    """Whether ``optimizer`` is the one the innermost ``minimize()`` running resolved and hands over to.

    ``CustomModel.apply_gradients`` then uses it as it is: ``minimize``
    resolved its ``optimizer=`` argument already, once.
    """
    path = _innermost()
    return path is not None and path.optimizer is optimizer


def hand_over(optimizer: Any, grads_and_vars: GradsAndVars) -> None:
    """``optimizer.apply_gradients(grads_and_vars)``, through the running ``minimize()``'s path where it is that one's.

    Inside :meth:`CustomModel.minimize <custom_fit.CustomModel.minimize>` the
    pairs are true gradients, which :meth:`GradientPath.apply` gives the
    optimizer in the form it takes. Elsewhere (a step that calls
    ``apply_gradients`` itself) they reach the optimizer as they are, as in Keras.
    """
    path = _innermost()
    if path is None or path.optimizer is not optimizer:
        optimizer.apply_gradients(grads_and_vars)
        return
    path.apply(grads_and_vars)


def without_clip_after_aggregation(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``compile()``'s keyword arguments less custom_fit 0.2's ``clip_after_aggregation``.

    Optimizers now always receive, and so clip, the gradient summed over
    replicas: ``True`` warns that it is not needed, ``False`` (clip each
    replica's gradient, Keras 3's own order) can no longer be had.

    Raises:
        ValueError: ``clip_after_aggregation=False``.
    """
    if "clip_after_aggregation" not in kwargs:
        return kwargs
    kwargs = dict(kwargs)
    if kwargs.pop("clip_after_aggregation") is False:
        raise ValueError(
            "compile(clip_after_aggregation=False) asks to clip each replica's gradient. Expected it left out: "
            "custom_fit hands every optimizer the gradient summed over replicas, so clipnorm, global_clipnorm "
            "and clipvalue clip the global gradient, as on one device (received False). Fix: leave "
            "clip_after_aggregation out."
        )
    warnings.warn(
        "compile(clip_after_aggregation=True) is no longer needed: optimizers always clip the gradient summed "
        "over replicas. Fix: leave it out.",
        DeprecationWarning,
        stacklevel=3,
    )
    return kwargs
