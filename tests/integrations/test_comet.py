"""Comet's auto-logging records a ``CustomModel`` run as it records ``keras.Model``'s, offline.

Comet hooks Keras as Keras is imported (``import comet_ml`` first, as its
documentation says): it wraps ``keras.Model.fit`` of the keras package to add
its callback, which custom_fit runs around its own ``fit``. It does not hook
tf_keras (it hooks the long-gone ``tensorflow.python.keras``), for either base;
there its callback, passed to ``fit``, records both alike. Each case runs in a
new process (this one imported Keras long ago) that trains both bases, each
with an ``OfflineExperiment``, and prints what each experiment's archive holds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import custom_fit

pytest.importorskip("comet_ml")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = """
import comet_ml  # before Keras: Comet wraps keras.Model.fit as Keras is imported

import glob, json, os, sys, zipfile

import custom_fit
from custom_fit import keras
from tests.integrations.harness import BASES, DATA, build, fit

mode, folder = sys.argv[1:]
records = {}
# "named": CustomModel only, validating on two named sets (plain Keras takes one).
halves = {"first": (DATA["x_val"][:8], DATA["y_val"][:8]), "second": (DATA["x_val"][8:], DATA["y_val"][8:])}
validation_data = halves if mode == "named" else (DATA["x_val"], DATA["y_val"])
for name, base in BASES.items():
    if mode == "named" and name != "CustomModel":
        continue
    os.makedirs(os.path.join(folder, name))
    experiment = comet_ml.OfflineExperiment(
        offline_directory=os.path.join(folder, name), project_name="custom-fit", display_summary_level=0,
        log_env_details=False, log_git_metadata=False, log_git_patch=False, auto_output_logging=False,
    )
    model = build(base)
    callbacks = [experiment.get_callback("tf-keras" if custom_fit.KERAS_2 else "keras")] if mode == "callback" else []
    history = fit(model, epochs=2, validation_data=validation_data, callbacks=callbacks)
    experiment.end()
    (archive,) = glob.glob(os.path.join(folder, name, "*.zip"))
    with zipfile.ZipFile(archive) as files:
        messages = [json.loads(line) for line in files.read("messages.json").decode().splitlines()]
    metrics, params, others, graphs = [], {}, {}, []
    for message in messages:
        payload = message.get("payload", {})
        if message.get("type") == "metric_msg":
            metric = payload["metric"]
            if metric["metricName"].startswith("sys.") or metric["metricName"] == "process duration":
                continue  # the machine's, sampled by time
            value = None if metric["metricName"] == "epoch_duration" else metric["metricValue"]  # a time
            metrics.append([metric["metricName"], metric.get("step"), metric.get("epoch"), value])
        elif message.get("type") == "parameter_msg":
            params[payload["param"]["paramName"]] = payload["param"]["paramValue"]
        elif message.get("type") == "log_other":
            others[payload["key"]] = payload["value"]
        elif message.get("type") == "graph":
            graphs.append([layer["name"] for layer in json.loads(payload["graph"])["config"]["layers"]])
    records[name] = {"metrics": sorted(metrics, key=str), "params": params, "others": others, "graphs": graphs,
                     "history": history.history}
print(json.dumps(records))
"""


def comet_records(mode: str, tmp_path) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode, str(tmp_path)], capture_output=True, text=True, cwd=ROOT,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "COMET_API_KEY": "", "PYTHONWARNINGS": "ignore"},
        timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.keras3  # Comet hooks the keras package only; tf_keras: see the callback's test below
def test_comet_auto_logging_records_custommodel_as_keras_model(tmp_path):
    records = comet_records("auto", tmp_path)
    assert records["CustomModel"] == records["keras.Model"]
    custom = records["CustomModel"]
    names = {name for name, _, _, _ in custom["metrics"]}
    assert {"loss", "accuracy", "val_loss", "val_accuracy", "batch_loss", "batch_accuracy", "epoch_duration"} <= names
    epoch_loss = [value for name, _, _, value in sorted(custom["metrics"], key=lambda m: m[2] or 0) if name == "loss"]
    assert epoch_loss == custom["history"]["loss"]
    assert custom["params"]["epochs"] == 2 and custom["params"]["Optimizer"] == "adam"
    assert custom["others"]["trainable_params"] == records["keras.Model"]["others"]["trainable_params"] > 0
    assert len(custom["graphs"]) == 1


def test_comets_callback_records_both_alike_and_on_keras_2_auto_logging_records_neither(tmp_path):
    records = comet_records("callback", tmp_path)
    assert records["CustomModel"] == records["keras.Model"]
    assert {"loss", "val_loss"} <= {name for name, _, _, _ in records["CustomModel"]["metrics"]}
    if custom_fit.KERAS_2:
        automatic = comet_records("auto", tmp_path / "auto")
        assert automatic["CustomModel"]["metrics"] == automatic["keras.Model"]["metrics"] == []


@pytest.mark.keras3  # Comet hooks the keras package only
def test_comet_auto_logging_records_each_named_validation_set(tmp_path):
    custom = comet_records("named", tmp_path)["CustomModel"]
    for name in ("first", "second"):
        logged = [
            value
            for metric, _, _, value in sorted(custom["metrics"], key=lambda m: m[2] or 0)
            if metric == f"val_{name}_loss"
        ]
        assert logged == custom["history"][f"val_{name}_loss"]
