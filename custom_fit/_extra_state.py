"""State Keras leaves out of the weights file, saved with the model's own variables.

``model.save``, ``save_weights``, ``ModelCheckpoint`` and both
``BackupAndRestore``s write a model's variables through its
``save_own_variables``; these mixins add what Keras would leave out, so that
a model restored from any of those files continues exactly like the one
that was saved:

* :class:`SavesSeedGeneratorStates` (Keras 3) saves random seed generator
  states: a model restored from a file would draw other ``Dropout`` masks
  and noise. (Keras 2 layers draw from TensorFlow's global generator, which
  no Keras 2 format saves.)
* :class:`SavesUntrackedVariables` saves the variables layers keep as
  attributes that Keras does not track: raw ``tf.Variable``s on Keras 3
  (tf_keras tracks them) and ``tf.random.Generator`` states on both. A model
  restored from a file would hold their initial values (a fresh random
  ``mask_token``) and predict differently.

(Which variables each named optimizer updates is saved by
:class:`custom_fit._optimizers.SavesOptimizerAssignment`.)
"""

from __future__ import annotations

from typing import Any

from custom_fit import _compat
from custom_fit._host import Host

__all__ = ["SavesSeedGeneratorStates", "SavesUntrackedVariables"]

# Prefixes of the entries save_own_variables adds to the model's own weights.
_SEED_STATE_KEY = "seed_generator_state_"
_UNTRACKED_KEY = "untracked_variable_"


class SavesSeedGeneratorStates(Host):
    """Saves and loads every ``SeedGenerator`` state with the model's own variables (Keras 3)."""

    def save_own_variables(self, store: Any) -> None:
        """Saves the model's own variables and the state of every random seed generator.

        Called by ``model.save``, ``save_weights``, ``ModelCheckpoint`` and
        ``BackupAndRestore``. Unlike ``keras.Model``, the states of
        ``SeedGenerator``s (``Dropout`` masks, noise) are saved too, so a run
        resumed from a file continues exactly like an uninterrupted one.
        """
        super().save_own_variables(store)
        for i, state in enumerate(_compat.keras3_only.seed_generator_states(self)):
            store[f"{_SEED_STATE_KEY}{i}"] = state

    def load_own_variables(self, store: Any) -> None:
        """Loads what :meth:`save_own_variables` saved (files without seed states load too)."""
        keys = list(store.keys())  # a Keras weights store (an H5 group), not a dict
        super().load_own_variables({k: store[k] for k in keys if not k.startswith(_SEED_STATE_KEY)})
        for i, state in enumerate(_compat.keras3_only.seed_generator_states(self)):
            if f"{_SEED_STATE_KEY}{i}" in keys:
                state.assign(store[f"{_SEED_STATE_KEY}{i}"])


class SavesUntrackedVariables(Host):
    """Saves and loads the variables of layer attributes that Keras does not track, with the model's own.

    Every save path (``model.save``, ``save_weights``, ``ModelCheckpoint``,
    both ``BackupAndRestore``s) writes the model's own variables, so each
    file holds their values and a loaded model predicts like the saved one.
    They are found by :func:`custom_fit._compat.untracked_variables`: layer
    attributes holding a raw ``tf.Variable`` (Keras 3) or a
    ``tf.random.Generator`` (or a list or dict of them), keyed by the
    layer's position and the attribute's name.
    """

    def save_own_variables(self, store: Any) -> None:
        """Saves the model's own variables and the value of every untracked ``tf.Variable``."""
        super().save_own_variables(store)
        for untracked in _compat.untracked_variables(self):
            store[_untracked_key(untracked)] = untracked.variable.numpy()

    def load_own_variables(self, store: Any) -> None:
        """Loads what :meth:`save_own_variables` saved (files without such values load too).

        Raises:
            ValueError: The file holds a value for a ``tf.Variable`` this model
                does not have (yet): one created in ``call``, or code changed
                since the file was written.
        """
        keys = list(store.keys())  # a Keras weights store (an H5 group), not a dict
        saved = [k for k in keys if k.startswith(_UNTRACKED_KEY)]
        super().load_own_variables({k: store[k] for k in keys if k not in saved})
        present = {_untracked_key(u): u for u in _compat.untracked_variables(self)}
        missing = [k[len(_UNTRACKED_KEY) :].split("_", 1) for k in saved if k not in present]
        if missing:
            raise ValueError(
                f"The file holds the values of tf.Variables that {type(self).__name__} '{self.name}' does not have "
                f"now: {[f'{attribute} of layer #{index}' for index, attribute in missing]} (#0 is the model itself, "
                "then its layers, nested ones included, in the order Keras walks them). Expected the "
                "tf.Variables a layer keeps as attributes to exist once the model is built, as when the file was "
                "written. Fix: create them in the layer's __init__ or build, with self.add_weight(...) (then Keras "
                "saves and trains them); or load with the code that wrote the file."
            )
        for key in saved:
            present[key].variable.assign(store[key])


def _untracked_key(untracked: Any) -> str:
    return f"{_UNTRACKED_KEY}{untracked.layer_index}_{untracked.attribute}"
