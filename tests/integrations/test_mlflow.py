"""MLflow's autologging records a ``CustomModel`` run as it records ``keras.Model``'s.

``mlflow.keras.autolog()`` and ``mlflow.tensorflow.autolog()`` wrap
``keras.Model.fit`` (tf_keras' under ``TF_USE_LEGACY_KERAS=1``); custom_fit runs
that wrapper around its own ``fit`` (``custom_fit._tool_wrappers``). Each test
trains the same model on both bases, with a local SQLite store and no network,
and compares everything MLflow kept: parameters, every metric's steps and
values, tags, artifacts, datasets and logged models.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import custom_fit
from custom_fit import keras
from tests.integrations.harness import BASES, DATA, build, fit, for_both

mlflow = pytest.importorskip("mlflow")

pytestmark = [
    # MLflow's own notices (as errors they would stop its autologging inside, for both bases), and tf_keras'
    # advice when MLflow's checkpoint callback saves .h5 (both bases).
    pytest.mark.filterwarnings("ignore::UserWarning:mlflow"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning:mlflow"),
    pytest.mark.filterwarnings("ignore::FutureWarning:mlflow"),
    pytest.mark.filterwarnings("ignore:You are saving your model as an HDF5 file:UserWarning"),
]

#: Tags whose values differ between any two runs (ids, times, paths), compared by name only.
_RUN_SPECIFIC = re.compile(r"mlflow\.(runName|source\.name|user|log-model\.history|latest_checkpoint_artifact)$")


@pytest.fixture
def tracking(tmp_path, monkeypatch, request):
    """A local SQLite store in ``tmp_path`` and a fresh experiment; autologging is off again afterwards."""
    monkeypatch.chdir(tmp_path)
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = mlflow.create_experiment(request.node.name[:200], artifact_location=(tmp_path / "artifacts").as_uri())
    mlflow.set_experiment(experiment_id=experiment)
    yield mlflow.MlflowClient()
    if not custom_fit.KERAS_2:
        mlflow.keras.autolog(disable=True)
    mlflow.tensorflow.autolog(disable=True)
    mlflow.set_tracking_uri(None)


def _artifacts(client, run_id, path=None):
    found: list[str] = []
    for entry in client.list_artifacts(run_id, path):
        found += _artifacts(client, run_id, entry.path) if entry.is_dir else [entry.path]
    return found


def recorded(client, run_id):
    """Everything MLflow kept of run ``run_id``, in a form two runs of equal training compare equal in."""
    run = client.get_run(run_id)
    metrics = {}
    for key in run.data.metrics:
        history = sorted(client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp))
        metrics[key] = [(m.step, m.value) for m in history]
    models = []
    for model in mlflow.search_logged_models(filter_string=f"source_run_id='{run_id}'", output_format="list"):
        info = mlflow.models.get_model_info(f"models:/{model.model_id}")
        signature = info.signature.to_dict() if info.signature else None
        logged_metrics = sorted((m.key, m.step, m.value) for m in model.metrics or [])
        models.append((model.name, sorted(info.flavors), signature, logged_metrics))
    return {
        "params": run.data.params,
        "metrics": metrics,
        "tags": {k: (None if _RUN_SPECIFIC.match(k) else v) for k, v in run.data.tags.items()},
        # TensorBoard's event files are named after the time, the host and the process.
        "artifacts": sorted(re.sub(r"events\.out\.tfevents\..*", "events", p) for p in _artifacts(client, run_id)),
        "datasets": [
            (d.dataset.name, d.dataset.digest, sorted(t.value for t in d.tags)) for d in run.inputs.dataset_inputs
        ],
        "models": models,
    }


def autologged_run(client, autolog, options, fit_kwargs):
    """What MLflow recorded for a ``fit`` of each base under ``autolog(**options)``, required equal; and the history.

    Returns:
        CustomModel's record and its ``History`` (keras.Model's record equals it).
    """
    autolog(**options)

    def run(base):
        history = fit(build(base), **fit_kwargs())
        return recorded(client, mlflow.last_active_run().info.run_id), history.history

    records = for_both(run)
    assert records["CustomModel"][0] == records["keras.Model"][0]
    return records["CustomModel"]


def early_stopping():
    """Stops after the second epoch (no epoch improves by 10) and restores the first epoch's weights."""
    return {
        "epochs": 4,
        "validation_data": (DATA["x_val"], DATA["y_val"]),
        "callbacks": [keras.callbacks.EarlyStopping(patience=1, min_delta=10.0, restore_best_weights=True)],
    }


#: ``{case: (autolog's options, fit's arguments)}``
Cases = dict[str, tuple[dict[str, Any], Callable[[], dict[str, Any]]]]

KERAS_AUTOLOG_CASES: Cases = {
    "defaults, validation, EarlyStopping": ({}, early_stopping),
    "every 2 steps, no model, no dataset": (
        {"log_every_epoch": False, "log_every_n_steps": 2, "log_models": False, "log_datasets": False},
        lambda: {"epochs": 2, "validation_split": 0.25},
    ),
    "no signature": ({"log_model_signatures": False}, lambda: {"epochs": 2}),
    "exported model": ({"save_exported_model": True}, lambda: {"epochs": 2}),  # MLflow needs the signature then
}


@pytest.mark.keras3  # mlflow.keras hooks the keras package (Keras 3); tf_keras' models are mlflow.tensorflow's
@pytest.mark.parametrize("case", list(KERAS_AUTOLOG_CASES))
def test_keras_autolog_records_custommodel_as_keras_model(tracking, case):
    options, fit_kwargs = KERAS_AUTOLOG_CASES[case]
    custom_record, history = autologged_run(tracking, mlflow.keras.autolog, options, fit_kwargs)
    assert custom_record["params"]["optimizer_name"] == "adam" and len(custom_record["params"]) >= 25
    assert custom_record["tags"]["mlflow.autologging"] == "keras"
    if options.get("log_every_n_steps"):  # 5 steps an epoch; MLflow's callback counts the optimizer's iterations
        assert [step for step, _ in custom_record["metrics"]["loss"]] == [2, 4, 6, 8, 10]
    else:
        assert [value for _, value in custom_record["metrics"]["loss"]] == history["loss"]
    assert len(custom_record["models"]) == (0 if options.get("log_models") is False else 1)


TENSORFLOW_AUTOLOG_CASES: Cases = {
    "defaults, EarlyStopping stops and restores": ({}, early_stopping),
    "every 2 steps, checkpoints every 3 batches, weights only": (
        {
            "log_every_epoch": False,
            "log_every_n_steps": 2,
            "log_models": False,
            "log_datasets": False,
            "checkpoint_monitor": "loss",
            "checkpoint_save_freq": 3,
            "checkpoint_save_best_only": False,
            "checkpoint_save_weights_only": True,
        },
        lambda: {"epochs": 2},
    ),
}


@pytest.mark.parametrize("case", list(TENSORFLOW_AUTOLOG_CASES))
def test_tensorflow_autolog_records_custommodel_as_keras_model(tracking, case):
    options, fit_kwargs = TENSORFLOW_AUTOLOG_CASES[case]
    custom_record, _ = autologged_run(tracking, mlflow.tensorflow.autolog, options, fit_kwargs)
    assert custom_record["tags"]["mlflow.autologging"] == "tensorflow"
    assert any(path.startswith("tensorboard_logs/") for path in custom_record["artifacts"])
    assert any(path.startswith("checkpoints/") for path in custom_record["artifacts"])
    if "callbacks" in fit_kwargs():
        # EarlyStopping's parameters, and the epochs it stopped at (the second, counted from 0) and restored.
        assert custom_record["params"]["patience"] == "1" and abs(float(custom_record["params"]["min_delta"])) == 10.0
        assert custom_record["metrics"]["stopped_epoch"] == [(0, 1.0)]
        assert "restored_epoch" in custom_record["metrics"]


@pytest.mark.parametrize("exclusive", [False, True])
def test_a_run_the_user_opened_gets_the_same_records(tracking, exclusive):
    """Autologging into the user's own run (``exclusive=False``), or not at all (``exclusive=True``)."""
    mlflow.tensorflow.autolog(exclusive=exclusive, log_models=False)

    def run(base):
        with mlflow.start_run(run_name="mine") as mine:
            mlflow.log_param("mine", 1)
            fit(build(base), epochs=2)
        return recorded(tracking, mine.info.run_id)

    records = for_both(run)
    assert records["CustomModel"] == records["keras.Model"]
    assert ("epochs" in records["CustomModel"]["params"]) is not exclusive
    assert records["CustomModel"]["tags"]["mlflow.runName"] is None  # the user's name, kept


FLAVORS = [
    pytest.param("keras", marks=pytest.mark.keras3),  # mlflow.keras: the keras package's models (Keras 3)
    "tensorflow",
]

#: The repository's root: a new process that loads a model logged by mlflow.tensorflow imports the modules
#: of every Keras class registered when it was logged (the tests' too).
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def logged_model(run_id):
    """The model logged by run ``run_id``: its URI and a local folder with its files."""
    (logged,) = mlflow.search_logged_models(filter_string=f"source_run_id='{run_id}'", output_format="list")
    return f"models:/{logged.model_id}", mlflow.artifacts.download_artifacts(f"models:/{logged.model_id}")


@pytest.mark.parametrize("flavor", FLAVORS)
def test_the_logged_model_loads_with_pyfunc_and_predicts_as_the_model(tracking, flavor):
    """In this process and in a new one. mlflow.tensorflow saves Keras' registered classes with the model
    (custom_fit's among them), so loading imports custom_fit; with mlflow.keras a new process imports it
    first, as for any custom Keras class (Keras finds only classes registered in the process)."""
    getattr(mlflow, flavor).autolog(log_datasets=False)
    model = build(custom_fit.CustomModel)
    fit(model, epochs=2)
    uri, _ = logged_model(mlflow.last_active_run().info.run_id)
    expected = model.predict(DATA["x_val"], verbose=0)
    np.testing.assert_array_equal(np.asarray(mlflow.pyfunc.load_model(uri).predict(DATA["x_val"])), expected)
    script = (
        f"import json, sys, numpy as np, mlflow{', custom_fit' if flavor == 'keras' else ''}\n"
        f"mlflow.set_tracking_uri({mlflow.get_tracking_uri()!r})\n"
        "x = np.asarray(json.loads(sys.stdin.read()), 'float32')\n"
        f"print(json.dumps(np.asarray(mlflow.pyfunc.load_model({uri!r}).predict(x)).tolist()))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], input=json.dumps(DATA["x_val"].tolist()), capture_output=True, text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}, cwd=ROOT, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    np.testing.assert_array_equal(np.asarray(json.loads(done.stdout.splitlines()[-1]), "float32"), expected)


class Subclassed(keras.Model):
    """A keras.Model subclass of the user's own, not registered: a new process cannot find it either."""


@pytest.mark.parametrize("flavor", FLAVORS)
def test_requirements_are_inferred_as_for_any_custom_keras_class(tracking, flavor):
    """MLflow infers a logged model's requirements by loading it in a new process. mlflow.tensorflow saves
    Keras' registered classes with the model, so that process imports custom_fit and finds everything;
    mlflow.keras does not, so the process cannot find the class and MLflow falls back to Keras alone, for a
    CustomModel as for a keras.Model subclass of the user's (docs/integrations.md says what to add)."""
    getattr(mlflow, flavor).autolog(log_datasets=False)

    def requirements(base):
        fit(build(base), epochs=1)
        _, folder = logged_model(mlflow.last_active_run().info.run_id)
        with open(os.path.join(folder, "requirements.txt")) as file:
            return sorted(line.split("==")[0] for line in file.read().split())

    found = {name: requirements(base) for name, base in {**BASES, "Subclassed": Subclassed}.items()}
    if flavor == "tensorflow":
        assert found["CustomModel"] == found["keras.Model"]
        assert {"custom-fit", "tensorflow"} <= set(found["CustomModel"])
    else:
        assert found["CustomModel"] == found["Subclassed"] == ["keras", "mlflow"]
        assert "tensorflow" in found["keras.Model"]


def test_steps_validation_runs_are_logged_each_when_it_ends_and_each_epoch_with_its_last_run(tracking):
    """``validation_freq=Steps(N)``: MLflow's callback logs ``validation_*`` at each run's end (its
    ``on_test_end``) and ``val_*`` at each epoch's end with the epoch's last run, as the History keeps them."""
    mlflow.tensorflow.autolog(log_models=False, log_datasets=False)
    model = build(custom_fit.CustomModel)
    history = fit(
        model, epochs=2, validation_data=(DATA["x_val"], DATA["y_val"]), validation_freq=custom_fit.Steps(3)
    ).history
    record = recorded(tracking, mlflow.last_active_run().info.run_id)
    assert history["val_step"] == [3, 6, 9, 12]  # 7 steps an epoch
    assert [value for _, value in record["metrics"]["validation_loss"]] == pytest.approx(history["val_loss"], rel=1e-7)
    assert record["metrics"]["val_loss"] == [
        (0, pytest.approx(history["val_loss"][1])),
        (1, pytest.approx(history["val_loss"][3])),
    ]
    assert record["params"]["validation_freq"] == "Steps(every=3)"


def test_named_validation_sets_are_logged_each_under_its_name(tracking):
    """Two named validation sets, Steps(3): MLflow logs ``validation_<set>_*`` at each run's end and
    ``val_<set>_*`` at each epoch's end, each set's values apart, as the History keeps them."""
    mlflow.tensorflow.autolog(log_models=False, log_datasets=False)
    model = build(custom_fit.CustomModel)
    halves = {"first": (DATA["x_val"][:8], DATA["y_val"][:8]), "second": (DATA["x_val"][8:], DATA["y_val"][8:])}
    history = fit(model, epochs=2, validation_data=halves, validation_freq=custom_fit.Steps(3)).history
    record = recorded(tracking, mlflow.last_active_run().info.run_id)
    assert history["val_step"] == [3, 6, 9, 12]
    for name in ("first", "second"):
        logged = [value for _, value in record["metrics"][f"validation_{name}_loss"]]
        assert logged == pytest.approx(history[f"val_{name}_loss"], rel=1e-7)
        assert [value for _, value in record["metrics"][f"val_{name}_loss"]] == pytest.approx(
            [history[f"val_{name}_loss"][1], history[f"val_{name}_loss"][3]], rel=1e-7
        )
    assert "validation_loss" not in record["metrics"]  # no set's values under another's name


def test_named_optimizers_and_the_gan_log_each_optimizers_parameters(tracking):
    """MLflow's callback logs ``model.optimizer.get_config()``: for named optimizers, the group's, whose
    ``optimizer_optimizers`` holds each member's configuration (class, learning rate, ...)."""
    (mlflow.tensorflow if custom_fit.KERAS_2 else mlflow.keras).autolog(log_datasets=False)
    keras.utils.set_random_seed(3)
    features = DATA["x"].shape[1]
    generator = keras.Sequential([keras.Input((4,)), keras.layers.Dense(features)], name="generator")
    discriminator = keras.Sequential([keras.Input((features,)), keras.layers.Dense(1)], name="discriminator")
    gan = custom_fit.GAN(generator, discriminator, 4, seed=3)
    gan.compile(
        optimizer={
            "generator": keras.optimizers.Adam(2e-4, beta_1=0.5),
            "discriminator": keras.optimizers.Adam(1e-4, beta_1=0.5),
        }
    )
    history = gan.fit(DATA["x"], batch_size=16, epochs=2, verbose=0).history
    record = recorded(tracking, mlflow.last_active_run().info.run_id)
    prefix = "opt_" if custom_fit.KERAS_2 else "optimizer_"
    members = ast.literal_eval(record["params"][f"{prefix}optimizers"])
    assert record["params"][f"{prefix}name"] == "named_optimizers"
    rates = {name: member["config"]["learning_rate"] for name, member in members.items()}
    assert rates == {"generator": pytest.approx(2e-4), "discriminator": pytest.approx(1e-4)}
    assert [value for _, value in record["metrics"]["g_loss"]] == history["g_loss"]
    assert [value for _, value in record["metrics"]["d_loss"]] == history["d_loss"]
    assert len(record["models"]) == 1
