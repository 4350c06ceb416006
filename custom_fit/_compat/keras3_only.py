"""Keras 3 private names used only by features that exist only on Keras 3.

Two features of custom_fit have no Keras 2 counterpart, because Keras 2 does
them itself or has nothing to do: the Keras-2 meaning of ``compiled_loss`` /
``compiled_metrics`` (:mod:`custom_fit.compiled`) and saving random seed
generator states (:mod:`custom_fit.saving`). Importing this module loads
Keras 3, so only those Keras-3-only code paths import it.

Nothing in this module is public API.
"""

from __future__ import annotations

from typing import Any

import keras

__all__ = [
    "aggregate_additional_loss",
    "compiled_loss_trackers",
    "compiled_loss_value",
    "seed_generator_states",
    "sum_losses",
]


def compiled_loss_value(model: keras.Model, y: Any, y_pred: Any, sample_weight: Any) -> Any:
    """The loss given to ``compile()`` alone (no ``add_loss`` or regularizers).

    Returns ``None`` when no loss was compiled. Updates the per-output loss
    trackers of multi-output models, as ``Trainer.compute_loss`` does.
    """
    if model._compile_loss is None:
        return None
    return model._compile_loss(y, y_pred, sample_weight)


def compiled_loss_trackers(model: keras.Model) -> list[Any]:
    """Per-output loss trackers of a multi-output compiled loss (may be empty)."""
    return list(model._compile_loss.metrics) if model._compile_loss is not None else []


def aggregate_additional_loss(model: keras.Model, loss: Any) -> Any:
    """Reduces one ``add_loss``/regularization tensor the way Keras' trainer does.

    (Cast to float, sum, then scale for distribution:
    ``TensorFlowTrainer._aggregate_additional_loss``.)
    """
    return model._aggregate_additional_loss(loss)


def sum_losses(losses: list[Any]) -> Any:
    """The total of several scalar losses, reduced as ``Trainer.compute_loss`` does (bit-identical)."""
    return losses[0] if len(losses) == 1 else keras.ops.sum(losses)


def seed_generator_states(model: keras.Model) -> list[Any]:
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
