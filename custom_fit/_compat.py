"""The only module that knows Keras' private names.

Everything here leans on Keras 3 (TensorFlow backend) internals that have no
public equivalent. Each helper is small, named for what it does, and says which
private name it touches, so that a Keras upgrade that moves one of them breaks
exactly one function here instead of the training step.

Nothing in this module is public API.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import keras
import tensorflow as tf
from keras.src.losses import loss as _loss_module
from keras.src.models import functional as _functional
from keras.src.models import model as _model
from keras.src.saving import object_registration as _registration

KERAS_VERSION: str = keras.version()

#: The class Keras uses for models built from ``(inputs, outputs)``.
Functional = _functional.Functional


# --------------------------------------------------------------------------
# Forward pass and data
# --------------------------------------------------------------------------


def call_accepts_training(model: keras.Model) -> bool:
    """Whether ``model.call`` takes a ``training`` argument (``Layer._call_has_training_arg``)."""
    return bool(model._call_has_training_arg)


def forward(model: keras.Model, x: Any, training: bool):
    """``model(x, training=...)``, passing ``training`` only if ``call`` accepts it.

    Keras' own steps do the same: a ``call`` without ``training`` is invoked
    as ``model(x)``, which leaves sublayers in their default mode.
    """
    if call_accepts_training(model):
        return model(x, training=training)
    return model(x)


def batch_size_of(x: Any) -> tf.Tensor:
    """The batch size of the first non-``None`` input, as Keras' trainer computes it."""
    first = next(t for t in tf.nest.flatten(x) if t is not None)
    return tf.shape(first)[0]


def has_compiled_loss(model: keras.Model) -> bool:
    """Whether ``compile()`` was given a ``loss`` (``Trainer._compile_loss``)."""
    return model._compile_loss is not None


# --------------------------------------------------------------------------
# Losses and metrics created by ``compile()``
# --------------------------------------------------------------------------


def compute_loss(model: keras.Model, x, y, y_pred, sample_weight, training: bool):
    """Calls ``model.compute_loss``, passing ``training`` only if the override accepts it.

    Mirrors ``Trainer._compute_loss``: user overrides written before Keras 3.3
    have no ``training`` argument.
    """
    if model._compute_loss_has_training_arg:
        return model.compute_loss(x, y, y_pred, sample_weight, training=training)
    return model.compute_loss(x, y, y_pred, sample_weight)


def compiled_loss_value(model: keras.Model, y, y_pred, sample_weight):
    """The loss given to ``compile()`` alone (no ``add_loss`` or regularizers).

    Returns ``None`` when no loss was compiled. Updates the per-output loss
    trackers of multi-output models, as ``Trainer.compute_loss`` does.
    """
    if model._compile_loss is None:
        return None
    return model._compile_loss(y, y_pred, sample_weight)


def aggregate_additional_loss(model: keras.Model, loss):
    """Reduces one ``add_loss``/regularization tensor the way Keras' trainer does.

    (Cast to float, sum, then scale for distribution:
    ``TensorFlowTrainer._aggregate_additional_loss``.)
    """
    return model._aggregate_additional_loss(loss)


def compiled_metrics_container(model: keras.Model):
    """The ``CompileMetrics`` object made by ``compile()`` (or ``None``)."""
    return model._compile_metrics


def compiled_loss_trackers(model: keras.Model) -> list:
    """Per-output loss trackers of a multi-output compiled loss (may be empty)."""
    return list(model._compile_loss.metrics) if model._compile_loss is not None else []


def loss_tracker(model: keras.Model):
    """The ``Mean`` metric named ``"loss"`` that ``compile()`` creates."""
    return model._loss_tracker


def unscale_loss_for_distribution(loss):
    """Undoes the ``1 / num_replicas`` factor Keras losses apply under ``tf.distribute``."""
    return _loss_module.unscale_loss_for_distribution(loss)


def track_loss(model: keras.Model, loss, x: Any) -> None:
    """Adds one batch's loss to the ``loss`` tracker, as Keras' steps do.

    The tracker sees the loss unscaled for distribution (the global mean, not
    ``1 / num_replicas`` of it) and weighted by batch size, so the epoch value
    is the per-sample mean also when the last batch is partial.
    """
    tracker = loss_tracker(model)
    if tracker is not None:
        tracker.update_state(
            unscale_loss_for_distribution(loss), sample_weight=batch_size_of(x)
        )


# --------------------------------------------------------------------------
# Step functions
# --------------------------------------------------------------------------


def make_step_function(model: keras.Model, step: Callable) -> Callable:
    """Wraps ``step`` in Keras' own distributed, fused, optionally XLA function.

    ``TensorFlowTrainer._make_function`` handles ``strategy.run``, reduction
    of per-replica outputs, ``steps_per_execution`` and ``jit_compile``.
    """
    return model._make_function(step)


# --------------------------------------------------------------------------
# Gradient tapes
# --------------------------------------------------------------------------


@contextlib.contextmanager
def recording(tape: tf.GradientTape) -> Iterator[None]:
    """Records on ``tape``: re-enters it, unless it is recording already.

    ``GradientTape._recording`` is private; re-entering a tape that is still
    recording raises in TensorFlow, so it is checked first.
    """
    if tape._recording:
        yield
    else:
        with tape:
            yield


def variable_name(variable) -> str:
    """A variable's path (Keras variables) or name (plain ``tf.Variable``)."""
    return getattr(variable, "path", None) or variable.name


def seed_generator_states(model: keras.Model) -> list:
    """The state variable of every ``SeedGenerator`` in ``model`` and its layers.

    Keras does not save these (``Layer._seed_generators``) with the weights,
    so a ``Dropout`` restored from a file draws different masks.
    """
    states, seen = [], set()
    for layer in model._flatten_layers(include_self=True):
        for generator in layer._seed_generators:
            if id(generator.state) not in seen:
                seen.add(id(generator.state))
                states.append(generator.state)
    return states


# --------------------------------------------------------------------------
# Functional construction without rewriting class bases
# --------------------------------------------------------------------------


def is_functional_call(args: tuple, kwargs: dict) -> bool:
    """Whether constructor arguments mean ``Model(inputs, outputs)``.

    Keras' own test (``functional_init_arguments``) only counts arguments; the
    inputs must also be symbolic ``KerasTensor``s, so that a subclass taking
    two ordinary arguments is not mistaken for a functional model.
    """
    if not _model.functional_init_arguments(args, kwargs):
        return False
    inputs = kwargs["inputs"] if "inputs" in kwargs else args[0]
    flat = tf.nest.flatten(inputs)
    return bool(flat) and all(isinstance(t, keras.KerasTensor) for t in flat)


def share_registered_name(twin: type, cls: type) -> None:
    """Serializes ``twin`` under ``cls``' registered name, so ``load_model`` finds ``cls``."""
    _registration.GLOBAL_CUSTOM_NAMES[twin] = keras.saving.get_registered_name(cls)


# --------------------------------------------------------------------------
# Overrides of private Trainer hooks
# --------------------------------------------------------------------------


class TrainerHooks:
    """Overrides of private ``Trainer`` methods, kept here with the other private names.

    ``CustomModel`` inherits from this mixin before ``keras.Model``.
    """

    def _assert_compile_called(self, method_name: str | None = None) -> None:
        # Keras' own message does not name the method or the fix (and its
        # ``method_name`` branch is dead code in Keras 3.15).
        if not self.compiled:
            method = f"{method_name}()" if method_name else "this method"
            raise ValueError(
                f"{type(self).__name__}.{method} needs a compiled model: expected "
                f"`model.compile(optimizer=..., loss=...)` to have been called "
                f"first, but model '{self.name}' was never compiled. Fix: call "
                f"`model.compile(...)` before `model.{method}`."
            )
