"""Where ``fit`` reads its data: the position a backup records, and the one owner of the replay and the skip.

:class:`Position` is a point where ``fit`` can stop and resume;
:class:`EpochPosition` is where the running ``fit`` reads (which iterator,
how many of its batches before step 0), kept by its
:class:`~custom_fit._trainer.progress.Progress`; :class:`DataCursor` is what an
epoch iterator reads through.

Each Keras' epoch iterator (:class:`custom_fit._compat.keras3_only.EpochIterator`,
:class:`custom_fit._compat.keras2_loop.EpochIterator`) decides where that
Keras makes its data iterators and when the data ran out; what a resumed
``fit`` needs from them is the same on both and is kept here:

* which data iterator is current and how many of its batches were read;
* in a resumed run, making the interrupted run's iterators again (each new
  iterator of a ``tf.data`` pipeline with a seeded ``shuffle`` draws the next
  order) and skipping the batches it had trained;
* the epoch's executions: the steps of each, asked of the plan (told no
  number left where the data may end before the epoch's steps do: it then
  runs one step per execution), and where the epoch ends (its steps done,
  or the data ran dry);
* what :class:`EpochPosition` records, so that a backup says where to resume.

It is bookkeeping over an iterator factory, with no TensorFlow in it, so a
resume's replay and skip are tested with plain Python iterators
(``tests/trainer/test_data_position.py``).

Nothing in this module is public API.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

from custom_fit._random_state import RandomState

__all__ = ["DataCursor", "EpochPosition", "Position"]


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


class DataCursor:
    """The current data iterator of an epoch iterator, the batches read from it, and the position it reports.

    Args:
        make_iterator: Makes a new data iterator (the Keras' dataset's ``iter``).
        position: The running ``fit``'s data position, else ``None``
            (``evaluate``, ``predict``).
        replays_iterators: Whether a resumed run makes the interrupted run's
            earlier iterators again (``tf.data``: each draws its own order),
            or reads on in one (a ``PyDataset`` or a generator reads a Python
            object: making and dropping iterators would only race with it).
        may_run_dry: Whether the data may end before the epoch's steps do
            (its length is not known in advance): the plan is then told no
            number of steps left.

    Example:
        >>> position = EpochPosition()
        >>> cursor = DataCursor(lambda: iter(range(10)), position, replays_iterators=True, may_run_dry=False)
        >>> position.resume = Position(epoch=0, step=3, iterator=1, skip=3)
        >>> cursor.start_epoch(cursor.take_resume())  # the 2nd iterator made, 3 batches skipped: step 3
        3
        >>> position.iterators_made, next(cursor.iterator)
        (2, 3)
    """

    def __init__(
        self,
        make_iterator: Callable[[], Iterator[Any]],
        position: EpochPosition | None,
        *,
        replays_iterators: bool,
        may_run_dry: bool,
    ):
        self._make = make_iterator
        self.position = position
        self.replays_iterators = replays_iterators
        self.may_run_dry = may_run_dry
        #: The data iterator the epoch reads (``None``: none made, or dropped).
        self.iterator: Any = None
        #: How many batches were read from :attr:`iterator`.
        self.read = 0

    def new_iterator(self) -> Any:
        """Makes a new data iterator, the current one (and tells the position)."""
        if self.position is not None:
            self.position.iterator_made()
        self.iterator = self._make()
        self.read = 0
        return self.iterator

    def drop_iterator(self) -> None:
        """Drops the current iterator (the next epoch makes one)."""
        self.iterator = None
        self.read = 0

    def take_resume(self) -> Position | None:
        """Where the first epoch of a resumed ``fit`` starts, once; else ``None``."""
        return self.position.take_resume() if self.position is not None else None

    def replay_before(self, resume: Position) -> None:
        """Makes and drops the iterators the interrupted run had made before the one ``resume`` names.

        Only where :attr:`replays_iterators`; :meth:`start_epoch` makes that one
        and would make these too: Keras 3 makes them before its data's epoch
        hooks run, as the interrupted run had.
        """
        while self.replays_iterators and self._iterators_made() < resume.iterator:
            self.new_iterator()

    def start_epoch(self, resume: Position | None, first_step: int = 0) -> int:
        """The epoch's first step, its iterator ready: where ``resume`` says, else ``first_step``.

        In a resumed epoch the iterator that ``resume`` names is made current
        (the earlier ones are made and dropped where :attr:`replays_iterators`;
        otherwise one is made if none is current) and the batches read before
        its step are skipped. The position learns how many batches of the
        iterator come before step 0.
        """
        step = first_step
        if resume is not None:
            self.replay_before(resume)
            if self.replays_iterators and self._iterators_made() == resume.iterator:
                self.new_iterator()  # the one resume names
            if self.iterator is None:
                self.new_iterator()
            for _ in range(resume.skip - self.read):  # batches the interrupted run had read
                next(self.iterator)
            self.read = max(self.read, resume.skip)
            step = resume.step
        if self.position is not None:
            self.position.reading(batches_before_step_0=self.read - step)
        return step

    def executions(
        self,
        step: int,
        epoch_steps: Callable[[], int | None],
        plan: Callable[[int | None], int],
        *,
        ran_dry: Callable[[], bool],
        shortens_last: bool,
    ) -> Iterator[tuple[int, int]]:
        """The epoch's executions from ``step`` on, as ``(first step, steps)``; each reads its batches.

        Args:
            step: The epoch's first step (:meth:`start_epoch`).
            epoch_steps: The epoch's number of steps, asked before each
                execution (``None``: unknown; tf_keras learns it when the
                first epoch of such data runs dry).
            plan: The next execution's number of steps, given the steps left
                (told ``None`` where :attr:`may_run_dry`).
            ran_dry: Asked before each execution: whether the data ran out
                (the epoch then ends).
            shortens_last: Whether an execution is cut to the steps left
                (tf_keras); Keras 3 numbers the last one as if whole.

        Example:
            >>> cursor = DataCursor(lambda: iter(range(8)), None, replays_iterators=True, may_run_dry=False)
            >>> cursor.new_iterator() is not None
            True
            >>> list(cursor.executions(0, lambda: 8, lambda left: 3, ran_dry=lambda: False, shortens_last=True))
            [(0, 3), (3, 3), (6, 2)]
        """
        while (steps := epoch_steps()) is None or step < steps:
            if ran_dry():
                return
            left = None if steps is None else steps - step
            count = plan(None if self.may_run_dry else left)
            if shortens_last and left is not None:
                count = min(count, left)
            self.read += count
            yield step, count
            step += count

    def end_epoch(self, *, next_reads_on: bool) -> None:
        """The epoch's steps are done; ``next_reads_on``: the next epoch reads on from the current iterator."""
        if self.position is not None:
            self.position.epoch_ends(next_skip=self.read if next_reads_on else None)

    def _iterators_made(self) -> int:
        assert self.position is not None  # a resume comes only through a position
        return self.position.iterators_made
