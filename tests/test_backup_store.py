"""custom_fit._backup_store: backups written aside and renamed in, damaged ones skipped, one process a directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest

import custom_fit
from custom_fit._backup_store import BackupStore, Restored
from tests import crash_cases

ROOT = Path(__file__).resolve().parents[1]


def _write_text(text: str) -> Any:
    return lambda directory: (directory / "state.txt").write_text(text)


def _read_text(directory: Path) -> str:
    text = (directory / "state.txt").read_text()
    if "\0" in text:
        raise ValueError("damaged")
    return text


def _latest(store: BackupStore) -> Restored[str]:
    """What ``store.load_latest`` loaded with ``_read_text`` (there must be something to load)."""
    restored = store.load_latest(_read_text)
    assert restored is not None
    return restored


def _damage(path: Path) -> None:
    """A disk error after the fact: the file keeps its size, its bytes are garbage."""
    path.write_text("\0" * path.stat().st_size)


def _flip_a_bit(path: Path, offset: int | None = None) -> None:
    """One bit of ``path`` flipped in place (at ``offset``, else in the middle): the size stays."""
    data = bytearray(path.read_bytes())
    at = len(data) // 2 if offset is None else offset
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def test_store_keeps_the_newest_max_to_keep(tmp_path: Path) -> None:
    store = BackupStore(tmp_path / "backups")
    assert store.load_latest(_read_text) is None
    for i in range(4):
        store.write(_write_text(f"backup {i}"))
    assert [p.name for p in store.backups()] == ["backup-3", "backup-2"]
    three = BackupStore(tmp_path / "three", max_to_keep=3)
    for i in range(5):
        three.write(_write_text(f"backup {i}"))
    assert [p.name for p in three.backups()] == ["backup-4", "backup-3", "backup-2"]
    one = BackupStore(tmp_path / "one", max_to_keep=1)
    for i in range(2):
        one.write(_write_text(f"backup {i}"))
    assert [p.name for p in one.backups()] == ["backup-1"]
    restored = store.load_latest(_read_text)
    assert restored is not None and (restored.value, restored.backup.name, restored.skipped) == (
        "backup 3",
        "backup-3",
        [],
    )


@pytest.mark.parametrize("max_to_keep", [0, -1, 1.5, True, "2"])
def test_max_to_keep_is_a_positive_integer(tmp_path: Path, max_to_keep: Any) -> None:
    with pytest.raises(
        ValueError, match=r"max_to_keep is how many backups stay, at least 1; received .*Fix: max_to_keep=2"
    ):
        BackupStore(tmp_path, max_to_keep=max_to_keep)


def test_the_manifest_records_each_files_size_and_crc32(tmp_path: Path) -> None:
    backup = BackupStore(tmp_path).write(_write_text("epoch 3"))
    manifest = json.loads((backup / "manifest.json").read_text())
    entries = {"state.txt": {"size": 7, "crc32": zlib.crc32(b"epoch 3")}}
    assert manifest == {
        "format": 2,
        "files": entries,
        "crc32": zlib.crc32(json.dumps(entries, sort_keys=True).encode()),
    }


def test_store_ignores_a_write_that_did_not_finish(tmp_path: Path) -> None:
    store = BackupStore(tmp_path)
    store.write(_write_text("complete"))
    (tmp_path / ".writing-1").mkdir()  # what a kill during a write leaves
    (tmp_path / ".writing-1" / "state.txt").write_text("half")
    assert _latest(store).value == "complete"
    store.write(_write_text("next"))
    assert not (tmp_path / ".writing-1").exists()
    assert _latest(store).value == "next"


DAMAGES = {
    "a flipped bit": (lambda path: _flip_a_bit(path), "has another CRC-32 than when it was written"),
    "truncated": (lambda path: path.write_bytes(path.read_bytes()[:3]), "has 3 bytes, not the 6 written"),
    "zero length": (lambda path: path.write_bytes(b""), "has 0 bytes, not the 6 written"),
    "deleted": (lambda path: path.unlink(), "is missing"),
    "garbage, same size": (_damage, "has another CRC-32 than when it was written"),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_newest_backup_is_never_loaded_and_the_one_before_is(tmp_path: Path, damage: str) -> None:
    store = BackupStore(tmp_path)
    store.write(_write_text("good"))
    newest = store.write(_write_text("newest"))
    harm, problem = DAMAGES[damage]
    harm(newest / "state.txt")
    loaded = []

    def load(directory: Path) -> str:
        loaded.append(directory.name)
        return _read_text(directory)

    restored = store.load_latest(load)
    assert loaded == ["backup-0"]  # the damaged backup's load never ran
    assert restored is not None and restored.value == "good"
    (skipped,) = restored.skipped
    assert (skipped.backup, skipped.file) == (newest, "state.txt") and problem in skipped.problem
    assert str(skipped).startswith("backup-1: state.txt " + problem)


def test_a_damaged_manifest_is_the_backups_damage(tmp_path: Path) -> None:
    store = BackupStore(tmp_path)
    store.write(_write_text("good"))
    newest = store.write(_write_text("newest"))
    (newest / "manifest.json").write_text('{"format": 2, "fil')
    restored = store.load_latest(_read_text)
    assert restored is not None and restored.value == "good"
    assert (
        restored.skipped[0].file == "manifest.json" and "cannot be read (JSONDecodeError" in restored.skipped[0].problem
    )


def test_when_no_backup_is_intact_the_store_says_so_and_how_to_start_over(tmp_path: Path) -> None:
    store = BackupStore(tmp_path)
    for text in ("old", "new"):
        _flip_a_bit(store.write(_write_text(text)) / "state.txt")
    with pytest.raises(custom_fit.DamagedBackupError) as raised:
        store.load_latest(_read_text)
    message = str(raised.value)
    assert message.startswith(f"No intact backup in {tmp_path}: backup-1: state.txt has another CRC-32")
    assert "; backup-0: state.txt has another CRC-32" in message
    assert "custom_fit does not start over on its own" in message
    assert f"Fix: to start over, move {tmp_path} aside (or delete it) and run again" in message
    assert isinstance(raised.value, OSError)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["backup-0", "backup-1"]  # nothing removed


def test_a_verified_backup_that_does_not_load_is_not_passed_over(tmp_path: Path) -> None:
    """Bytes that match the manifest are the ones written: a load error then is no damage (another model's backup)."""
    store = BackupStore(tmp_path)
    store.write(_write_text("good"))
    store.write(_write_text("\0 written so"))
    with pytest.raises(ValueError, match="damaged"):
        store.load_latest(_read_text)


def test_agree_keeps_the_backups_every_worker_found_intact(tmp_path: Path) -> None:
    store = BackupStore(tmp_path, max_to_keep=3)
    for text in ("a", "b", "c"):
        store.write(_write_text(text))
    restored = store.load_latest(_read_text, agree=lambda intact: intact[1:])  # another worker: backup-2 damaged
    assert restored is not None and restored.value == "b"
    assert [str(damage) for damage in restored.skipped] == ["backup-2: (on another worker) failed its check there"]


def test_store_skips_a_backup_with_files_missing_written_with_sizes_only(tmp_path: Path) -> None:
    """custom_fit 0.3 recorded sizes only: those are checked, and a file that fails to load falls back."""
    store = BackupStore(tmp_path)
    store.write(_write_text("good"))
    newest = store.write(_write_text("newest"))
    (newest / "manifest.json").write_text(json.dumps({"format": 1, "files": {"state.txt": 6}}))
    _damage(newest / "state.txt")
    restored = store.load_latest(_read_text)
    assert restored is not None and restored.value == "good"
    assert restored.skipped[0].problem == "cannot be read: ValueError: damaged"
    (newest / "state.txt").unlink()
    assert _latest(store).skipped[0].problem == "is missing"
    store.write(_write_text("next"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["backup-0", "backup-2"]


def test_a_backup_without_a_manifest_is_damaged(tmp_path: Path) -> None:
    """What custom_fit 0.1 left when killed while it deleted a backup in place, or a manifest deleted by hand."""
    half_deleted = tmp_path / "backup-149"
    half_deleted.mkdir()
    (half_deleted / "meta.json").write_text("{}")
    store = BackupStore(tmp_path)
    with pytest.raises(
        custom_fit.DamagedBackupError, match=r"No intact backup in .*: backup-149: manifest.json is missing"
    ):
        store.load_latest(_read_text)
    assert store.write(_write_text("fresh")).name == "backup-150"
    assert not half_deleted.exists()
    assert custom_fit.IncompleteBackupWarning is custom_fit.DamagedBackupWarning  # its name before checksums


def test_the_next_write_removes_the_backups_found_damaged(tmp_path: Path) -> None:
    store = BackupStore(tmp_path, max_to_keep=3)
    store.write(_write_text("good"))
    _flip_a_bit(store.write(_write_text("newest")) / "state.txt")
    assert _latest(store).value == "good"
    store.write(_write_text("next"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["backup-0", "backup-2"]


def test_store_removes_a_backup_by_renaming_it_out_first(tmp_path: Path) -> None:
    """A kill while a backup's files are deleted leaves a directory that no longer counts as a backup."""

    class KilledWhileDeleting(BackupStore):
        def delete_files(self, directory: Path) -> None:
            (directory / "state.txt").unlink()  # half deleted, then the process dies
            raise KeyboardInterrupt

    store = KilledWhileDeleting(tmp_path)
    store.write(_write_text("last"))
    with pytest.raises(KeyboardInterrupt):
        store.clear()
    assert [p.name for p in tmp_path.iterdir()] == [".removing-backup-0"]
    assert BackupStore(tmp_path).load_latest(_read_text) is None  # as after a completed deletion, no warning
    BackupStore(tmp_path).write(_write_text("next run"))
    assert [p.name for p in tmp_path.iterdir()] == ["backup-0"]


def test_store_clear_removes_the_newest_backup_last(tmp_path: Path) -> None:
    removed = []

    class Recording(BackupStore):
        def remove(self, backup: Path) -> None:
            removed.append(backup.name)
            super().remove(backup)

    store = Recording(tmp_path / "run")
    for text in ("a", "b", "c"):
        store.write(_write_text(text))
    removed.clear()
    store.clear()
    assert removed == ["backup-1", "backup-2"]
    assert not (tmp_path / "run").exists()


def test_store_is_locked_for_one_process(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(tmp_path / "backup")],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "LOCKED"
        model = crash_cases.dropout_model()
        backup = custom_fit.BackupAndRestore(tmp_path / "backup")
        with pytest.raises(
            custom_fit.BackupDirectoryInUseError,
            match=rf"backup directory .*backup is in use by another process \(pid {holder.pid}\)\. Expected a "
            r"backup_dir for this run only.*Fix: give each run its own backup_dir",
        ):
            model.fit(*crash_cases.arrays(), epochs=1, verbose=0, callbacks=[backup])
        assert not list((tmp_path / "backup").glob("backup-*")), "nothing may be written"
    finally:
        holder.kill()  # the kernel releases a killed process' lock
        holder.communicate()
    model.fit(*crash_cases.arrays(), epochs=1, verbose=0, callbacks=[backup])
    assert not (tmp_path / "backup").exists()


# Holds BackupStore(argv[1])'s lock until killed (imports only the store module's file, not TensorFlow).
HOLD_LOCK = """
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("backup_store", "custom_fit/_backup_store.py")
module = importlib.util.module_from_spec(spec)
sys.modules["backup_store"] = module  # dataclasses look their module up
spec.loader.exec_module(module)
module.BackupStore(sys.argv[1]).acquire()
print("LOCKED", flush=True)
time.sleep(600)
"""


def test_store_clear_removes_only_backups(tmp_path: Path) -> None:
    store = BackupStore(tmp_path / "run")
    store.write(_write_text("a"))
    (tmp_path / "run" / ".writing-9").mkdir()
    store.clear()
    assert not (tmp_path / "run").exists()
    store.write(_write_text("a"))
    (tmp_path / "run" / "notes.txt").write_text("the user's")
    store.clear()
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["notes.txt"]
