"""The main job: train a CNN on scikit-learn's bundled digits with ``CustomModel.fit``.

Run ``python examples/demo.py`` (or ``make demo``). It trains the same small
CNN twice from the same seed, once with :class:`custom_fit.CustomModel` and once
with ``keras.Model``, showing Keras' progress bar and a validation split, then
prints a side-by-side report: test accuracy, final losses, the largest weight
difference between the two runs, and the time of each epoch. Nothing is
downloaded: the 1,797 8x8 digit images ship with scikit-learn.

stderr stays empty unless something goes wrong: TensorFlow's C++ log is off
(``TF_CPP_MIN_LOG_LEVEL=3`` unless set), including the lines TensorFlow prints
while it loads, before it reads that variable (see :func:`import_tensorflow_quietly`).
The arguments are checked before TensorFlow loads, so ``--help`` and a wrong
value answer at once. That is why the demo is a script beside the package
rather than a module in it: ``import custom_fit`` loads TensorFlow (it
registers custom_fit's classes with Keras, so that ``load_model`` finds them),
and ``python -m custom_fit.<module>`` would import the package first.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from tensorflow import keras

# A line of TensorFlow's C++ log: severity letter and date, time (before absl starts:
# 00:00:<epoch seconds>), thread id, `file:line] `.
_TF_LOG_LINE = re.compile(r"(?P<severity>[IWEF])\d{4} [\d:.]+ +\d+ [^\]\s]+:\d+\] ")
_ABSL_NOTICE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
_SEVERITIES = "IWEF"  # TF_CPP_MIN_LOG_LEVEL 0 shows all, 1 hides I, 2 hides I and W, 3 hides I, W and E


def without_tensorflow_log(text: str, min_level: int) -> str:
    """``text`` less TensorFlow's C++ log lines below ``min_level`` (``TF_CPP_MIN_LOG_LEVEL``).

    absl's notice that early log lines are written to stderr goes with the info
    lines it announces (level 1 and up). Every other line is kept, also a log
    message's second line: the early lines that ignore the level are one line each.
    """

    def wanted(line: str) -> bool:
        if header := _TF_LOG_LINE.match(line):
            return _SEVERITIES.index(header["severity"]) >= min_level
        return not (line.startswith(_ABSL_NOTICE) and min_level > 0)

    return "".join(line for line in text.splitlines(keepends=True) if wanted(line))


def import_tensorflow_quietly() -> None:
    """Loads TensorFlow, its Keras and its devices, with TensorFlow's C++ log at ``TF_CPP_MIN_LOG_LEVEL``.

    The level is 3 (no log) unless the environment sets it. TensorFlow honours
    it only once absl is initialised; the lines printed while its libraries
    load (no CUDA driver, CPU instructions, ``cuInit`` failed) come before that.
    So file descriptor 2 goes to a temporary file while TensorFlow loads and
    finds its devices, then back to stderr, which gets everything captured but
    the log lines below the level; if loading fails, everything. Does nothing
    once TensorFlow is loaded.
    """
    if "tensorflow" in sys.modules:
        return
    level = os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    min_level = int(level) if level.isdigit() else 0
    sys.stderr.flush()
    stderr_fd = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import tensorflow as tf

            tf.keras.Model  # noqa: B018  (loads Keras 3, or tf_keras under TF_USE_LEGACY_KERAS=1)
            tf.config.list_physical_devices()  # initialises the devices (CUDA logs here)
        except BaseException:
            min_level = 0
            raise
        finally:
            sys.stderr.flush()
            os.dup2(stderr_fd, 2)
            os.close(stderr_fd)
            captured.seek(0)
            sys.stderr.write(without_tensorflow_log(captured.read().decode(errors="replace"), min_level))
            sys.stderr.flush()


def load_digits_split(seed: int, test_fraction: float = 0.2) -> tuple[np.ndarray, ...]:
    """Returns ``x_train, y_train, x_test, y_test`` from scikit-learn's digits (8x8x1 in [0, 1])."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise SystemExit(
            "The demo needs scikit-learn for its bundled digits data set, which is not "
            "installed. Fix: `pip install 'custom_fit[demo]'` (or `pip install scikit-learn`)."
        ) from error
    digits = load_digits()
    x = (digits.images / 16.0).astype("float32")[..., None]
    y = digits.target.astype("int32")
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = int(len(x) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


def build_cnn(base: type) -> keras.Model:
    """A small CNN for 8x8 grayscale digits, built functionally on ``base``."""
    from tensorflow import keras

    inputs = keras.Input((8, 8, 1))
    h = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(inputs)
    h = keras.layers.MaxPooling2D()(h)
    h = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(h)
    h = keras.layers.Flatten()(h)
    h = keras.layers.Dense(64, activation="relu")(h)
    h = keras.layers.Dropout(0.2)(h)
    outputs = keras.layers.Dense(10, activation="softmax")(h)
    return base(inputs, outputs, name=f"digits_cnn_{base.__name__}")


def train(base: type, data: tuple[np.ndarray, ...], *, seed: int, epochs: int, batch_size: int, verbose: int) -> dict:
    """Trains the CNN on ``base`` from ``seed``; returns its model, history, epoch times and test scores."""
    from tensorflow import keras

    x_train, y_train, x_test, y_test = data
    keras.utils.set_random_seed(seed)
    model = build_cnn(base)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    starts: list[float] = []
    seconds: list[float] = []  # wall-clock time of each epoch, training and validation
    timer = keras.callbacks.LambdaCallback(
        on_epoch_begin=lambda epoch, logs: starts.append(time.perf_counter()),
        on_epoch_end=lambda epoch, logs: seconds.append(time.perf_counter() - starts[-1]),
    )
    history = model.fit(
        x_train,
        y_train,
        batch_size=batch_size,
        epochs=epochs,
        validation_split=0.15,
        callbacks=[timer],
        verbose=verbose,
    )
    test_loss, test_accuracy = model.evaluate(x_test, y_test, batch_size=256, verbose=0)
    return {
        "model": model,
        "history": history.history,
        "epoch_seconds": seconds,
        "test_loss": float(test_loss),
        "test_accuracy": float(test_accuracy),
    }


def _timing_rows(runs: Sequence[dict]) -> list[tuple[str, ...]]:
    """Epoch times: the first (it also traces the step), then the median and range of the others."""
    epochs = len(runs[0]["epoch_seconds"])
    first = "epoch 1 (traces the step)" if epochs > 1 else "the only epoch (traces the step)"
    rows = [(first, *(f"{r['epoch_seconds'][0]:.2f} s" for r in runs))]
    if epochs == 2:
        rows.append(("epoch 2", *(f"{r['epoch_seconds'][1]:.3f} s" for r in runs)))
    elif epochs > 2:
        later = [r["epoch_seconds"][1:] for r in runs]
        rows.append((f"epochs 2-{epochs}: median", *(f"{statistics.median(s):.3f} s" for s in later)))
        rows.append((f"epochs 2-{epochs}: fastest-slowest", *(f"{min(s):.3f}-{max(s):.3f} s" for s in later)))
    return rows


def report(
    custom: dict, plain: dict, n_train: int, n_test: int, names: tuple[str, str] = ("CustomModel", "keras.Model")
) -> str:
    """The side-by-side text report of the run on ``CustomModel`` and on plain ``names[1]``."""
    pairs = zip(custom["model"].get_weights(), plain["model"].get_weights(), strict=True)
    weight_delta = max(float(np.max(np.abs(a - b))) for a, b in pairs)
    runs = (custom, plain)
    rows = [
        ("test accuracy", *(f"{r['test_accuracy']:.4f}" for r in runs)),
        ("test loss", *(f"{r['test_loss']:.4f}" for r in runs)),
        ("final training loss", *(f"{r['history']['loss'][-1]:.4f}" for r in runs)),
        ("final validation loss", *(f"{r['history']['val_loss'][-1]:.4f}" for r in runs)),
        *_timing_rows(runs),
    ]
    verdict = "bit-for-bit identical" if weight_delta == 0.0 else "DIFFERENT"
    return "\n".join(
        [
            "",
            f"custom_fit demo: CNN on scikit-learn digits ({n_train} train incl. 15% validation, {n_test} test, 8x8x1)",
            "",
            f"{'':<34}{names[0] + '.fit':>20}{names[1] + '.fit':>20}",
            *(f"{name:<34}{a:>20}{b:>20}" for name, a, b in rows),
            "",
            f"max |weight difference| between the two runs: {weight_delta:.3g} ({verdict})",
            "",
            f"Epoch times: one run each, {names[0]} first, on a possibly busy machine; they show the cost",
            "of tracing, not which is faster. `make bench` measures speed: benchmarks/results/results.md.",
        ]
    )


def _whole_number(what: str, low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse ``type``: ``what`` as an int from ``low`` (to ``high``), else an error naming both."""
    expected = f"from {low} to {high}" if high is not None else f"{low} or more"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"expected {what}, a whole number {expected}; received {text!r}")
        return value

    return parse


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The demo's arguments, checked (argparse exits with status 2 and says what it expected)."""
    parser = argparse.ArgumentParser(
        prog="python examples/demo.py",
        description="Trains a CNN on scikit-learn's digits with CustomModel.fit and keras.Model.fit from the same "
        "seed and compares the two runs.",
    )
    parser.add_argument(
        "--epochs", type=_whole_number("the number of epochs", 1), default=10, help="training epochs (default 10)"
    )
    parser.add_argument(
        "--batch-size",
        type=_whole_number("the samples per batch", 1),
        default=32,
        help="samples per batch (default 32)",
    )
    parser.add_argument(
        "--seed",
        type=_whole_number("the random seed", 0, 2**32 - 1),
        default=42,
        help="seed of the data split and the weights (default 42)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Runs the demo; returns the two runs and the report (used by the tests)."""
    args = parse_args(argv)
    import_tensorflow_quietly()
    from tensorflow import keras

    from custom_fit._model import CustomModel

    data = load_digits_split(args.seed)
    verbose = 0 if args.quiet else 1
    plain_name = f"{keras.Model.__module__.split('.')[0]}.Model"  # keras.Model, or tf_keras.Model on Keras 2
    runs = {}
    for base, name in ((CustomModel, "CustomModel"), (keras.Model, plain_name)):
        if verbose:
            print(f"\n== {name}.fit ==")
        runs[name] = train(base, data, seed=args.seed, epochs=args.epochs, batch_size=args.batch_size, verbose=verbose)
    text = report(runs["CustomModel"], runs[plain_name], len(data[0]), len(data[2]), ("CustomModel", plain_name))
    print(text)
    return {"custom": runs["CustomModel"], "keras": runs[plain_name], "report": text}


if __name__ == "__main__":
    main()
