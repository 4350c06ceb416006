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
    "tune_epoch_iterator",
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


_VERSION = tuple(int(part) for part in keras.version().split(".")[:2])


def tune_epoch_iterator(epoch_iterator: Any, tuner: Any) -> None:
    """Makes ``fit``'s epoch iterator run as many steps per execution as ``tuner`` plans.

    Keras fixes the steps per execution when ``fit`` starts: its epoch
    iterator (``EpochIterator._enumerate_iterator``) steps through the epoch
    in strides of ``steps_per_execution`` and passes the first and last step
    of each execution to the callbacks. This generator does the same with a
    stride ``tuner.plan(remaining)`` chooses before each execution, never
    past the end of the epoch; the rest (data adapter hooks, one iterator per
    epoch or one kept across epochs with ``steps_per_epoch``, the warning
    when data runs out) is Keras' own, as of 3.8-3.15 (where the items grew
    from ``(step, iterator)`` to ``(first, last, iterator)`` in 3.11).
    """
    it = epoch_iterator

    def item(first: int, steps: int, iterator: Any) -> tuple[Any, ...]:
        return (first, first + steps - 1, iterator) if _VERSION >= (3, 11) else (first, iterator)

    def enumerate_iterator() -> Any:
        it.data_adapter.on_epoch_begin()
        steps_per_epoch = it.steps_per_epoch or it._num_batches or -1
        if steps_per_epoch > 0:
            if it._current_iterator is None or it.steps_per_epoch is None:
                it._current_iterator = iter(it._get_iterator())
                it._steps_seen = 0
            step = 0
            while step < steps_per_epoch:
                if it._num_batches and it._steps_seen >= it._num_batches:
                    if it.steps_per_epoch:
                        it._interrupted_warning()
                    break
                steps = tuner.plan(steps_per_epoch - step)
                it._steps_seen += steps
                yield item(step, steps, it._current_iterator)
                step += steps
            if it._num_batches and it._steps_seen >= it._num_batches:
                it._current_iterator = iter(it._get_iterator())
                it._steps_seen = 0
        else:  # unknown length: one step per execution
            iterator = iter(it._get_iterator())
            step = 0
            while True:
                it._steps_seen = step + tuner.plan(None)
                yield item(step, 1, iterator)
                step += 1
        it.data_adapter.on_epoch_end()

    object.__setattr__(epoch_iterator, "_enumerate_iterator", enumerate_iterator)
