"""custom_fit._trainer.data_position: the replay, the skip and the position, with plain Python iterators.

What the epoch iterators of both Kerases read through (``DataCursor``): no TensorFlow here. That a resumed
``fit`` then reads the batches of an uninterrupted one is tested on the real loop in
``tests/test_backup_and_restore.py`` (kill harness included).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from custom_fit._trainer.data_position import DataCursor, EpochPosition, Position


class Data:
    """Iterators that yield ``(iterator number, batch number)``: which iterator, which batch."""

    def __init__(self) -> None:
        self.made = 0

    def __call__(self) -> Iterator[tuple[int, int]]:
        number, self.made = self.made, self.made + 1
        return ((number, batch) for batch in itertools.count())


def cursor_for(data: Data, position: EpochPosition | None, *, replays: bool = True, dry: bool = False) -> DataCursor:
    return DataCursor(data, position, replays_iterators=replays, may_run_dry=dry)


def test_an_epoch_records_where_each_step_reads() -> None:
    position = EpochPosition()
    cursor = cursor_for(Data(), position)
    cursor.new_iterator()
    position.epoch_begins()
    assert cursor.start_epoch(None) == 0
    assert list(cursor.executions(0, lambda: 3, lambda left: 3, ran_dry=lambda: False, shortens_last=False)) == [(0, 3)]
    assert position.at_step(3) == (0, 3)
    cursor.end_epoch(next_reads_on=True)
    assert position.at_next_epoch() == (0, 3)  # steps_per_epoch: the next epoch reads on


@pytest.mark.parametrize(("next_skip", "next_epoch"), [(None, (2, 0)), (7, (1, 7))])
def test_the_next_epoch_starts_a_new_iterator_or_reads_on_in_the_current_one(next_skip, next_epoch) -> None:
    position = EpochPosition()
    position.iterator_made()
    position.iterator_made()  # the epoch reads the second iterator
    position.epoch_begins()
    position.reading(batches_before_step_0=2)
    assert position.at_step(3) == (1, 5)
    position.epoch_ends(next_skip=next_skip)
    assert position.at_next_epoch() == next_epoch


def test_a_resume_makes_the_interrupted_runs_iterators_again_and_skips_the_trained_batches() -> None:
    data, position = Data(), EpochPosition()
    position.resume = Position(epoch=2, step=4, iterator=2, skip=4)
    cursor = cursor_for(data, position)
    step = cursor.start_epoch(cursor.take_resume())
    assert step == 4 and data.made == 3 and position.iterator == 2
    assert next(cursor.iterator) == (2, 4)  # the 3rd iterator's 5th batch
    assert position.at_step(step) == (2, 4)


def test_keras_3_replays_the_earlier_iterators_before_the_data_hooks_then_makes_the_resumed_one() -> None:
    data, position = Data(), EpochPosition()
    resume = Position(epoch=1, step=2, iterator=1, skip=2)
    cursor = cursor_for(data, position)
    cursor.replay_before(resume)
    assert data.made == 1  # the interrupted run's first iterator, made and dropped
    assert cursor.start_epoch(resume) == 2 and data.made == 2
    assert next(cursor.iterator) == (1, 2)


def test_keras_2_skips_what_its_current_iterator_has_not_read_yet() -> None:
    """tf_keras makes an iterator before the first epoch; a resume reads on in it up to the skip."""
    data, position = Data(), EpochPosition()
    cursor = cursor_for(data, position)
    cursor.new_iterator()
    step = cursor.start_epoch(Position(epoch=3, step=1, iterator=0, skip=7), first_step=0)
    assert step == 1 and data.made == 1 and cursor.read == 7
    assert next(cursor.iterator) == (0, 7)
    assert position.at_step(1) == (0, 7)  # arrays: one iterator over all epochs, 6 batches before step 0


def test_data_that_reads_a_python_object_is_not_replayed() -> None:
    """A PyDataset or generator: one iterator, skipped up to the batch (making and dropping would race)."""
    data, position = Data(), EpochPosition()
    cursor = cursor_for(data, position, replays=False)
    resume = Position(epoch=4, step=3, iterator=5, skip=3)
    cursor.replay_before(resume)
    assert cursor.start_epoch(resume) == 3 and data.made == 1
    assert next(cursor.iterator) == (0, 3)


def run(cursor: DataCursor, plan, epoch_steps=lambda: 8, ran_dry=lambda: False, shortens_last=False):
    return list(cursor.executions(0, epoch_steps, plan, ran_dry=ran_dry, shortens_last=shortens_last))


@pytest.mark.parametrize(("dry", "asked"), [(False, [8, 5, 2]), (True, [None, None, None])])
def test_the_plan_is_told_no_steps_left_where_the_data_may_run_dry(dry: bool, asked: list[int | None]) -> None:
    seen: list[int | None] = []
    cursor = cursor_for(Data(), None, dry=dry)

    def plan(steps_left: int | None) -> int:
        seen.append(steps_left)
        return 3

    assert run(cursor, plan) == [(0, 3), (3, 3), (6, 3)]
    assert seen == asked and cursor.read == 9


@pytest.mark.parametrize(
    ("shortens_last", "executions", "read"), [(True, [(0, 3), (3, 3), (6, 2)], 8), (False, [(0, 3), (3, 3), (6, 3)], 9)]
)
def test_the_last_execution_is_cut_to_the_steps_left_only_where_keras_does(shortens_last, executions, read) -> None:
    """tf_keras cuts the last execution of an 8-step epoch at 3 per execution to 2; Keras 3 numbers it as 3."""
    cursor = cursor_for(Data(), None)
    assert run(cursor, lambda left: 3, shortens_last=shortens_last) == executions
    assert cursor.read == read


def test_the_epoch_ends_before_an_execution_when_the_data_ran_dry() -> None:
    cursor = cursor_for(Data(), None)
    assert run(cursor, lambda left: 2, ran_dry=lambda: cursor.read >= 5) == [(0, 2), (2, 2), (4, 2)]


def test_the_epochs_length_is_asked_before_each_execution() -> None:
    """Unknown (``None``) until the data runs dry: tf_keras then takes the steps counted so far."""
    cursor = cursor_for(Data(), None, dry=True)
    length: list[int | None] = [None]
    executions = cursor.executions(0, lambda: length[0], lambda left: 1, ran_dry=lambda: False, shortens_last=True)
    assert [next(executions), next(executions)] == [(0, 1), (1, 1)]
    length[0] = 2  # the second execution found the data exhausted
    assert list(executions) == []


def test_without_a_position_the_cursor_only_counts() -> None:
    cursor = cursor_for(Data(), None)
    cursor.new_iterator()
    assert cursor.take_resume() is None and cursor.start_epoch(None, first_step=0) == 0
    assert run(cursor, lambda left: 4, epoch_steps=lambda: 4) == [(0, 4)]
    cursor.end_epoch(next_reads_on=False)
    assert cursor.read == 4
    cursor.drop_iterator()
    assert cursor.iterator is None and cursor.read == 0
