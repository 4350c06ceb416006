"""Misuse of a training step, found while it is traced: warnings and errors that say what to do.

A :class:`StepDiagnostics` belongs to one model. ``CustomModel`` traces its
training step inside :meth:`StepDiagnostics.tracing_train_step` and reports
every ``minimize`` call to it; afterwards it knows which named optimizers the
step used and which variables it updated, and warns (once per model) about
optimizers that never update anything and regularization penalties that are
never added to a loss. It also pairs gradients with variables for
``minimize``, dropping and reporting variables that got no gradient.

Everything here runs in Python while ``tf.function`` traces the step, not
once per batch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import tensorflow as tf

from custom_fit._compat import version
from custom_fit._optimizers import NamedOptimizers
from custom_fit._per_replica import PerReplica

__all__ = [
    "MissingGradientWarning",
    "StepDiagnostics",
    "UntrackedVariableWarning",
    "UnusedOptimizerWarning",
    "UnusedRegularizationWarning",
    "missing_targets_error",
    "no_loss_error",
]

GradsAndVars = list[tuple[Any, Any]]


class MissingGradientWarning(UserWarning):
    """Some variables passed to ``minimize`` got no gradient (``None``).

    Emitted once per model and set of variables; those variables are left
    unchanged. Filter it with ``warnings.filterwarnings("ignore",
    category=custom_fit.MissingGradientWarning)`` when that is intended.
    """


class UnusedOptimizerWarning(UserWarning):
    """A named optimizer given to ``compile()`` is never used by the training step."""


class UnusedRegularizationWarning(UserWarning):
    """Variables with regularizers were updated, but their penalties were never computed.

    Keras adds ``model.losses`` only in ``compute_loss``; a multi-loss step
    must add ``sum(sub_model.losses)`` to the losses it minimizes itself.
    """


class UntrackedVariableWarning(UserWarning):
    """The training step reads a trainable ``tf.Variable`` that Keras 3 does not track.

    A raw ``tf.Variable`` set as a layer attribute is missing from
    ``trainable_variables`` on Keras 3, so no optimizer updates it (tf_keras
    tracks it). custom_fit saves and restores its value; create it with
    ``self.add_weight(...)`` to train it.
    """


@dataclasses.dataclass
class _Trace:
    """What one replica's trace of the training step did: the named optimizers and variables it used."""

    used_optimizers: set[str] = dataclasses.field(default_factory=set)
    minimized: set[int] = dataclasses.field(default_factory=set)


class StepDiagnostics:
    """Records what one model's training step does while it is traced, and reports misuse.

    The records are per replica (:class:`~custom_fit._per_replica.PerReplica`):
    under ``MirroredStrategy`` the replicas trace the step at the same time.

    Args:
        model: The model whose step is checked (used for names in messages).
    """

    def __init__(self, model: Any):
        self._model = model
        self._trace: PerReplica[_Trace] = PerReplica(_Trace)
        self._reported: set[Any] = set()

    # -- recording ------------------------------------------------------------

    @contextlib.contextmanager
    def tracing_train_step(self) -> Iterator[None]:
        """Records one trace of the training step, then warns about what it left unused.

        Warns about named optimizers the step never used, about regularized
        variables it updated without computing their penalties (Keras'
        ``compute_loss`` computes them; a custom multi-loss step may forget),
        and about trainable ``tf.Variable``s it reads that Keras 3 does not
        track (no optimizer updates them).
        """
        self._trace.set(_Trace())
        with version.counting_regularizer_calls(self._model) as counters:
            calls_before = {key: counter.calls for key, counter in counters.items()}
            yield
            calls = {key: counter.calls - calls_before[key] for key, counter in counters.items()}
        trace = self._trace.pop()
        self._check_untracked_variables()
        self._check_unused_optimizers(trace)
        skipped = [key for key, count in calls.items() if key in trace.minimized and not count]
        if skipped:
            self._warn_unused_regularization(skipped)

    def record_minimize(self, optimizer_name: str | None, variables: Sequence[Any]) -> None:
        """Notes that the step updates ``variables`` (with named optimizer ``optimizer_name``)."""
        trace = self._trace.get()  # made here for minimize() outside fit(), e.g. in a test
        trace.minimized.update(id(v) for v in variables)
        if optimizer_name is not None:
            trace.used_optimizers.add(optimizer_name)
        if not variables:
            warnings.warn(
                f"{type(self._model).__name__}.minimize() received no variables to "
                "update, so nothing is trained. Expected trainable variables "
                "(e.g. `self.trainable_weights`); if the model has none, check "
                "that its layers are built and `trainable=True`.",
                stacklevel=4,
            )

    # -- gradients -------------------------------------------------------------

    def pair_with_gradients(self, gradients: Sequence[Any], variables: Sequence[Any]) -> GradsAndVars:
        """``(gradient, variable)`` pairs, leaving out (and reporting once) variables without a gradient.

        Raises:
            ValueError: No variable has a gradient.
        """
        model = self._model
        missing = version.variable_names(model, [v for g, v in zip(gradients, variables, strict=True) if g is None])
        if not missing:
            return list(zip(gradients, variables, strict=True))
        if len(missing) == len(variables):
            raise ValueError(
                f"{type(model).__name__}.minimize(): none of the {len(variables)} "
                "variables has a gradient. Expected a loss computed from these "
                "variables inside the `tf.GradientTape` passed to minimize(); "
                f"received a loss that does not depend on any of {missing}. Fix: "
                "compute the loss inside `with tape:` and pass the variables it "
                "depends on."
            )
        self.warn_once(
            tuple(missing),
            MissingGradientWarning,
            f"{type(model).__name__} '{model.name}': {len(missing)} of "
            f"{len(variables)} variables passed to minimize() got no gradient "
            f"and are not updated: {missing}. Expected every variable to "
            "influence the loss. Fix: use them in the loss computed inside "
            "the tape, leave them out of the `variables` you pass, or set "
            "their layer's `trainable = False` and recompile.",
        )
        return [(g, v) for g, v in zip(gradients, variables, strict=True) if g is not None]

    # -- warnings --------------------------------------------------------------

    def warn_once(self, key: Any, category: type[Warning], message: str) -> None:
        """Warns ``message`` unless this model already warned about ``key``."""
        if key not in self._reported:
            self._reported.add(key)
            warnings.warn(message, category, stacklevel=5)

    def _check_untracked_variables(self) -> None:
        """Warns about trainable ``tf.Variable``s Keras does not track that the traced step read.

        A variable the step reads is captured by the graph being traced (by
        its handle); in eager mode (``run_eagerly``) nothing is traced, and
        nothing is checked.
        """
        untracked = [u for u in version.untracked_variables(self._model) if u.variable.trainable]
        if not untracked or not tf.inside_function():
            return
        captured = _captured_in_trace()
        read = [u.name for u in untracked if id(u.variable.handle) in captured]
        if read:
            model = self._model
            self.warn_once(
                UntrackedVariableWarning,
                UntrackedVariableWarning,
                f"{type(model).__name__} '{model.name}': train_step reads trainable tf.Variables that Keras 3 does "
                f"not track: {read}. Expected every trainable variable to be a Keras variable; these are "
                "missing from trainable_variables, so no optimizer updates them (custom_fit saves their "
                "values). Fix: create them with self.add_weight(shape=..., initializer=..., trainable=True) "
                "in the layer's __init__ or build, or with keras.Variable(...).",
            )

    def _check_unused_optimizers(self, trace: _Trace) -> None:
        model = self._model
        group = model.optimizer
        if not isinstance(group, NamedOptimizers) or group.from_attributes:
            return
        names = list(group)
        unused = [name for name in names if name not in trace.used_optimizers and not _applied_in_trace(group[name])]
        if unused:
            self.warn_once(
                UnusedOptimizerWarning,
                UnusedOptimizerWarning,
                f"{type(model).__name__} '{model.name}' was compiled with optimizers "
                f"{sorted(names)}, but its train_step never used {unused}. "
                "Expected every named optimizer to update something; their state is "
                f"saved but never changes. Fix: call self.minimize(..., optimizer={unused[0]!r}) "
                "in the step, or leave that name out of compile(optimizer={...}).",
            )

    def _warn_unused_regularization(self, variable_ids: list[int]) -> None:
        model, wanted = self._model, set(variable_ids)
        owners = [layer.name for layer in model.layers if any(id(v) in wanted for v in layer.trainable_variables)]
        owners = owners or [model.name]
        self.warn_once(
            UnusedRegularizationWarning,
            UnusedRegularizationWarning,
            f"{type(model).__name__} '{model.name}': train_step updated regularized "
            f"variables of {owners} without computing their regularization losses. "
            "Expected `sum(layer.losses)` to be added to the loss minimized for those "
            "variables (Keras adds `model.losses` only in compute_loss). Fix: inside "
            f"the tape, add the penalties of '{owners[0]}' to its loss, e.g. "
            "`loss = loss + custom_fit.regularization_loss(sub_model)`.",
        )


def missing_targets_error(model: Any) -> ValueError:
    """The error for batches without ``y`` on a model compiled with a loss."""
    return ValueError(
        f"{type(model).__name__} '{model.name}' was compiled with loss={model.loss!r}, which "
        "needs targets: expected batches of (x, y) or (x, y, sample_weight), received "
        "batches with inputs only. Fix: pass `y` to fit()/evaluate(), make the dataset "
        "yield (x, y) pairs, or compile without `loss` and add the loss with "
        "`self.add_loss()` or an overridden `compute_loss`."
    )


def no_loss_error(model: Any) -> ValueError:
    """The error for a step whose loss is ``None``: no loss compiled and none added (tf_keras' wording first)."""
    return ValueError(
        f"No loss found. {type(model).__name__}.minimize() received loss=None for model '{model.name}': "
        "expected a loss to minimize, from compile(loss=...) or from losses the model adds with "
        "`self.add_loss()`. Fix: pass `loss=` to compile(), or add a loss in `call` or `compute_loss`."
    )


def _applied_in_trace(optimizer: Any) -> bool:
    """Whether the step being traced applied gradients with ``optimizer`` itself (it reads its ``iterations``).

    A step may call a named member directly (``self.optimizer[name].apply_gradients(...)``,
    Keras 2's ``self.optimizer[name].minimize(loss, variables, tape=tape)``) instead of
    ``self.minimize(..., optimizer=name)``.
    """
    iterations = optimizer.iterations
    variable = iterations if isinstance(iterations, tf.Variable) else iterations.value  # a Keras 3 variable
    return id(getattr(variable, "handle", None)) in _captured_in_trace()


def _captured_in_trace() -> set[int]:
    """The ids of the outside tensors (variable handles among them) the step being traced reads."""
    return {id(external) for external, _ in tf.compat.v1.get_default_graph().captures}
