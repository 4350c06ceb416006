"""One write at a time, in a background thread: the caller waits only for the previous one.

:class:`custom_fit.BackupAndRestore` copies a backup's state off the device
on the training thread and hands the writing of its files (serializing,
checksums, ``fsync``, the rename into place) to a :class:`BackgroundWriter`,
so training goes on while they are written. The writer runs one write at a
time: :meth:`BackgroundWriter.submit` first waits for the one before (never two
in flight, so backups are numbered and kept in the order they were taken),
and :meth:`BackgroundWriter.wait` waits for the last one (``on_train_end``,
a preemption's exit).

A write that fails is not lost from sight: its error is raised by the next
:meth:`~BackgroundWriter.submit` or :meth:`~BackgroundWriter.wait` (so at the
next backup at the latest, or when ``fit`` ends), with a note naming the
backup. The thread is ``concurrent.futures``' (a one-worker
``ThreadPoolExecutor``), which Python joins before the interpreter exits: a
``fit`` that raises still has its last backup written. Only a ``SIGKILL``
stops a write, which leaves a temporary directory that no reader takes for a
backup (:mod:`custom_fit._backup_store`).
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable

__all__ = ["BackgroundWriter"]


class BackgroundWriter:
    """Runs ``write`` functions one at a time, in a thread of its own or (``in_background=False``) at once.

    Args:
        in_background: Whether :meth:`submit` returns before ``write`` has run.

    Example:
        >>> writer = BackgroundWriter()
        >>> written = []
        >>> writer.submit(lambda: written.append("backup-0"), "backup-0")
        >>> writer.wait()
        >>> written
        ['backup-0']
    """

    def __init__(self, in_background: bool = True):
        self.in_background = in_background
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._pending: tuple[concurrent.futures.Future[None], str] | None = None

    def submit(self, write: Callable[[], None], what: str) -> None:
        """Waits for the write before, then starts ``write`` (``what`` names it in an error's note).

        Raises:
            Exception: What the write before raised (see :meth:`wait`); with
                ``in_background=False``, what ``write`` raises.
        """
        self.wait()
        if not self.in_background:
            write()
            return
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="custom_fit-backup")
        self._pending = (self._executor.submit(write), what)

    def wait(self) -> None:
        """Waits for the last write submitted, if one is in flight.

        Raises:
            Exception: What that write raised, as it raised it, with a note
                that names the write (an ``OSError`` of a full disk stays an
                ``OSError``).
        """
        pending, self._pending = self._pending, None
        if pending is None:
            return
        future, what = pending
        error = future.exception()
        if error is not None:
            error.add_note(
                f"custom_fit.BackupAndRestore: raised while {what} was written in the background (training went "
                "on meanwhile; the backups before it are intact). Fix the cause (free disk space, permissions) and "
                "run again to resume from the newest intact backup, or pass write_in_background=False to "
                "BackupAndRestore to write each backup before training goes on."
            )
            raise error
