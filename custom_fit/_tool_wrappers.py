"""Wrappers that tools install on ``keras.Model.fit``, ``evaluate`` and ``predict``, run for ``CustomModel`` too.

Experiment trackers hook Keras by replacing a method of ``keras.Model`` with a
wrapper that does their work around the function it replaced, Keras' own:
``mlflow.keras.autolog()`` and ``mlflow.tensorflow.autolog()`` start a run, log
``fit``'s arguments, add their callback and log the model around
``keras.Model.fit``; Comet adds its callback. ``CustomModel`` defines its own
``fit``, ``evaluate`` and ``predict`` (custom_fit's loop), which come before
``keras.Model``'s in its method resolution order, so such a wrapper would never
run for it, and the run would come out empty without a word.

:func:`runs_tool_wrappers` decorates those three methods of the loop. While the
Keras in use's ``Model.<method>`` is Keras' own function (the usual case: one
attribute read and a comparison per call), the method runs as it is. When a
tool has replaced it, the method runs inside the tool's wrapper, with
custom_fit's method in the place of Keras' own: a wrapper is a function that
reaches the function it wrapped through a closure cell (``functools.wraps``
decorators, MLflow's ``safe_patch``, Comet's ``Entrypoint``: every tool seen),
so the wrapper is rebuilt from its own code object with a cell that holds
custom_fit's method instead (a second tool's wrapper of the first: with a cell
that holds the first one rebuilt so). The tool's
code runs unchanged, nothing of it is copied, and no attribute of Keras, of
the tool or of any class is replaced, so other threads and other models see
nothing of it. A wrapper that does not reach Keras' method that way is named in
an :class:`UnappliedWrapperWarning` when the method runs, with what it misses
and how to get it.

No library does this (``wrapt`` and ``functools`` make wrappers, they do not
re-point one that exists), hence the few lines of our own below.
Nothing in this module is public API; the warning is exported by the package.
"""

from __future__ import annotations

import functools
import os
import types
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

from custom_fit import _compat
from custom_fit._compat import keras
from custom_fit._state import state_of

__all__ = ["UnappliedWrapperWarning", "runs_tool_wrappers", "wrapper_around"]

_Method = TypeVar("_Method", bound=Callable[..., Any])

#: The Keras package's folder: a function whose code lies in it is Keras' own (a tool's wrapper
#: copies a method's name and signature with ``functools.wraps``, never its code).
_KERAS_FOLDER = os.path.dirname(os.path.abspath(keras.__file__)) + os.sep

#: Keras' model class, as it was when custom_fit was imported: tools replace its methods, and code that
#: replaces the module's ``Model`` itself (tf_keras' own tests run with ``CustomModel`` in its place) installs
#: no tool.
_KERAS_MODEL = keras.Model

#: The methods a call of each may run in turn: ``fit`` validates through ``evaluate``.
_CALLS = {"fit": ("fit", "evaluate"), "evaluate": ("evaluate",), "predict": ("predict",)}

#: How deep wrappers of wrappers are followed (two tools stacked make two levels).
_MAX_DEPTH = 8


class UnappliedWrapperWarning(UserWarning):
    """A tool's wrapper of ``keras.Model.fit`` (``evaluate``, ``predict``) could not run for a ``CustomModel``.

    ``CustomModel`` runs a tool's wrapper of these methods around its own
    (docs/integrations.md); this warning names a wrapper it could not, once per
    call of ``fit``, ``evaluate`` or ``predict``. The tool's work around the
    method (callbacks it adds, parameters, metrics or models it logs) does not
    happen for that call: pass the tool's Keras callback to ``fit`` instead, if
    it has one.
    """


def is_keras_function(function: Any, name: str) -> bool:
    """Whether ``function`` is the Keras in use's own method ``name`` (not a tool's wrapper of it).

    Example:
        >>> import functools
        >>> from custom_fit._compat import keras
        >>> wrapper = functools.wraps(keras.Model.fit)(lambda *args, **kwargs: None)
        >>> is_keras_function(keras.Model.fit, "fit"), is_keras_function(wrapper, "fit")
        (True, False)
    """
    code = getattr(function, "__code__", None)
    return (
        code is not None
        and getattr(function, "__name__", None) == name
        and os.path.abspath(code.co_filename).startswith(_KERAS_FOLDER)
    )


def _pointed_at(function: Any, name: str, method: Callable[..., Any], depth: int = 0) -> Any:
    """A copy of ``function`` whose closure reaches ``method`` where it reached Keras' own ``name``; else ``None``."""
    if not isinstance(function, types.FunctionType) or not function.__closure__ or depth > _MAX_DEPTH:
        return None
    cells = []
    changed = False
    for cell in function.__closure__:
        try:
            content = cell.cell_contents
        except ValueError:  # a cell not yet filled (a name the function assigns later)
            cells.append(cell)
            continue
        if is_keras_function(content, name):
            replacement = _in_place_of(content, method)
        else:
            replacement = _pointed_at(content, name, method, depth + 1)
        if replacement is None:
            cells.append(cell)
        else:
            cells.append(types.CellType(replacement))
            changed = True
    if not changed:
        return None
    copy = types.FunctionType(
        function.__code__, function.__globals__, function.__name__, function.__defaults__, tuple(cells)
    )
    copy.__kwdefaults__ = function.__kwdefaults__
    copy.__dict__.update(function.__dict__)  # functools.wraps' attributes (__wrapped__, ...) and the tool's own
    copy.__qualname__ = function.__qualname__
    copy.__doc__ = function.__doc__
    return copy


def _in_place_of(keras_method: Any, method: Callable[..., Any]) -> Callable[..., Any]:
    """``method``, with the name and signature of the Keras method a wrapper calls.

    Tools read the method they wrap: MLflow logs ``fit``'s arguments by the
    names and defaults of its signature, so the signature is Keras', as for
    ``keras.Model`` (custom_fit's own takes Keras 2's data options too).
    """

    @functools.wraps(keras_method)
    def custom_fit_method(model: Any, *args: Any, **kwargs: Any) -> Any:
        return method(model, *args, **kwargs)

    return custom_fit_method


#: custom_fit's ``fit``, ``evaluate`` and ``predict`` by name, as :func:`runs_tool_wrappers` found them.
_METHODS: dict[str, Callable[..., Any]] = {}

#: ``{name: (the wrapper on keras.Model, its copy that runs custom_fit's method, or None)}``: made again
#: only when a tool installs another wrapper.
_COPIES: dict[str, tuple[Any, Any]] = {}


def _installed_wrapper(name: str) -> tuple[Any, Any] | None:
    """``(wrapper, copy)`` for the tool's wrapper on ``keras.Model.<name>``; ``None`` while Keras' own is there."""
    installed = getattr(_KERAS_MODEL, name)
    if is_keras_function(installed, name) or getattr(installed, "__wrapped__", None) is _METHODS[name]:
        return None  # Keras' own, or custom_fit's (put there by whoever made CustomModel Keras' model)
    found = _COPIES.get(name)
    if found is None or found[0] is not installed:
        found = (installed, _pointed_at(installed, name, _METHODS[name]))
        _COPIES[name] = found
    return found


def wrapper_around(model: Any, name: str) -> Any:
    """The tool's wrapper of ``keras.Model.<name>``, made to run custom_fit's method; ``None`` where none can run.

    ``None`` while ``keras.Model.<name>`` is Keras' own, and in a TF1 graph on
    Keras 2 (there the method calls tf_keras' own, through the wrapper). A call
    the user makes (not one another call of the model makes, such as ``fit``'s
    validation) warns about each wrapper it would run that cannot run
    (:class:`UnappliedWrapperWarning`): ``fit`` about ``fit``'s and ``evaluate``'s.
    """
    found = {called: _installed_wrapper(called) for called in _CALLS[name]}
    if all(wrapper is None for wrapper in found.values()) or _compat.loop.in_legacy_graph():
        return None
    if not state_of(model).loop_calls:
        for called, wrapper in found.items():
            if wrapper is not None and wrapper[1] is None:
                _warn_unapplied(model, name, called, wrapper[0])
    own = found[name]
    return None if own is None else own[1]


def _warn_unapplied(model: Any, name: str, called: str, installed: Any) -> None:
    """Names the wrapper of ``keras.Model.<called>`` that a call of ``name`` cannot run, and the fix."""
    where = f"{getattr(installed, '__module__', '?')}.{getattr(installed, '__qualname__', type(installed).__name__)}"
    warnings.warn(
        f"keras.Model.{called} is wrapped by {where} (a tool that hooks Keras, such as an experiment tracker "
        f"or a profiler), and custom_fit could not run that wrapper around CustomModel.{called} of model "
        f"'{model.name}': expected a function that reaches Keras' {called} through a closure (as functools.wraps "
        f"decorators, MLflow and Comet do), received {type(installed).__name__} {installed!r}. What the tool does "
        f"around keras.Model.{called} (callbacks it adds, parameters, metrics or models it logs) does not happen "
        f"for this call. Fix: pass the tool's Keras callback to {name}(callbacks=[...]) if it has one "
        "(docs/integrations.md lists the tools tested with custom_fit), or silence this warning with "
        "warnings.filterwarnings('ignore', category=custom_fit.UnappliedWrapperWarning).",
        UnappliedWrapperWarning,
        stacklevel=4,
    )


def runs_tool_wrappers(method: _Method) -> _Method:
    """Decorates the loop's ``fit``, ``evaluate`` or ``predict`` to run inside a tool's wrapper of Keras'.

    The decorated method takes the arguments exactly as its caller passed them
    (positional or by name) and hands them on unchanged: the tool sees the call
    it would see for ``keras.Model``.
    """
    name = method.__name__
    _METHODS[name] = method

    @functools.wraps(method)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        wrapper = wrapper_around(self, name)
        if wrapper is None:
            return method(self, *args, **kwargs)
        return wrapper(self, *args, **kwargs)

    return run  # type: ignore[return-value]
