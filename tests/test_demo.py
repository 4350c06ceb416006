"""The main job, ``python -m custom_fit.demo``, end to end on bundled data."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from custom_fit import demo


def test_demo_trains_both_models_identically(capsys):
    result = demo.main(["--epochs", "2", "--quiet"])
    out = capsys.readouterr().out
    assert "max |weight difference| between the two runs: 0 (bit-for-bit identical)" in out
    custom, plain = result["custom"], result["keras"]
    assert custom["history"] == plain["history"]
    assert custom["test_accuracy"] == plain["test_accuracy"] > 0.5  # two epochs already learn digits
    assert len(custom["epoch_seconds"]) == 2


@pytest.mark.slow
def test_demo_entry_point_shows_progress_bar():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    completed = subprocess.run(
        [sys.executable, "-m", "custom_fit.demo", "--epochs", "2"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=True,
    )
    assert "Epoch 2/2" in completed.stdout and "val_accuracy" in completed.stdout
    assert "CustomModel.fit" in completed.stdout and "bit-for-bit identical" in completed.stdout
