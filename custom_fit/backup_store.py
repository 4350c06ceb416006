"""A directory of backups that a kill at any instant leaves loadable: write aside, then rename.

Keras' ``BackupAndRestore`` overwrites ``latest.weights.h5`` and
``training_metadata.json`` in place; a process killed while writing them
leaves files that no restart can read. :class:`BackupStore` never writes
over a backup: each one is written into a temporary directory, flushed to
disk (``fsync``), then renamed to ``backup-<number>``. A rename within a
directory is atomic on POSIX file systems, so ``backup-*`` directories are
always complete; a half-written temporary directory is ignored and removed
by the next write. The previous backup is kept until the next one is
complete, and :meth:`BackupStore.load_latest` falls back to it when the
newest cannot be read.

Written here rather than taken from a library because none of the ones
Keras or TensorFlow ship does this for Keras' weight files:
``tf.train.CheckpointManager`` writes its ``checkpoint`` index in place.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

__all__ = ["BackupStore"]

T = TypeVar("T")

_BACKUP = re.compile(r"^backup-(\d+)$")
_TEMPORARY_PREFIX = ".writing-"


class BackupStore:
    """Numbered, complete backups in ``directory``: the newest, and optionally the one before.

    Args:
        directory: Where the backups go (created when the first one is written).

    Example:
        >>> import tempfile, pathlib
        >>> store = BackupStore(tempfile.mkdtemp())
        >>> _ = store.write(lambda d: (d / "state.txt").write_text("epoch 3"))
        >>> store.load_latest(lambda d: (d / "state.txt").read_text())
        'epoch 3'
    """

    def __init__(self, directory: str | os.PathLike[str]):
        self.directory = Path(directory)

    def backups(self) -> list[Path]:
        """The complete backups, newest first."""
        if not self.directory.is_dir():
            return []
        numbered = [(int(m.group(1)), p) for p in self.directory.iterdir() if (m := _BACKUP.match(p.name))]
        return [path for _, path in sorted(numbered, reverse=True)]

    def write(self, fill: Callable[[Path], object], keep_previous: bool = True) -> Path:
        """Makes a new backup: ``fill(directory)`` writes its files, then it replaces the previous one.

        Args:
            fill: Writes the backup's files into the directory it is given.
            keep_previous: Keep the previous backup as a fallback for
                :meth:`load_latest` (else it is deleted once this one is complete).

        Returns:
            The new backup's directory.
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        existing = self.backups()
        number = int(_BACKUP.match(existing[0].name).group(1)) + 1 if existing else 0  # type: ignore[union-attr]
        self._remove_temporary()
        temporary = self.directory / f"{_TEMPORARY_PREFIX}{number}"
        temporary.mkdir()
        fill(temporary)
        for file in temporary.iterdir():
            _fsync(file)
        _fsync(temporary)
        final = self.directory / f"backup-{number}"
        os.rename(temporary, final)
        _fsync(self.directory)  # the rename itself reaches the disk
        for old in existing[1:] if keep_previous else existing:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def load_latest(self, load: Callable[[Path], T]) -> T | None:
        """``load(directory)`` of the newest backup it can read; ``None`` if there is none.

        A backup that ``load`` fails on (an ``OSError`` or a ``ValueError``: an
        unreadable or damaged file) is skipped for the one before it.

        Raises:
            OSError: No backup could be read (the newest one's error).
        """
        first_error: Exception | None = None
        for backup in self.backups():
            try:
                return load(backup)
            except (OSError, ValueError) as error:
                first_error = first_error or error
        if first_error is not None:
            raise OSError(f"No backup in {self.directory} could be read: {first_error}") from first_error
        return None

    def clear(self) -> None:
        """Removes every backup and temporary directory, and ``directory`` if nothing else is in it."""
        self._remove_temporary()
        for backup in self.backups():
            shutil.rmtree(backup, ignore_errors=True)
        if self.directory.is_dir() and not any(self.directory.iterdir()):
            self.directory.rmdir()

    def _remove_temporary(self) -> None:
        if self.directory.is_dir():
            for path in self.directory.glob(f"{_TEMPORARY_PREFIX}*"):
                shutil.rmtree(path, ignore_errors=True)


def _fsync(path: Path) -> None:
    """Flushes a file, or a directory's entries, to disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
