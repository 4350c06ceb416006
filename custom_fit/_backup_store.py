"""A directory of backups that a kill at any instant leaves loadable: write aside, rename in, rename out.

Keras' ``BackupAndRestore`` overwrites ``latest.weights.h5`` and
``training_metadata.json`` in place; a process killed while writing them
leaves files that no restart can read. :class:`BackupStore` never changes a
backup in place:

* **writing**: each backup is written into a temporary directory with a
  manifest of its files (names and sizes), flushed to disk (``fsync``), then
  renamed to ``backup-<number>``. A rename within a directory is atomic on
  POSIX file systems, so a ``backup-*`` directory is complete or absent; a
  half-written temporary directory is ignored and removed by the next write.
* **removing**: a backup is first renamed out of the ``backup-*`` names, then
  its files are deleted; a kill during the deletion leaves a directory that
  no longer counts as a backup, removed by the next write or clear.
  :meth:`BackupStore.clear` removes the newest backup last, so until that
  rename a restart resumes from it, and afterwards it starts afresh.
* **reading**: :meth:`BackupStore.load_latest` loads the newest complete
  backup. A ``backup-*`` directory whose files do not match its manifest (or
  that an older custom_fit left half-deleted) is skipped with an
  :class:`IncompleteBackupWarning`; a complete one that cannot be read (a
  damaged disk) falls back to the previous backup, if one is kept.
* **one writer**: :meth:`BackupStore.acquire` locks the directory
  (``fcntl.flock``) for one process; another process gets an error that
  names it, not a backup that two runs overwrite in turn. The kernel
  releases the lock when its process dies, also by ``SIGKILL``.

Written here rather than taken from a library because none of the ones
Keras or TensorFlow ship does this for Keras' weight files:
``tf.train.CheckpointManager`` writes its ``checkpoint`` index in place. The
lock is ``fcntl.flock`` itself rather than the ``filelock`` package, because
the error must name the process that holds it and a later ``fit`` in the same
process (after an interrupted one) must be able to take it over.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; the directory is not locked there
    fcntl = None  # type: ignore[assignment]

__all__ = ["BackupDirectoryInUseError", "BackupStore", "IncompleteBackupWarning"]

T = TypeVar("T")

_BACKUP = re.compile(r"^backup-(\d+)$")
_TEMPORARY_PREFIX = ".writing-"  # a backup being written
_REMOVED_PREFIX = ".removing-"  # a backup being deleted (renamed out of the backup-* names)
_MANIFEST = "manifest.json"  # written last into a backup: its files and their sizes
_LOCK = ".lock"

# Directories this process has locked, by resolved path, with the lock file's descriptor: a
# later BackupAndRestore of this process (after a fit that raised) takes the lock over.
_held_locks: dict[Path, int] = {}


class IncompleteBackupWarning(UserWarning):
    """A ``backup-*`` directory lacks files its manifest lists, so it is skipped.

    Left by an older custom_fit killed while it deleted a backup, or by files
    removed from it by hand. The next backup written removes it.
    """


class BackupDirectoryInUseError(RuntimeError):
    """Another process holds the backup directory (:meth:`BackupStore.acquire`)."""


class BackupStore:
    """Numbered, complete backups in ``directory``: the newest, and optionally the one before.

    Args:
        directory: Where the backups go (created when first needed).

    Example:
        >>> import tempfile, pathlib
        >>> store = BackupStore(tempfile.mkdtemp())
        >>> _ = store.write(lambda d: (d / "state.txt").write_text("epoch 3"))
        >>> store.load_latest(lambda d: (d / "state.txt").read_text())
        'epoch 3'
        >>> store.clear()
        >>> store.load_latest(lambda d: (d / "state.txt").read_text()) is None
        True
    """

    def __init__(self, directory: str | os.PathLike[str]):
        self.directory = Path(directory)

    # -- reading ----------------------------------------------------------------

    def backups(self) -> list[Path]:
        """The complete backups, newest first."""
        return [path for path in self._numbered() if self._is_complete(path) is not False]

    def load_latest(self, load: Callable[[Path], T]) -> T | None:
        """``load(directory)`` of the newest backup it can read; ``None`` if there is none.

        An incomplete backup (files missing; or, for a backup an older
        custom_fit wrote without a manifest, any failure to load it) is
        skipped with an :class:`IncompleteBackupWarning`. A complete one that
        ``load`` fails on (an ``OSError`` or a ``ValueError``: an unreadable
        or damaged file) is skipped for the one before it.

        Raises:
            OSError: Complete backups exist, but none could be read (the
                newest one's error).
        """
        first_error: Exception | None = None
        for backup in self._numbered():
            complete = self._is_complete(backup)
            if complete is False:
                _warn_incomplete(backup, "files its manifest lists are missing")
                continue
            try:
                return load(backup)
            except (OSError, ValueError) as error:
                if complete is None:  # no manifest: an older custom_fit's, which may have half-deleted it
                    _warn_incomplete(backup, f"{type(error).__name__}: {error}")
                    continue
                first_error = first_error or error
        if first_error is not None:
            raise OSError(
                f"No backup in {self.directory} could be read: {first_error} Fix: if the disk is fine, "
                f"report this; to give up the interrupted run and start over, delete {self.directory}."
            ) from first_error
        return None

    # -- writing ----------------------------------------------------------------

    def write(self, fill: Callable[[Path], object], keep_previous: bool = True) -> Path:
        """Makes a new backup: ``fill(directory)`` writes its files, then it replaces the previous one.

        Args:
            fill: Writes the backup's files into the directory it is given.
            keep_previous: Keep the previous backup as a fallback for
                :meth:`load_latest` (else it is removed once this one is complete).

        Returns:
            The new backup's directory.
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        numbered = self._numbered()
        complete = [path for path in numbered if self._is_complete(path)]  # an older custom_fit's goes too
        number = _number(numbered[0]) + 1 if numbered else 0
        self._remove_leftovers()
        temporary = self.directory / f"{_TEMPORARY_PREFIX}{number}"
        temporary.mkdir()
        fill(temporary)
        _write_manifest(temporary)
        final = self.directory / f"backup-{number}"
        os.rename(temporary, final)
        _fsync(self.directory)  # the rename itself reaches the disk
        incomplete = [path for path in numbered if path not in complete]
        for old in reversed(incomplete + (complete[1:] if keep_previous else complete)):
            self.remove(old)
        return final

    def remove(self, backup: Path) -> None:
        """Removes one backup: renames it out of the ``backup-*`` names (atomic), then deletes it."""
        removed = self.directory / f"{_REMOVED_PREFIX}{backup.name}"
        os.rename(backup, removed)
        _fsync(self.directory)
        self.delete_files(removed)

    def delete_files(self, directory: Path) -> None:
        """Deletes a directory that holds no backup any more (renamed out by :meth:`remove`)."""
        shutil.rmtree(directory, ignore_errors=True)

    def clear(self) -> None:
        """Removes every backup, oldest first, and the directories a kill left behind.

        The newest backup goes last: a kill before its rename leaves it, and
        a restart resumes from it; after that rename a restart starts afresh.
        ``directory`` itself is removed if nothing else is in it.
        """
        for backup in reversed(self._numbered()):
            self.remove(backup)
        self._remove_leftovers()
        self._remove_directory_if_empty()

    # -- one process at a time ---------------------------------------------------------

    def acquire(self) -> None:
        """Locks ``directory`` for this process (created if needed); a no-op if this process holds it.

        Raises:
            BackupDirectoryInUseError: Another process holds it.
        """
        if fcntl is None:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        key = self.directory.resolve()
        if key in _held_locks:
            return
        path = self.directory / _LOCK
        while True:
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(descriptor)
                os.close(descriptor)
                raise BackupDirectoryInUseError(
                    f"The backup directory {self.directory} is in use by another process ({holder}). "
                    "Expected a backup_dir for this run only: two runs writing backups into one directory "
                    "would overwrite each other's, and a restart would resume the other run. Fix: give each "
                    "run its own backup_dir, or stop the other process first."
                ) from None
            with contextlib.suppress(FileNotFoundError):
                if os.stat(path).st_ino == os.fstat(descriptor).st_ino:
                    break  # locked the file that is in place (not one a releasing process just unlinked)
            os.close(descriptor)
        os.ftruncate(descriptor, 0)
        os.write(descriptor, f"pid {os.getpid()}\n".encode())
        _held_locks[key] = descriptor

    def release(self) -> None:
        """Unlocks ``directory`` (if this process holds it) and removes it if nothing else is in it."""
        descriptor = _held_locks.pop(self.directory.resolve(), None)
        if descriptor is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.directory / _LOCK)  # while locked: a waiting process then re-opens
            os.close(descriptor)
        self._remove_directory_if_empty()

    # -- helpers ----------------------------------------------------------------

    def _numbered(self) -> list[Path]:
        """Every ``backup-*`` directory, complete or not, newest first."""
        if not self.directory.is_dir():
            return []
        numbered = [path for path in self.directory.iterdir() if _BACKUP.match(path.name)]
        return sorted(numbered, key=_number, reverse=True)

    @staticmethod
    def _is_complete(backup: Path) -> bool | None:
        """Whether ``backup`` holds every file of its manifest; ``None`` without a manifest (an older custom_fit)."""
        try:
            manifest = json.loads((backup / _MANIFEST).read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return False
        files: dict[str, Any] = manifest.get("files", {}) if isinstance(manifest, dict) else {}
        for name, size in files.items():
            try:
                if (backup / name).stat().st_size != size:
                    return False
            except OSError:
                return False
        return True

    def _remove_leftovers(self) -> None:
        """Removes half-written backups and backups whose deletion a kill interrupted."""
        if self.directory.is_dir():
            for prefix in (_TEMPORARY_PREFIX, _REMOVED_PREFIX):
                for path in self.directory.glob(f"{prefix}*"):
                    self.delete_files(path)

    def _remove_directory_if_empty(self) -> None:
        with contextlib.suppress(OSError):  # absent, or not empty (the user's files, backups kept)
            self.directory.rmdir()


def _number(backup: Path) -> int:
    match = _BACKUP.match(backup.name)
    assert match is not None
    return int(match.group(1))


def _write_manifest(directory: Path) -> None:
    """Lists ``directory``'s files with their sizes in its manifest; flushes all of it to disk."""
    files = sorted(path for path in directory.rglob("*") if path.is_file())
    for path in files:
        _fsync(path)
    sizes = {str(path.relative_to(directory)): path.stat().st_size for path in files}
    manifest = directory / _MANIFEST
    manifest.write_text(json.dumps({"format": 1, "files": sizes}))
    _fsync(manifest)
    for subdirectory in {path.parent for path in files} | {directory}:
        _fsync(subdirectory)


def _read_holder(descriptor: int) -> str:
    """What the lock file says about its holder (``"pid 1234"``), for messages."""
    text = os.pread(descriptor, 64, 0).decode(errors="replace").strip()
    return text or "pid unknown"


def _warn_incomplete(backup: Path, detail: str) -> None:
    warnings.warn(
        f"Skipped the backup in {backup}: it is incomplete ({detail}). An older custom_fit killed while it "
        "deleted a backup leaves such a directory, as does removing files from it. The backup before it (if "
        "any) is used instead; the next backup written removes it.",
        IncompleteBackupWarning,
        stacklevel=3,
    )


def _fsync(path: Path) -> None:
    """Flushes a file, or a directory's entries, to disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
