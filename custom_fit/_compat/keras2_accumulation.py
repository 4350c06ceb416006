"""Gradient accumulation for tf_keras' optimizers (Keras 2): ``compile(gradient_accumulation_steps=N)``.

Keras 3's optimizers take ``gradient_accumulation_steps``; tf_keras' have no
accumulation at all (keras-team/tf-keras#107), and the workarounds around
them are wrong or costly (zero gradients to the optimizer decay Adam's
moments; backing the variables up costs more memory than accumulating saves,
tf-keras#301). Why hand-written, then: nothing in tf_keras or TensorFlow
offers it. It does what Keras 3's ``BaseOptimizer.apply`` does, so that one
option means the same on both Kerases:

* each step adds its gradient to the variable's accumulator; every N-th step
  the optimizer's own ``apply_gradients`` gets the mean of the N gradients
  (``(gradient + accumulated) / N``; its clipping applies to that mean) and
  the accumulators return to zero, so ``optimizer.iterations`` counts updates;
* the accumulators and the count of accumulated steps are the optimizer's
  own variables (``add_variable_from_reference`` / ``add_slot``), created with
  its state by :func:`build_accumulators`: saved, restored and resumed with it;
* under a ``LossScaleOptimizer`` the accumulation sits below it: a step whose
  scaled gradient overflows is skipped and not accumulated, and the loss
  scale sees every step, as Keras 3's does;
* under a multi-replica strategy the accumulate-or-update ``tf.cond`` runs in
  one cross-replica ``merge_call``
  (:func:`custom_fit._compat.common.in_one_merge_call`), where its branches
  may update the mirrored variables; the update branch goes back into the
  replicas for the optimizer's ``apply_gradients``, as tf_keras'
  ``LossScaleOptimizer`` does in its own branch.
"""

from __future__ import annotations

import dataclasses
import inspect
import weakref
from typing import Any

import tensorflow as tf
from tf_keras.src.mixed_precision import loss_scale_optimizer as _lso
from tf_keras.src.optimizers import optimizer as _optimizer
from tf_keras.src.optimizers.legacy import optimizer_v2 as _optimizer_v2

from custom_fit._compat.common import in_one_merge_call, shared_while_inside

__all__ = ["accumulation_steps", "apply_gradients", "build_accumulators", "set_accumulation_steps"]


@dataclasses.dataclass
class _Accumulators:
    """One optimizer's accumulation state: the count of steps accumulated and one accumulator per variable."""

    steps: int
    counter: Any = None
    by_variable: dict[int, tuple[Any, Any]] = dataclasses.field(default_factory=dict)  # id -> (variable, acc)


# Inner optimizer -> its accumulation (the option is the model's compile's; the optimizer has no attribute).
_ACCUMULATIONS: weakref.WeakKeyDictionary[Any, _Accumulators] = weakref.WeakKeyDictionary()


def _inner(optimizer: Any) -> Any:
    return optimizer.inner_optimizer if isinstance(optimizer, _lso.BaseLossScaleOptimizer) else optimizer


def set_accumulation_steps(optimizer: Any, steps: int) -> None:
    """``compile(gradient_accumulation_steps=steps)`` for ``optimizer`` (a ``LossScaleOptimizer``: its inner one).

    Raises:
        ValueError: ``optimizer`` has state already (its accumulators would be missing from it).
    """
    inner = _inner(optimizer)
    if isinstance(inner, _optimizer_v2.OptimizerV2):
        built = inner._iterations is not None
    else:
        built = bool(getattr(inner, "_built", False))  # set by its build
    current = _ACCUMULATIONS.get(inner)
    if current is not None and current.steps == steps:
        return
    if built:
        raise ValueError(
            f"compile(gradient_accumulation_steps={steps}) adds accumulators to the optimizer's state, but "
            f"{type(inner).__name__} '{inner.name}' was built already (it has state). Fix: compile a new optimizer."
        )
    _ACCUMULATIONS[inner] = _Accumulators(steps)


def accumulation_steps(optimizer: Any) -> int:
    """How many steps ``optimizer`` accumulates per update (1: ``compile`` asked for no accumulation)."""
    accumulation = _ACCUMULATIONS.get(_inner(optimizer))
    return accumulation.steps if accumulation is not None else 1


def build_accumulators(optimizer: Any, variables: list[Any]) -> None:
    """Creates the accumulators of an optimizer that accumulates, with its state (after its own build)."""
    inner = _inner(optimizer)
    accumulation = _ACCUMULATIONS.get(inner)
    if accumulation is None or accumulation.counter is not None:
        return
    aggregation = tf.VariableAggregation.ONLY_FIRST_REPLICA
    if isinstance(inner, _optimizer_v2.OptimizerV2):
        accumulation.counter = inner.add_weight(
            "accumulated_steps", shape=[], dtype=tf.int64, trainable=False, initializer="zeros", aggregation=aggregation
        )
        accumulation.by_variable = {id(v): (v, inner.add_slot(v, "gradient_accumulator")) for v in variables}
        return
    accumulation.counter = inner.add_variable(shape=(), dtype=tf.int64, name="accumulated_steps")
    accumulation.by_variable = {
        id(v): (v, inner.add_variable_from_reference(v, "gradient_accumulator")) for v in variables
    }


def apply_gradients(optimizer: Any, grads_and_vars: list[Any], *, summed: bool) -> None:
    """``optimizer.apply_gradients(grads_and_vars)``, accumulating where ``compile`` asked for it.

    ``summed``: the gradients are the replicas' sum already, so the optimizer
    gets Keras' own argument that skips its sum (:func:`_without_second_sum`).
    Accumulating, it makes one ``merge_call`` whether or not the gradients
    are a sum over several replicas (without a strategy the default one's
    runs the update as it is). A ``LossScaleOptimizer`` runs as usual (its
    finite check, its loss scale, its own ``merge_call``) with its inner
    optimizer's ``apply_gradients`` accumulating while it runs; it calls that
    only on a finite step.
    """
    inner = _inner(optimizer)
    accumulation = _ACCUMULATIONS.get(inner)
    once = _without_second_sum(optimizer) if summed else {}
    if accumulation is None:
        optimizer.apply_gradients(grads_and_vars, **once)
        return
    if inner is optimizer:
        _accumulate(inner, accumulation, grads_and_vars)
        return
    with _accumulating_below(inner):
        optimizer.apply_gradients(grads_and_vars, **once)


def _without_second_sum(optimizer: Any) -> dict[str, bool]:
    """The keyword argument of ``optimizer.apply_gradients`` that skips its sum over replicas.

    tf_keras' optimizers sum the gradients across replicas in
    ``apply_gradients`` unless told not to, each kind with its own argument
    (a ``LossScaleOptimizer`` takes its inner one's and passes it on). A
    ``tf.compat.v1`` optimizer (``TFOptimizer``) takes none: ``{}``.

    Raises:
        TypeError: ``optimizer``'s class overrides ``apply_gradients`` without
            that argument or ``**kwargs`` (it could not pass it on).
    """
    inner = _inner(optimizer)
    if isinstance(inner, _optimizer_v2.OptimizerV2):
        keyword, value = "experimental_aggregate_gradients", False
    elif isinstance(inner, _optimizer.Optimizer):
        keyword, value = "skip_gradients_aggregation", True
    else:
        return {}
    parameters = inspect.signature(type(optimizer).apply_gradients).parameters.values()
    if not any(p.name == keyword or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        raise TypeError(
            f"{type(optimizer).__name__}.apply_gradients() takes no `{keyword}` argument. Expected it, or "
            f"**kwargs passed on to super().apply_gradients(): the gradients are summed over replicas already "
            f"(the gradient contract) and tf_keras' argument is how the optimizer is told not to sum them again "
            f"(received an override without it). Fix: define `apply_gradients(self, grads_and_vars, **kwargs)` "
            f"and pass the kwargs on."
        )
    return {keyword: value}


def _install(inner: Any) -> None:
    def accumulating(pairs: Any, *args: Any, **kwargs: Any) -> None:
        _accumulate(inner, _ACCUMULATIONS[inner], list(pairs))

    object.__setattr__(inner, "apply_gradients", accumulating)  # untracked: not optimizer state


#: ``with _accumulating_below(inner):`` the inner optimizer's ``apply_gradients`` accumulates, for the
#: loss-scale optimizer above it (installed once while the replica threads trace the step).
#:
#: A swap kept on purpose (tests/end_to_end/test_layout.py lists it): tf_keras' ``LossScaleOptimizer``
#: calls its inner optimizer's ``apply_gradients`` from its own cross-replica branch, only on a
#: finite step and after its loss scale saw the step. Not swapping means a copy of that branch
#: (its private loss-scale state and ``_UnwrapPreventer``, both ``LossScaleOptimizer`` kinds), an
#: accumulating wrapper below it (the loss-scale optimizer takes its inner one only when made, so
#: ``model.optimizer`` would be a new one, not the one compiled), or accumulating above it (Keras 3
#: accumulates below it: the meaning the option has on both). Accumulating above was measured
#: (``benchmarks/trace_time_swaps.py``: ``mixed_float16``, 12 steps, N=4, one step overflowing): the
#: loss scale saw 3 steps of 12 (below: 12), and the one non-finite step threw away the 3 finite
#: steps accumulated with it (below: none).
_accumulating_below = shared_while_inside(_install, lambda inner, _: object.__delattr__(inner, "apply_gradients"))


def _accumulate(optimizer: Any, accumulation: _Accumulators, grads_and_vars: list[Any]) -> None:
    """Adds the gradients to the accumulators, or applies their mean every ``steps``-th step (from a replica)."""
    pairs = [(g, v) for g, v in grads_and_vars if g is not None]  # as apply_gradients filters them
    variables = [v for _, v in pairs]
    if accumulation.counter is None:  # built before the option (compile refuses that) or never built here
        build_accumulators(optimizer, variables)
    accumulators = [accumulation.by_variable[id(v)][1] for v in variables]
    steps = accumulation.steps
    apply = type(optimizer).apply_gradients  # the class' method: the instance's may be the patch above
    # Summed over replicas already (or one replica), and tf_keras' sum needs a replica context.
    no_second_sum = _without_second_sum(optimizer)

    def update(gradients: list[Any]) -> None:
        dense = [tf.convert_to_tensor(g) for g in gradients]  # IndexedSlices: accumulated densely

        def apply_mean() -> None:
            mean = [(g + a) / tf.cast(steps, g.dtype) for g, a in zip(dense, accumulators, strict=True)]
            # Back in the replicas, where tf_keras' optimizers update (the legacy ones refuse
            # cross-replica context); their merge_call is one level below this branch's.
            tf.distribute.get_strategy().extended.call_for_each_replica(
                lambda: apply(optimizer, list(zip(mean, variables, strict=True)), **no_second_sum)
            )
            for a in accumulators:
                a.assign(tf.zeros_like(a))

        def add() -> None:
            for g, a in zip(dense, accumulators, strict=True):
                a.assign_add(g)

        tf.cond(tf.equal((accumulation.counter + 1) % steps, 0), apply_mean, add)
        accumulation.counter.assign_add(1)

    in_one_merge_call(update, [g for g, _ in pairs], direct_updates=False)
