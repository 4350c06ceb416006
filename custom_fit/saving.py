"""Saving and loading: what ``keras.Model`` leaves out, so that a resumed run equals an uninterrupted one.

Public Keras examples write multi-model code that ``keras.Model`` cannot save:
sub-models handed to ``__init__`` with no ``get_config``, and optimizers,
losses and settings handed to a ``compile`` of the model's own and kept as
attributes. ``CustomModel`` saves such code as it is:

* :class:`ConfigFromConstructor` records the arguments each model was
  constructed with and, when the class defines no ``get_config``, serializes
  them with Keras' own serialization (sub-models, optimizers, losses, plain
  values); ``from_config`` rebuilds them and calls the constructor again.
* :class:`RecompilesOnLoad` records the arguments of a ``compile`` with a
  signature of its own, saves them as the compile config, and re-runs that
  ``compile`` when the model is loaded; ``CustomModel.compile`` re-runs from
  Keras' own config.
* :class:`SavesOptimizerAssignment` writes which variables each named
  optimizer updates next to the weights, so that ``load_model``,
  ``load_weights``, ``ModelCheckpoint`` and ``BackupAndRestore`` can build the
  optimizers before their state is read (Keras skips an unbuilt optimizer's
  state with a warning).
* :class:`SavesSeedGeneratorStates` (Keras 3) saves random seed generator
  states, which Keras does not: a model restored from a file would draw other
  ``Dropout`` masks and noise. (Keras 2 layers draw from TensorFlow's global
  generator, which no Keras 2 format saves.)
* :class:`SavesUntrackedVariables` saves the variables layers keep as
  attributes that Keras does not track: raw ``tf.Variable``s on Keras 3
  (tf_keras tracks them) and ``tf.random.Generator`` states on both. A model
  restored from a file would hold their initial values (a fresh random
  ``mask_token``) and predict differently.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import tensorflow as tf

from custom_fit import _compat
from custom_fit._compat import keras

if not _compat.KERAS_2:  # a Keras 2 process never loads Keras 3
    from custom_fit._compat import keras3_only

__all__ = [
    "ConfigFromConstructor",
    "RecompilesOnLoad",
    "SavesOptimizerAssignment",
    "SavesSeedGeneratorStates",
    "SavesUntrackedVariables",
]

# Wraps a Keras object inside a config of captured arguments.
_KERAS_OBJECT = "__custom_fit_keras_object__"
# The build config of a model built without being called: its sub-layers' build configs.
_SUB_LAYERS = "custom_fit_sub_layers"
# The compile config of a compile() with a signature of its own.
_COMPILE_ARGUMENTS = "custom_fit_compile_arguments"
# Prefixes of the entries save_own_variables adds to the model's own weights.
_SEED_STATE_KEY = "seed_generator_state_"
_UNTRACKED_KEY = "untracked_variable_"
_OPTIMIZER_VARIABLES_KEY = "optimizer_variables_"


# --------------------------------------------------------------------------
# Arguments as configs
# --------------------------------------------------------------------------


def captured_arguments(
    function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Any] | None:
    """``function``'s arguments by name (``**kwargs`` merged), or ``None`` if they cannot be named.

    ``function`` is an unbound method; its first parameter (``self``) is
    left out. Positional ``*args`` cannot be passed back by name.
    """
    try:
        bound = inspect.signature(function).bind(None, *args, **kwargs)
    except TypeError:
        return None
    parameters = list(inspect.signature(function).parameters.values())
    arguments: dict[str, Any] = {}
    for parameter in parameters[1:]:
        if parameter.name not in bound.arguments:
            continue
        value = bound.arguments[parameter.name]
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            if value:
                return None
        elif parameter.kind is inspect.Parameter.VAR_KEYWORD:
            arguments.update(value)
        else:
            arguments[parameter.name] = value
    return arguments


def _is_plain(value: Any) -> bool:
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_is_plain(v) for v in value)
    if isinstance(value, Mapping):
        return all(isinstance(k, str) and _is_plain(v) for k, v in value.items())
    return False


def serialize_argument(value: Any, owner: str) -> Any:
    """A JSON-able form of one captured argument; Keras objects through Keras' serialization.

    Raises:
        NotImplementedError: ``value`` is neither plain nor serializable by Keras
            (``owner`` names the argument in the message).
    """
    if _is_plain(value):
        return value
    if isinstance(value, (list, tuple)):
        return [serialize_argument(v, owner) for v in value]
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return {k: serialize_argument(v, owner) for k, v in value.items()}
    try:
        return {_KERAS_OBJECT: keras.saving.serialize_keras_object(value)}
    except Exception as error:
        raise NotImplementedError(
            f"custom_fit cannot save {owner}: expected Keras objects (layers, models, optimizers, "
            f"losses, registered functions) or plain values, received {type(value).__name__} "
            f"({error}). Fix: define get_config() (and from_config() if needed) on the class."
        ) from error


def deserialize_argument(value: Any, custom_objects: Any = None) -> Any:
    """Inverse of :func:`serialize_argument`."""
    if isinstance(value, list):
        return [deserialize_argument(v, custom_objects) for v in value]
    if isinstance(value, dict):
        if set(value) == {_KERAS_OBJECT}:
            return keras.saving.deserialize_keras_object(value[_KERAS_OBJECT], custom_objects=custom_objects)
        return {k: deserialize_argument(v, custom_objects) for k, v in value.items()}
    return value


def _accepts(function: Callable[..., Any], name: str) -> bool:
    parameters = inspect.signature(function).parameters.values()
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


# --------------------------------------------------------------------------
# Constructor and compile arguments
# --------------------------------------------------------------------------


class ConfigFromConstructor:
    """Gives a ``CustomModel`` subclass without ``get_config`` one made from its constructor arguments.

    Keras serializes a subclassed model's constructor arguments only when all
    are plain values; sub-models (the usual GAN, VAE and distiller code) make
    ``model.save`` raise ``NotImplementedError``. Here every argument a Keras
    object is serialized with ``keras.saving.serialize_keras_object`` and
    rebuilt by ``from_config``; a class' own ``get_config`` still wins.
    Functional and Sequential models keep Keras' own configs.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        instance = super().__new__(cls, *args, **kwargs)
        _compat.set_untracked(instance, "_constructor_arguments", captured_arguments(cls.__init__, args, kwargs))
        return instance

    def get_config(self: Any) -> dict[str, Any]:
        arguments = getattr(self, "_constructor_arguments", None)
        if arguments is None or isinstance(self, (_compat.Functional, keras.Sequential)):
            return super().get_config()  # type: ignore[misc]
        base = {"name": self.name, "trainable": self.trainable}
        config = {k: v for k, v in base.items() if _accepts(type(self).__init__, k)}
        owner = f"{type(self).__name__}.__init__ argument"
        config.update({name: serialize_argument(value, f"{owner} {name!r}") for name, value in arguments.items()})
        return config

    @classmethod
    def from_config(cls, config: dict[str, Any], custom_objects: Any = None) -> Any:
        config = {k: deserialize_argument(v, custom_objects) for k, v in config.items()}
        return super().from_config(config, custom_objects)  # type: ignore[misc]

    def get_build_config(self: Any) -> dict[str, Any] | None:
        """Keras' build config; for a model built without being called, each sub-layer's.

        Sub-models made in ``__init__`` without an input shape (the SimCLR
        example's ``Sequential``s) are built by the first training step. A
        model whose own ``call`` never ran has no input shape to rebuild from,
        so ``load_model`` could not create their variables; their own build
        configs (input shapes) are saved instead.
        """
        config: dict[str, Any] | None = super().get_build_config()  # type: ignore[misc]
        if config is not None or not self.built:
            return config
        return {_SUB_LAYERS: {str(i): layer.get_build_config() for i, layer in enumerate(self.layers) if layer.built}}

    def build_from_config(self: Any, config: dict[str, Any]) -> None:
        """Rebuilds what :meth:`get_build_config` saved (Keras' own configs as Keras does)."""
        if _SUB_LAYERS not in config:
            super().build_from_config(config)  # type: ignore[misc]
            return
        for i, layer in enumerate(self.layers):
            layer_config = config[_SUB_LAYERS].get(str(i))
            if layer_config and not layer.built:
                layer.build_from_config(layer_config)
        _compat.mark_built_if_complete(self)


def _recording_arguments(compile_method: Callable[..., Any]) -> Callable[..., Any]:
    """Wraps a subclass' own ``compile`` so that the outermost call records its arguments."""

    @functools.wraps(compile_method)
    def compile(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "_recording_compile", False):  # super().compile() from a subclass' compile
            return compile_method(self, *args, **kwargs)
        _compat.set_untracked(self, "_recording_compile", True)
        try:
            result = compile_method(self, *args, **kwargs)
        finally:
            _compat.set_untracked(self, "_recording_compile", False)
        _compat.set_untracked(self, "_compile_arguments", captured_arguments(compile_method, args, kwargs))
        self._after_compile()
        return result

    return compile


class RecompilesOnLoad:
    """Lets ``load_model`` re-run ``compile``, including one with a signature of its own.

    A subclass whose ``compile`` takes its own arguments (the keras.io GAN's
    ``compile(d_optimizer, g_optimizer, loss_fn)``) gets them recorded; they
    are saved as the compile config and ``load_model`` calls that ``compile``
    again with them. (Keras warns and leaves such a model uncompiled.)
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "compile" in vars(cls):
            setattr(cls, "compile", _recording_arguments(vars(cls)["compile"]))  # noqa: B010  (a subclass attribute)

    def _after_compile(self) -> None:
        """Called after a subclass' own ``compile`` returned (``CustomModel`` groups attribute optimizers)."""

    def get_compile_config(self: Any) -> dict[str, Any]:
        """Keras' compile config, or the recorded arguments of a ``compile`` with its own signature."""
        config: dict[str, Any] = super().get_compile_config()  # type: ignore[misc]
        arguments = getattr(self, "_compile_arguments", None)
        if arguments is None or _binds(self.compile, keras.saving.deserialize_keras_object(config)):
            return config
        owner = f"{type(self).__name__}.compile argument"
        return {_COMPILE_ARGUMENTS: {k: serialize_argument(v, f"{owner} {k!r}") for k, v in arguments.items()}}

    def compile_from_config(self: Any, config: dict[str, Any]) -> None:
        """Re-runs ``compile`` from :meth:`get_compile_config` (used by ``load_model``)."""
        if _COMPILE_ARGUMENTS in config:
            self.compile(**{k: deserialize_argument(v) for k, v in config[_COMPILE_ARGUMENTS].items()})
        else:
            config = keras.saving.deserialize_keras_object(config)
            if not _binds(self.compile, config):
                # A compile() of its own saved by Keras (not by CustomModel):
                # Keras' behaviour, a warning that compile() must be called.
                super().compile_from_config(config)  # type: ignore[misc]
                return
            self.compile(**config)
        _compat.mark_built_if_complete(self)
        if self.optimizer is not None and self.built:
            self.optimizer.build(self.trainable_variables)


def _binds(function: Callable[..., Any], config: Any) -> bool:
    try:
        inspect.signature(function).bind(**config)
    except TypeError:
        return False
    return True


# --------------------------------------------------------------------------
# State next to the weights
# --------------------------------------------------------------------------


class SavesOptimizerAssignment:
    """Saves which model variables each named optimizer updates, and builds it from that on load.

    An optimizer's state (slots) can only be read into a built optimizer;
    after ``load_model`` or in a fresh process before ``load_weights`` the
    named optimizers are not built yet. Their variables' positions in
    ``model.trainable_variables`` are saved with the model's own variables and
    used to build them first.
    """

    def save_own_variables(self: Any, store: Any) -> None:
        """Saves the model's own variables and the variable positions of each built named optimizer."""
        super().save_own_variables(store)  # type: ignore[misc]
        group: Any = getattr(self, "optimizer", None)
        if not hasattr(group, "members_built_on"):
            return
        variables = self.trainable_variables
        positions = {id(v): i for i, v in enumerate(variables)}
        for name, built_on in group.members_built_on(variables).items():
            store[f"{_OPTIMIZER_VARIABLES_KEY}{name}"] = np.array([positions[id(v)] for v in built_on], "int64")

    def load_own_variables(self: Any, store: Any) -> None:
        """Loads the model's own variables, then builds the unbuilt named optimizers that were saved built."""
        names = list(store.keys())  # a Keras weights store (an H5 group), not a dict
        keys = [k for k in names if k.startswith(_OPTIMIZER_VARIABLES_KEY)]
        super().load_own_variables({k: store[k] for k in names if k not in keys})  # type: ignore[misc]
        group: Any = getattr(self, "optimizer", None)
        if not keys or not hasattr(group, "build_member"):
            return
        variables = self.trainable_variables
        # Under a tf.distribute strategy (BackupAndRestore restores before the first step, outside
        # the strategy's scope) the slots must be created by the strategy, like the model's variables.
        with tf.init_scope(), self.distribute_strategy.scope():
            for key in keys:
                name = key[len(_OPTIMIZER_VARIABLES_KEY) :]
                if name in group and not _compat.optimizer_built(group[name]):
                    group.build_member(name, [variables[int(i)] for i in np.asarray(store[key])])


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
        keys = list(store.keys())  # a Keras weights store (an H5 group), not a dict
        super().load_own_variables({k: store[k] for k in keys if not k.startswith(_SEED_STATE_KEY)})  # type: ignore[misc]
        for i, state in enumerate(keras3_only.seed_generator_states(self)):
            if f"{_SEED_STATE_KEY}{i}" in keys:
                state.assign(store[f"{_SEED_STATE_KEY}{i}"])


class SavesUntrackedVariables:
    """Saves and loads the variables of layer attributes that Keras does not track, with the model's own.

    Every save path (``model.save``, ``save_weights``, ``ModelCheckpoint``,
    both ``BackupAndRestore``s) writes the model's own variables, so each
    file holds their values and a loaded model predicts like the saved one.
    They are found by :func:`custom_fit._compat.untracked_variables`: layer
    attributes holding a raw ``tf.Variable`` (Keras 3) or a
    ``tf.random.Generator`` (or a list or dict of them), keyed by the
    layer's position and the attribute's name.
    """

    def save_own_variables(self: Any, store: Any) -> None:
        """Saves the model's own variables and the value of every untracked ``tf.Variable``."""
        super().save_own_variables(store)  # type: ignore[misc]
        for untracked in _compat.untracked_variables(self):
            store[_untracked_key(untracked)] = untracked.variable.numpy()

    def load_own_variables(self: Any, store: Any) -> None:
        """Loads what :meth:`save_own_variables` saved (files without such values load too).

        Raises:
            ValueError: The file holds a value for a ``tf.Variable`` this model
                does not have (yet): one created in ``call``, or code changed
                since the file was written.
        """
        keys = list(store.keys())  # a Keras weights store (an H5 group), not a dict
        saved = [k for k in keys if k.startswith(_UNTRACKED_KEY)]
        super().load_own_variables({k: store[k] for k in keys if k not in saved})  # type: ignore[misc]
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
