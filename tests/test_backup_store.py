"""custom_fit._backup_store: backups written aside and renamed in, damaged ones skipped, one process a directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import custom_fit
from custom_fit._backup_store import BackupStore
from tests import crash_cases

ROOT = Path(__file__).resolve().parents[1]


def _write_text(text: str) -> Any:
    return lambda directory: (directory / "state.txt").write_text(text)


def _read_text(directory: Path) -> str:
    text = (directory / "state.txt").read_text()
    if "\0" in text:
        raise ValueError("damaged")
    return text


def _damage(path: Path) -> None:
    """A disk error after the fact: the file keeps its size, its bytes are garbage."""
    path.write_text("\0" * path.stat().st_size)


def test_store_keeps_the_newest_and_optionally_the_previous(tmp_path: Path) -> None:
    store = BackupStore(tmp_path / "backups")
    assert store.load_latest(_read_text) is None
    for i in range(3):
        store.write(_write_text(f"backup {i}"))
    assert [p.name for p in store.backups()] == ["backup-2", "backup-1"]
    store.write(_write_text("backup 3"), keep_previous=False)
    assert [p.name for p in store.backups()] == ["backup-3"]
    assert store.load_latest(_read_text) == "backup 3"


def test_store_ignores_a_write_that_did_not_finish(tmp_path: Path) -> None:
    store = BackupStore(tmp_path)
    store.write(_write_text("complete"))
    (tmp_path / ".writing-1").mkdir()  # what a kill during a write leaves
    (tmp_path / ".writing-1" / "state.txt").write_text("half")
    assert store.load_latest(_read_text) == "complete"
    store.write(_write_text("next"))
    assert not (tmp_path / ".writing-1").exists()
    assert store.load_latest(_read_text) == "next"


def test_store_falls_back_to_the_previous_backup_when_the_newest_is_damaged(tmp_path: Path) -> None:
    store = BackupStore(tmp_path)
    store.write(_write_text("good"))
    newest = store.write(_write_text("newest"))
    _damage(newest / "state.txt")
    assert store.load_latest(_read_text) == "good"
    _damage(store.backups()[1] / "state.txt")
    with pytest.raises(OSError, match=r"No backup in .* could be read: damaged Fix: .*delete .*"):
        store.load_latest(_read_text)


def test_store_skips_a_backup_with_files_missing_with_a_warning(tmp_path: Path) -> None:
    store = BackupStore(tmp_path)
    store.write(_write_text("good"))
    newest = store.write(_write_text("newest"))
    (newest / "state.txt").unlink()  # removed by hand: the manifest still lists it
    with pytest.warns(custom_fit.IncompleteBackupWarning, match=r"Skipped the backup in .*backup-1: it is incomplete"):
        assert store.load_latest(_read_text) == "good"
    store.write(_write_text("next"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["backup-0", "backup-2"]


def test_store_skips_a_backup_an_older_version_left_half_deleted(tmp_path: Path) -> None:
    """custom_fit 0.1.0 deleted a backup in place; a kill left ``backup-<n>/`` without some files (and no manifest)."""
    half_deleted = tmp_path / "backup-149"
    half_deleted.mkdir()
    (half_deleted / "meta.json").write_text("{}")
    store = BackupStore(tmp_path)
    with pytest.warns(custom_fit.IncompleteBackupWarning, match=r"backup-149: it is incomplete \(FileNotFoundError"):
        assert store.load_latest(_read_text) is None
    assert store.write(_write_text("fresh")).name == "backup-150"
    assert not half_deleted.exists()


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
