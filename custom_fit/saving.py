"""Saving and loading: what ``keras.Model`` leaves out, so that a resumed run equals an uninterrupted one.

:class:`RecompilesOnLoad` lets ``load_model`` re-run ``CustomModel.compile``
with everything it was given (named optimizers, ``clip_after_aggregation``).
Keras 3 does not save the state of random seed generators (``Dropout``
masks, noise layers, a GAN's noise): a model restored from a file draws
different random numbers than the one that was saved. :class:`SavesSeedGeneratorStates`
adds those states to what ``save_own_variables`` writes. (Keras 2 layers draw
from TensorFlow's global generator, which no Keras 2 format saves; this piece
is Keras 3 only.)
"""

from __future__ import annotations

import inspect
from typing import Any

from custom_fit import _compat
from custom_fit._compat import keras

if not _compat.KERAS_2:  # a Keras 2 process never loads Keras 3
    from custom_fit._compat import keras3_only

__all__ = ["RecompilesOnLoad", "SavesSeedGeneratorStates"]

# Prefix of the entries `save_own_variables` adds for random seed generator states.
_SEED_STATE_KEY = "seed_generator_state_"


class RecompilesOnLoad:
    """Gives ``CustomModel`` a ``compile_from_config`` that rebuilds every compiled optimizer."""

    def compile_from_config(self: Any, config: dict[str, Any]) -> None:
        """Re-runs ``compile`` from ``get_compile_config`` (used by ``load_model``)."""
        config = keras.saving.deserialize_keras_object(config)
        try:
            inspect.signature(self.compile).bind(**config)
        except TypeError:
            # A compile() with a signature of its own (e.g. the keras.io GAN's
            # `compile(d_optimizer, g_optimizer, loss_fn)`): Keras' behaviour,
            # a warning that compile() must be called after loading.
            super().compile_from_config(config)  # type: ignore[misc]
            return
        self.compile(**config)
        if self.optimizer is not None and self.built:
            self.optimizer.build(self.trainable_variables)


class SavesSeedGeneratorStates:
    """Saves and loads every ``SeedGenerator`` state with the model's own variables (Keras 3)."""

    def save_own_variables(self, store: Any) -> None:
        """Saves the model's own variables and the state of every random seed generator.

        Called by ``model.save``, ``save_weights``, ``ModelCheckpoint`` and
        ``BackupAndRestore``. Unlike ``keras.Model``, the states of
        ``SeedGenerator``s (``Dropout`` masks, noise) are saved too, so a run
        resumed from a file continues exactly like an uninterrupted one.
        """
        super().save_own_variables(store)  # type: ignore[misc]
        for i, state in enumerate(keras3_only.seed_generator_states(self)):
            store[f"{_SEED_STATE_KEY}{i}"] = state

    def load_own_variables(self, store: Any) -> None:
        """Loads what :meth:`save_own_variables` saved (files without seed states load too)."""
        keys = list(store.keys())
        super().load_own_variables({k: store[k] for k in keys if not k.startswith(_SEED_STATE_KEY)})  # type: ignore[misc]
        for i, state in enumerate(keras3_only.seed_generator_states(self)):
            if f"{_SEED_STATE_KEY}{i}" in keys:
                state.assign(store[f"{_SEED_STATE_KEY}{i}"])
