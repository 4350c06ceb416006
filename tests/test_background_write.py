"""custom_fit._background_write: one write at a time, in a thread; its error raised where the caller waits."""

from __future__ import annotations

import functools
import threading

import pytest

from custom_fit._background_write import BackgroundWriter


def test_a_write_runs_in_another_thread_and_submit_returns_before_it_ends() -> None:
    release, seen = threading.Event(), []

    def write() -> None:
        release.wait(10)
        seen.append(threading.current_thread() is not threading.main_thread())

    writer = BackgroundWriter()
    writer.submit(write, "backup-0")
    assert seen == []  # submit returned while the write waits
    release.set()
    writer.wait()
    assert seen == [True]


def test_the_next_submit_waits_for_the_write_before_never_two_in_flight() -> None:
    running, order = threading.Semaphore(1), []

    def write(name: str) -> None:
        assert running.acquire(blocking=False), "two writes in flight"
        order.append(name)
        threading.Event().wait(0.05)
        running.release()

    writer = BackgroundWriter()
    for name in ("backup-0", "backup-1", "backup-2"):
        writer.submit(functools.partial(write, name), name)
    writer.wait()
    assert order == ["backup-0", "backup-1", "backup-2"]


@pytest.mark.parametrize("where", ["the next submit", "wait"])
def test_a_failed_write_raises_its_own_error_where_the_caller_waits_with_a_note(where: str) -> None:
    def fails() -> None:
        raise OSError(28, "No space left on device")

    writer = BackgroundWriter()
    writer.submit(fails, "the backup of epoch 2, step 10")
    with pytest.raises(OSError, match="No space left on device") as caught:
        writer.submit(lambda: None, "the next") if where == "the next submit" else writer.wait()
    (note,) = caught.value.__notes__
    assert note.startswith(
        "custom_fit.BackupAndRestore: raised while the backup of epoch 2, step 10 was written in the background"
    )
    assert "pass write_in_background=False to BackupAndRestore" in note
    writer.wait()  # raised once: nothing in flight now


def test_in_background_false_writes_before_submit_returns_and_raises_there() -> None:
    writer, seen = BackgroundWriter(in_background=False), []
    writer.submit(lambda: seen.append(threading.current_thread() is threading.main_thread()), "backup-0")
    assert seen == [True]
    with pytest.raises(ValueError, match="bad"):
        writer.submit(lambda: (_ for _ in ()).throw(ValueError("bad")), "backup-1")
