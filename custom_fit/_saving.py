"""What ``model.save`` writes and ``load_model`` reads: existing multi-model code saves and loads unchanged.

:class:`Saving` gives ``CustomModel`` Keras' saving methods: configs
(``get_config``, ``get_build_config``, ``get_compile_config`` and their
``from_config`` counterparts) and the model's own variables
(``save_own_variables``, ``load_own_variables``, with the state
:mod:`custom_fit._extra_state` adds).

Public Keras examples write multi-model code that ``keras.Model`` cannot save:
sub-models handed to ``__init__`` with no ``get_config``, and optimizers,
losses and settings handed to a ``compile`` of the model's own and kept as
attributes. ``CustomModel`` saves such code as it is; :class:`Saving`

* records the arguments each model was constructed with and, when the class
  defines no ``get_config``, serializes them with Keras' own serialization
  (sub-models, optimizers, losses, plain values); ``from_config`` rebuilds
  them and calls the constructor again;
* records the arguments of a ``compile`` with a signature of its own, saves
  them as the compile config, and re-runs that ``compile`` when the model is
  loaded; ``CustomModel.compile`` re-runs from Keras' own config.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from custom_fit import _extra_state as extra_state
from custom_fit import _optimizers as optimizers
from custom_fit._compat import keras, version
from custom_fit._compat.common import unbuilt_sub_layers
from custom_fit._host import Host
from custom_fit._state import state_of

__all__ = ["Saving"]

# Wraps a Keras object inside a config of captured arguments.
_KERAS_OBJECT = "__custom_fit_keras_object__"
# The build config of a model built without being called: its sub-layers' build configs.
_SUB_LAYERS = "custom_fit_sub_layers"
# ... and how many variables each of those sub-layers had (custom_fit >= 0.3).
_SUB_LAYER_VARIABLES = "custom_fit_sub_layer_variables"
# The compile config of a compile() with a signature of its own.
_COMPILE_ARGUMENTS = "custom_fit_compile_arguments"
# Keras' own compile config, saved for a compile() of its own whose arguments could not be:
# load_model leaves the model uncompiled, as for keras.Model (never calls that compile() with it).
_NOT_RECOMPILED = "custom_fit_not_recompiled"
#: The arguments that can only be passed by position, in a config of captured arguments.
POSITIONAL = "custom_fit_positional"
# Keras' base keys of a layer config: set on the model from_config made when its constructor
# does not take them (or swallows them).
_BASE_KEYS = ("name", "trainable", "dtype")


# --------------------------------------------------------------------------
# Arguments as configs
# --------------------------------------------------------------------------


def captured_arguments(
    function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Any] | None:
    """``function``'s arguments by name (``**kwargs`` merged), or ``None`` if they do not bind.

    ``function`` is an unbound method; its first parameter (``self``) is left
    out. What can only be passed by position (positional-only parameters, a
    non-empty ``*args`` and the parameters before it) is kept, in order, as a
    list under :data:`POSITIONAL`; :func:`call_with` passes it back so.
    """
    try:
        bound = inspect.signature(function).bind(None, *args, **kwargs)
    except TypeError:
        return None
    parameters = list(inspect.signature(function).parameters.values())[1:]
    by_position = any(p.kind is inspect.Parameter.VAR_POSITIONAL and bound.arguments.get(p.name) for p in parameters)
    positional: list[Any] = []
    arguments: dict[str, Any] = {}
    for parameter in parameters:
        if parameter.name not in bound.arguments:
            continue
        value = bound.arguments[parameter.name]
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            positional.extend(value)
        elif parameter.kind is inspect.Parameter.VAR_KEYWORD:
            arguments.update(value)
        elif parameter.kind is inspect.Parameter.POSITIONAL_ONLY or (
            by_position and parameter.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
        ):
            positional.append(value)
        else:
            arguments[parameter.name] = value
    if positional:
        arguments[POSITIONAL] = positional
    return arguments


def call_with(function: Callable[..., Any], arguments: Mapping[str, Any]) -> Any:
    """Calls ``function`` with what :func:`captured_arguments` recorded (deserialized)."""
    keywords = dict(arguments)
    return function(*keywords.pop(POSITIONAL, []), **keywords)


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
        serialized = keras.saving.serialize_keras_object(value)
    except Exception as error:
        raise NotImplementedError(
            f"custom_fit cannot save {owner}: expected Keras objects (layers, models, optimizers, "
            f"losses, registered functions) or plain values, received {type(value).__name__} "
            f"({error}). Fix: define get_config() (and from_config() if needed) on the class."
        ) from error
    if isinstance(serialized, (bool, int, float)):
        return serialized  # a NumPy scalar: a plain number in the config, as Keras writes it
    return {_KERAS_OBJECT: serialized}


def _serialize_arguments(arguments: Mapping[str, Any], owner: str) -> dict[str, Any]:
    """:func:`serialize_argument` of each argument; ``owner`` is e.g. ``"MyGAN.compile argument"``."""
    return {name: serialize_argument(value, f"{owner} {name!r}") for name, value in arguments.items()}


def _saved_as_keras_saves(error: NotImplementedError, keras_config: Any, what: str) -> Any:
    """Keras' own ``keras_config`` where custom_fit cannot serialize arguments: never fail where Keras saves.

    Warns (``error`` names the argument and the fix) that ``load_model`` will
    not rebuild ``what`` from the file, as with ``keras.Model``.
    """
    warnings.warn(
        f"{error} Saved Keras' own {what} instead, as keras.Model does: load_model will not rebuild the "
        "model from these arguments.",
        stacklevel=3,
    )
    return keras_config


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


def _recording_arguments(compile_method: Callable[..., Any]) -> Callable[..., Any]:
    """Wraps a subclass' own ``compile`` so that the outermost call records its arguments.

    Those of a user's ``compile``: custom_fit's own (``CustomModel.compile``,
    ``GAN.compile``) pass Keras what they receive, and Keras' compile config is saved.
    """
    own_signature = compile_method.__module__.partition(".")[0] != __name__.partition(".")[0]

    @functools.wraps(compile_method)
    def compile(self: Host, *args: Any, **kwargs: Any) -> Any:
        state = state_of(self)
        if state.recording_compile:  # super().compile() from a subclass' compile
            return compile_method(self, *args, **kwargs)
        state.recording_compile = True
        before = optimizers.attribute_optimizers(self)
        try:
            result = compile_method(self, *args, **kwargs)
        finally:
            state.recording_compile = False
        state.compile_arguments = captured_arguments(compile_method, args, kwargs) if own_signature else None
        after = optimizers.attribute_optimizers(self)
        state.rebuilt_optimizers.update({name: value for name, value in after.items() if before.get(name) is not value})
        self._after_compile()
        return result

    return compile


def _recording_optimizers(init: Callable[..., Any]) -> Callable[..., Any]:
    """Wraps a subclass' ``__init__`` so that the optimizers it keeps as attributes are known to be rebuilt.

    Each constructor of the chain records when it returns; the outermost returns last.
    """

    @functools.wraps(init)
    def recording_init(self: Host, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        state_of(self).rebuilt_optimizers = optimizers.attribute_optimizers(self)

    # Keras 3 reads the constructor's arguments with `inspect.getfullargspec`, which does not
    # follow `__wrapped__` but reads `__signature__`.
    recording_init.__signature__ = inspect.signature(init)  # type: ignore[attr-defined]
    return recording_init


def _warn_unrebuilt_optimizers(model: Any) -> None:
    """Warns about attribute optimizers that neither the constructor nor the model's own ``compile`` made."""
    rebuilt = state_of(model).rebuilt_optimizers
    lost = [
        name
        for name, value in optimizers.attribute_optimizers(model).items()
        if rebuilt.get(name) is not value and value is not model.optimizer
    ]
    if lost:
        warnings.warn(
            f"{type(model).__name__} '{model.name}' keeps the optimizers {lost} as attributes, but neither its "
            "constructor nor a compile() of its own made them (they were assigned later): load_model re-runs "
            "only those, so the loaded model will not have them, and their state in the file is not read. "
            "Expected every optimizer the training step uses to be made by __init__, or passed to compile(). "
            f"Fix: create them in {type(model).__name__}.__init__, or pass them to compile(optimizer={{name: "
            "optimizer}}) or to a compile() of the model's own; then they are saved and restored with their state.",
            stacklevel=3,
        )


def _rebuild_lazy_sub_layers(model: Any, layer: Any, config: dict[str, Any], saved: int | None) -> None:
    """Builds what ``layer``'s ``call`` builds when ``build_from_config`` left variables out (see the caller).

    ``saved`` is the number of variables ``layer`` had when the model was saved
    (``None`` in files written before custom_fit 0.3: then any unbuilt
    sub-layer is built by a call, and what still fails is Keras' loader's to report).
    """
    unbuilt = unbuilt_sub_layers(layer)
    missing = len(layer.variables) < saved if saved is not None else bool(unbuilt)
    if not missing or "input_shape" not in config:
        return
    shape = config["input_shape"]
    problem: str | None = None
    try:
        version.call_symbolically(layer, shape)
    except Exception as error:  # whatever the layer's call raises; reported with the fix below
        problem = f"calling it on a symbolic input of that shape raised {error!r}"
    else:
        if saved is not None and len(layer.variables) < saved:
            problem = f"calling it on a symbolic input of that shape left {unbuilt_sub_layers(layer)} unbuilt"
    if saved is None or problem is None:
        return
    raise ValueError(
        f"Cannot load {type(model).__name__} '{model.name}': its layer '{layer.name}' "
        f"({type(layer).__name__}) was saved with {saved} variables, but rebuilding it from its input shape "
        f"{shape} made {len(layer.variables)}: its build() leaves the sub-layers {unbuilt} unbuilt, and "
        f"{problem}. Expected build() to create all of the layer's state. Fix: in "
        f"{type(layer).__name__}.build, build each sub-layer it makes (for example "
        f"`self.projection.build(input_shape)`), or give {type(layer).__name__} a build_from_config that does."
    )


class Saving(Host):
    """``CustomModel``'s configs, made from the arguments its constructor and ``compile`` received, and its variables.

    **Constructor.** Keras serializes a subclassed model's constructor
    arguments only when all are plain values; sub-models (the usual GAN, VAE
    and distiller code) make ``model.save`` raise ``NotImplementedError``.
    Here every argument a Keras object is serialized with
    ``keras.saving.serialize_keras_object`` and rebuilt by ``from_config``; a
    class' own ``get_config`` still wins. Functional and Sequential models keep
    Keras' own configs.

    **compile.** A subclass whose ``compile`` takes its own arguments (the
    keras.io GAN's ``compile(d_optimizer, g_optimizer, loss_fn)``) gets them
    recorded; they are saved as the compile config and ``load_model`` calls
    that ``compile`` again with them. (Keras warns and leaves such a model uncompiled.)

    **Variables.** Seed generator states, untracked variables and the named
    optimizers' assignments are saved with the model's own variables
    (:mod:`custom_fit._extra_state`).
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        instance = super().__new__(cls, *args, **kwargs)
        state_of(instance).constructor_arguments = captured_arguments(cls.__init__, args, kwargs)
        return instance

    def get_config(self) -> dict[str, Any]:
        """Keras' config, or the constructor's recorded arguments with Keras' base keys.

        The keys are those Keras writes: the base keys (``name``, ``trainable``,
        ``dtype``) where ``__init__`` takes them back, then the arguments; the
        model's own ``name`` and ``trainable``. A constructor may take them
        through ``**kwargs`` and not pass them on to ``keras.Model`` (a subclass
        forwarding ``**kwargs`` to a parent ``__init__`` that takes none):
        :meth:`from_config` then makes the model without them and sets them.
        Warns when the model keeps optimizers as attributes that ``load_model``
        will not make again.
        """
        _warn_unrebuilt_optimizers(self)
        arguments = state_of(self).constructor_arguments
        if arguments is None or isinstance(self, (version.Functional, keras.Sequential)):
            return super().get_config()
        own_from_config = type(self).from_config.__func__ is not Saving.from_config.__func__  # type: ignore[attr-defined]
        if own_from_config and POSITIONAL in arguments:
            return super().get_config()  # the class' from_config calls cls(**config)
        # Keras' base keys, which `Layer.get_config` returns alone for a class with its own
        # `get_config`; kept where `__init__` takes them back, as Keras' automatic config does.
        base = keras.layers.Layer.get_config(self)
        config = {k: v for k, v in base.items() if _accepts(type(self).__init__, k)}
        try:
            config.update(_serialize_arguments(arguments, f"{type(self).__name__}.__init__ argument"))
        except NotImplementedError as error:
            if not version.SAVES_UNCONFIGURABLE_MODELS:  # Keras 3 raises too (less clearly)
                raise
            return _saved_as_keras_saves(error, super().get_config(), "config")
        # What the model has, also where its constructor swallowed what it was given.
        config.update({k: base[k] for k in ("name", "trainable") if k in config})
        return config

    @classmethod
    def from_config(cls, config: dict[str, Any], custom_objects: Any = None) -> Any:
        """The model :meth:`get_config` describes: its constructor called as it was, then the base keys set.

        A base key the constructor rejects (``... got an unexpected keyword
        argument 'name'``: it was not passed when the model was made) is left
        out of the call and set on the model it made.
        """
        config = {k: deserialize_argument(v, custom_objects) for k, v in config.items()}
        base = {k: config[k] for k in _BASE_KEYS if k in config}
        arguments = dict(config)
        while True:
            try:
                if POSITIONAL in arguments:
                    model = call_with(cls, arguments)
                else:
                    model = super().from_config(arguments, custom_objects)
                break
            except TypeError as error:
                rejected = [k for k in _BASE_KEYS if k in arguments and f"argument '{k}'" in str(error)]
                if not rejected:
                    raise
                del arguments[rejected[0]]
        version.restore_base_config(model, base)
        return model

    def get_build_config(self) -> dict[str, Any] | None:
        """Keras' build config; for a model built without being called, each sub-layer's.

        Sub-models made in ``__init__`` without an input shape (the SimCLR
        example's ``Sequential``s) are built by the first training step. A
        model whose own ``call`` never ran has no input shape to rebuild from,
        so ``load_model`` could not create their variables; their own build
        configs (input shapes) are saved instead.
        """
        config: dict[str, Any] | None = super().get_build_config()
        if config is not None or not self.built:
            return config
        built = {str(i): layer for i, layer in enumerate(self.layers) if layer.built}
        return {
            _SUB_LAYERS: {i: layer.get_build_config() for i, layer in built.items()},
            _SUB_LAYER_VARIABLES: {i: len(layer.variables) for i, layer in built.items()},
        }

    def build_from_config(self, config: dict[str, Any]) -> None:
        """Rebuilds what :meth:`get_build_config` saved (Keras' own configs as Keras does).

        A sub-layer is rebuilt from its input shape with its ``build_from_config``
        (its ``build``). A layer whose ``build`` makes sub-layers that its
        ``call`` builds (the keras.io masked autoencoder's ``PatchEncoder``
        makes a ``Dense`` and an ``Embedding`` there) would have fewer
        variables than were saved, and Keras would load the rest into nothing:
        it is then called on a symbolic input of that shape, which builds them.
        A sub-layer that still has fewer variables raises an error naming it
        (never a model with fewer weights than its file).

        Raises:
            ValueError: A sub-layer could not be rebuilt with the variables it was saved with.
        """
        if _SUB_LAYERS not in config:
            super().build_from_config(config)
            return
        counts = config.get(_SUB_LAYER_VARIABLES, {})  # files saved before custom_fit 0.3 have none
        for i, layer in enumerate(self.layers):
            layer_config = config[_SUB_LAYERS].get(str(i))
            if not layer_config:
                continue
            if not layer.built:  # deserializing a sub-layer saved with its own build config built it already
                layer.build_from_config(layer_config)
            _rebuild_lazy_sub_layers(self, layer, layer_config, counts.get(str(i)))
        version.mark_built_if_complete(self)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "compile" in vars(cls):
            setattr(cls, "compile", _recording_arguments(vars(cls)["compile"]))  # noqa: B010  (a subclass attribute)
        if "__init__" in vars(cls):
            cls.__init__ = _recording_optimizers(vars(cls)["__init__"])  # type: ignore[method-assign]

    def _after_compile(self) -> None:
        """Called after a subclass' own ``compile`` returned (``CustomModel`` groups attribute optimizers)."""

    def get_compile_config(self) -> dict[str, Any] | None:
        """Keras' compile config, or the recorded arguments of a ``compile`` with its own signature.

        A ``compile`` of the model's own is always saved as the arguments it was
        called with, never as Keras' config: Keras' config holds what it passed
        on to ``keras.Model.compile``, and may bind to its signature through
        ``**kwargs`` while leaving out its own arguments. ``None`` before
        ``compile``, as in Keras.
        """
        config = super().get_compile_config()
        arguments = state_of(self).compile_arguments
        if config is None or arguments is None:
            return config
        try:
            return {_COMPILE_ARGUMENTS: _serialize_arguments(arguments, f"{type(self).__name__}.compile argument")}
        except NotImplementedError as error:  # Keras saves its own config (and warns at load)
            return _saved_as_keras_saves(error, {**config, _NOT_RECOMPILED: True}, "compile config")

    def compile_from_config(self, config: dict[str, Any]) -> None:
        """Re-runs ``compile`` from :meth:`get_compile_config` (used by ``load_model``)."""
        if _COMPILE_ARGUMENTS in config:
            call_with(self.compile, {k: deserialize_argument(v) for k, v in config[_COMPILE_ARGUMENTS].items()})
        elif config.get(_NOT_RECOMPILED) or not _binds(self.compile, config):
            # A compile() of its own saved by Keras (not by CustomModel), or whose arguments
            # could not be saved: Keras' behaviour, a warning that compile() must be called.
            super().compile_from_config({k: v for k, v in config.items() if k != _NOT_RECOMPILED})
            return
        else:
            self.compile(**keras.saving.deserialize_keras_object(config))
        version.mark_built_if_complete(self)
        if self.optimizer is not None and self.built:
            optimizers.ensure_state(self.optimizer, self.trainable_variables)

    def save_own_variables(self, store: Any) -> None:
        """Saves the model's own variables and the state Keras leaves out (:mod:`custom_fit._extra_state`).

        Called by ``model.save``, ``save_weights``, ``ModelCheckpoint`` and
        ``BackupAndRestore``. Unlike ``keras.Model``, seed generator states,
        untracked variables and the named optimizers' variables are saved too,
        so a run resumed from a file continues exactly like an uninterrupted one.
        """
        super().save_own_variables(store)
        extra_state.save(self, store)

    def load_own_variables(self, store: Any) -> None:
        """Loads what :meth:`save_own_variables` saved (files without some of it load too).

        Raises:
            ValueError: The file holds a value for a ``tf.Variable`` this model
                does not have (yet): one created in ``call``, or code changed
                since the file was written.
        """
        keras_own, parts = extra_state.split(store)
        super().load_own_variables(keras_own)
        extra_state.load(self, parts)


def _binds(function: Callable[..., Any], config: Mapping[str, Any]) -> bool:
    """Whether ``function`` takes every key of ``config`` as a keyword argument.

    Only the keys are read: a serialized config's values are not deserialized,
    so user functions (``metrics=[my_metric]``) need no registration to save.
    """
    try:
        inspect.signature(function).bind(**dict.fromkeys(config))
    except TypeError:
        return False
    return True
