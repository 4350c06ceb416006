"""How ``CustomModel`` joins Keras 3's ``fit``/``evaluate``/``predict`` loop, and the state each call keeps.

Keras 3 builds the loop's pieces inside ``fit``: the ``CallbackList`` (unless
it is given one) and an epoch iterator that decides how many steps each call
of the train function runs. :class:`FitLoopHooks` hands ``fit`` and
``evaluate`` a :class:`~custom_fit._callbacks.LazyCallbackList` (no host wait
per step) and steers ``fit``'s epoch iterator
(:func:`custom_fit._compat.keras3_only.steer_epoch_iterator`): each execution
runs the number of steps a plan chooses (``compile(steps_per_execution="auto")``:
the model's :class:`~custom_fit._step_fusion.StepsPerExecutionTuner`), and the
iterator reports to the call's :class:`EpochPosition`, from which
:class:`~custom_fit.BackupAndRestore` resumes at the exact step.

State: each ``fit``, ``evaluate`` and ``predict`` call on a model is a
:class:`LoopCall`, on a stack the model keeps while they run (``fit``'s
validation is an ``evaluate`` inside a ``fit``). Nothing else about a call is
kept on the model.

Keras 2 needs none of the hooks: tf_keras skips unused batch hooks itself,
and its data handler reads the number of steps per execution from a variable
before every execution. :class:`EpochPosition` is Keras-independent.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any, Literal, Protocol

from custom_fit import _compat
from custom_fit._callbacks import LazyCallbackList
from custom_fit._compat import keras
from custom_fit._host import Host
from custom_fit._random_state import RandomState
from custom_fit._state import state_of

__all__ = ["EpochPosition", "FitLoopHooks", "LoopCall", "ResumePoint", "fit_position"]


class ResumePoint(Protocol):
    """Where a resumed ``fit`` starts (a :class:`custom_fit._backup_and_restore.Backup` is one)."""

    step: int  # the first step of the epoch not trained yet
    iterator: int  # which data iterator, counted from fit's start, that step reads from
    skip: int  # how many of its batches were read before that step
    data_epoch: int | None  # the data adapter's count of ended epochs (Keras >= 3.16)


@dataclasses.dataclass
class LoopCall:
    """One ``fit``, ``evaluate`` or ``predict`` call running on a model (Keras 3).

    Attributes:
        kind: The method.
        callbacks: The lazy ``CallbackList`` made for the call, until Keras'
            epoch iterator tells its number of steps (``None`` for a list the
            user passed, or once it knows).
        position: ``fit`` only: where it reads its data.
        steered: ``fit`` only: whether its training epoch iterator is steered.
    """

    kind: Literal["fit", "evaluate", "predict"]
    callbacks: LazyCallbackList | None = None
    position: EpochPosition | None = None
    steered: bool = False


class FitLoopHooks(Host):
    """Gives ``CustomModel`` Keras 3 ``fit``/``evaluate`` with lazy callbacks and steered epochs.

    Keras uses a ``CallbackList`` it is given as it is (one passed by the user
    too). The number of steps the progress bar shows, and the training epoch
    iterator, become known when Keras calls ``_maybe_symbolic_build`` with
    its epoch iterator, before any callback runs; then
    :meth:`_epoch_iterator_made` completes what the call started.
    """

    @property
    def steps_per_execution(self) -> int:
        """The number of steps each call of the train, test or predict function runs.

        What ``compile`` was given. With ``compile(steps_per_execution="auto")``,
        the number of training steps the tuner fuses now (1 until ``fit`` has
        tuned it), but 1 while ``evaluate`` or ``predict`` run: Keras' own
        ``evaluate`` and ``predict`` run ``steps_per_execution`` batches even
        when their ``steps`` asks for fewer, so fusing the tuned number could
        change their results. ``get_compile_config()`` keeps ``"auto"``.
        """
        state = state_of(self)
        if state.steps_tuner is None or (state.loop_calls and state.loop_calls[-1].kind != "fit"):
            return state.fixed_steps_per_execution
        return state.steps_tuner.steps

    @steps_per_execution.setter
    def steps_per_execution(self, value: int) -> None:
        state_of(self).fixed_steps_per_execution = value  # Keras sets it in __init__ and compile

    @functools.wraps(keras.Model.fit)  # keeps Keras' signature and docstring for help() and inspect
    def fit(self, *args: Any, **kwargs: Any) -> Any:
        arguments = _by_name(super().fit, args, kwargs)
        call = LoopCall("fit", position=EpochPosition())
        arguments["callbacks"], call.callbacks = self._callback_list(arguments, add_history=True)
        with self._running(call):
            return super().fit(**arguments)

    @functools.wraps(keras.Model.evaluate)
    def evaluate(self, *args: Any, **kwargs: Any) -> Any:
        arguments = _by_name(super().evaluate, args, kwargs)
        call = LoopCall("evaluate")
        arguments["callbacks"], call.callbacks = self._callback_list(arguments, add_history=False)
        with self._running(call):
            return super().evaluate(**arguments)

    @functools.wraps(keras.Model.predict)
    def predict(self, *args: Any, **kwargs: Any) -> Any:
        with self._running(LoopCall("predict")):
            return super().predict(*args, **kwargs)

    @contextlib.contextmanager
    def _running(self, call: LoopCall) -> Iterator[LoopCall]:
        """Keeps ``call`` on the model's stack of running calls while it runs."""
        state_of(self).loop_calls.append(call)
        try:
            yield call
        finally:
            state_of(self).loop_calls.pop()
            if call.position is not None:
                call.position.adapter = None  # it holds the data: not kept past fit, as in Keras

    def _callback_list(self, arguments: dict[str, Any], *, add_history: bool) -> tuple[Any, LazyCallbackList | None]:
        """The callbacks to hand Keras: a user's ``CallbackList`` as it is, else a lazy one (also returned)."""
        callbacks = arguments.get("callbacks")
        if isinstance(callbacks, keras.callbacks.CallbackList):
            return callbacks, None
        verbose = arguments.get("verbose", "auto")
        lazy = LazyCallbackList(
            callbacks,
            add_history=add_history,
            add_progbar=verbose != 0,
            model=self,
            verbose=verbose,
            epochs=arguments.get("epochs", 1),
            steps=None,  # known once Keras has made its epoch iterator
        )
        return lazy, lazy

    def _epoch_iterator_made(self, epoch_iterator: Any) -> None:
        """Called by ``_maybe_symbolic_build`` with each epoch iterator ``fit``/``evaluate`` make, before callbacks."""
        _compat.keras3_only.without_autotuning(epoch_iterator)
        state = state_of(self)
        if not state.loop_calls:
            return
        call = state.loop_calls[-1]
        if call.callbacks is not None:
            call.callbacks.set_params({**call.callbacks.params, "steps": epoch_iterator.num_batches})
            call.callbacks = None
        if call.kind == "fit" and not call.steered:
            assert call.position is not None
            call.steered = True
            tuner, fixed = state.steps_tuner, state.fixed_steps_per_execution
            plan = tuner.plan if tuner is not None else lambda remaining: fixed
            _compat.keras3_only.steer_epoch_iterator(epoch_iterator, plan, call.position)
        elif call.kind == "evaluate":
            # fit made its validation's epoch iterator when "auto" may have fused another number.
            _compat.keras3_only.set_steps_per_execution(epoch_iterator, self.steps_per_execution)


def fit_position(model: Any) -> EpochPosition | None:
    """Where the ``fit`` running on ``model`` reads its data; ``None`` when no custom_fit ``fit`` runs (Keras 3)."""
    calls = state_of(model).loop_calls if isinstance(model, FitLoopHooks) else []
    positions = [call.position for call in calls if call.position is not None]
    return positions[-1] if positions else None


def _by_name(method: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """``method``'s arguments as keywords (``fit(x, y, 32, 3, 0, callbacks)`` works too)."""
    signature = inspect.signature(method)
    arguments = dict(signature.bind(*args, **kwargs).arguments)
    for parameter in signature.parameters.values():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            arguments.update(arguments.pop(parameter.name, {}))
    return arguments


class EpochPosition:
    """Where ``fit`` reads its data: which iterator, and how many of its batches came before step 0.

    ``CustomModel.fit`` (Keras 3) makes one per call (:class:`LoopCall`); its epoch iterator
    (:func:`custom_fit._compat.keras3_only.steer_epoch_iterator`) reports to
    it and, in a resumed run, asks it where to start (:attr:`resume`).
    Iterators are counted because each new iterator of a ``tf.data`` pipeline
    with a seeded ``shuffle`` draws a new order: the n-th iterator of a
    resumed run reads what the n-th of the interrupted run read.

    Example:
        >>> position = EpochPosition()
        >>> position.iterator_made(); position.epoch_begins(); position.reading(batches_before_step_0=0)
        >>> position.at_step(5)  # (iterator, batches read before step 5)
        (0, 5)
        >>> position.epoch_ends(next_skip=None); position.at_next_epoch()  # the next epoch makes a new iterator
        (1, 0)
    """

    def __init__(self) -> None:
        self.iterators_made = 0
        #: The index of the iterator the current epoch reads from.
        self.iterator = 0
        #: Set by :class:`BackupAndRestore` before the first epoch of a resumed run.
        self.resume: ResumePoint | None = None
        #: The random state before each epoch's ``on_epoch_begin`` and ``on_epoch_end``
        #: of the data, kept when :attr:`records_hooks` (set by the epoch iterator).
        self.hook_states: list[tuple[RandomState, RandomState]] = []
        self.records_hooks = False
        self.adapter: Any = None  # Keras' data adapter (set by the epoch iterator)
        #: The data adapter's count of ended epochs when the current epoch began (Keras >= 3.16).
        self.data_epoch: int | None = None
        self.element_spec: Any = None  # the structure, shapes and dtypes of a batch
        self._batches_before_step_0 = 0
        self._next_epoch: tuple[int, int] | None = None
        self._hook_begin: RandomState | None = None

    # Called by the epoch iterator --------------------------------------------------

    def take_resume(self) -> ResumePoint | None:
        """The backup to resume from, once (the first epoch of a resumed run)."""
        resume, self.resume = self.resume, None
        return resume

    def iterator_made(self) -> None:
        """A new data iterator was made (and is the current one)."""
        self.iterator = self.iterators_made
        self.iterators_made += 1

    def epoch_begins(self, data_epoch: int | None = None) -> None:
        """The data's ``on_epoch_begin`` is about to run (its adapter has ended ``data_epoch`` epochs)."""
        self.data_epoch = data_epoch
        self._next_epoch = None
        if self.records_hooks:
            self._hook_begin = RandomState.capture()

    def reading(self, batches_before_step_0: int) -> None:
        """The epoch's steps read the current iterator after ``batches_before_step_0`` batches."""
        self._batches_before_step_0 = batches_before_step_0

    def epoch_ends(self, next_skip: int | None) -> None:
        """The data's ``on_epoch_end`` is about to run.

        Args:
            next_skip: ``None`` if the next epoch makes a new iterator, else
                the batches of the current one read when it begins.
        """
        self._next_epoch = (self.iterators_made, 0) if next_skip is None else (self.iterator, next_skip)
        if self.records_hooks and self._hook_begin is not None:
            self.hook_states.append((self._hook_begin, RandomState.capture()))

    # Asked by BackupAndRestore -----------------------------------------------------

    def at_step(self, step: int) -> tuple[int, int]:
        """``(iterator, batches read before)`` for ``step`` of the current epoch."""
        return self.iterator, self._batches_before_step_0 + step

    def at_next_epoch(self) -> tuple[int, int]:
        """``(iterator, batches read before)`` for step 0 of the next epoch."""
        return self._next_epoch if self._next_epoch is not None else (self.iterators_made, 0)
