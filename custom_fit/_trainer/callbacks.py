"""Callbacks without a host wait per step: logs stay tensors until a callback reads them (Keras 3).

Keras 3's ``CallbackList`` converts every step's logs to Python numbers
(``pythonify_logs``) before each batch hook, whatever callbacks are attached:
even ``fit(verbose=0)`` with no callback makes the host wait for every step
(and, on a GPU, the device wait for the host). tf_keras skipped batch hooks
nobody implements and handed tensors to callbacks that accept them.
:class:`LazyCallbackList` does the same for Keras 3:

* a batch hook that no callback implements is not called at all;
* callbacks that implement one get a :class:`LazyLogs`: a ``dict`` whose values
  become Python numbers, by ``pythonify_logs``' rule, when they are read, so a
  callback that reads ``loss`` (``TerminateOnNaN``) waits for ``loss`` only, and
  one that reads nothing waits for nothing;
* Keras' ``ProgbarLogger`` gets the tensors: its progress bar keeps the latest
  values and converts them only when it redraws (at most every 0.05 s).

Epoch-level hooks and ``History`` see exactly what they see in Keras.
:class:`custom_fit._trainer.loop.Loop` makes ``fit``/``evaluate`` use the list.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from custom_fit._compat import keras

__all__ = ["LazyCallbackList", "LazyLogs"]

_BATCH_HOOKS = {  # hook -> the generic hook Keras' Callback forwards it to by default
    "on_train_batch_begin": "on_batch_begin",
    "on_train_batch_end": "on_batch_end",
    "on_test_batch_begin": None,
    "on_test_batch_end": None,
    "on_predict_batch_begin": None,
    "on_predict_batch_end": None,
    "on_batch_begin": None,
    "on_batch_end": None,
}


def _python_value(value: Any) -> Any:
    """One log value as ``pythonify_logs`` converts it: a ``float`` where it can be one."""
    try:
        if keras.ops.is_tensor(value):
            value = keras.ops.convert_to_numpy(value)
        return float(value)
    except Exception:  # what cannot be a float stays as it is, as in Keras
        return value


def _flat(logs: dict[str, Any] | None) -> dict[str, Any]:
    """Nested dicts flattened and keys sorted, as ``pythonify_logs`` does, values untouched."""
    flat: dict[str, Any] = {}
    for key, value in sorted((logs or {}).items()):
        if isinstance(value, dict):
            flat.update(_flat(value))
        else:
            flat[key] = value
    return flat


class LazyLogs(dict):
    """One step's logs; each value becomes a Python number when it is first read.

    Reading a value (``logs["loss"]``, ``get``, ``items``, ``values``,
    ``dict(logs)``, ``{**logs}``) waits for that value only; the converted value
    is kept, so every callback of the step sees the same number.

    Example:
        >>> import tensorflow as tf, custom_fit
        >>> logs = custom_fit._trainer.callbacks.LazyLogs({"loss": tf.constant(0.5), "mae": tf.constant(1.0)})
        >>> logs["loss"], sorted(logs)
        (0.5, ['loss', 'mae'])
    """

    def __init__(self, logs: dict[str, Any] | None = None):
        super().__init__(_flat(logs))
        self._converted: set[str] = set()

    def raw(self) -> dict[str, Any]:
        """The values as the step returned them (tensors), flattened."""
        return {key: dict.__getitem__(self, key) for key in dict.keys(self)}

    def __getitem__(self, key: str) -> Any:
        if key not in self._converted:
            dict.__setitem__(self, key, _python_value(dict.__getitem__(self, key)))
            self._converted.add(key)
        return dict.__getitem__(self, key)

    def __setitem__(self, key: str, value: Any) -> None:
        self._converted.add(key)
        dict.__setitem__(self, key, value)

    def __iter__(self) -> Iterator[str]:
        # Overriding __iter__ makes CPython's dict(logs) / {**logs} go through __getitem__.
        return iter(list(dict.keys(self)))

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self else default  # noqa: SIM401  (self.get is this method)

    def items(self) -> list[tuple[str, Any]]:  # type: ignore[override]
        return [(key, self[key]) for key in self]

    def values(self) -> list[Any]:  # type: ignore[override]
        return [self[key] for key in self]

    def copy(self) -> dict[str, Any]:
        return dict(self.items())

    def pop(self, key: str, *default: Any) -> Any:
        if key not in self:
            return dict.pop(self, key, *default)
        value = self[key]
        dict.pop(self, key)
        return value

    def __repr__(self) -> str:
        return repr(self.copy())

    def __eq__(self, other: object) -> bool:
        return self.copy() == (dict(other.items()) if isinstance(other, dict) else other)

    __hash__ = None


def _implements(callback: Any, hook: str) -> bool:
    """Whether ``callback`` does something in ``hook`` (its own method, on its class or instance)."""
    generic = _BATCH_HOOKS[hook]
    for name in (hook, generic) if generic else (hook,):
        if name in vars(callback) or getattr(type(callback), name) is not getattr(keras.callbacks.Callback, name):
            return True
    return False


class LazyCallbackList(keras.callbacks.CallbackList):
    """Keras' ``CallbackList`` without a host wait per step (see the module docstring)."""

    #: Callbacks handed the step's tensors as they are: Keras' progress bar converts them when it redraws.
    tensors_for: tuple[type, ...] = (keras.callbacks.ProgbarLogger,)

    def _batch_hook(self, hook: str, batch: int, logs: dict[str, Any] | None) -> None:
        callbacks = [callback for callback in self.callbacks if _implements(callback, hook)]
        if not callbacks:
            return
        lazy = LazyLogs(logs)
        for callback in callbacks:
            getattr(callback, hook)(batch, logs=lazy.raw() if type(callback) in self.tensors_for else lazy)

    def on_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._batch_hook("on_batch_begin", batch, logs)

    def on_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._batch_hook("on_batch_end", batch, logs)

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._batch_hook("on_train_batch_begin", batch, logs)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._batch_hook("on_train_batch_end", batch, logs)

    def on_test_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._batch_hook("on_test_batch_begin", batch, logs)

    def on_test_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._batch_hook("on_test_batch_end", batch, logs)

    def on_predict_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._batch_hook("on_predict_batch_begin", batch, logs)

    def on_predict_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._batch_hook("on_predict_batch_end", batch, logs)
