"""Where ``fit`` is in its data: what a resumed ``fit`` needs to read the batches the interrupted one would have.

:class:`EpochPosition` is kept by each running ``fit`` (Keras 3: on its
:class:`~custom_fit._state.LoopCall`); the epoch iterator
(:class:`custom_fit._compat.keras3_only.EpochIterator`) reports to it, and
:class:`custom_fit.BackupAndRestore` reads it when it writes a backup and
hands it a :class:`ResumePoint` when it loads one. It knows nothing of the
model or the loop, so both may hold it.

Nothing in this module is public API.
"""

from __future__ import annotations

from typing import Any, Protocol

from custom_fit._random_state import RandomState

__all__ = ["EpochPosition", "ResumePoint"]


class ResumePoint(Protocol):
    """Where a resumed ``fit`` starts (a :class:`custom_fit._backup_and_restore.Backup` is one)."""

    step: int  # the first step of the epoch not trained yet
    iterator: int  # which data iterator, counted from fit's start, that step reads from
    skip: int  # how many of its batches were read before that step
    data_epoch: int | None  # the data adapter's count of ended epochs (Keras >= 3.16)


class EpochPosition:
    """Where ``fit`` reads its data: which iterator, and how many of its batches came before step 0.

    ``CustomModel.fit`` (Keras 3) makes one per call (:class:`~custom_fit._state.LoopCall`); its epoch iterator
    (:class:`custom_fit._compat.keras3_only.EpochIterator`) reports to
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
