"""custom_fit._trainer.data_position: the replay, the skip and the position, with plain Python iterators.

No TensorFlow here. That a resumed ``fit`` then reads the batches of an uninterrupted one is tested on the
real loop in ``tests/test_backup_and_restore.py`` (kill harness included).
"""

from __future__ import annotations

import pytest

from custom_fit._trainer.data_position import EpochPosition


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
