"""``fit(validation_freq=custom_fit.Steps(N))`` (``custom_fit._trainer.validation``), on both Kerases.

Plain Keras has no reference for validation inside an epoch, so each run is
checked against what it promises: a run after step k·N evaluates the weights
the model had after that step (a snapshot ``evaluate`` equals the run's
values exactly), training is unchanged by the runs (weights equal a ``fit``
without validation, bit for bit), and each callback sees the hooks the module
docstring lists. Under ``MirroredStrategy`` and two MWMS workers:
``tests/test_distribute.py`` (groups ``mirrored_parity`` and ``worker``); a
SIGKILL between two runs: the end of this module.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import custom_fit
from custom_fit import keras
from custom_fit._trainer.progress import Progress
from custom_fit._trainer.validation import ValidationSchedule

ROOT = Path(__file__).resolve().parents[2]
RNG = np.random.default_rng(0)
X = RNG.normal(size=(64, 3)).astype("float32")
Y = (X @ RNG.normal(size=(3, 1))).astype("float32")
X_VAL, Y_VAL = X[:24], Y[:24] + 0.5


def model(steps_per_execution: Any = 1, lr: float = 0.05) -> keras.Model:
    keras.utils.set_random_seed(3)
    net = custom_fit.CustomSequential(
        [keras.Input((3,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(1)]
    )
    net.compile(
        optimizer=keras.optimizers.SGD(lr), loss="mse", metrics=["mae"], steps_per_execution=steps_per_execution
    )
    return net


class Snapshots(keras.callbacks.Callback):
    """Monitors (so it sees each run): keeps the weights and the logs of each run."""

    monitor = "val_loss"

    def __init__(self) -> None:
        super().__init__()
        self.weights: list[list[np.ndarray]] = []
        self.calls: list[tuple[int, dict[str, Any]]] = []

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.weights.append(self.model.get_weights())
        self.calls.append((epoch, dict(logs)))


class Hooks(keras.callbacks.Callback):
    """Monitors nothing: records the hooks it sees, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[Any, ...]] = []

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.seen.append(("epoch_begin", epoch))

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.seen.append(("epoch_end", epoch, dict(logs)))

    def on_test_begin(self, logs: Any = None) -> None:
        self.seen.append(("test_begin",))

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        self.seen.append(("batch_begin", batch))

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.seen.append(("batch_end", batch))


def fit(net: keras.Model, every: int | None, **kwargs: Any) -> Any:
    keras.utils.set_random_seed(5)  # the same shuffle for every fit
    if every is not None:
        kwargs.update(validation_data=(X_VAL, Y_VAL), validation_freq=custom_fit.Steps(every))
    return net.fit(X, Y, batch_size=4, epochs=kwargs.pop("epochs", 2), verbose=0, **kwargs)


def evaluate_at(weights: list[np.ndarray]) -> dict[str, float]:
    net = model()
    net.set_weights(weights)
    return {f"val_{k}": v for k, v in net.evaluate(X_VAL, Y_VAL, batch_size=4, verbose=0, return_dict=True).items()}


# --------------------------------------------------------------------------
# The schedule and its errors
# --------------------------------------------------------------------------


@pytest.mark.parametrize("every", [0, -3, 2.5, True, "10", None])
def test_steps_takes_a_whole_number_of_steps_and_says_how_to_fix(every: Any) -> None:
    with pytest.raises(ValueError, match=r"Steps\(every\) expects a whole number of training steps >= 1; received"):
        custom_fit.Steps(every)


def test_steps_without_validation_data_says_what_is_missing() -> None:
    with pytest.raises(ValueError, match=r"received no validation data .* Fix: pass validation_data="):
        model().fit(X, Y, validation_freq=custom_fit.Steps(4), verbose=0)


def test_the_schedule_counts_steps_across_epochs_and_caps_executions() -> None:
    schedule = ValidationSchedule(custom_fit.Steps(10))
    assert [t for t in range(1, 33) if schedule.due(t)] == [10, 20, 30]
    assert [schedule.run_index(t) for t in (10, 20, 30)] == [0, 1, 2]
    progress = Progress()
    capped = schedule.capped(lambda remaining: 4, progress)
    executions = []
    while progress.trained_steps < 32:  # a plan of 4 steps per execution, cut at each run
        executions.append(capped(None))
        progress.execution_ends(progress.trained_steps + executions[-1])
    assert executions == [4, 4, 2, 4, 4, 2, 4, 4, 2, 4]


# --------------------------------------------------------------------------
# What each run evaluates, and that training does not change
# --------------------------------------------------------------------------


def test_runs_after_every_n_steps_evaluate_the_weights_of_that_step() -> None:
    """32 steps (2 epochs of 16), Steps(10): runs after steps 10, 20, 30, each evaluate() of that step's weights."""
    snapshots = Snapshots()
    net = model()
    history = fit(net, 10, callbacks=[snapshots])
    assert history.history["val_step"] == [10, 20, 30]
    assert len(history.history["loss"]) == 2 and history.epoch == [0, 1]
    assert [epoch for epoch, _ in snapshots.calls] == [0, 1, 2]  # the monitors' epochs are the runs
    for i, weights in enumerate(snapshots.weights):
        for name, value in evaluate_at(weights).items():
            assert history.history[name][i] == value, (i, name)
            assert snapshots.calls[i][1][name] == value
    plain = model()
    plain_history = fit(plain, None)
    for have, want in zip(net.get_weights(), plain.get_weights(), strict=True):
        np.testing.assert_array_equal(have, want)  # validation changes no training step
    # nor the training metrics: evaluate resets the metrics it shares with training, the loop puts them back
    assert {k: history.history[k] for k in ("loss", "mae")} == plain_history.history
    assert int(net.optimizer.iterations) == 32


def test_monitors_see_the_training_metrics_of_the_epoch_so_far() -> None:
    """A run's logs hold the training metrics as they stand after the run's step (here step 10 of a 16-step epoch)."""
    snapshots = Snapshots()

    class TrainLogs(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.at_step_10: dict[str, float] = {}

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if batch == 9:
                self.at_step_10 = {k: float(v) for k, v in logs.items()}

    train_logs = TrainLogs()
    fit(model(), 10, callbacks=[train_logs, snapshots], epochs=1)
    first_run = snapshots.calls[0][1]
    assert {k: first_run[k] for k in ("loss", "mae")} == pytest.approx(train_logs.at_step_10, rel=0, abs=0)


def test_other_callbacks_see_the_data_epochs_with_the_last_run_of_each() -> None:
    hooks, snapshots = Hooks(), Snapshots()
    history = fit(model(), 10, callbacks=[hooks, snapshots])
    epoch_ends = [item for item in hooks.seen if item[0] == "epoch_end"]
    assert [item[1] for item in epoch_ends] == [0, 1]
    first, second = epoch_ends[0][2], epoch_ends[1][2]
    assert first["val_loss"] == history.history["val_loss"][0]  # the run after step 10, in epoch 0
    assert second["val_loss"] == history.history["val_loss"][2]  # the run after step 30, in epoch 1
    assert first["loss"] == history.history["loss"][0] and second["loss"] == history.history["loss"][1]
    assert sum(item == ("test_begin",) for item in hooks.seen) == 3  # each run is an evaluate with fit's callbacks
    # each run comes right after its step's batch hook: steps 10, 20, 30 are batches 9, 3 (of epoch 1), 13
    order = [item[:2] for item in hooks.seen if item[0] in ("batch_end", "test_begin")]
    assert [order[i - 1] for i, item in enumerate(order) if item == ("test_begin",)] == [
        ("batch_end", 9),
        ("batch_end", 3),
        ("batch_end", 13),
    ]


def test_an_epoch_without_a_run_logs_no_validation_values() -> None:
    hooks = Hooks()
    history = fit(model(), 20, callbacks=[hooks], epochs=3)  # 48 steps: runs after 20 and 40 (epochs 1 and 2)
    epoch_ends = [item[2] for item in hooks.seen if item[0] == "epoch_end"]
    assert "val_loss" not in epoch_ends[0]
    assert epoch_ends[1]["val_loss"] == history.history["val_loss"][0]
    assert history.history["val_step"] == [20, 40]


@pytest.mark.parametrize("steps_per_execution", [3, "auto"])
def test_fused_executions_end_at_runs_and_change_nothing(steps_per_execution: Any) -> None:
    """Executions of 3 steps (or the tuner's) stop at each run and epoch end: every value equals one step each."""
    hooks, fused_hooks = Hooks(), Hooks()
    unfused, fused = model(), model(steps_per_execution)
    expected = fit(unfused, 7, callbacks=[hooks])
    got = fit(fused, 7, callbacks=[fused_hooks])
    assert got.history == expected.history
    assert got.history["val_step"] == [7, 14, 21, 28]
    for have, want in zip(fused.get_weights(), unfused.get_weights(), strict=True):
        np.testing.assert_array_equal(have, want)
    # The runs inside epochs leave evaluate as compiled (Keras 2 built its test function for the
    # steps of the execution before a run once: evaluate then read 1 batch of each 3).
    assert fused.evaluate(X_VAL, Y_VAL, batch_size=4, verbose=0) == unfused.evaluate(
        X_VAL, Y_VAL, batch_size=4, verbose=0
    )
    if steps_per_execution == 3:  # executions' first steps: 1-3 4-6 7 | 8-10 11-13 14 | 15-16 (epoch end) | ...
        begins = [item[1] for item in fused_hooks.seen if item[0] == "batch_begin"]
        assert begins[:8] == [0, 3, 6, 7, 10, 13, 14, 0]


def test_data_of_unknown_length_validates_on_schedule() -> None:
    dataset = tf.data.Dataset.from_tensor_slices((X, Y)).filter(lambda x, y: True).batch(4)
    keras.utils.set_random_seed(5)
    with warnings.catch_warnings():  # Keras 3 warns when its first epoch finds the end, as for keras.Model
        warnings.filterwarnings("ignore", "Your input ran out of data", UserWarning)
        history = model().fit(
            dataset,
            epochs=2,
            validation_data=(X_VAL, Y_VAL),
            validation_freq=custom_fit.Steps(6),
            verbose=0,
            shuffle=False,
        )
    assert history.history["val_step"] == [6, 12, 18, 24, 30]


def test_an_int_validation_freq_keeps_counting_epochs() -> None:
    history = model().fit(X, Y, batch_size=4, epochs=3, validation_data=(X_VAL, Y_VAL), validation_freq=2, verbose=0)
    assert len(history.history["val_loss"]) == 1 and "val_step" not in history.history


# --------------------------------------------------------------------------
# Keras' monitoring callbacks act on every run, without changes
# --------------------------------------------------------------------------


def test_early_stopping_stops_inside_the_first_epoch_and_restores_the_best_run() -> None:
    """mode="max" on a falling val_loss: the first run stays the best; patience 2 stops after the third run.

    One epoch of 16 steps, Steps(4): the third run is after step 12, so fit stops there, inside epoch 0
    (Keras' EarlyStopping stops only after its epoch 0, which is the first run here).
    """
    snapshots = Snapshots()
    stopper = keras.callbacks.EarlyStopping(monitor="val_loss", mode="max", patience=2, restore_best_weights=True)
    net = model()
    history = fit(net, 4, callbacks=[snapshots, stopper], epochs=1)
    assert history.history["val_step"] == [4, 8, 12]
    assert int(net.optimizer.iterations) == 12  # stopped mid-epoch
    assert len(history.history["loss"]) == 1  # the stopped epoch still ends, as after a batch-level stop
    for have, want in zip(net.get_weights(), snapshots.weights[0], strict=True):
        np.testing.assert_array_equal(have, want)


def test_model_checkpoint_saves_the_best_run(tmp_path: Path) -> None:
    checkpoint = keras.callbacks.ModelCheckpoint(
        str(tmp_path / "run{epoch:02d}.weights.h5"), monitor="val_loss", save_best_only=True, save_weights_only=True
    )
    snapshots = Snapshots()
    history = fit(model(), 10, callbacks=[snapshots, checkpoint])
    losses = history.history["val_loss"]
    improving = [i for i, loss in enumerate(losses) if loss == min(losses[: i + 1])]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"run{i + 1:02d}.weights.h5" for i in improving]
    best = model()
    best.load_weights(str(tmp_path / f"run{improving[-1] + 1:02d}.weights.h5"))
    for have, want in zip(best.get_weights(), snapshots.weights[improving[-1]], strict=True):
        np.testing.assert_array_equal(have, want)


def test_reduce_lr_on_plateau_counts_runs() -> None:
    """mode="max" on a falling val_loss, patience 1: every run after the first halves the learning rate."""
    reduce = keras.callbacks.ReduceLROnPlateau(monitor="val_loss", mode="max", patience=1, factor=0.5, min_lr=0)
    net = model(lr=0.08)
    history = fit(net, 8, callbacks=[reduce])  # 32 steps: 4 runs
    assert len(history.history["val_step"]) == 4
    assert float(net.optimizer.learning_rate.numpy()) == pytest.approx(0.08 / 8, rel=1e-6)


# --------------------------------------------------------------------------
# Resume: a SIGKILL between two runs
# --------------------------------------------------------------------------


def _scenario(workdir: Path, after_steps: int | None) -> tuple[int, int]:
    """Runs tests/crash_cases.py's ``dense_arrays`` with runs every 7 steps; SIGKILL after ``after_steps`` steps.

    Returns ``(status, steps trained)``.
    """
    command = [
        sys.executable, "-m", "tests.crash_cases", "dense_arrays", str(workdir / "backup"), str(workdir / "result.npz"),
        "--save-freq", "5", "--validate-every", "7", "--no-background",  # the kill finds the newest backup written
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "0"}
    steps = 0
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=ROOT
    ) as run:
        assert run.stdout is not None
        for line in run.stdout:
            steps += line.strip() == "STEP"
            if steps == after_steps:
                run.send_signal(signal.SIGKILL)
        return run.wait(timeout=600), steps


@pytest.mark.slow
def test_a_sigkill_between_two_runs_resumes_the_schedule_exactly(tmp_path: Path) -> None:
    """Backups every 5 steps, runs every 7 (6 epochs of 15 steps): killed after step 72.

    Epoch 4 (steps 61-75) has runs after steps 63 and 70, then the backup at step 70. The restart
    trains steps 71-90 only, runs after 77 and 84 as the uninterrupted run does, with the same
    values, and epoch 4's logs keep the run of step 70 (its last, from the backup). No random
    layer (Keras 2's draw from TensorFlow's unsaved global generator).
    """
    assert _scenario(tmp_path / "uninterrupted", None) == (0, 90)
    status, _ = _scenario(tmp_path / "run", 72)
    assert status == -signal.SIGKILL
    assert _scenario(tmp_path / "run", None) == (0, 20)  # resumed after the backup at step 70
    with np.load(tmp_path / "uninterrupted" / "result.npz") as want, np.load(tmp_path / "run" / "result.npz") as have:
        runs_want, runs_have = json.loads(str(want["runs"])), json.loads(str(have["runs"]))
        assert runs_want["val_step"] == list(range(7, 91, 7))
        assert runs_have["val_step"] == [77, 84]
        assert {k: v[-2:] for k, v in runs_want.items()} == runs_have
        epochs_want, epochs_have = json.loads(str(want["epoch_logs"])), json.loads(str(have["epoch_logs"]))
        assert epochs_have == epochs_want[4:]  # epochs 4 and 5, val_* of the runs after steps 70 and 84
        assert epochs_have[0][1]["val_loss"] == runs_want["val_loss"][9]  # the run after step 70
        for name in set(want.files) - {"runs", "epoch_logs", "epochs_run"}:
            np.testing.assert_array_equal(have[name], want[name], err_msg=name)
