"""Tools that hook Keras through callbacks record a ``CustomModel`` run as they record ``keras.Model``'s.

Weights & Biases (offline), DVCLive, Optuna's pruning callback, KerasTuner and
Keras' own TensorBoard callback reach a model only through the callbacks
``fit`` calls, which custom_fit's loop calls as Keras' does. Each test trains
both bases with the tool as its documentation attaches it and compares what the
tool wrote, read back from its files.
"""

from __future__ import annotations

import glob
import json
import os
import struct

import numpy as np
import pytest

import custom_fit
from custom_fit import keras
from tests.integrations.harness import BASES, DATA, build, fit, for_both

VALIDATION = (DATA["x_val"], DATA["y_val"])

# W&B installs an import hook without find_spec (Python warns when a module is first imported under it).
pytestmark = pytest.mark.filterwarnings("ignore:ImportMetaHook.find_spec\\(\\) not found:ImportWarning")


# --------------------------------------------------------------------------
# Weights & Biases
# --------------------------------------------------------------------------


def wandb_records(path):
    """The records of a W&B run's transaction log ``run-*.wandb``, parsed as W&B's protobuf ``Record``.

    wandb 0.31 reads the file in its Go core only; the file is LevelDB's log
    format (32 KiB blocks of records with a 7-byte header: CRC, length, type
    full/first/middle/last) after W&B's own 7-byte header.
    """
    from wandb.proto import wandb_internal_pb2

    with open(path, "rb") as file:
        data = file.read()
    assert data[:4] == b":W&B", data[:7]
    position, pending, records = 7, b"", []
    while position + 7 <= len(data):
        left = 32768 - position % 32768
        if left < 7:  # a block's tail too short for a header is padding
            position += left
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # a full record, or a record's last piece
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def wandb_run(base, folder):
    """History rows (W&B's own keys left out) and model artifacts of a run of ``base`` with both Keras callbacks."""
    import wandb
    from wandb.integration.keras import WandbMetricsLogger, WandbModelCheckpoint

    settings = wandb.Settings(silent=True, console="off", x_disable_stats=True, x_disable_meta=True)
    run = wandb.init(mode="offline", dir=folder, project="custom-fit", settings=settings)
    model = build(base)
    checkpoints = os.path.join(folder, "model-{epoch}.keras")
    callbacks = [WandbMetricsLogger(log_freq=3), WandbModelCheckpoint(checkpoints, monitor="val_loss")]
    fit(model, epochs=3, validation_data=VALIDATION, callbacks=callbacks)
    run.finish()
    # finish() returns once wandb-core has handled the run's exit record, not once it has written and
    # closed the log; under load the log could still be its header alone (a CI run read no history
    # then). teardown() stops wandb-core and waits for it to exit, which closes every log it wrote.
    wandb.teardown()
    (log,) = glob.glob(os.path.join(folder, "wandb", "offline-run-*", "run-*.wandb"))
    rows, artifacts, kinds = [], [], set()
    for record in wandb_records(log):
        kinds.add(record.WhichOneof("record_type"))
        if record.WhichOneof("record_type") == "history":
            row = {"/".join(item.nested_key) or item.key: json.loads(item.value_json) for item in record.history.item}
            rows.append({key: value for key, value in row.items() if not key.startswith("_")})
        elif record.WhichOneof("record_type") == "artifact":
            contents = [entry.path for entry in record.artifact.manifest.contents]
            artifacts.append((record.artifact.type, sorted(record.artifact.aliases), contents))
    assert "exit" in kinds, f"the log {log} ends before the run's exit record: {sorted(kinds)}"
    saved = {name: keras.models.load_model(os.path.join(folder, name)).get_weights() for _, _, (name,) in artifacts}
    return {"history": rows, "artifacts": artifacts}, saved, model


def test_wandb_metrics_logger_and_model_checkpoint_record_both_alike_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    runs = {name: wandb_run(base, str(tmp_path / name.replace(".", "_"))) for name, base in BASES.items()}
    (keras_records, keras_saved, _), (custom_records, custom_saved, model) = runs.values()
    assert custom_records == keras_records
    rows = custom_records["history"]
    # Batches 0, 3 and 6 of each 7-batch epoch, numbered on by log_freq=3.
    assert [row["batch/batch_step"] for row in rows if "batch/batch_step" in row] == list(range(0, 27, 3))
    assert [row["epoch/epoch"] for row in rows if "epoch/epoch" in row] == [0, 1, 2]
    assert [row["epoch/val_loss"] for row in rows if "epoch/epoch" in row] == model.history.history["val_loss"]
    assert custom_records["artifacts"][0][1] == ["epoch_0", "latest"]
    for name, weights in custom_saved.items():
        for mine, theirs in zip(weights, keras_saved[name], strict=True):
            np.testing.assert_array_equal(mine, theirs)


# --------------------------------------------------------------------------
# DVCLive
# --------------------------------------------------------------------------


def test_dvclive_callback_records_both_alike(tmp_path, monkeypatch):
    pytest.importorskip("dvclive")
    from dvclive import Live
    from dvclive.keras import DVCLiveCallback

    monkeypatch.setenv("DVC_NO_ANALYTICS", "1")
    monkeypatch.chdir(tmp_path)  # no Git repository: DVCLive writes its files and nothing else

    def run(base):
        folder = tmp_path / base.__name__
        with Live(str(folder), save_dvc_exp=False) as live:
            fit(build(base), epochs=3, validation_data=VALIDATION, callbacks=[DVCLiveCallback(live=live)])
        plots = {
            path.relative_to(folder).as_posix(): path.read_text()
            for path in sorted((folder / "plots" / "metrics").rglob("*.tsv"))
        }
        return json.loads((folder / "metrics.json").read_text()), plots

    records = for_both(run)
    assert records["CustomModel"] == records["keras.Model"]
    metrics, plots = records["CustomModel"]
    assert metrics["step"] == 2 and set(metrics["train"]) == set(metrics["eval"]) == {"loss", "accuracy"}
    assert len(plots["plots/metrics/eval/loss.tsv"].splitlines()) == 1 + 3  # a header and 3 epochs


# --------------------------------------------------------------------------
# Optuna
# --------------------------------------------------------------------------


def test_optuna_pruning_callback_reports_and_prunes_both_alike():
    optuna = pytest.importorskip("optuna")
    integration = pytest.importorskip("optuna_integration")
    callback = integration.TFKerasPruningCallback if custom_fit.KERAS_2 else integration.KerasPruningCallback

    def study(base):
        def objective(trial):
            learning_rate = trial.suggest_float("learning_rate", 1e-3, 1e-1, log=True)
            model = build(base, optimizer=keras.optimizers.Adam(learning_rate))
            history = fit(model, epochs=4, validation_data=VALIDATION, callbacks=[callback(trial, "val_loss")])
            return history.history["val_loss"][-1]

        sampler = optuna.samplers.TPESampler(seed=0, n_startup_trials=2)
        run = optuna.create_study(sampler=sampler, pruner=optuna.pruners.MedianPruner(n_startup_trials=2))
        run.optimize(objective, n_trials=5)
        return [(t.state.name, t.params, t.intermediate_values, t.value) for t in run.trials]

    trials = for_both(study)
    assert trials["CustomModel"] == trials["keras.Model"]
    assert all(len(values) >= 1 for _, _, values, _ in trials["CustomModel"])


# --------------------------------------------------------------------------
# KerasTuner
# --------------------------------------------------------------------------


@pytest.mark.keras3  # KerasTuner builds on the keras package (Keras 3); tf_keras models are not its to tune
@pytest.mark.filterwarnings("ignore:Skipping variable loading for optimizer:UserWarning")  # best model, both bases
@pytest.mark.filterwarnings("ignore:(currentThread|getName)\\(\\) is deprecated:DeprecationWarning")  # KerasTuner's
def test_keras_tuner_search_scores_and_best_models_are_the_same(tmp_path):
    keras_tuner = pytest.importorskip("keras_tuner")

    def search(base, **fit_kwargs):
        def hypermodel(hp):
            return build(base, optimizer=keras.optimizers.Adam(hp.Choice("learning_rate", [1e-3, 1e-2, 5e-2])))

        tuner = keras_tuner.RandomSearch(
            hypermodel, objective="val_loss", max_trials=3, seed=1, directory=str(tmp_path), project_name=base.__name__
        )
        tuner.search(DATA["x"], DATA["y"], batch_size=16, epochs=2, verbose=0, validation_data=VALIDATION, **fit_kwargs)
        trials = [(t.hyperparameters.values, t.score, t.best_step) for t in tuner.oracle.get_best_trials(3)]
        return trials, tuner.get_best_models(1)[0].predict(DATA["x_val"], verbose=0)

    results = for_both(search)
    assert results["CustomModel"][0] == results["keras.Model"][0]
    np.testing.assert_array_equal(results["CustomModel"][1], results["keras.Model"][1])
    assert len(results["CustomModel"][0]) == 3

    # validation_freq=Steps(N) feeds the objective: each trial's score is its best run's val_loss.
    steps, _ = search(custom_fit.CustomModel, validation_freq=custom_fit.Steps(3))
    assert len(steps) == 3 and all(np.isfinite(score) for _, score, _ in steps)


# --------------------------------------------------------------------------
# TensorBoard (Keras' callback)
# --------------------------------------------------------------------------


def tensorboard_events(folder):
    """``{run: sorted (tag, step, value)}`` of the event files of ``folder``'s runs, and whether each has a graph.

    A value that is bytes (tf_keras writes the traced step's run metadata when
    it profiles) is kept as its tag and step: custom_fit's train function is
    another graph than Keras'.
    """
    import tensorflow as tf
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    found = {}
    for run in ("train", "validation"):
        events = EventAccumulator(os.path.join(folder, run), size_guidance={"tensors": 0})
        events.Reload()
        tensors = []
        for tag in events.Tags()["tensors"]:
            for event in events.Tensors(tag):
                value = tf.make_ndarray(event.tensor_proto)
                tensors.append((tag, event.step, None if value.dtype == object else value.tolist()))
        found[run] = (sorted(tensors, key=str), events.Tags()["graph"])
    return found


@pytest.mark.filterwarnings("ignore:.*(profiler|Profiler|trace).*")  # TensorFlow's profiler notices, both bases
def test_tensorboard_update_freq_histograms_and_profile_are_written_alike(tmp_path):
    def run(base):
        folder = str(tmp_path / base.__name__)
        callback = keras.callbacks.TensorBoard(folder, update_freq=2, histogram_freq=1, profile_batch=(2, 3))
        fit(build(base), epochs=2, validation_data=VALIDATION, callbacks=[callback])
        profiles = glob.glob(os.path.join(folder, "**", "plugins", "profile", "*", "*"), recursive=True)
        return tensorboard_events(folder), sorted(os.path.basename(p).split(".", 1)[1] for p in profiles)

    results = for_both(run)
    (keras_events, keras_profile), (custom_events, custom_profile) = results.values()
    assert custom_events == keras_events
    assert custom_profile == keras_profile and custom_profile  # the same profile files for steps 2-3
    tags = {tag for tag, _, _ in custom_events["train"][0]}
    assert "keras" in tags  # the model's summary: TensorBoard's conceptual graph
    assert any(tag.startswith("batch_") for tag in tags) and any("kernel" in tag for tag in tags)
