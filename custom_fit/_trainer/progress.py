"""Where a running ``fit`` is: the state a resumed ``fit`` loads to go on where the interrupted one stopped.

Each ``fit`` owns one :class:`Progress` (on its
:class:`~custom_fit._state.LoopCall`), which the loop moves along (epoch and
step) and hands to the callbacks that take it (``set_progress``, as Keras
hands the model with ``set_model``). :class:`custom_fit.BackupAndRestore`
writes its :meth:`~Progress.state_dict` into each backup and loads a backup's
with :meth:`~Progress.load_state_dict` before the first epoch; the loop then
starts there. Its :class:`~custom_fit._trainer.data_position.EpochPosition`
also says where the data is: the epoch iterator of the Keras in use
(``_compat.loop.EpochIterator``: Keras 3's subclass, or custom_fit's over
tf_keras' data handler) reads through a
:class:`~custom_fit._trainer.data_position.DataCursor`, which reports to it
which data iterator each batch comes from and starts a resumed epoch after
the batches already trained. Neither knows the model or the loop, so both may
hold them.

Nothing in this module is public API.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from custom_fit import _compat
from custom_fit._trainer.data_position import EpochPosition, Position

__all__ = ["Progress", "epoch_metrics"]


class Progress:
    """What a running ``fit`` has trained and where it reads its data: the state a resumed ``fit`` loads.

    The loop owns one per ``fit`` call and tells it, in its order, when an
    epoch begins (:meth:`epoch_begins`, before ``on_epoch_begin``), when a step
    begins (:meth:`step_begins`, before ``on_train_batch_begin``), when an
    execution ended (:meth:`execution_ends`, after ``on_train_batch_end``), when
    a validation run inside the epoch ended (:meth:`validated`) and when the
    epoch's steps are done (:meth:`epoch_ends`, before validation and
    ``on_epoch_end``). :meth:`state_dict` is then the point a ``fit`` stopped
    now would resume at; a resumed ``fit`` is given it with
    :meth:`load_state_dict` before its first epoch (``on_train_begin``) and
    starts there (:meth:`first_epoch`). The data's part of it is
    :attr:`data`, where ``fit`` reads its batches.

    Example:
        >>> progress = Progress()
        >>> progress.epoch_begins(0); progress.step_begins(3); progress.state_dict()["step"]
        3
        >>> progress.execution_ends(5); progress.epoch_ends()
        >>> progress.state_dict()["epoch"], progress.state_dict()["step"], progress.trained_steps
        (1, 0, 5)
        >>> resumed = Progress(); resumed.load_state_dict(progress.state_dict())
        >>> resumed.first_epoch(initial_epoch=0)
        1
    """

    def __init__(self) -> None:
        #: Where ``fit`` reads its data (the epoch iterator reports to it).
        self.data = EpochPosition()
        #: Whether the ``fit`` that owns it still runs (``False`` once it returned or raised).
        self.running = True
        self.epoch = 0
        self.step = 0
        #: The ``val_*`` values of the last validation run in this epoch (``Steps(N)``), else ``None``.
        self.validation_logs: dict[str, Any] | None = None
        self._epoch_done = False
        self._trained_before_epoch = 0
        self._trained_in_epoch = 0
        self._loaded: Position | None = None
        self._resuming = False  # loaded, and the first epoch has not begun
        self._at_end: list[Callable[[], None]] = []

    def when_fit_ends(self, function: Callable[[], None]) -> None:
        """Calls ``function`` when the ``fit`` that owns this progress returns or raises (after ``on_train_end``).

        Callbacks have no hook that runs when ``fit`` raises; a callback with
        work in flight (a backup written in the background) finishes it here.
        """
        self._at_end.append(function)

    # Told by the loop ----------------------------------------------------------------

    def fit_ends(self) -> None:
        """The ``fit`` that owns it returned or raised: no longer :attr:`running`; the :meth:`when_fit_ends` calls."""
        self.running = False
        functions, self._at_end = self._at_end, []
        for function in functions:
            function()

    def epoch_begins(self, epoch: int) -> None:
        """Epoch ``epoch`` begins (before ``on_epoch_begin``)."""
        loaded, self._resuming = (self._loaded if self._resuming else None), False
        self.epoch, self.step, self._epoch_done = epoch, 0, False
        # A resumed epoch keeps the last validation run's values from before the loaded step.
        self.validation_logs = loaded.validation_logs if loaded is not None and loaded.epoch == epoch else None

    def step_begins(self, step: int) -> None:
        """The execution that trains ``step`` (counted in the epoch) begins (before ``on_train_batch_begin``)."""
        self.step = self._trained_in_epoch = step

    def execution_ends(self, next_step: int) -> None:
        """An execution ended; ``next_step`` is the epoch's first step not trained (after ``on_train_batch_end``)."""
        self._trained_in_epoch = next_step

    def validated(self, val_logs: dict[str, Any]) -> None:
        """A validation run inside the epoch ended with ``val_logs`` (``Steps(N)``; before the monitors see it)."""
        self.validation_logs = dict(val_logs)

    def epoch_ends(self) -> None:
        """The epoch's steps are done (before its validation and ``on_epoch_end``)."""
        self._epoch_done = True
        self._trained_before_epoch += self._trained_in_epoch
        self._trained_in_epoch = 0

    @property
    def trained_steps(self) -> int:
        """The steps trained since the first ``fit`` of this training began (a resumed one continues the count)."""
        return self._trained_before_epoch + self._trained_in_epoch

    @property
    def loaded(self) -> bool:
        """Whether a :meth:`state_dict` was loaded (the ``fit`` resumes an interrupted one)."""
        return self._loaded is not None

    def first_epoch(self, initial_epoch: int) -> int:
        """The epoch ``fit`` starts with: the loaded one, else ``fit``'s ``initial_epoch``."""
        return self._loaded.epoch if self._loaded is not None else initial_epoch

    def forget_data(self) -> None:
        """Drops what holds the data (``fit`` ended: nothing keeps it past ``fit``, as in Keras)."""
        self.data.adapter = None
        self.data.read_data_epoch = lambda: None

    # Read and loaded by BackupAndRestore ---------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The point a ``fit`` stopped now would resume at (see :class:`Position`), as plain values."""
        data = self.data
        if self._epoch_done:
            iterator, skip = data.at_next_epoch()
            point = Position(
                self.epoch + 1, 0, iterator, skip, data.read_data_epoch(), trained_steps=self.trained_steps
            )
        else:
            iterator, skip = data.at_step(self.step)
            point = Position(
                self.epoch, self.step, iterator, skip, data.data_epoch,
                trained_steps=self._trained_before_epoch + self.step, validation_logs=self.validation_logs,
            )  # fmt: skip
        return dataclasses.asdict(point)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Makes ``fit`` start at ``state`` (a :meth:`state_dict`); before its first epoch."""
        self._loaded = loaded = Position(**state)
        # A backup older than the count: counted from the loaded step (only Steps(N) reads it).
        trained = loaded.trained_steps if loaded.trained_steps is not None else loaded.step
        self._trained_before_epoch, self._trained_in_epoch = trained - loaded.step, loaded.step
        self._resuming = True
        self.data.resume = self._loaded


def hand_to_callbacks(progress: Progress, callbacks: Any) -> None:
    """Gives ``progress`` to each callback that takes one: ``callback.set_progress(progress)``.

    As Keras gives each callback the model (``set_model``), the loop gives
    its ``fit``'s progress to the callbacks that ask for it
    (:class:`custom_fit.BackupAndRestore`), before ``on_train_begin``.
    ``callbacks`` is a ``CallbackList``, a list of callbacks, one, or ``None``.
    """
    items = getattr(callbacks, "callbacks", callbacks)
    for callback in items if isinstance(items, (list, tuple)) else [items]:
        set_progress = getattr(callback, "set_progress", None)
        if callable(set_progress):
            set_progress(progress)


def epoch_metrics(model: Any) -> list[Any]:
    """The metrics ``fit`` accumulates over an epoch: ``model.metrics`` and the ``loss`` tracker.

    (``CustomModel.metrics`` lists the ``loss`` tracker of a model compiled
    without a loss only once a step has reported a loss, which a resumed run
    has not done yet when it restores them.)
    """
    tracker = _compat.version.loss_tracker(model)
    return ([tracker] if tracker is not None else []) + [m for m in model.metrics if m is not tracker]
