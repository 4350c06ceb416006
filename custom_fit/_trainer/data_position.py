"""Where ``fit`` reads its data: the position a backup records.

:class:`Position` is a point where ``fit`` can stop and resume;
:class:`EpochPosition` is where the running ``fit`` reads (which iterator,
how many of its batches before step 0), kept by its
:class:`~custom_fit._trainer.progress.Progress`.

Nothing in this module is public API.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from custom_fit._random_state import RandomState

__all__ = ["EpochPosition", "Position"]


class EpochPosition:
    """Where ``fit`` reads its data: which iterator, and how many of its batches came before step 0.

    Each ``CustomModel.fit`` call's :class:`~custom_fit._trainer.progress.Progress` has one; the epoch iterator
    (``_compat.loop.EpochIterator``, on both Kerases) reports to it and, in a
    resumed run, asks it where to start (:attr:`resume`).
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
        self.resume: Position | None = None
        #: The random state before each epoch's ``on_epoch_begin`` and ``on_epoch_end``
        #: of the data, kept when :attr:`records_hooks` (set by the epoch iterator).
        self.hook_states: list[tuple[RandomState, RandomState]] = []
        self.records_hooks = False
        self.adapter: Any = None  # Keras' data adapter (set by the epoch iterator)
        #: The data adapter's count of ended epochs when the current epoch began (Keras >= 3.16).
        self.data_epoch: int | None = None
        self.element_spec: Any = None  # the structure, shapes and dtypes of a batch
        #: The data adapter's count of ended epochs now (set by the epoch iterator; Keras >= 3.16).
        self.read_data_epoch: Callable[[], int | None] = lambda: None
        self._batches_before_step_0 = 0
        self._next_epoch: tuple[int, int] | None = None
        self._hook_begin: RandomState | None = None

    # Called by the epoch iterator --------------------------------------------------

    def take_resume(self) -> Position | None:
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


@dataclasses.dataclass(frozen=True)
class Position:
    """A point of a ``fit`` where it can stop and resume.

    Attributes:
        epoch: The epoch to resume in.
        step: The first step of ``epoch`` not trained yet (0: the epoch's start).
        iterator: Which data iterator, counted from ``fit``'s start, that step reads from.
        skip: How many of that iterator's batches were read before that step.
        data_epoch: The data adapter's count of ended epochs when ``epoch``
            began, where its shuffle depends on it (Keras >= 3.16); else ``None``.
        trained_steps: The steps trained before that step, counted from the
            first ``fit``'s start across epochs (``validation_freq=Steps(N)``
            counts its runs on it); ``None`` in a backup older than the count.
        validation_logs: The ``val_*`` values of the last validation run
            inside ``epoch`` before that step (``Steps(N)``), else ``None``.
    """

    epoch: int
    step: int
    iterator: int = 0
    skip: int = 0
    data_epoch: int | None = None
    trained_steps: int | None = None
    validation_logs: dict[str, Any] | None = None
