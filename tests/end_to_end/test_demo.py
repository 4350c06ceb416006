"""The main job, ``python examples/demo.py`` (``make demo``), end to end on bundled data."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest

import custom_fit

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEMO = [sys.executable, str(ROOT / "examples" / "demo.py")]
_spec = importlib.util.spec_from_file_location("demo", DEMO[1])
assert _spec is not None and _spec.loader is not None
demo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(demo)


def test_demo_trains_both_models_identically(capsys):
    result = demo.main(["--epochs", "2", "--quiet"])
    out = capsys.readouterr().out
    assert "max |weight difference| between the two runs: 0 (bit-for-bit identical)" in out
    custom, plain = result["custom"], result["keras"]
    assert custom["history"] == plain["history"]
    assert custom["test_accuracy"] == plain["test_accuracy"] > 0.5  # two epochs already learn digits
    assert len(custom["epoch_seconds"]) == 2
    assert "epoch 1 (traces the step)" in out and "epoch 2 " in out
    assert "ratio" not in out  # one run each, in a fixed order: no speed comparison (benchmarks/ makes it)


def fake_run(seconds: list[float]) -> dict:
    model = types.SimpleNamespace(get_weights=lambda: [np.zeros(3)])
    history = {"loss": [0.5], "val_loss": [0.25]}
    return {"model": model, "history": history, "epoch_seconds": seconds, "test_loss": 0.1, "test_accuracy": 0.9}


def test_report_of_one_epoch_has_no_later_epochs():
    text = demo.report(fake_run([2.0]), fake_run([3.0]), 100, 20)
    assert "the only epoch (traces the step)" in text
    assert "later" not in text and "epoch 2" not in text and "median" not in text


def test_report_states_median_and_range_of_later_epochs():
    text = demo.report(fake_run([2.0, 0.3, 0.1, 0.2]), fake_run([3.0, 0.4, 0.5, 0.6]), 100, 20)
    rows = {line[:34].strip(): line[34:].split() for line in text.splitlines() if line.startswith("epoch")}
    assert rows["epoch 1 (traces the step)"] == ["2.00", "s", "3.00", "s"]
    assert rows["epochs 2-4: median"] == ["0.200", "s", "0.500", "s"]
    assert rows["epochs 2-4: fastest-slowest"] == ["0.100-0.300", "s", "0.400-0.600", "s"]
    assert "not which is faster" in text and "make bench" in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--epochs", "0"], "argument --epochs: expected the number of epochs, a whole number 1 or more; received '0'"),
        (
            ["--epochs", "-2"],
            "argument --epochs: expected the number of epochs, a whole number 1 or more; received '-2'",
        ),
        (
            ["--epochs", "ten"],
            "argument --epochs: expected the number of epochs, a whole number 1 or more; received 'ten'",
        ),
        (["--batch-size", "0"], "argument --batch-size: expected the samples per batch, a whole number 1 or more"),
        (["--batch-size", "1.5"], "argument --batch-size: expected the samples per batch, a whole number 1 or more"),
        (["--seed", "-1"], "argument --seed: expected the random seed, a whole number from 0 to 4294967295; received"),
        (["--seed", str(2**32)], "argument --seed: expected the random seed, a whole number from 0 to 4294967295"),
    ],
)
def test_invalid_argument_says_what_was_expected_and_received(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        demo.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_tensorflow_log_lines_are_filtered_by_level():
    log = textwrap.dedent(
        """\
        WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
        I0000 00:00:1795341778.197260    8810 cudart_stub.cc:31] Could not find cuda drivers on your machine.
        a line that is not TensorFlow's log
        W1122 10:01:59.123456   8810 some_file.cc:12] a warning
        E0000 00:00:1795341784.318623    8810 cuda_platform.cc:52] failed call to cuInit: UNKNOWN ERROR (303)
        """
    )
    _notice, _info, other, warning, error = log.splitlines(keepends=True)
    assert demo.without_tensorflow_log(log, 0) == log
    assert demo.without_tensorflow_log(log, 1) == other + warning + error
    assert demo.without_tensorflow_log(log, 2) == other + error
    assert demo.without_tensorflow_log(log, 3) == other


FAKE_TENSORFLOW = """
import os
os.write(2, b"I0000 00:00:1795341778.197260    8810 cudart_stub.cc:31] Could not find cuda drivers.\\n")
os.write(2, b"printed while loading\\n")
if os.environ.get("FAKE_TF_FAILS"):
    raise ImportError("this TensorFlow does not load")
keras = config = type("Namespace", (), {"Model": None, "list_physical_devices": staticmethod(lambda: [])})
"""


@pytest.mark.slow
@pytest.mark.parametrize("fails", [False, True])
def test_tensorflow_is_loaded_quietly_and_failures_keep_their_output(tmp_path, fails):
    """File descriptor 2 is captured while TensorFlow loads (a fake one here, which writes to it directly)."""
    (tmp_path / "tensorflow").mkdir()
    (tmp_path / "tensorflow" / "__init__.py").write_text(FAKE_TENSORFLOW)
    load_demo_alone = (  # the helper alone: the demo's main would load the fake TensorFlow for Keras
        "import importlib.util, sys; "
        f"spec = importlib.util.spec_from_file_location('demo', {demo.__file__!r}); "
        "demo = importlib.util.module_from_spec(spec); spec.loader.exec_module(demo); "
        "demo.import_tensorflow_quietly(); print('loaded')"
    )
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env.update(PYTHONPATH=str(tmp_path), **({"FAKE_TF_FAILS": "1"} if fails else {}))
    completed = subprocess.run(
        [sys.executable, "-c", load_demo_alone], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    if fails:
        assert completed.returncode == 1 and completed.stdout == ""
        assert completed.stderr.startswith("I0000 00:00:1795341778.197260    8810 cudart_stub.cc:31] Could not find")
        assert "printed while loading\n" in completed.stderr
        assert completed.stderr.rstrip().endswith("ImportError: this TensorFlow does not load")
    else:
        assert (completed.returncode, completed.stdout, completed.stderr) == (0, "loaded\n", "printed while loading\n")


@pytest.mark.slow
@pytest.mark.parametrize("argv", [["--help"], ["--epochs", "0"]])
def test_help_and_argument_errors_answer_without_loading_tensorflow(argv):
    completed = subprocess.run(
        [sys.executable, "-X", "importtime", *DEMO[1:], *argv], capture_output=True, text=True, timeout=120, check=False
    )
    imported = {
        line.split("|")[-1].strip() for line in completed.stderr.splitlines() if line.startswith("import time:")
    }
    assert not {"custom_fit", "tensorflow", "keras", "tf_keras"} & imported
    if argv == ["--help"]:
        assert completed.returncode == 0 and "--epochs EPOCHS" in completed.stdout
    else:
        assert completed.returncode == 2 and "argument --epochs: expected the number of epochs" in completed.stderr


@pytest.mark.slow
def test_bare_import_registers_the_classes_for_load_model(tmp_path):
    """Why ``import custom_fit`` loads TensorFlow: Keras finds a saved class only if it is registered."""
    inputs = custom_fit.keras.Input((2,))
    model = custom_fit.CustomModel(inputs, custom_fit.keras.layers.Dense(1)(inputs))
    model.compile(optimizer="sgd", loss="mse")
    path = str(tmp_path / "model.keras")
    model.save(path)
    code = f"import custom_fit, tensorflow as tf; print(type(tf.keras.models.load_model({path!r})))"
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert "CustomModel" in completed.stdout


@pytest.mark.slow
def test_demo_entry_point_shows_progress_bar_and_nothing_on_stderr():
    """A tiny run of ``python examples/demo.py``, with the Keras of this test run and no TF_CPP_MIN_LOG_LEVEL set."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    completed = subprocess.run(
        [*DEMO, "--epochs", "1", "--batch-size", "128"], capture_output=True, text=True, env=env, timeout=300
    )
    assert (completed.returncode, completed.stderr) == (0, "")
    assert "10/10" in completed.stdout and "val_accuracy" in completed.stdout  # progress bar: 10 batches
    assert "CustomModel.fit" in completed.stdout and "bit-for-bit identical" in completed.stdout
    assert "the only epoch (traces the step)" in completed.stdout
