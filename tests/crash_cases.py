"""A training script that the kill harness (tests/test_backup_and_restore.py) runs, kills and restarts.

    python -m tests.crash_cases SCENARIO BACKUP_DIR RESULT.npz [--save-freq N] [--validate-every N] [--no-background]

Each scenario is a user's script: seed everything, build the model and the
data, ``fit`` with :class:`custom_fit.BackupAndRestore`. Run again after a
kill, it resumes from the backup. When ``fit`` completes it writes the model's
and the optimizers' variables and the last epoch's history to ``RESULT.npz``;
with ``--validate-every N`` (``validation_freq=custom_fit.Steps(N)``) also,
as JSON, the validation runs the ``History`` holds (``runs``) and each
epoch's logs as a callback that monitors nothing sees them (``epoch_logs``).

It prints, flushed, the lines the harness waits for: ``TRAINING`` when
``fit`` begins, ``STEP`` after each step, ``WRITING`` when a backup is taken
(its files, written in the background while training goes on, then pause
50 ms before their rename), ``RESTORING`` when a
backup is loaded (50 ms pause after loading, still inside ``on_train_begin``)
and ``DELETING`` when the final deletion deletes the last backup's files (half
of them, then a 50 ms pause), so that kills land inside each.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import tensorflow as tf

import custom_fit
from custom_fit import keras
from custom_fit._backup_store import BackupStore, PendingBackup, Restored

T = TypeVar("T")

EPOCHS = 6
SAMPLES = 120
BATCH = 8  # 15 steps per epoch, 90 in all
STEP_SECONDS = 0.01  # a pause after each step, for kills between and inside steps


PAUSE = 0.05  # seconds each announced operation lasts at least


class HarnessStore(BackupStore):
    """A ``BackupStore`` that announces writes, restores and the final deletion, and makes them last."""

    def __init__(self, directory: str | os.PathLike[str]):
        super().__init__(directory)
        self.clearing: str | None = None  # in the final deletion: the newest backup's name, which it removes last

    def begin(self) -> PendingBackup:
        pending = super().begin()
        print("WRITING", flush=True)  # on the training thread; the files are written in the background
        return pending

    def commit(self, pending: PendingBackup) -> Path:
        time.sleep(PAUSE)  # complete files, not yet renamed into place (training goes on meanwhile)
        return super().commit(pending)

    def load_latest(self, load: Callable[[Path], T], **kwargs: Any) -> Restored[T] | None:
        def slow_load(directory: Path) -> T:
            print("RESTORING", flush=True)
            loaded = load(directory)
            time.sleep(PAUSE)  # loaded into the model, fit not started yet
            return loaded

        return super().load_latest(slow_load, **kwargs)

    def clear(self) -> None:
        backups = self.backups()
        self.clearing = backups[0].name if backups else None
        super().clear()

    def delete_files(self, directory: Path) -> None:
        # The final deletion of the last backup (writes also delete the backups they replace, and the
        # final deletion removes the older ones first: a kill there leaves the newest, which a restart
        # resumes from, its training done).
        if self.clearing is not None and directory.name.endswith(self.clearing):
            files = sorted(path for path in directory.rglob("*") if path.is_file())
            for path in files[: len(files) // 2]:
                path.unlink()
            print("DELETING", flush=True)
            time.sleep(PAUSE)
        super().delete_files(directory)


class Pace(keras.callbacks.Callback):
    """Says when training starts and when each step ends, and pauses after each step."""

    def on_train_begin(self, logs: Any = None) -> None:
        print("TRAINING", flush=True)

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        print("STEP", flush=True)
        time.sleep(STEP_SECONDS)


class Interrupt(keras.callbacks.Callback):
    """Stops ``fit`` with an exception after ``steps`` training steps (a crash, in-process)."""

    def __init__(self, steps: int):
        super().__init__()
        self.steps, self.seen = steps, 0

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.seen += 1
        if self.seen == self.steps:
            raise KeyboardInterrupt


# --------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------


def arrays() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(SAMPLES, 6)).astype("float32")
    y = (x @ rng.normal(size=(6, 1)) + 0.1 * rng.normal(size=(SAMPLES, 1))).astype("float32")
    return x, y


def array_input() -> dict[str, Any]:
    x, y = arrays()
    return {"x": x, "y": y, "batch_size": BATCH, "shuffle": True}


def tf_data_input() -> dict[str, Any]:
    """A seeded shuffle that draws a new order for every iterator (every epoch)."""
    x, y = arrays()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(SAMPLES, seed=7).batch(BATCH)
    return {"x": dataset, "shuffle": False}  # the dataset shuffles itself


def repeated_tf_data_input() -> dict[str, Any]:
    """One iterator for the whole run (``repeat`` and ``steps_per_epoch``): resuming skips across epochs."""
    x, y = arrays()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(SAMPLES, seed=7).repeat().batch(BATCH)
    return {"x": dataset, "steps_per_epoch": SAMPLES // BATCH, "shuffle": False}


class ShufflingPyDataset(keras.utils.PyDataset if hasattr(keras.utils, "PyDataset") else keras.utils.Sequence):  # type: ignore[misc]
    """The Keras-2 ``Sequence`` pattern: reshuffles sample indices with NumPy in ``on_epoch_end``, adds noise."""

    def __init__(self) -> None:
        super().__init__()
        self.x, self.y = arrays()
        self.indices = np.arange(SAMPLES)

    def __len__(self) -> int:
        return SAMPLES // BATCH

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        batch = self.indices[index * BATCH : (index + 1) * BATCH]
        noise = np.random.normal(scale=0.01, size=(len(batch), 6)).astype("float32")
        return self.x[batch] + noise, self.y[batch]

    def on_epoch_end(self) -> None:
        np.random.shuffle(self.indices)


def py_dataset_input() -> dict[str, Any]:
    return {"x": ShufflingPyDataset()}  # fit's shuffle=True also shuffles the batch order (Python's random)


def keras_io_gan_input() -> dict[str, Any]:
    """The keras.io GAN's samples (``tests/existing_code.py``), shuffled."""
    from tests import existing_code

    return {"x": existing_code.vectors(), "batch_size": 16, "shuffle": True}  # 4 steps per epoch


class PlainPyDataset(keras.utils.PyDataset if hasattr(keras.utils, "PyDataset") else keras.utils.Sequence):  # type: ignore[misc]
    """A ``PyDataset`` without epoch hooks: only ``fit``'s ``shuffle=True`` changes its batch order."""

    def __init__(self) -> None:
        super().__init__()
        self.x, self.y = arrays()

    def __len__(self) -> int:
        return SAMPLES // BATCH

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        return self.x[index * BATCH : (index + 1) * BATCH], self.y[index * BATCH : (index + 1) * BATCH]


def plain_py_dataset_input() -> dict[str, Any]:
    # Keras 3.8-3.15 shuffle the batch order with Python's global random state, 3.16 with
    # random.Random(epochs the data adapter has ended): a resumed fit must continue that count.
    return {"x": PlainPyDataset(), "shuffle": True}


INPUTS: dict[str, Callable[[], dict[str, Any]]] = {
    "arrays": array_input,
    "ordered_arrays": lambda: {**array_input(), "shuffle": False},
    "tf_data": tf_data_input,
    "repeated_tf_data": repeated_tf_data_input,
    "py_dataset": py_dataset_input,
    "keras_io_gan": keras_io_gan_input,
    "plain_py_dataset": plain_py_dataset_input,
}


# --------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------


def dropout_model(
    steps_per_execution: int | str = 1, dropout: bool = True, accumulate: int | None = None
) -> keras.Model:
    """``accumulate``: ``compile(gradient_accumulation_steps=accumulate)`` (one update every that many steps)."""
    dropout_layers = [keras.layers.Dropout(0.3)] if dropout else []
    model = custom_fit.CustomSequential(
        [keras.Input((6,)), keras.layers.Dense(16, activation="relu"), *dropout_layers, keras.layers.Dense(1)]
    )
    accumulation = {"gradient_accumulation_steps": accumulate} if accumulate else {}
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss="mse",
        metrics=["mae"],
        steps_per_execution=steps_per_execution,
        **accumulation,
    )
    return model


class TwoOptimizers(custom_fit.CustomModel):
    """Named optimizers with a custom step and logged values (one optimizer per layer)."""

    logged_values = ("first_norm", "loss")

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(8, activation="tanh")
        self.out = keras.layers.Dense(1)

    def build(self, input_shape: Any) -> None:
        self.hidden.build(input_shape)
        self.out.build((None, 8))
        self.built = True  # Keras 3 sets it after a build of its own; tf_keras would call build again

    def call(self, x: Any, training: bool = False) -> Any:
        return self.out(self.hidden(x))

    def train_step(self, data: Any) -> dict[str, Any]:
        x, y = data
        with tf.GradientTape(persistent=True) as tape:
            loss = custom_fit.batch_mean(keras.losses.mean_squared_error(y, self(x, training=True)))
        self.minimize(loss, tape, self.hidden.trainable_variables, optimizer="hidden")
        self.minimize(loss, tape, self.out.trainable_variables, optimizer="out")
        self.log_values(x, first_norm=tf.linalg.global_norm(self.hidden.trainable_variables), loss=loss)
        return self.get_metrics_result()


def named_model(steps_per_execution: int | str = 1) -> keras.Model:
    model = TwoOptimizers()
    model.build((None, 6))
    optimizers = {"hidden": keras.optimizers.Adam(1e-2), "out": keras.optimizers.SGD(1e-2, momentum=0.9)}
    model.compile(optimizer=optimizers, steps_per_execution=steps_per_execution)
    return model


def gan_model(loss: str) -> keras.Model:
    generator = keras.Sequential([keras.Input((4,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(6)])
    discriminator = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16), keras.layers.Dense(1)])
    gan = custom_fit.GAN(generator, discriminator, latent_dim=4, loss=loss, seed=3, discriminator_steps=1)
    gan.compile()
    return gan


def _x_only(inputs: dict[str, Any]) -> dict[str, Any]:
    """A GAN fits on samples only."""
    if "y" in inputs:
        return {**inputs, "y": None}
    if isinstance(inputs["x"], tf.data.Dataset):
        return {**inputs, "x": inputs["x"].map(lambda x, y: x)}
    return inputs  # a PyDataset's (x, y) batches: the GAN uses x


def keras_io_gan_mirrored() -> keras.Model:
    """The keras.io GAN (``tests/existing_code.py``'s ``dcgan``) built under ``MirroredStrategy`` on two CPUs."""
    from tests import existing_code

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    pattern = existing_code.pattern("dcgan", custom_fit.CustomModel)
    with tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]).scope():
        model = pattern.make()
        model.compile(**pattern.compile())
    return model


SCENARIOS: dict[str, tuple[Callable[[], keras.Model], str]] = {
    "dropout_arrays": (dropout_model, "arrays"),
    "dropout_tf_data": (dropout_model, "tf_data"),
    "dropout_py_dataset": (dropout_model, "py_dataset"),
    "named_optimizers_repeated_tf_data": (named_model, "repeated_tf_data"),
    "gan_bce_arrays": (lambda: gan_model("bce"), "arrays"),
    "gan_hinge_tf_data": (lambda: gan_model("hinge"), "tf_data"),
    "gan_wgan_gp_py_dataset": (lambda: gan_model("wgan-gp"), "py_dataset"),
}
#: Keras 2's resume is exact for these too: no layer draws random numbers (tf_keras' layers draw
#: from TensorFlow's global generator, which no Keras 2 file format saves).
DETERMINISTIC_SCENARIOS: dict[str, tuple[Callable[[], keras.Model], str]] = {
    "dense_arrays": (lambda: dropout_model(dropout=False), "arrays"),
    "dense_ordered_arrays": (lambda: dropout_model(dropout=False), "ordered_arrays"),
    # compile(gradient_accumulation_steps=4): a backup every 5 steps lands mid-accumulation.
    "accumulating_dense_arrays": (lambda: dropout_model(dropout=False, accumulate=4), "arrays"),
}
#: Scenarios under a tf.distribute strategy, backed up at the end of each epoch.
STRATEGY_SCENARIOS: dict[str, tuple[Callable[[], keras.Model], str]] = {
    "keras_io_gan_mirrored": (keras_io_gan_mirrored, "keras_io_gan"),
}


def cluster_input(strategy: tf.distribute.Strategy, shuffle: bool = True) -> dict[str, Any]:
    """The repeated, seeded shuffle of ``repeated_tf_data_input`` (or no shuffle), each worker reading its shard."""
    x, y = arrays()

    def shard(context: tf.distribute.InputContext) -> tf.data.Dataset:
        dataset = tf.data.Dataset.from_tensor_slices((x, y))
        dataset = (dataset.shuffle(SAMPLES, seed=7) if shuffle else dataset).repeat()
        dataset = dataset.shard(context.num_input_pipelines, context.input_pipeline_id)
        return dataset.batch(context.get_per_replica_batch_size(BATCH))

    return {
        "x": strategy.distribute_datasets_from_function(shard),
        "steps_per_epoch": SAMPLES // BATCH,
        "shuffle": False,
    }


def join_cluster(worker: int, ports: str) -> tf.distribute.Strategy:
    """Makes this process worker ``worker`` of a MultiWorkerMirroredStrategy cluster on 127.0.0.1."""
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports.split(",")]}
    os.environ["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": worker}})
    return tf.distribute.MultiWorkerMirroredStrategy()


def variables_of(model: keras.Model) -> list[np.ndarray]:
    """The model's variables, then every optimizer's (a group's members in order)."""
    optimizer_variables = list(model.optimizer.variables)
    for member in getattr(model.optimizer, "optimizers", []):  # a NamedOptimizers group
        optimizer_variables += list(member.variables)
    return [np.asarray(v.numpy()) for v in list(model.variables) + optimizer_variables]


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=sorted({**SCENARIOS, **DETERMINISTIC_SCENARIOS, **STRATEGY_SCENARIOS}))
    parser.add_argument("backup_dir")
    parser.add_argument("result")
    parser.add_argument("--save-freq", default=None)
    parser.add_argument("--worker", type=int, help="this process' index in a two-worker cluster (needs --ports)")
    parser.add_argument("--ports", help="the cluster's ports on 127.0.0.1, comma-separated")
    parser.add_argument("--validate-every", type=int, help="validation_freq=custom_fit.Steps(N) on 40 samples")
    parser.add_argument(
        "--no-background",
        action="store_true",
        help="BackupAndRestore(write_in_background=False): each backup on disk before training goes on",
    )
    parser.add_argument(
        "--own-dirs",
        action="store_true",
        help="each worker its own copy of the backups, BACKUP_DIR-w<index> (storage each sees on its own)",
    )
    args = parser.parse_args(argv)
    if args.own_dirs:
        args.backup_dir = f"{args.backup_dir}-w{args.worker}"

    build, input_kind = {**SCENARIOS, **DETERMINISTIC_SCENARIOS, **STRATEGY_SCENARIOS}[args.scenario]
    if args.worker is None:
        keras.utils.set_random_seed(1)
        model = build()
        inputs = INPUTS[input_kind]()
    else:  # every worker runs this same script with the same backup_dir
        strategy = join_cluster(args.worker, args.ports)
        keras.utils.set_random_seed(1)
        with strategy.scope():
            model = build()
        inputs = cluster_input(strategy, shuffle=input_kind != "ordered_arrays")
    if isinstance(model, custom_fit.GAN):
        inputs = _x_only(inputs)
    frequency = args.save_freq or ("epoch" if args.scenario in STRATEGY_SCENARIOS else "5")
    save_freq: str | int = frequency if frequency == "epoch" else int(frequency)
    validation: dict[str, Any] = {}
    epoch_logs: list[Any] = []
    if args.validate_every:
        x, y = arrays()
        validation = {"validation_data": (x[:40], y[:40]), "validation_freq": custom_fit.Steps(args.validate_every)}
    history = model.fit(
        **inputs,
        **validation,
        epochs=EPOCHS,
        verbose=0,
        callbacks=[
            custom_fit.BackupAndRestore(
                args.backup_dir,
                save_freq=save_freq,
                store=HarnessStore(args.backup_dir),
                write_in_background=not args.no_background,
            ),
            Pace(),
            keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: epoch_logs.append([epoch, dict(logs)])),
        ],
    )
    last_epoch: dict[str, Any] = {f"history_{k}": np.float64(v[-1]) for k, v in history.history.items()}
    arrays_out: dict[str, Any] = {f"variable_{i}": v for i, v in enumerate(variables_of(model))}
    if args.validate_every:
        runs = {k: v for k, v in history.history.items() if k.startswith("val_")}
        arrays_out.update(runs=json.dumps(runs), epoch_logs=json.dumps(epoch_logs))
    np.savez(args.result, **arrays_out, **last_epoch, epochs_run=len(history.epoch))


if __name__ == "__main__":
    main(sys.argv[1:])
