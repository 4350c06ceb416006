"""The examples the README points to run as documented."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # each test starts processes

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_multi_worker_example_two_local_workers():
    completed = subprocess.run(
        [sys.executable, "examples/multi_worker.py", "--launch", "2", "--epochs", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(ROOT)),
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    reports = re.findall(
        r"worker (\d): 2 replicas, final loss ([\d.]+), test accuracy ([\d.]+), weight checksum (-?[\d.]+)$",
        completed.stdout,
        flags=re.M,
    )
    assert sorted(r[0] for r in reports) == ["0", "1"], completed.stdout
    assert reports[0][1:] == reports[1][1:], "both workers must end with the same model"
    assert float(reports[0][2]) > 0.5


def test_multi_worker_example_without_tf_config_says_what_to_do():
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    completed = subprocess.run(
        [sys.executable, "examples/multi_worker.py"], cwd=ROOT, capture_output=True, text=True, env=env, timeout=120
    )
    assert completed.returncode == 2
    assert "TF_CONFIG is not set: expected the cluster and this worker's index" in completed.stderr
    assert "--launch N" in completed.stderr
