"""``fit(..., validation_freq=custom_fit.Steps(N))``: validation every N training steps, counted across epochs.

Keras validates at epochs' ends only (``validation_freq`` counts epochs). The
usual workaround, ``steps_per_epoch=N`` over a repeated dataset, changes what
an epoch is: the metrics reset every N steps, the progress bar and
``epochs`` count N-step slices, and a finite dataset runs dry. With
:class:`Steps`, the epochs stay the data's and validation runs after each
N-th training step of the ``fit`` (steps N, 2N, 3N, …; 32 steps with
``Steps(10)``: after steps 10, 20 and 30), also across epochs and across a
resumed run. Lightning's ``val_check_interval`` with
``check_val_every_n_epoch=None`` does the same.

Who sees what (a callback that *monitors* a value is one with a ``monitor``
attribute: Keras' ``EarlyStopping``, ``ModelCheckpoint``,
``ReduceLROnPlateau``, on both Kerases, and a user's callback that has one):

* each run is an ``evaluate`` with ``fit``'s callbacks, as an epoch's
  validation is (``on_test_begin``, ``on_test_batch_*``, ``on_test_end``
  reach every callback);
* then the callbacks that monitor get ``on_epoch_end(run, logs)``, where
  ``run`` counts the runs of the ``fit`` from 0 (the run after step
  ``(run + 1) * N``) and ``logs`` are the training metrics of the epoch so far
  and the run's ``val_*`` values. So they act on every run without changes:
  ``EarlyStopping(patience=3)`` stops three runs after the best one (also
  inside the first epoch; its messages say "epoch" for the run),
  ``ModelCheckpoint(save_best_only=True)`` saves the best run's model
  (``{epoch}`` in its file path is the run's number), ``ReduceLROnPlateau``
  counts runs. A ``stop_training`` set there ends the epoch right after the
  run, as a stop in a batch hook does in Keras;
* every other callback sees the data's epochs, as without ``Steps``:
  ``on_epoch_end(epoch, logs)`` with the epoch's training metrics and the
  ``val_*`` values of the last run inside that epoch, if one ran (the progress
  bar, ``CSVLogger``, ``TensorBoard``, ``BackupAndRestore``);
* the ``History`` holds the training metrics once per epoch and the
  ``val_*`` values once per run, and ``history.history["val_step"]`` the
  training step (counted from the ``fit``'s start) after which each ran.

Executions end at runs: with ``steps_per_execution`` > 1 or ``"auto"``, an
execution never fuses steps past the next run (:meth:`ValidationSchedule.capped`).

Example:
    >>> import numpy as np, keras, custom_fit
    >>> model = custom_fit.CustomSequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> model.compile(optimizer="sgd", loss="mse")
    >>> x, y = np.ones((64, 2)), np.ones((64, 1))
    >>> history = model.fit(x, y, batch_size=4, epochs=2, validation_data=(x, y),
    ...                     validation_freq=custom_fit.Steps(10), verbose=0)
    >>> history.history["val_step"], len(history.history["loss"])
    ([10, 20, 30], 2)
"""

from __future__ import annotations

import contextlib
import dataclasses
import numbers
from collections.abc import Callable, Iterator
from typing import Any

import tensorflow as tf

from custom_fit._compat import keras
from custom_fit._trainer.progress import Progress, epoch_metrics

__all__ = ["Steps", "ValidationSchedule", "epoch_end", "keeping_training_metrics", "monitors", "run_end"]


@dataclasses.dataclass(frozen=True)
class Steps:
    """``fit(validation_freq=Steps(N))``: validate after every ``N`` training steps, counted across epochs.

    An ``int`` or a list as ``validation_freq`` keeps Keras' meaning (epochs).
    What each callback sees: :mod:`custom_fit._trainer.validation`'s module
    docstring, also in docs/training_controls.md.

    Args:
        every: The number of training steps between two validation runs (>= 1).

    Example:
        >>> import custom_fit
        >>> custom_fit.Steps(500)
        Steps(every=500)
    """

    every: int

    def __post_init__(self) -> None:
        if isinstance(self.every, bool) or not isinstance(self.every, numbers.Integral) or self.every < 1:
            raise ValueError(
                f"Steps(every) expects a whole number of training steps >= 1; received {self.every!r}. "
                "Fix: pass e.g. custom_fit.Steps(500) to validate after every 500 steps."
            )


class ValidationSchedule:
    """When a ``fit`` with ``validation_freq=Steps(N)`` validates: after each N-th step it trains.

    The loop asks :meth:`due` after each execution with the steps trained so
    far (counted from the ``fit``'s start; a resumed ``fit`` goes on with the
    count its backup saved), and gives its epoch iterator :meth:`capped`, so
    that no execution fuses steps past a run.

    Example:
        >>> schedule = ValidationSchedule(Steps(10))
        >>> [schedule.due(trained) for trained in (9, 10, 11)], schedule.run_index(20)
        ([False, True, False], 1)
        >>> progress = Progress()
        >>> progress.execution_ends(6)  # 6 steps trained
        >>> plan = schedule.capped(lambda remaining: 8, progress)
        >>> plan(None)  # 8 planned, 4 left until the run after step 10
        4
    """

    def __init__(self, steps: Steps) -> None:
        self.every = int(steps.every)

    @staticmethod
    def for_fit(validation_freq: Any, *, validates: bool) -> ValidationSchedule | None:
        """The schedule of a ``fit`` given ``validation_freq``; ``None`` where it counts epochs (Keras').

        Raises:
            ValueError: ``Steps`` without validation data (Keras ignores an
                epoch ``validation_freq`` then; a step schedule asks for
                validation data on purpose).
        """
        if not isinstance(validation_freq, Steps):
            return None
        if not validates:
            raise ValueError(
                f"fit(validation_freq={validation_freq!r}) validates every {validation_freq.every} training steps, "
                "but fit received no validation data (validation_data=None and no validation_split). "
                "Fix: pass validation_data=(x_val, y_val) or validation_split=0.2, or leave validation_freq out."
            )
        return ValidationSchedule(validation_freq)

    def due(self, trained: int) -> bool:
        """Whether a run is due now that ``trained`` steps are trained."""
        return trained > 0 and trained % self.every == 0

    def run_index(self, trained: int) -> int:
        """The number of the run after step ``trained`` (0 for the first): the epoch the monitors see."""
        return trained // self.every - 1

    def capped(self, plan: Callable[[int | None], int], progress: Progress) -> Callable[[int | None], int]:
        """``plan`` (asked for an execution's steps), at most the steps left until the run after ``progress``'s step.

        Also at most ``remaining``, the steps left in the epoch (``None``:
        unknown), which a fixed plan does not cut (Keras' step function stops
        at the epoch's end): the loop counts the steps trained from what
        the executions were planned to run.
        """

        def plan_to_next_run(remaining: int | None) -> int:
            steps = min(plan(remaining), self.every - progress.trained_steps % self.every)
            return steps if remaining is None else min(steps, remaining)

        return plan_to_next_run


@contextlib.contextmanager
def keeping_training_metrics(model: Any) -> Iterator[None]:
    """Puts the epoch's training metrics back after the block (a validation run inside the epoch).

    Keras' ``evaluate`` resets the model's metrics, which training and
    evaluation share (``compile(metrics=...)``, the ``loss`` tracker); at an
    epoch's end the epoch's logs are read before, but inside an epoch the
    training metrics go on accumulating after the run. Each replica's
    variable is read and put back (``experimental_local_results``), so the
    values are the same bits under a ``tf.distribute`` strategy too (a
    cross-replica ``assign`` of a summed variable divides the sum among the
    replicas).
    """
    strategy = model.distribute_strategy
    variables = [
        component
        for metric in epoch_metrics(model)
        for variable in metric.variables
        # Keras 3 wraps the TensorFlow variable (its public ``value``); tf_keras' is one.
        for component in strategy.experimental_local_results(
            variable if isinstance(variable, tf.Variable) else variable.value
        )
    ]
    values = [variable.read_value() for variable in variables]
    yield
    for variable, value in zip(variables, values, strict=True):
        variable.assign(value)


@contextlib.contextmanager
def _only(callbacks: Any, chosen: list[Any]) -> Iterator[None]:
    """Makes the ``CallbackList`` ``callbacks`` call ``chosen`` only, while the block runs.

    The list's own method then runs (its conversion of the logs, a user's
    ``CallbackList`` subclass), for a part of its callbacks: Keras' lists
    have no such option, so the ``callbacks`` attribute is swapped and put back.
    """
    every = callbacks.callbacks
    callbacks.callbacks = chosen
    try:
        yield
    finally:
        callbacks.callbacks = every


def monitors(callbacks: Any) -> list[Any]:
    """The callbacks of a ``CallbackList`` that monitor a value: those with a ``monitor`` attribute."""
    return [callback for callback in callbacks.callbacks if hasattr(callback, "monitor")]


def run_end(callbacks: Any, run: int, trained: int, logs: dict[str, Any], val_logs: dict[str, Any]) -> None:
    """A validation run after step ``trained`` ended: the ``History`` records it, the monitors see it.

    Each ``History`` of the list appends ``val_logs`` and ``trained``
    (``val_step``); then the callbacks that monitor get
    ``on_epoch_end(run, logs | val_logs)``.
    """
    for history in callbacks.callbacks:
        if isinstance(history, keras.callbacks.History):
            history.history.setdefault("val_step", []).append(trained)
            for name, value in val_logs.items():
                history.history.setdefault(name, []).append(value)
    with _only(callbacks, monitors(callbacks)):
        callbacks.on_epoch_end(run, {**logs, **val_logs})


def epoch_end(callbacks: Any, epoch: int, logs: dict[str, Any], val_logs: dict[str, Any] | None) -> dict[str, Any]:
    """An epoch of the data ended: ``on_epoch_end`` for every callback that does not monitor.

    ``History`` gets the training ``logs`` (it holds each run's values
    already); the others ``logs`` with ``val_logs``, the last run of the
    epoch (``None``: no run in this epoch).

    Returns:
        The logs the others got (``on_train_end``'s, as Keras passes the last epoch's).
    """
    watching = monitors(callbacks)
    with_runs = {**logs, **(val_logs or {})}
    for callback in list(callbacks.callbacks):  # in the list's order, as Keras calls them
        if callback in watching:
            continue
        with _only(callbacks, [callback]):
            callbacks.on_epoch_end(epoch, logs if isinstance(callback, keras.callbacks.History) else with_runs)
    return with_runs
