"""How ``CustomModel`` joins Keras 3's ``fit``/``evaluate`` loop: lazy callbacks, tuned and resumable epochs.

Keras 3 builds the loop's pieces inside ``fit``: the ``CallbackList`` (unless
it is given one) and an epoch iterator that decides how many steps each call
of the train function runs. :class:`FitLoopHooks` hands ``fit`` and
``evaluate`` a :class:`~custom_fit.callbacks.LazyCallbackList` (no host wait
per step), and steers ``fit``'s epoch iterator: with
``compile(steps_per_execution="auto")`` it follows the model's
:class:`~custom_fit.step_fusion.StepsPerExecutionTuner`, and it reports to an
:class:`~custom_fit.backup_and_restore.EpochPosition`, from which
:class:`~custom_fit.BackupAndRestore` resumes at the exact step. Keras 2
needs none of it for lazy callbacks and tuning: tf_keras skips unused batch
hooks itself, and its data handler reads the number of steps per execution
from a variable before every execution.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from custom_fit._compat import keras, keras3_only
from custom_fit.backup_and_restore import EpochPosition
from custom_fit.callbacks import LazyCallbackList

__all__ = ["FitLoopHooks"]


class FitLoopHooks:
    """Gives ``CustomModel`` Keras 3 ``fit``/``evaluate`` with lazy callbacks and tuned step fusion.

    Keras uses a ``CallbackList`` it is given as it is (one passed by the user
    too). The number of steps the progress bar shows, and the training epoch
    iterator, become known when Keras calls ``_maybe_symbolic_build`` with
    its epoch iterator, before any callback runs; then
    :meth:`_epoch_iterator_made` completes what ``fit`` started.
    """

    def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        arguments = _by_name(super().fit, args, kwargs)  # type: ignore[misc]
        position = EpochPosition()
        object.__setattr__(self, "_epoch_position", position)
        arguments["callbacks"] = self._lazy_callback_list(arguments, add_history=True)
        object.__setattr__(self, "_training_epoch_iterator_pending", True)
        try:
            return super().fit(**arguments)  # type: ignore[misc]
        finally:
            position.adapter = None  # it holds the data: not kept past fit, as in Keras

    def evaluate(self: Any, *args: Any, **kwargs: Any) -> Any:
        arguments = _by_name(super().evaluate, args, kwargs)  # type: ignore[misc]
        arguments["callbacks"] = self._lazy_callback_list(arguments, add_history=False)
        return super().evaluate(**arguments)  # type: ignore[misc]

    def _lazy_callback_list(self: Any, arguments: dict[str, Any], *, add_history: bool) -> Any:
        """The ``CallbackList`` Keras would make from ``arguments``, lazy; a user's list as it is."""
        callbacks = arguments.get("callbacks")
        if isinstance(callbacks, keras.callbacks.CallbackList):
            return callbacks
        verbose = arguments.get("verbose", "auto")
        callbacks = LazyCallbackList(
            callbacks,
            add_history=add_history,
            add_progbar=verbose != 0,
            model=self,
            verbose=verbose,
            epochs=arguments.get("epochs", 1),
            steps=None,  # known once Keras has made its epoch iterator
        )
        object.__setattr__(self, "_callbacks_waiting_for_steps", callbacks)
        return callbacks

    def _epoch_iterator_made(self: Any, epoch_iterator: Any) -> None:
        """Called with each epoch iterator ``fit``/``evaluate`` make, before any callback runs."""
        keras3_only.without_autotuning(epoch_iterator)
        callbacks = getattr(self, "_callbacks_waiting_for_steps", None)
        if callbacks is not None:
            object.__setattr__(self, "_callbacks_waiting_for_steps", None)
            callbacks.set_params({**callbacks.params, "steps": epoch_iterator.num_batches})
        if getattr(self, "_training_epoch_iterator_pending", False):
            object.__setattr__(self, "_training_epoch_iterator_pending", False)
            tuner = self._steps_tuner
            fixed = self.steps_per_execution
            plan = tuner.plan if tuner is not None else lambda remaining: fixed
            keras3_only.steer_epoch_iterator(epoch_iterator, plan, self._epoch_position)


def _by_name(method: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """``method``'s arguments as keywords (``fit(x, y, 32, 3, 0, callbacks)`` works too)."""
    signature = inspect.signature(method)
    arguments = dict(signature.bind(*args, **kwargs).arguments)
    for parameter in signature.parameters.values():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            arguments.update(arguments.pop(parameter.name, {}))
    return arguments
