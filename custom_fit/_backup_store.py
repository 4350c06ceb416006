"""A directory of backups that a kill at any instant leaves loadable, and damaged bytes never load.

Keras' ``BackupAndRestore`` overwrites ``latest.weights.h5`` and
``training_metadata.json`` in place; a process killed while writing them
leaves files that no restart can read, and a file whose bytes went bad on disk
is loaded as it is. :class:`BackupStore` never changes a backup in place, and
checks every byte before anything is loaded:

* **writing**: each backup is written into a temporary directory
  (:meth:`BackupStore.begin`; its files may be written by another thread)
  and made a backup by :meth:`BackupStore.commit`, with a
  manifest of its files (their sizes and CRC-32 checksums), flushed to disk
  (``fsync``), then renamed to ``backup-<number>``. A rename within a
  directory is atomic on POSIX file systems, so a ``backup-*`` directory is
  complete or absent; a half-written temporary directory is ignored and
  removed by the next write. The newest ``max_to_keep`` backups stay.
* **removing**: a backup is first renamed out of the ``backup-*`` names, then
  its files are deleted; a kill during the deletion leaves a directory that
  no longer counts as a backup, removed by the next write or clear.
  :meth:`BackupStore.clear` removes the newest backup last, so until that
  rename a restart resumes from it, and afterwards it starts afresh.
* **reading**: :meth:`BackupStore.check` compares every file of a backup with
  its manifest (missing, another size, another checksum: a damaged disk, bit
  rot, a truncated copy, an edit), and :meth:`BackupStore.load_latest` loads
  the newest backup that passes, reporting the newer ones that did not. None
  of a backup that fails is loaded. When backups exist and none passes, it
  raises :class:`DamagedBackupError` rather than start over, which would drop
  the training they hold without a word.
* **one writer**: :meth:`BackupStore.acquire` locks the directory
  (``fcntl.flock``) for one process; another process gets an error that
  names it, not a backup that two runs overwrite in turn. The kernel
  releases the lock when its process dies, also by ``SIGKILL``.

Written here rather than taken from a library because none of the ones
Keras or TensorFlow ship does this for Keras' weight files:
``tf.train.CheckpointManager`` writes its ``checkpoint`` index in place, and
TensorFlow's asynchronous checkpoints fail on Keras 3's variables
(``_copy_trackable_to_cpu`` creates a variable inside a ``tf.function``; on
Keras 2, whose backups are TensorFlow checkpoints, custom_fit uses them to
copy the weights: ``_compat.keras2.snapshot_weights``). The
checksum is ``zlib``'s CRC-32, what a ``.keras`` (zip) file carries per member:
it catches every burst of up to 32 flipped bits, at twice SHA-256's speed here
(10 ms against 19 ms for a 25 MB weights file). The lock is ``fcntl.flock``
itself rather than the ``filelock`` package, because the error must name the
process that holds it and a later ``fit`` in the same process (after an
interrupted one) must be able to take it over.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; the directory is not locked there
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "BackupDirectoryInUseError",
    "BackupStore",
    "Damage",
    "DamagedBackupError",
    "DamagedBackupWarning",
    "IncompleteBackupWarning",
    "PendingBackup",
    "Restored",
]

T = TypeVar("T")

_BACKUP = re.compile(r"^backup-(\d+)$")
_TEMPORARY_PREFIX = ".writing-"  # a backup being written
_REMOVED_PREFIX = ".removing-"  # a backup being deleted (renamed out of the backup-* names)
_MANIFEST = "manifest.json"  # written last into a backup: its files, their sizes and checksums
_MANIFEST_FORMAT = 2  # 1 (custom_fit 0.3): sizes only; 2: sizes and CRC-32s
_CHUNK = 1 << 22  # bytes read at a time for a checksum
_LOCK = ".lock"

# Directories this process has locked, by resolved path, with the lock file's descriptor: a
# later BackupAndRestore of this process (after a fit that raised) takes the lock over.
_held_locks: dict[Path, int] = {}


class DamagedBackupWarning(UserWarning):
    """A backup failed its check (a file missing, of another size, or with another checksum), so an older one is used.

    ``custom_fit.BackupAndRestore`` warns once per ``fit``, naming the backup,
    the file and where each backup would have resumed. The damaged backup is
    never loaded, in whole or in part, and the next backup written removes it.
    (:meth:`BackupStore.load_latest` itself reports such backups in what it
    returns.)
    """


#: The name of :class:`DamagedBackupWarning` before backups carried checksums (custom_fit 0.3).
IncompleteBackupWarning = DamagedBackupWarning


class DamagedBackupError(OSError):
    """Backups exist in the directory, but none passed its check: ``fit`` stops instead of starting over."""


class BackupDirectoryInUseError(RuntimeError):
    """Another process holds the backup directory (:meth:`BackupStore.acquire`)."""


@dataclasses.dataclass(frozen=True)
class Damage:
    """Why a backup failed its check.

    Attributes:
        backup: The backup's directory.
        file: The first file that failed, relative to ``backup`` (``manifest.json`` for the manifest).
        problem: What is wrong with it, for messages.
    """

    backup: Path
    file: str
    problem: str

    def __str__(self) -> str:
        return f"{self.backup.name}: {self.file} {self.problem}"


@dataclasses.dataclass(frozen=True)
class PendingBackup:
    """A backup being written (:meth:`BackupStore.begin`): not a backup until :meth:`BackupStore.commit`.

    Attributes:
        directory: The temporary directory its files go into.
        number: The number it will have (``backup-<number>``).
    """

    directory: Path
    number: int


@dataclasses.dataclass(frozen=True)
class Restored(Generic[T]):
    """What :meth:`BackupStore.load_latest` loaded, and the newer backups it passed over.

    Attributes:
        backup: The backup loaded.
        value: What the ``load`` function returned for it.
        skipped: The backups newer than ``backup`` that failed their check, newest first.
    """

    backup: Path
    value: T
    skipped: list[Damage]


class BackupStore:
    """Numbered backups in ``directory``, each checked before it is loaded; the newest ``max_to_keep`` stay.

    Args:
        directory: Where the backups go (created when first needed).
        max_to_keep: How many backups stay (at least 1): a damaged newest one
            falls back to the one before it.

    Example:
        >>> import tempfile, pathlib
        >>> store = BackupStore(tempfile.mkdtemp())
        >>> _ = store.write(lambda d: (d / "state.txt").write_text("epoch 3"))
        >>> store.load_latest(lambda d: (d / "state.txt").read_text()).value
        'epoch 3'
        >>> store.clear()
        >>> store.load_latest(lambda d: (d / "state.txt").read_text()) is None
        True
    """

    def __init__(self, directory: str | os.PathLike[str], max_to_keep: int = 2):
        if not isinstance(max_to_keep, int) or isinstance(max_to_keep, bool) or max_to_keep < 1:
            raise ValueError(
                f"max_to_keep is how many backups stay, at least 1; received {max_to_keep!r}. "
                "Fix: max_to_keep=2 (the default) keeps one to fall back to when the newest is damaged."
            )
        self.directory = Path(directory)
        self.max_to_keep = max_to_keep
        self._damaged: set[Path] = set()  # backups load_latest found damaged: the next write removes them

    # -- reading ----------------------------------------------------------------

    def backups(self) -> list[Path]:
        """The backups whose files are all there at their recorded sizes, newest first (no checksum read)."""
        return [path for path in self._numbered() if self._size_damage(path) is None]

    def check(self, backup: Path) -> Damage | None:
        """How ``backup`` first differs from its manifest (a file missing, a size, a checksum); ``None``: intact.

        A backup without a manifest is damaged (custom_fit 0.1 left such
        directories when killed while it deleted a backup); one whose manifest
        has sizes only (written before backups carried checksums) is checked
        for what it records.
        """
        manifest = _read_manifest(backup)
        if isinstance(manifest, Damage):
            return manifest
        damages = (_file_damage(backup, name, recorded) for name, recorded in manifest.items())
        return next((damage for damage in damages if damage is not None), None)

    def check_file(self, backup: Path, name: str) -> Damage | None:
        """How file ``name`` of ``backup`` differs from its manifest; ``None`` if it matches or is not listed."""
        manifest = _read_manifest(backup)
        if isinstance(manifest, Damage):
            return manifest
        recorded = manifest.get(name)
        return None if recorded is None else _file_damage(backup, name, recorded)

    def load_latest(
        self, load: Callable[[Path], T], *, agree: Callable[[list[Path]], list[Path]] | None = None
    ) -> Restored[T] | None:
        """``load(directory)`` of the newest backup that passes :meth:`check`; ``None`` if there is none at all.

        Args:
            load: Reads a backup's directory. It is called only for a backup
                whose files all passed their check, newest first. An error it
                raises on a backup written before backups carried checksums
                (an ``OSError`` or a ``ValueError``) passes that backup over
                as damaged; on a checked backup it propagates (its bytes are
                the ones written: another model's, say).
            agree: Given the backups that passed (newest first), returns
                those to load from (a cluster's workers keep the ones that
                passed on every worker). The next :meth:`write` removes the
                backups that did not.

        Raises:
            DamagedBackupError: Backups exist, and none passed (each one's damage named).
        """
        numbered = self._numbered()
        damages = {backup: self.check(backup) for backup in numbered}
        intact = [backup for backup in numbered if damages[backup] is None]
        if agree is not None:
            agreed = agree(intact)
            for backup in intact:
                if backup not in agreed:
                    damages[backup] = Damage(backup, "(on another worker)", "failed its check there")
            intact = agreed
        for backup in intact:
            try:
                value = load(backup)
            except (OSError, ValueError) as error:
                if _format_of(backup) >= _MANIFEST_FORMAT:
                    raise  # its bytes are the ones written: not damage (another model's backup, say)
                damages[backup] = Damage(backup, "(its files)", f"cannot be read: {type(error).__name__}: {error}")
                continue
            skipped = [damages[newer] for newer in numbered if _number(newer) > _number(backup)]
            self._damaged = {damage.backup for damage in damages.values() if damage is not None}
            return Restored(backup, value, [damage for damage in skipped if damage is not None])
        if not numbered:
            return None
        found = "; ".join(str(damages[backup]) for backup in numbered)
        raise DamagedBackupError(
            f"No intact backup in {self.directory}: {found}. Expected at least one backup whose files all match "
            "the manifest written with them. custom_fit does not start over on its own, which would drop the "
            f"training these backups hold without a word. Fix: to start over, move {self.directory} aside (or "
            "delete it) and run again; if the storage was only unreachable, repair it and run again."
        )

    # -- writing ----------------------------------------------------------------

    def write(self, fill: Callable[[Path], object]) -> Path:
        """Makes a new backup: ``fill(directory)`` writes its files; then the oldest beyond ``max_to_keep`` go.

        :meth:`begin`, ``fill``, then :meth:`commit`. Damaged backups go too:
        those :meth:`load_latest` found, and those with a file missing or of
        another size (no checksum is read here).

        Returns:
            The new backup's directory.
        """
        pending = self.begin()
        fill(pending.directory)
        return self.commit(pending)

    def begin(self) -> PendingBackup:
        """Starts a new backup: a temporary directory for its files, which no reader takes for a backup.

        One backup at a time: call :meth:`commit` (or let the process end,
        which leaves the temporary directory to the next write) before the
        next :meth:`begin`.
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        numbered = self._numbered()
        number = _number(numbered[0]) + 1 if numbered else 0
        self._remove_leftovers()
        temporary = self.directory / f"{_TEMPORARY_PREFIX}{number}"
        temporary.mkdir()
        return PendingBackup(temporary, number)

    def commit(self, pending: PendingBackup) -> Path:
        """Makes ``pending``'s files a backup: its manifest, on disk, renamed into place; old backups go.

        Returns:
            The new backup's directory.
        """
        numbered = self._numbered()
        _write_manifest(pending.directory)
        final = self.directory / f"backup-{pending.number}"
        os.rename(pending.directory, final)
        _fsync(self.directory)  # the rename itself reaches the disk
        whole = [path for path in numbered if path not in self._damaged and self._size_damage(path) is None]
        unwanted = [path for path in numbered if path not in whole] + whole[self.max_to_keep - 1 :]
        self._damaged.clear()
        for old in sorted(unwanted, key=_number):
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
    def _size_damage(backup: Path) -> Damage | None:
        """A file of ``backup``'s manifest that is missing or of another size (no checksum is read)."""
        manifest = _read_manifest(backup)
        if isinstance(manifest, Damage):
            return manifest
        damages = (_file_damage(backup, name, {"size": entry["size"]}) for name, entry in manifest.items())
        return next((damage for damage in damages if damage is not None), None)

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
    """Lists ``directory``'s files with their sizes and CRC-32s in its manifest; flushes all of it to disk."""
    files = sorted(path for path in directory.rglob("*") if path.is_file())
    for path in files:
        _fsync(path)
    entries = {str(path.relative_to(directory)): {"size": path.stat().st_size, "crc32": _crc32(path)} for path in files}
    manifest = directory / _MANIFEST
    manifest.write_text(json.dumps({"format": _MANIFEST_FORMAT, "files": entries, "crc32": _entries_crc32(entries)}))
    _fsync(manifest)
    for subdirectory in {path.parent for path in files} | {directory}:
        _fsync(subdirectory)


def _file_damage(backup: Path, name: str, recorded: dict[str, Any]) -> Damage | None:
    """How file ``name`` of ``backup`` differs from ``recorded`` (its size, and its CRC-32 where recorded)."""
    try:
        size = (backup / name).stat().st_size
    except OSError:
        return Damage(backup, name, "is missing")
    if size != recorded["size"]:
        return Damage(backup, name, f"has {size} bytes, not the {recorded['size']} written")
    if "crc32" in recorded and _crc32(backup / name) != recorded["crc32"]:
        return Damage(
            backup,
            name,
            "has another CRC-32 than when it was written: its bytes changed on disk (a damaged disk, bit rot, "
            "an interrupted copy, an edit)",
        )
    return None


def _read_manifest(backup: Path) -> dict[str, dict[str, Any]] | Damage:
    """``{file: {"size": ..., "crc32": ...}}`` from ``backup``'s manifest, or why it cannot be read.

    A manifest with sizes only (written before backups carried checksums)
    gives entries without a checksum; a manifest that records its own CRC-32
    is checked against it.
    """
    try:
        manifest = json.loads((backup / _MANIFEST).read_text())
        files = manifest["files"]
        entries = {name: entry if isinstance(entry, dict) else {"size": entry} for name, entry in files.items()}
        if "crc32" in manifest and manifest["crc32"] != _entries_crc32(entries):
            return Damage(backup, _MANIFEST, "has another CRC-32 than when it was written")
        return entries
    except FileNotFoundError:
        return Damage(backup, _MANIFEST, "is missing")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        return Damage(backup, _MANIFEST, f"cannot be read ({type(error).__name__}: {error})")


def _format_of(backup: Path) -> int:
    """The manifest format of a backup whose manifest :func:`_read_manifest` read (1: sizes only)."""
    return int(json.loads((backup / _MANIFEST).read_text()).get("format", 1))


def _entries_crc32(entries: dict[str, dict[str, Any]]) -> int:
    """The CRC-32 of a manifest's entries (the manifest's own, so that a flipped bit in it is its damage)."""
    return zlib.crc32(json.dumps(entries, sort_keys=True).encode())


def _crc32(path: Path) -> int:
    """The CRC-32 of a file's bytes (``zlib``), read in chunks."""
    checksum = 0
    with open(path, "rb") as file:
        while chunk := file.read(_CHUNK):
            checksum = zlib.crc32(chunk, checksum)
    return checksum


def _read_holder(descriptor: int) -> str:
    """What the lock file says about its holder (``"pid 1234"``), for messages."""
    text = os.pread(descriptor, 64, 0).decode(errors="replace").strip()
    return text or "pid unknown"


def _fsync(path: Path) -> None:
    """Flushes a file, or a directory's entries, to disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
