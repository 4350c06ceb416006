"""State Keras leaves out of the weights file, saved with the model's own variables.

``model.save``, ``save_weights``, ``ModelCheckpoint`` and both
``BackupAndRestore``s write a model's variables through its
``save_own_variables``. :class:`custom_fit._saving.Saving` adds entries
(with :func:`save`) for what Keras would leave out, so that a model restored
from any of those files continues exactly like the one that was saved. Each
kind of state is one
:class:`ExtraState` (a key prefix, a save function, a load function):

* **optimizer assignment:** which model variables each named optimizer
  updates, so that its slots can be read into it before it ran
  (:func:`custom_fit._optimizers.save_assignment`);
* **attribute optimizers' assignment:** the same for optimizers the model keeps
  as attributes outside ``model.optimizer`` (made in ``__init__``, the
  WGAN-GP shape): Keras saves their variables but reads them only into a built
  optimizer (:func:`custom_fit._optimizers.save_attribute_assignment`);
* **untracked variables:** variables layers keep as attributes that Keras does
  not track: raw ``tf.Variable``s on Keras 3 (tf_keras tracks them) and
  ``tf.random.Generator`` states on both. A model restored from a file would
  hold their initial values (a fresh random ``mask_token``) and predict differently;
* **seed generator states** (Keras 3): a model restored from a file would draw
  other ``Dropout`` masks and noise. (Keras 2 layers draw from TensorFlow's
  global generator, which no Keras 2 format saves; custom_fit's Keras 2
  ``SeedGenerator`` is a layer whose state Keras saves itself.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from custom_fit import _optimizers as optimizers
from custom_fit._compat import version

__all__ = ["PARTS", "ExtraState", "load", "save", "split"]


@dataclasses.dataclass(frozen=True)
class ExtraState:
    """One kind of state saved as entries ``prefix + key`` next to the model's own variables.

    Attributes:
        prefix: The prefix of its entries' names (kept from custom_fit 0.2: older files load).
        save: ``model -> {key: value}``.
        load: ``(model, {key: value})``: called with what ``save`` wrote, after the model's
            own variables are loaded (empty for a file written without this state).
    """

    prefix: str
    save: Callable[[Any], Mapping[str, Any]]
    load: Callable[[Any, Mapping[str, Any]], None]


def _save_untracked(model: Any) -> dict[str, Any]:
    return {_untracked_key(u): u.variable.numpy() for u in version.untracked_variables(model)}


def _load_untracked(model: Any, saved: Mapping[str, Any]) -> None:
    present = {_untracked_key(u): u for u in version.untracked_variables(model)}
    missing = [key.split("_", 1) for key in saved if key not in present]
    if missing:
        raise ValueError(
            f"The file holds the values of tf.Variables that {type(model).__name__} '{model.name}' does not have "
            f"now: {[f'{attribute} of layer #{index}' for index, attribute in missing]} (#0 is the model itself, "
            "then its layers, nested ones included, in the order Keras walks them). Expected the "
            "tf.Variables a layer keeps as attributes to exist once the model is built, as when the file was "
            "written. Fix: create them in the layer's __init__ or build, with self.add_weight(...) (then Keras "
            "saves and trains them); or load with the code that wrote the file."
        )
    for key, value in saved.items():
        present[key].variable.assign(value)


def _untracked_key(untracked: Any) -> str:
    return f"{untracked.layer_index}_{untracked.attribute}"


def _save_seed_states(model: Any) -> dict[str, Any]:
    return {str(i): state for i, state in enumerate(version.seed_generator_states(model))}


def _load_seed_states(model: Any, saved: Mapping[str, Any]) -> None:
    for i, state in enumerate(version.seed_generator_states(model)):
        if str(i) in saved:
            state.assign(saved[str(i)])


#: What :func:`save` saves, in the order :func:`load` loads it.
PARTS: tuple[ExtraState, ...] = (
    ExtraState("optimizer_variables_", optimizers.save_assignment, optimizers.load_assignment),
    ExtraState(
        "attribute_optimizer_variables_", optimizers.save_attribute_assignment, optimizers.load_attribute_assignment
    ),
    ExtraState("untracked_variable_", _save_untracked, _load_untracked),
    ExtraState("seed_generator_state_", _save_seed_states, _load_seed_states),
)


def save(model: Any, store: Any) -> None:
    """Adds every :data:`PARTS` entry to ``store``, which holds the model's own variables already."""
    for part in PARTS:
        for key, value in part.save(model).items():
            store[part.prefix + key] = value


def split(store: Any) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """``store``'s entries as ``(Keras' own, {prefix: {key: value}} of each part)``; Keras counts its own."""
    keys = list(store.keys())  # a Keras weights store (an H5 group), not a dict
    parts = {
        part.prefix: {k[len(part.prefix) :]: store[k] for k in keys if k.startswith(part.prefix)} for part in PARTS
    }
    prefixes = tuple(part.prefix for part in PARTS)
    return {k: store[k] for k in keys if not k.startswith(prefixes)}, parts


def load(model: Any, parts: Mapping[str, Mapping[str, Any]]) -> None:
    """Loads what :func:`split` took out, after the model's own variables (a file may lack some of it).

    Raises:
        ValueError: The file holds a value for a ``tf.Variable`` the model
            does not have (yet): one created in ``call``, or code changed
            since the file was written.
    """
    for part in PARTS:
        part.load(model, parts[part.prefix])
