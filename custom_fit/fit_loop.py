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

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
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

    @property
    def steps_per_execution(self: Any) -> int:
        """The number of steps each call of the train, test or predict function runs.

        What ``compile`` was given. With ``compile(steps_per_execution="auto")``,
        the number of training steps the tuner fuses now (1 until ``fit`` has
        tuned it), but 1 while ``evaluate`` or ``predict`` run: Keras 3.15's
        ``evaluate`` and ``predict`` run ``steps_per_execution`` batches even
        when their ``steps`` asks for fewer (``predict(steps=3)`` with 8
        fused steps returns 8 batches), so fusing the tuned number could
        change their results. ``get_compile_config()`` keeps ``"auto"``.
        """
        tuner = getattr(self, "_steps_tuner", None)
        if tuner is None or getattr(self, "_evaluating", False):
            return self._fixed_steps_per_execution
        return tuner.steps

    @steps_per_execution.setter
    def steps_per_execution(self: Any, value: int) -> None:
        object.__setattr__(self, "_fixed_steps_per_execution", value)  # Keras sets it in __init__ and compile

    @functools.wraps(keras.Model.fit)  # keeps Keras' signature and docstring for help() and inspect
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

    @functools.wraps(keras.Model.evaluate)
    def evaluate(self: Any, *args: Any, **kwargs: Any) -> Any:
        arguments = _by_name(super().evaluate, args, kwargs)  # type: ignore[misc]
        arguments["callbacks"] = self._lazy_callback_list(arguments, add_history=False)
        with self._evaluation():
            return super().evaluate(**arguments)  # type: ignore[misc]

    @functools.wraps(keras.Model.predict)
    def predict(self: Any, *args: Any, **kwargs: Any) -> Any:
        with self._evaluation():
            return super().predict(*args, **kwargs)  # type: ignore[misc]

    @contextlib.contextmanager
    def _evaluation(self: Any) -> Iterator[None]:
        """While ``evaluate`` or ``predict`` (also ``fit``'s validation) run: see :attr:`steps_per_execution`."""
        evaluating = getattr(self, "_evaluating", False)
        object.__setattr__(self, "_evaluating", True)
        try:
            yield
        finally:
            object.__setattr__(self, "_evaluating", evaluating)

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
        if not getattr(self, "_training_epoch_iterator_pending", False):
            # Evaluation: fit made its validation's epoch iterator with the number "auto" fused then.
            keras3_only.set_steps_per_execution(epoch_iterator, self.steps_per_execution)
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
