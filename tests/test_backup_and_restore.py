"""custom_fit.BackupAndRestore: atomic backups, and a resumed fit that equals an uninterrupted one.

Three layers of tests:

* the callback's errors (:class:`~custom_fit._backup_store.BackupStore` itself:
  ``tests/test_backup_store.py``);
* in-process resume: ``fit`` interrupted by an exception at a chosen step,
  then a new model resumes (fast; every input kind and step fusion);
* the kill harness: ``tests/crash_cases.py`` run as a subprocess, killed with
  ``SIGKILL`` at seeded random moments (some inside backup writes) and
  restarted until it completes; its final weights, optimizer state and last
  epoch's history must equal an uninterrupted run's exactly.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest

import custom_fit
from custom_fit import KERAS_2, keras
from custom_fit._backup_and_restore import Backup
from custom_fit._backup_store import BackupStore
from custom_fit._compat import version
from custom_fit._preemption import PREEMPTION_EXIT_CODE
from custom_fit._random_state import RandomState
from custom_fit._trainer.data_position import Position
from custom_fit._trainer.progress import Progress
from tests import crash_cases, parity

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------
# The store's lock, taken over within a process
# --------------------------------------------------------------------------


def test_a_later_fit_of_the_same_process_takes_the_lock_over(tmp_path: Path) -> None:
    x, y = crash_cases.arrays()
    model = crash_cases.dropout_model()
    with pytest.raises(RuntimeError, match="simulated interruption"):
        model.fit(x, y, epochs=3, verbose=0, callbacks=[custom_fit.BackupAndRestore(tmp_path), parity.StopAt(1)])
    resumed = crash_cases.dropout_model()
    assert len(resumed.fit(x, y, epochs=3, verbose=0, callbacks=[custom_fit.BackupAndRestore(tmp_path)]).epoch) == 2
    assert not tmp_path.exists()


# --------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------


@pytest.mark.parametrize("save_freq", [0, -3, True, "batch", 2.5])
def test_rejects_a_save_freq_that_is_not_epoch_or_a_positive_integer(save_freq: Any) -> None:
    with pytest.raises(ValueError, match=r"save_freq must be 'epoch' or a positive number of training steps"):
        custom_fit.BackupAndRestore("backups", save_freq=save_freq)


def test_rejects_an_empty_backup_dir() -> None:
    with pytest.raises(ValueError, match="needs a directory for its backups, received backup_dir=''"):
        custom_fit.BackupAndRestore("")


def test_step_backups_need_a_custom_fit_model(tmp_path: Path) -> None:
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(TypeError, match="resumes mid-epoch through custom_fit's fit loop, but the model is a"):
        model.fit(np.zeros((4, 2)), np.zeros((4, 1)), callbacks=[custom_fit.BackupAndRestore(tmp_path, 2)], verbose=0)


@pytest.mark.keras3
def test_a_plain_keras_model_is_not_saved_on_sigterm_and_says_so(tmp_path: Path) -> None:
    """Only a custom_fit model's fit keeps the record that tells the notice whether fit still runs."""
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    backup = custom_fit.BackupAndRestore(tmp_path)
    handler = signal.getsignal(signal.SIGTERM)
    with pytest.warns(UserWarning, match="a SIGTERM ends this run as in plain Keras.*Fix: use custom_fit.CustomModel"):
        model.fit(np.zeros((4, 2)), np.zeros((4, 1)), callbacks=[backup], verbose=0)
    assert signal.getsignal(signal.SIGTERM) is handler
    quiet = custom_fit.BackupAndRestore(tmp_path / "quiet", save_before_preemption=False)
    model.fit(np.zeros((4, 2)), np.zeros((4, 1)), callbacks=[quiet], verbose=0)  # no warning


@pytest.mark.keras2
def test_keras_2_backups_need_a_custom_fit_model(tmp_path: Path) -> None:
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(TypeError, match="on Keras 2 resumes through custom_fit's fit loop"):
        model.fit(np.zeros((4, 2)), np.zeros((4, 1)), callbacks=[custom_fit.BackupAndRestore(tmp_path)], verbose=0)


def _small_model(**compile_kwargs: Any) -> keras.Model:
    model = custom_fit.CustomSequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", **compile_kwargs)
    return model


def test_an_unbuilt_model_cannot_load_a_backup(tmp_path: Path) -> None:
    x, y = np.zeros((8, 2)), np.zeros((8, 1))
    backup = custom_fit.BackupAndRestore(tmp_path, delete_checkpoint=False)
    _small_model().fit(x, y, epochs=2, callbacks=[backup], verbose=0)
    unbuilt = custom_fit.CustomSequential([keras.layers.Dense(1)])
    unbuilt.compile(optimizer="sgd", loss="mse")
    with pytest.raises(RuntimeError, match=r"is not built, so its weights cannot be loaded\. Fix: build the model"):
        unbuilt.fit(x, y, epochs=3, callbacks=[custom_fit.BackupAndRestore(tmp_path)], verbose=0)


def test_a_backup_of_other_metrics_is_refused(tmp_path: Path) -> None:
    x, y = np.zeros((16, 2)), np.zeros((16, 1))
    backup = custom_fit.BackupAndRestore(tmp_path, save_freq=2)
    with pytest.raises(KeyboardInterrupt):
        _small_model().fit(x, y, batch_size=2, callbacks=[backup, crash_cases.Interrupt(5)], verbose=0)
    other = _small_model(metrics=["mae", "mse"])
    with pytest.raises(ValueError, match="holds metrics of another model: expected variables of shapes"):
        other.fit(x, y, batch_size=2, callbacks=[custom_fit.BackupAndRestore(tmp_path, save_freq=2)], verbose=0)


# --------------------------------------------------------------------------
# What a backup records of the progress
# --------------------------------------------------------------------------


def _a_backup(progress: dict[str, Any]) -> Backup:
    return Backup(progress=progress, random_state=RandomState.capture(), hook_states=[], metric_values=[[np.ones(2)]])


def test_a_backup_holds_the_progress_state_as_the_running_fit_gave_it(tmp_path: Path) -> None:
    progress = Progress()
    progress.epoch_begins(2)
    progress.step_begins(3)
    progress.validated({"val_loss": np.float32(0.25)})
    state = progress.state_dict()
    _a_backup(state).write(tmp_path)
    read = Backup.read(tmp_path)
    assert read.progress == {**state, "validation_logs": {"val_loss": 0.25}}  # a float32 read back exactly
    resumed = Progress()
    resumed.load_state_dict(read.progress)
    assert resumed.first_epoch(initial_epoch=0) == 2 and resumed.trained_steps == 3
    assert Backup.position_of(tmp_path) == "epoch 3, step 3, after 3 steps"


def test_a_backup_written_before_a_progress_field_existed_resumes_with_its_default(tmp_path: Path) -> None:
    """custom_fit releases before data_epoch, trained_steps and validation_logs wrote meta.json without them."""
    _a_backup({"epoch": 1, "step": 4, "iterator": 1, "skip": 4}).write(tmp_path)
    read = Backup.read(tmp_path)
    assert read.position == Position(epoch=1, step=4, iterator=1, skip=4)
    resumed = Progress()
    resumed.load_state_dict(read.progress)
    assert resumed.trained_steps == 4  # counted from the loaded step
    assert Backup.position_of(tmp_path) == "epoch 2, step 4"


@pytest.mark.parametrize(("steps_per_execution", "expected"), [(1, [4, 8, 12, 16]), (3, [6, 12, 18])])
def test_a_step_backup_is_written_once_save_freq_steps_were_trained(
    tmp_path: Path, steps_per_execution: int, expected: list[int]
) -> None:
    """Counted on the progress across epochs: at the first execution's start (or the epoch's end) at or past N.

    Two epochs of 9 steps, save_freq=4; with 3 steps per execution the executions start at steps 0, 3
    and 6 of each epoch, and the epoch's end (step 9) is not due in the first epoch (3 since step 6).
    """
    keras.utils.set_random_seed(0)
    model = custom_fit.CustomSequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", steps_per_execution=steps_per_execution)
    seen: list[int] = []

    class Watch(keras.callbacks.Callback):  # after the backup callback: each new backup once it is there
        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self.look()

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            self.look()

        def look(self) -> None:
            for backup in sorted(tmp_path.glob("backup-*")):
                if (backup / "meta.json").exists() and _trained_steps(backup) not in seen:
                    seen.append(_trained_steps(backup))

    backup = custom_fit.BackupAndRestore(tmp_path, save_freq=4, write_in_background=False, max_to_keep=10)
    x = np.zeros((18, 2), "float32")
    model.fit(x, x[:, :1], batch_size=2, epochs=2, callbacks=[backup, Watch()], verbose=0)
    assert seen == expected


def test_a_meta_json_without_the_step_cannot_be_read(tmp_path: Path) -> None:
    _a_backup({"epoch": 1, "iterator": 0, "skip": 0}).write(tmp_path)
    with pytest.raises(ValueError, match=r"cannot be read \(TypeError: .*'step'"):
        Backup.read(tmp_path)


# --------------------------------------------------------------------------
# In-process resume
# --------------------------------------------------------------------------


def _fit(
    build: Any, inputs: Any, backup_dir: Path, save_freq: Any, interrupt_at: int | None = None, **backup: Any
) -> Any:
    """A fresh seeded model fitted like the crash cases, maybe interrupted; ``(model, history)``."""
    keras.utils.set_random_seed(1)
    model = build()
    callbacks: list[Any] = [custom_fit.BackupAndRestore(backup_dir, save_freq=save_freq, **backup)]
    if interrupt_at is not None:
        callbacks.append(crash_cases.Interrupt(interrupt_at))
    try:
        history = model.fit(**inputs(), epochs=3, verbose=0, callbacks=callbacks)
    except KeyboardInterrupt:
        return model, None
    return model, history


def _assert_same_training(expected: tuple[Any, Any], got: tuple[Any, Any]) -> None:
    for want, have in zip(crash_cases.variables_of(expected[0]), crash_cases.variables_of(got[0]), strict=True):
        np.testing.assert_array_equal(have, want)
    assert {k: v[-1] for k, v in got[1].history.items()} == {k: v[-1] for k, v in expected[1].history.items()}


RESUME_CASES = [  # (model, input, steps_per_execution, save_freq, interrupts)
    ("dropout", "arrays", 1, 5, (7, 12, 20)),
    ("dropout", "arrays", 3, 4, (3, 7)),  # interrupts count executions (3 steps each)
    ("dropout", "arrays", "auto", 5, (13,)),
    ("dropout", "tf_data", 1, 5, (7, 31)),
    ("dropout", "repeated_tf_data", 1, 4, (7, 18)),
    # The PyDataset draws its noise from NumPy's global generator in tf.data's prefetch thread: exact
    # because an interrupted fit closes its data iterators (before, under load, a prefetch thread of
    # the interrupted run could draw on while the resumed run restored the state: issue 31).
    ("dropout", "py_dataset", 1, 6, (20,)),
    ("dropout", "plain_py_dataset", 1, 6, (7, 31)),
    ("named", "repeated_tf_data", "auto", 5, (23,)),
    ("dropout", "arrays", 1, "epoch", (20,)),
    # compile(gradient_accumulation_steps=4): backups every 5 steps land mid-accumulation (the
    # accumulators are optimizer state).
    ("accumulating", "arrays", 1, 5, (7, 13)),
    ("accumulating", "arrays", "auto", 5, (11,)),
]


#: Keras 2: the same cases with a model that draws no random numbers (tf_keras' layers draw from
#: TensorFlow's global generator, whose state no file saves), and no PyDataset (a Keras 2
#: ``Sequence`` reshuffling in ``on_epoch_end`` is not replayed on resume: docs/saving.md).
KERAS_2_RESUME_CASES = [
    ("dense", "arrays", 1, 5, (7, 12, 20)),
    ("dense", "arrays", 3, 4, (3, 7)),
    ("dense", "arrays", "auto", 5, (13,)),
    ("dense", "tf_data", 1, 5, (7, 31)),
    ("dense", "repeated_tf_data", 1, 4, (7, 18)),
    ("named", "repeated_tf_data", "auto", 5, (23,)),
    ("dense", "arrays", 1, "epoch", (20,)),
    ("accumulating_dense", "arrays", 1, 5, (7, 13)),
]
_BUILDERS: dict[str, Callable[..., keras.Model]] = {
    "dropout": crash_cases.dropout_model,
    "dense": functools.partial(crash_cases.dropout_model, dropout=False),
    "named": crash_cases.named_model,
    "accumulating": functools.partial(crash_cases.dropout_model, accumulate=4),
    "accumulating_dense": functools.partial(crash_cases.dropout_model, dropout=False, accumulate=4),
}


@pytest.mark.parametrize(
    ("model", "data", "steps_per_execution", "save_freq", "interrupts"),
    [pytest.param(*case, marks=pytest.mark.keras3) for case in RESUME_CASES]
    + [pytest.param(*case, marks=pytest.mark.keras2) for case in KERAS_2_RESUME_CASES],
)
def test_resumed_fit_equals_an_uninterrupted_one(
    tmp_path: Path, model: str, data: str, steps_per_execution: Any, save_freq: Any, interrupts: tuple[int, ...]
) -> None:
    builder = _BUILDERS[model]
    build = functools.partial(builder, steps_per_execution)
    inputs = crash_cases.INPUTS[data]
    expected = _fit(build, inputs, tmp_path / "uninterrupted", save_freq)
    for steps in interrupts:  # each run stops after `steps` steps of its own
        assert _fit(build, inputs, tmp_path / "run", save_freq, interrupt_at=steps)[1] is None
    _assert_same_training(expected, _fit(build, inputs, tmp_path / "run", save_freq))
    assert not (tmp_path / "run").exists()  # delete_checkpoint


# --------------------------------------------------------------------------
# Written in the background: training waits only for the copy
# --------------------------------------------------------------------------


class _SlowCommit(BackupStore):
    """Commits a backup only once training has run ``steps`` steps past it (or after 30 s: then it says so)."""

    def __init__(self, directory: Path, steps: int):
        super().__init__(directory)
        self.steps, self.seen = steps, 0
        self.trained_on: list[bool] = []
        self.moved_on = threading.Event()

    def commit(self, pending: Any) -> Path:
        self.trained_on.append(self.moved_on.wait(30))
        self.moved_on.clear()
        return super().commit(pending)

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.seen += 1
        if self.seen % 5 == self.steps:
            self.moved_on.set()


def test_training_goes_on_while_a_backup_is_written_and_the_result_is_the_same(tmp_path: Path) -> None:
    """Each backup (every 5 steps) is committed only after training ran 2 more steps, and resuming from them is
    exact: the same as an uninterrupted run, and as backups written before training goes on."""
    expected = _fit(_resumable_model, crash_cases.INPUTS["arrays"], tmp_path / "uninterrupted", 5)
    store = _SlowCommit(tmp_path / "background", steps=2)
    keras.utils.set_random_seed(1)
    model = _resumable_model()
    callbacks = [
        custom_fit.BackupAndRestore(store.directory, 5, store=store, delete_checkpoint=False),
        keras.callbacks.LambdaCallback(on_train_batch_end=store.on_train_batch_end),
        crash_cases.Interrupt(13),
    ]
    with pytest.raises(KeyboardInterrupt):
        model.fit(**crash_cases.INPUTS["arrays"](), epochs=3, verbose=0, callbacks=callbacks)
    assert store.trained_on == [True, True]  # backups after steps 5 and 10, each committed 2 steps later
    assert sorted(p.name for p in store.directory.iterdir() if p.name.startswith("backup-")) == ["backup-0", "backup-1"]
    _assert_same_training(expected, _fit(_resumable_model, crash_cases.INPUTS["arrays"], store.directory, 5))
    waits = tmp_path / "waits"
    assert _fit(_resumable_model, crash_cases.INPUTS["arrays"], waits, 5, 13, write_in_background=False)[1] is None
    _assert_same_training(expected, _fit(_resumable_model, crash_cases.INPUTS["arrays"], waits, 5))


class _FullDisk(BackupStore):
    def commit(self, pending: Any) -> Path:
        raise OSError(28, "No space left on device")


@pytest.mark.parametrize("in_background", [True, False])
def test_a_failed_backup_write_stops_fit_with_its_own_error_naming_the_backup(
    tmp_path: Path, in_background: bool
) -> None:
    """In the background, the error is raised at the next backup (step 10); otherwise at its own (step 5)."""
    backup = custom_fit.BackupAndRestore(
        tmp_path, save_freq=5, store=_FullDisk(tmp_path), write_in_background=in_background
    )
    seen: list[int] = []
    with pytest.raises(OSError, match="No space left on device") as caught:
        _resumable_model().fit(
            *crash_cases.arrays(), batch_size=crash_cases.BATCH, epochs=1, verbose=0,
            callbacks=[backup, keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: seen.append(b))],
        )  # fmt: skip
    assert len(seen) == (10 if in_background else 5)
    if in_background:
        (note,) = caught.value.__notes__
        assert (
            note.startswith("custom_fit.BackupAndRestore: raised while the backup of epoch 1, step 5 (into ")
            and "was written in the background" in note
        )


# --------------------------------------------------------------------------
# Damaged backups: checked before anything is loaded, the newest intact one used
# --------------------------------------------------------------------------


def _flip_a_bit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # the middle: inside the largest weight of the weights file
    path.write_bytes(bytes(data))


FAULTS: dict[str, Callable[[Path], object]] = {
    "a flipped bit": _flip_a_bit,
    "truncated to half": lambda path: path.write_bytes(path.read_bytes()[: path.stat().st_size // 2]),
    "zero length": lambda path: path.write_bytes(b""),
    "deleted": lambda path: path.unlink(),
}
#: The files of a backup: the weights (Keras 3: an .h5 file; Keras 2: TensorFlow's checkpoint, its index, data and
#: ``checkpoint`` files), the position and state custom_fit adds, and the manifest.
BACKUP_FILES = (
    *(
        (version.BACKUP_WEIGHTS_FILE,)
        if not KERAS_2
        else ("weights.index", "weights.data-00000-of-00001", "checkpoint")
    ),
    "meta.json",
    "state.npz",
    "manifest.json",
)


def _weights_file(backup: Path) -> Path:
    """The largest file of ``backup``: its weights."""
    return max((path for path in backup.iterdir() if path.is_file()), key=lambda path: path.stat().st_size)


def _resumable_model(steps_per_execution: Any = 1) -> keras.Model:
    """The crash cases' model: with Dropout on Keras 3; on Keras 2 without (tf_keras' masks are not saved)."""
    return crash_cases.dropout_model(steps_per_execution, dropout=not custom_fit.KERAS_2)


def _interrupted_with_two_backups(tmp_path: Path) -> tuple[Any, Path]:
    """An uninterrupted run, and a run stopped after 13 steps with backups after steps 5 and 10 (15-step epochs)."""
    inputs = crash_cases.INPUTS["arrays"]
    expected = _fit(_resumable_model, inputs, tmp_path / "uninterrupted", 5)
    assert _fit(_resumable_model, inputs, tmp_path / "run", 5, interrupt_at=13)[1] is None
    assert sorted(p.name for p in (tmp_path / "run").glob("backup-*")) == ["backup-0", "backup-1"]
    return expected, tmp_path / "run"


@pytest.mark.parametrize("file", BACKUP_FILES)
@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_damaged_newest_backup_is_not_loaded_and_the_run_resumes_from_the_one_before(
    tmp_path: Path, fault: str, file: str
) -> None:
    """The fault matrix: each file of the newest backup damaged each way. The restart warns once, naming the
    backup, the file and both steps, and resumes at step 5 instead of 10: equal to an uninterrupted run."""
    expected, run = _interrupted_with_two_backups(tmp_path)
    FAULTS[fault](run / "backup-1" / file)
    with pytest.warns(custom_fit.DamagedBackupWarning) as caught:
        got = _fit(_resumable_model, crash_cases.INPUTS["arrays"], run, 5)
    (warning,) = [w for w in caught if issubclass(w.category, custom_fit.DamagedBackupWarning)]
    message = str(warning.message)
    assert message.startswith(f"custom_fit.BackupAndRestore: 1 newer backup(s) in {run} failed their check")
    assert f"backup-1: {file} " in message
    if file in ("meta.json", "manifest.json"):
        assert "where it would have resumed is unknown (its meta.json is not intact)" in message
    else:
        assert "it would have resumed at epoch 1, step 10, after 10 steps" in message
    assert "Resuming from backup-0 instead, at epoch 1, step 5, after 5 steps" in message
    _assert_same_training(expected, got)


def test_when_every_backup_is_damaged_fit_stops_and_says_how_to_start_over(tmp_path: Path) -> None:
    _, run = _interrupted_with_two_backups(tmp_path)
    for backup in ("backup-0", "backup-1"):
        _flip_a_bit(_weights_file(run / backup))
    model = _resumable_model()
    weights = [w.copy() for w in model.get_weights()]
    with pytest.raises(custom_fit.DamagedBackupError) as raised:
        model.fit(
            **crash_cases.INPUTS["arrays"](), epochs=3, verbose=0, callbacks=[custom_fit.BackupAndRestore(run, 5)]
        )
    message = str(raised.value)
    assert f"No intact backup in {run}: backup-1: {_weights_file(run / 'backup-1').name} has another CRC-32" in message
    assert f"Fix: to start over, move {run} aside (or delete it) and run again" in message
    assert all(np.array_equal(a, b) for a, b in zip(weights, model.get_weights(), strict=True))  # nothing loaded
    assert sorted(p.name for p in run.glob("backup-*")) == ["backup-0", "backup-1"]  # nothing removed or written


def test_max_to_keep_backups_stay_and_a_damaged_one_is_removed_by_the_next_write(tmp_path: Path) -> None:
    _, run = _interrupted_with_two_backups(tmp_path)
    _flip_a_bit(run / "backup-1" / "state.npz")
    model = _resumable_model()
    callbacks = [custom_fit.BackupAndRestore(run, 5, max_to_keep=3, delete_checkpoint=False), crash_cases.Interrupt(6)]
    with pytest.warns(custom_fit.DamagedBackupWarning), pytest.raises(KeyboardInterrupt):
        model.fit(**crash_cases.INPUTS["arrays"](), epochs=3, verbose=0, callbacks=callbacks)
    # Resumed at step 5, stopped after step 11: the backup after step 10 (backup-2) removed the damaged backup-1.
    assert sorted(p.name for p in run.glob("backup-*")) == ["backup-0", "backup-2"]


@pytest.mark.parametrize("max_to_keep", [0, 1.5])
def test_max_to_keep_is_checked(tmp_path: Path, max_to_keep: Any) -> None:
    with pytest.raises(ValueError, match=r"max_to_keep is how many backups stay, at least 1; received"):
        custom_fit.BackupAndRestore(tmp_path, max_to_keep=max_to_keep)


def test_epoch_backups_resume_exactly(tmp_path: Path) -> None:
    """Both Kerases; no Dropout, whose Keras 2 masks come from TensorFlow's unsaved global generator.

    The arrays are shuffled on both: tf_keras draws each epoch's order from one stateful
    ``tf.random.shuffle`` op in a pipeline over all epochs, which the resumed fit reads on from where
    the interrupted one was (tf_keras' own loop started a resumed fit's data afresh).
    """

    def build() -> keras.Model:
        model = custom_fit.CustomSequential([keras.Input((6,)), keras.layers.Dense(8, "relu"), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse", metrics=["mae"])
        return model

    def inputs() -> dict[str, Any]:
        return crash_cases.array_input()

    expected = _fit(build, inputs, tmp_path / "uninterrupted", "epoch")
    assert _fit(build, inputs, tmp_path / "run", "epoch", interrupt_at=20)[1] is None
    got = _fit(build, inputs, tmp_path / "run", "epoch")
    assert len(got[1].epoch) == 2  # resumed after the first epoch
    _assert_same_training(expected, got)


def test_a_completed_fit_deletes_its_backups_and_the_next_fit_starts_at_its_initial_epoch(tmp_path: Path) -> None:
    model = _small_model()
    x, y = np.zeros((8, 2)), np.zeros((8, 1))
    model.fit(x, y, epochs=2, verbose=0, callbacks=[custom_fit.BackupAndRestore(tmp_path / "b")])
    assert not (tmp_path / "b").exists()
    assert len(model.fit(x, y, epochs=2, verbose=0).epoch) == 2


# --------------------------------------------------------------------------
# The kill harness
# --------------------------------------------------------------------------

# Per scenario, at seeded random moments, one process killed in each of these places: KILLS
# kills in all, then a last process that completes. Each kill costs a process start (TensorFlow
# import, build, trace: about 13 s of CPU).
KILLS = ("step", "step", "write", "write", "restore", "cleanup")
TRIGGERS = {  # the line a process prints, the n-th occurrence (random in the range), the kill's delay after it
    "step": ("STEP", (1, 10), crash_cases.STEP_SECONDS),
    "write": ("WRITING", (1, 2), 0.9 * crash_cases.PAUSE),
    "restore": ("RESTORING", (1, 1), 0.9 * crash_cases.PAUSE),
    "cleanup": ("DELETING", (1, 1), 0.9 * crash_cases.PAUSE),
}
# `make test` kills these (a step backup of arrays with Dropout and shuffle; named optimizers
# reading one tf.data iterator across epochs; a GAN); `make test-crash` (--crash-all) every scenario.
CI_SCENARIOS = ("dropout_arrays", "gan_bce_arrays", "named_optimizers_repeated_tf_data")


@dataclasses.dataclass
class KillReport:
    kills: dict[str, int] = dataclasses.field(default_factory=dict)
    restarts: int = 0


def kill_order(rng: random.Random, kills: tuple[str, ...]) -> list[str]:
    """``kills`` in a random order that each can happen in: ``cleanup`` last (the process must finish training)."""
    order = [kind for kind in kills if kind != "cleanup"]
    rng.shuffle(order)
    return order + [kind for kind in kills if kind == "cleanup"]


def _scenario_environment() -> dict[str, str]:
    # oneDNN off: the harness compares runs of separate processes, which must train bit for bit
    # alike. From Keras 3.16 the step is traced with static batch shapes, and with oneDNN's kernels
    # for those, uninterrupted runs of gan_hinge_tf_data differed (by up to 6.9e-6) in 3 of 16
    # processes on a loaded 2-core machine; with oneDNN off in 0 of 16, and with the batch fetched
    # inside the compiled step as on Keras 3.8-3.15 (forced on 3.16) in 0 of 12.
    return {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "0"}


def _scenario_command(workdir: Path, scenario: str, *options: str, result: str = "result.npz") -> list[str]:
    """The command that runs ``scenario`` with its backups in ``workdir/backup`` (``tests/crash_cases.py``)."""
    return [
        sys.executable,
        "-m",
        "tests.crash_cases",
        scenario,
        str(workdir / "backup"),
        str(workdir / result),
        *options,
    ]


def run_with_kills(scenario: str, workdir: Path, seed: int, kills: tuple[str, ...] = KILLS) -> KillReport:
    """Runs ``tests/crash_cases.py scenario`` until it completes, killing it once per entry of ``kills``.

    Each process but the last is killed with SIGKILL where its kind says
    (see ``TRIGGERS``): a random time after its r-th step (r in 1..10), inside
    its n-th backup write (n in 1..2, the write lasts at least 50 ms), while
    it restores a backup in ``on_train_begin``, or while the final deletion
    in ``on_train_end`` deletes the last backup's files. A restore kill waits
    for a process that has a backup to restore; the cleanup kill comes last,
    so that a process trains to the end; the process after it starts afresh.
    A process killed at a step trains at most 10 steps of the 90, so the run
    cannot complete before its last kill.
    """
    rng = random.Random(seed)
    pending = kill_order(rng, kills)
    report = KillReport()
    env = _scenario_environment()
    backup_dir = workdir / "backup"
    command = _scenario_command(workdir, scenario)
    while True:
        has_backup = bool(BackupStore(backup_dir).backups())
        kind = next((k for k in pending if k != "restore" or has_backup), None)
        line, (low, high), longest_delay = TRIGGERS[kind] if kind else ("", (0, 0), 0.0)
        occurrence, delay = rng.randint(low, high), rng.uniform(0, longest_delay)
        with (
            open(workdir / "stderr.txt", "w") as stderr,
            subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env, cwd=ROOT) as process,
        ):
            report.restarts += 1
            seen = 0
            assert process.stdout is not None
            for output in process.stdout:  # read to the end: a full pipe would block the worker
                if kind and output.strip() == line:
                    seen += 1
                    if seen == occurrence:
                        threading.Timer(delay, process.kill).start()
            returncode = process.wait(timeout=600)
        if returncode == 0:
            assert not pending, f"the run completed before the kills {pending} (killed: {report.kills})"
            return report
        assert returncode == -signal.SIGKILL, (workdir / "stderr.txt").read_text()[-3000:]
        assert kind is not None
        if kind == "write":  # killed inside a write (in the background: training went on): not renamed in yet
            assert list(backup_dir.glob(".writing-*")), sorted(p.name for p in backup_dir.iterdir())
        pending.remove(kind)
        report.kills[kind] = report.kills.get(kind, 0) + 1


def _max_difference(expected: Path, got: Path) -> float:
    with np.load(expected) as want, np.load(got) as have:
        assert sorted(want.files) == sorted(have.files)
        keys = [k for k in want.files if k != "epochs_run"]
        return max(float(np.max(np.abs(want[k] - have[k]), initial=0.0)) for k in keys)


@pytest.fixture(scope="module")
def uninterrupted_results(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Runs a scenario once without kills (lazily, once per module), returning its result file."""
    results: dict[str, Path] = {}

    def result(scenario: str) -> Path:
        if scenario not in results:
            workdir = tmp_path_factory.mktemp(f"uninterrupted_{scenario}")
            run_with_kills(scenario, workdir, seed=0, kills=())
            results[scenario] = workdir / "result.npz"
        return results[scenario]

    return result


@pytest.mark.slow
@pytest.mark.keras3
@pytest.mark.parametrize(
    "scenario",
    [s if s in CI_SCENARIOS else pytest.param(s, marks=pytest.mark.crash_all) for s in sorted(crash_cases.SCENARIOS)],
)
def test_sigkill_at_random_moments_changes_nothing(scenario: str, tmp_path: Path, uninterrupted_results: Any) -> None:
    report = run_with_kills(scenario, tmp_path, seed=sorted(crash_cases.SCENARIOS).index(scenario))
    difference = _max_difference(uninterrupted_results(scenario), tmp_path / "result.npz")
    print(f"\nkill harness: {scenario}: {json.dumps(dataclasses.asdict(report))}, max |difference| {difference}")
    assert report.kills == collections.Counter(KILLS)
    assert difference == 0.0
    assert not (tmp_path / "backup").exists(), "the completed run deletes its backups and what kills left"


@pytest.mark.slow
@pytest.mark.keras3  # on Keras 2 the keras.io GAN draws noise from tf.random, whose state no Keras 2 format saves
def test_sigkill_between_epochs_resumes_a_keras_io_gan_under_mirrored_strategy(
    tmp_path: Path, uninterrupted_results: Any
) -> None:
    """Attribute optimizers, a custom compile, two replicas: killed in two epoch-end backup writes, resumed."""
    scenario = "keras_io_gan_mirrored"
    report = run_with_kills(scenario, tmp_path, seed=0, kills=("write", "write"))
    difference = _max_difference(uninterrupted_results(scenario), tmp_path / "result.npz")
    print(f"\nkill harness: {scenario}: {json.dumps(dataclasses.asdict(report))}, max |difference| {difference}")
    assert report == KillReport(kills={"write": 2}, restarts=3)
    with np.load(tmp_path / "result.npz") as result:
        assert result["epochs_run"] < crash_cases.EPOCHS  # the last process resumed from a backup
    assert difference == 0.0


# --------------------------------------------------------------------------
# Preemption notices: SIGTERM
# --------------------------------------------------------------------------


def _run_until_sigterm(
    workdir: Path, scenario: str, save_freq: str, after_steps: int, send: int = signal.SIGTERM
) -> tuple[int, str, float]:
    """Runs ``scenario``, sends ``send`` after its ``after_steps``-th step; ``(status, stderr, seconds to exit)``.

    A ``SIGKILL`` goes to a run that writes each backup before training goes on: these tests check
    the position after the newest backup, and a kill soon after a backup written in the background
    can land while it is written (the run then resumes from the one before: ``run_with_kills``).
    """
    options = ("--no-background",) if send == signal.SIGKILL else ()
    command, env = _scenario_command(workdir, scenario, "--save-freq", save_freq, *options), _scenario_environment()
    sent = None
    with (
        open(workdir / "stderr.txt", "w") as stderr,
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env, cwd=ROOT) as process,
    ):
        assert process.stdout is not None
        steps = 0
        for output in process.stdout:
            steps += output.strip() == "STEP"
            if steps == after_steps and sent is None:
                process.send_signal(send)
                sent = time.monotonic()
        status = process.wait(timeout=600)
    assert sent is not None, "the run ended before the SIGTERM"
    return status, (workdir / "stderr.txt").read_text(), time.monotonic() - sent


def _steps_of_a_complete_run(workdir: Path, scenario: str, save_freq: str) -> int:
    """Runs ``scenario`` to its end (resuming from ``workdir``'s backup); the number of steps it trained."""
    command = _scenario_command(workdir, scenario, "--save-freq", save_freq)
    done = subprocess.run(command, capture_output=True, text=True, env=_scenario_environment(), cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.split().count("STEP")


@pytest.mark.slow
def test_sigterm_saves_at_the_next_step_and_the_restart_resumes_there(
    tmp_path: Path, uninterrupted_results: Any
) -> None:
    """With save_freq="epoch" too: the restart trains only the steps after the SIGTERM, and equals a run without it.

    Keras 2: a model without random layers (tf_keras' layers draw from TensorFlow's unsaved global generator).
    """
    scenario = "dense_arrays" if KERAS_2 else "dropout_arrays"
    status, stderr, seconds = _run_until_sigterm(tmp_path, scenario, "epoch", after_steps=20)
    assert status == 143, stderr[-3000:]
    saved = re.search(r"SIGTERM received; saved a backup at epoch 2, step (\d+) in .*Exiting with status 143", stderr)
    assert saved, stderr[-3000:]
    print(f"\nSIGTERM to exit: {seconds:.2f} s (saved at epoch 2, step {saved[1]})")
    trained_before = crash_cases.SAMPLES // crash_cases.BATCH + int(saved[1])  # epoch 1, then epoch 2's first steps
    assert _steps_of_a_complete_run(tmp_path, scenario, "epoch") == 90 - trained_before
    assert _max_difference(uninterrupted_results(scenario), tmp_path / "result.npz") == 0.0


def test_sigterm_after_fit_ends_the_process_as_before() -> None:
    """The handler is put back when fit ends, and a fit that raised no longer holds SIGTERM either."""
    script = (
        "import os, signal, numpy as np, tempfile, custom_fit\n"
        "from custom_fit import keras\n"
        "model = custom_fit.CustomSequential([keras.Input((2,)), keras.layers.Dense(1)])\n"
        "model.compile(optimizer='sgd', loss='mse')\n"
        "class Boom(keras.callbacks.Callback):\n"
        "    def on_train_batch_end(self, batch, logs=None):\n"
        "        raise RuntimeError('boom')\n"
        "backup = custom_fit.BackupAndRestore(tempfile.mkdtemp())\n"
        "try:\n"
        "    model.fit(np.zeros((8, 2)), np.zeros((8, 1)), callbacks=[backup, Boom()], verbose=0)\n"
        "except RuntimeError:\n"
        "    pass\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "import time; time.sleep(30)\n"
        "print('still running')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == -signal.SIGTERM, (done.returncode, done.stdout, done.stderr[-3000:])
    assert "still running" not in done.stdout


# --------------------------------------------------------------------------
# One backup_dir for a MultiWorkerMirroredStrategy cluster
# --------------------------------------------------------------------------


class ClusterRun(NamedTuple):
    """What ``_run_cluster`` saw of a two-worker run.

    Attributes:
        statuses: Each worker's exit status.
        steps: How many steps each worker trained.
        seconds_to_exit: From the first signal sent to the last worker's exit (``None``: no signal).
    """

    statuses: list[int]
    steps: list[int]
    seconds_to_exit: float | None


def _run_cluster(
    workdir: Path,
    kill: tuple[tuple[int, ...], str, int] | None = None,
    send: int = signal.SIGKILL,
    save_freq: str = "5",
    scenario: str = "dropout_arrays",
    options: tuple[str, ...] = (),
) -> ClusterRun:
    """Runs ``scenario`` as two workers on 127.0.0.1 sharing ``workdir/backup``, until both exit.

    ``kill=(workers, kind, n)``: send ``send`` to those workers at the ``n``-th ``kind`` of
    ``TRIGGERS`` (``"step"``: after their ``n``-th step; ``"write"``, ``"restore"``: inside it). When a worker
    fails (other than by a preemption exit, after which every worker exits by itself) the other one
    is killed too, as an orchestrator restarting the whole cluster would (it would wait for the
    failed one in its next collective).
    """
    from tests.end_to_end.test_distribute import free_ports

    ports = ",".join(map(str, free_ports(2)))
    workers = []
    for index in range(2):
        worker_options = ("--worker", str(index), "--ports", ports, "--save-freq", save_freq, *options)
        command = _scenario_command(workdir, scenario, *worker_options, result=f"result_w{index}.npz")
        with open(workdir / f"stderr_w{index}.txt", "w") as stderr:
            workers.append(
                subprocess.Popen(
                    command, stdout=subprocess.PIPE, stderr=stderr, text=True, env=_scenario_environment(), cwd=ROOT
                )
            )
    seen = [collections.Counter[str](), collections.Counter[str]()]
    sent: list[float] = []
    exited = [0.0, 0.0]

    def watch(index: int) -> None:
        for output in workers[index].stdout or ():
            seen[index][output.strip()] += 1
            if kill is not None and index in kill[0]:
                line, _, delay = TRIGGERS[kill[1]]
                if output.strip() == line and seen[index][line] == kill[2]:
                    time.sleep(delay)
                    workers[index].send_signal(send)
                    sent.append(time.monotonic())
        status = workers[index].wait()
        exited[index] = time.monotonic()
        if status not in (0, PREEMPTION_EXIT_CODE):
            workers[1 - index].kill()

    watchers = [threading.Thread(target=watch, args=(index,)) for index in range(2)]
    for watcher in watchers:
        watcher.start()
    try:
        for watcher in watchers:
            watcher.join(timeout=600)
        statuses = [worker.wait(timeout=60) for worker in workers]
        return ClusterRun(statuses, [counts["STEP"] for counts in seen], max(exited) - min(sent) if sent else None)
    finally:
        for worker in workers:
            worker.kill()
            worker.wait()
            if worker.stdout is not None:
                worker.stdout.close()


@pytest.fixture(scope="module")
def uninterrupted_cluster(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory of one uninterrupted two-worker run (its ``result_w0.npz``, ``result_w1.npz``)."""
    reference = tmp_path_factory.mktemp("uninterrupted_cluster")
    statuses = _run_cluster(reference).statuses
    assert statuses == [0, 0], (reference / "stderr_w0.txt").read_text()[-3000:]
    assert not (reference / "backup").exists(), "the chief deletes the backups at the end"
    return reference


def _assert_cluster_equals(reference: Path, run: Path) -> None:
    """Both workers of ``run`` resumed and ended with ``reference``'s weights, optimizer state and history."""
    for index in range(2):
        with np.load(run / f"result_w{index}.npz") as result:
            assert result["epochs_run"] < crash_cases.EPOCHS  # the last run resumed
        difference = _max_difference(reference / f"result_w{index}.npz", run / f"result_w{index}.npz")
        assert difference == 0.0, f"worker {index}: max |difference| {difference}"


@pytest.mark.slow
@pytest.mark.keras3
@pytest.mark.xdist_group("multi_worker")
def test_a_cluster_shares_one_backup_dir_and_survives_a_sigkill_of_either_worker_anywhere(
    tmp_path: Path, uninterrupted_cluster: Path
) -> None:
    """Every worker passes the same backup_dir; the chief writes; kills at steps, in writes and restores."""
    kills = [  # (victim, kind, n), each in a cluster restarted after the one before
        (1, "step", 33),  # the non-chief in epoch 3
        (0, "write", 2),  # the chief inside its second backup write (files complete, not renamed in)
        (0, "restore", 1),  # the chief while it loads the backup
        (1, "restore", 1),  # the non-chief while it loads the backup
        (0, "step", 20),  # the chief, a few steps into the restart
    ]
    for victim, kind, n in kills:
        statuses = _run_cluster(tmp_path, kill=((victim,), kind, n)).statuses
        assert statuses == [-signal.SIGKILL] * 2, (victim, kind, n, (tmp_path / "stderr_w0.txt").read_text()[-3000:])
    statuses = _run_cluster(tmp_path).statuses
    assert statuses == [0, 0], (tmp_path / "stderr_w0.txt").read_text()[-3000:]
    _assert_cluster_equals(uninterrupted_cluster, tmp_path)


@pytest.mark.slow
@pytest.mark.keras3
@pytest.mark.xdist_group("multi_worker")
def test_a_backup_damaged_on_one_worker_makes_every_worker_resume_from_the_one_before(
    tmp_path: Path, uninterrupted_cluster: Path
) -> None:
    """Each worker sees its own copy of the backups; the non-chief's newest has a flipped bit. Both resume from
    the backup before it (the chief's own copy is intact), and end as an uninterrupted cluster."""
    statuses = _run_cluster(tmp_path, kill=((1,), "step", 13), options=("--own-dirs",)).statuses
    assert statuses == [-signal.SIGKILL] * 2, (tmp_path / "stderr_w0.txt").read_text()[-3000:]
    chief, other = tmp_path / "backup-w0", tmp_path / "backup-w1"
    shutil.copytree(chief, other, ignore=shutil.ignore_patterns(".lock"))
    newest = sorted(other.glob("backup-*"), key=lambda path: int(path.name.split("-")[1]))[-1]
    _flip_a_bit(_weights_file(newest))
    statuses = _run_cluster(tmp_path, options=("--own-dirs",)).statuses
    stderr = [(tmp_path / f"stderr_w{index}.txt").read_text() for index in range(2)]
    assert statuses == [0, 0], stderr[0][-3000:]
    assert f"{newest.name}: (on another worker) failed its check there" in stderr[0]
    assert f"{newest.name}: {_weights_file(newest).name} has another CRC-32" in stderr[1]
    assert all("Resuming from backup-0 instead, at epoch 1, step 5, after 5 steps" in text for text in stderr)
    for index in range(2):  # resumed inside the first epoch: every epoch ran, and ended as never interrupted
        assert _max_difference(uninterrupted_cluster / f"result_w{index}.npz", tmp_path / f"result_w{index}.npz") == 0


@pytest.mark.slow
def test_a_sigkill_while_falling_back_leaves_the_backups_and_the_run_resumes_exactly(
    tmp_path: Path, uninterrupted_results: Any
) -> None:
    """The newest backup damaged, the process killed while it loads the one before: nothing is lost."""
    scenario = "dense_arrays" if KERAS_2 else "dropout_arrays"
    status, stderr, _ = _run_until_sigterm(tmp_path, scenario, "5", after_steps=13, send=signal.SIGKILL)
    assert status == -signal.SIGKILL, stderr[-3000:]
    backups = sorted(BackupStore(tmp_path / "backup").backups(), key=lambda path: int(path.name.split("-")[1]))
    assert [path.name for path in backups] == ["backup-0", "backup-1"]
    _flip_a_bit(_weights_file(backups[-1]))
    report = run_with_kills(scenario, tmp_path, seed=3, kills=("restore",))
    assert report.kills == {"restore": 1}
    assert "Resuming from backup-0 instead, at epoch 1, step 5, after 5 steps" in (tmp_path / "stderr.txt").read_text()
    assert _max_difference(uninterrupted_results(scenario), tmp_path / "result.npz") == 0.0


@pytest.mark.slow
@pytest.mark.keras3
@pytest.mark.xdist_group("multi_worker")
@pytest.mark.parametrize("signalled", [(1,), (0,), (0, 1)], ids=["worker", "chief", "both"])
def test_a_sigterm_saves_the_cluster_at_one_step_and_the_restart_resumes_there(
    signalled: tuple[int, ...], tmp_path: Path, uninterrupted_cluster: Path
) -> None:
    """save_freq="epoch": all workers save at the step after the signalled one's next, exit 143; nothing is lost."""
    statuses, _, seconds = _run_cluster(tmp_path, kill=(signalled, "step", 33), send=signal.SIGTERM, save_freq="epoch")
    stderrs = [(tmp_path / f"stderr_w{index}.txt").read_text() for index in range(2)]
    assert statuses == [PREEMPTION_EXIT_CODE] * 2, [stderr[-3000:] for stderr in stderrs]
    pattern = r"custom_fit.BackupAndRestore: ([^;]+); saved a backup at epoch (\d+), step (\d+) in "
    chief, worker = (re.search(pattern, stderr) for stderr in stderrs)
    assert chief and worker, [stderr[-3000:] for stderr in stderrs]
    assert [chief[1], worker[1]] == [
        "SIGTERM received" if index in signalled else "a worker got SIGTERM" for index in range(2)
    ]
    assert chief.groups()[1:] == worker.groups()[1:], "the workers saved at different steps"
    epoch, step = int(chief[2]), int(chief[3])
    trained_before = (epoch - 1) * (crash_cases.SAMPLES // crash_cases.BATCH) + step
    print(
        f"\ncluster SIGTERM after step 33 of workers {signalled}: both saved after step {trained_before}, "
        f"both exited {seconds:.2f} s after the signal"
    )
    # The signalled worker proposes at its next boundary and both save at the one after: one step later.
    assert trained_before in (34, 35), trained_before
    statuses, steps, _ = _run_cluster(tmp_path)
    assert statuses == [0, 0], (tmp_path / "stderr_w0.txt").read_text()[-3000:]
    assert steps == [90 - trained_before] * 2  # the restart trains only what was not trained
    _assert_cluster_equals(uninterrupted_cluster, tmp_path)


def _trained_steps(backup: Path) -> int:
    """The steps trained before ``backup`` (its ``meta.json``)."""
    return int(json.loads((backup / "meta.json").read_text())["trained_steps"])


def _saved_at(stderr: str) -> int:
    """The steps trained before the backup a preempted worker reports it saved (its stderr)."""
    found = re.search(r"saved a backup at epoch (\d+), step (\d+) in ", stderr)
    assert found, stderr[-3000:]
    return (int(found[1]) - 1) * (crash_cases.SAMPLES // crash_cases.BATCH) + int(found[2])


@pytest.mark.slow
@pytest.mark.keras2
@pytest.mark.xdist_group("multi_worker")
def test_a_keras_2_cluster_resumes_at_the_step_after_a_sigkill_or_a_sigterm(tmp_path: Path) -> None:
    """Keras 2: one backup_dir, a SIGKILL or a preemption mid-epoch, a restart at the step equal to no interruption.

    Backups every 4 steps of 15-step epochs, shuffled arrays (each worker its shard), a model
    without random layers (tf_keras' layers draw from TensorFlow's unsaved global generator).
    """
    runs = {name: tmp_path / name for name in ("uninterrupted", "sigkill", "sigterm")}
    for workdir in runs.values():
        workdir.mkdir()
    options: dict[str, Any] = {"save_freq": "4", "scenario": "dense_arrays"}
    assert _run_cluster(runs["uninterrupted"], **options).statuses == [0, 0]
    assert _run_cluster(runs["sigkill"], kill=((1,), "step", 33), **options).statuses == [-signal.SIGKILL] * 2
    statuses = _run_cluster(runs["sigterm"], kill=((0,), "step", 33), send=signal.SIGTERM, **options).statuses
    assert statuses == [PREEMPTION_EXIT_CODE] * 2, (runs["sigterm"] / "stderr_w0.txt").read_text()[-3000:]
    preempted_at = _saved_at((runs["sigterm"] / "stderr_w0.txt").read_text())
    assert preempted_at in (34, 35), preempted_at  # the step after the signalled worker's next one
    # The backup after step 32 (epoch 3, step 2) is written in the background: the SIGKILL after step 33
    # finds it on disk or still being written, and then the one after step 28 is the newest.
    killed_at = _trained_steps(BackupStore(runs["sigkill"] / "backup").backups()[0])
    assert killed_at in (28, 32), killed_at
    for name, trained_before in (("sigkill", killed_at), ("sigterm", preempted_at)):
        statuses, steps, _ = _run_cluster(runs[name], **options)
        assert statuses == [0, 0], (runs[name] / "stderr_w0.txt").read_text()[-3000:]
        assert steps == [90 - trained_before] * 2, name  # the restart trains only what was not trained
        _assert_cluster_equals(runs["uninterrupted"], runs[name])


@pytest.mark.slow
def test_a_sigkill_mid_accumulation_resumes_with_the_accumulated_gradients(
    tmp_path: Path, uninterrupted_results: Any
) -> None:
    """compile(gradient_accumulation_steps=4), backups every 5 steps, SIGKILL after step 7 (both Kerases).

    The backup at step 5 holds one accumulated step's gradient (an update came at step 4); the
    restart trains the 85 steps after it and ends equal to an uninterrupted run, so the accumulators
    and their count were saved and restored.
    """
    scenario = "accumulating_dense_arrays"
    status, stderr, _ = _run_until_sigterm(tmp_path, scenario, "5", after_steps=7, send=signal.SIGKILL)
    assert status == -signal.SIGKILL, stderr[-3000:]
    assert _steps_of_a_complete_run(tmp_path, scenario, "5") == 90 - 5
    assert _max_difference(uninterrupted_results(scenario), tmp_path / "result.npz") == 0.0


@pytest.mark.slow
@pytest.mark.keras2
def test_keras_2_sigkill_after_step_6_of_15_resumes_at_step_5(tmp_path: Path, uninterrupted_results: Any) -> None:
    """Keras 2: a SIGKILL mid-epoch (backups every 5 steps); the restart trains only the 85 steps after the backup."""
    status, stderr, _ = _run_until_sigterm(tmp_path, "dense_arrays", "5", after_steps=6, send=signal.SIGKILL)
    assert status == -signal.SIGKILL, stderr[-3000:]
    assert _steps_of_a_complete_run(tmp_path, "dense_arrays", "5") == 90 - 5  # resumed at epoch 1, step 5
    assert _max_difference(uninterrupted_results("dense_arrays"), tmp_path / "result.npz") == 0.0


@pytest.mark.slow
@pytest.mark.keras2
def test_keras_2_sigkill_mid_epoch_resumes_at_the_step(tmp_path: Path, uninterrupted_results: Any) -> None:
    """Keras 2: SIGKILLs after steps, inside a write and a restore; each restart resumes mid-epoch, exactly.

    Backups every 5 steps of 15-step epochs (``dense_arrays``: shuffled arrays, no random layer); a
    process killed at a step trains at most 10, so most restarts resume inside an epoch.
    """
    kills = ("step", "step", "write", "restore")
    report = run_with_kills("dense_arrays", tmp_path, seed=11, kills=kills)
    difference = _max_difference(uninterrupted_results("dense_arrays"), tmp_path / "result.npz")
    print(f"\nkill harness (Keras 2): {json.dumps(dataclasses.asdict(report))}, max |difference| {difference}")
    assert report.kills == collections.Counter(kills)
    assert difference == 0.0
    assert not (tmp_path / "backup").exists()


@pytest.mark.slow
@pytest.mark.keras3
@pytest.mark.xdist_group("multi_worker")
def test_another_run_on_a_clusters_backup_dir_is_refused(tmp_path: Path) -> None:
    """The chief locks backup_dir as a single process does: another run (here this process) keeps it."""
    other = BackupStore(tmp_path / "backup")
    other.acquire()
    try:
        statuses = _run_cluster(tmp_path).statuses
    finally:
        other.release()
    assert statuses[0] != 0
    assert "BackupDirectoryInUseError" in (tmp_path / "stderr_w0.txt").read_text()
