"""The main job: train a CNN on scikit-learn's bundled digits with ``CustomModel.fit``.

Run ``python -m custom_fit.demo`` (or ``make demo``). It trains the same small
CNN twice from the same seed, once with :class:`custom_fit.CustomModel` and once
with ``keras.Model``, showing Keras' progress bar and a validation split, then
prints a side-by-side report: test accuracy, final losses, the largest weight
difference between the two runs, and time per epoch. Nothing is downloaded:
the 1,797 8x8 digit images ship with scikit-learn.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
from tensorflow import keras

from custom_fit.model import CustomModel


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
    inputs = keras.Input((8, 8, 1))
    h = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(inputs)
    h = keras.layers.MaxPooling2D()(h)
    h = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(h)
    h = keras.layers.Flatten()(h)
    h = keras.layers.Dense(64, activation="relu")(h)
    h = keras.layers.Dropout(0.2)(h)
    outputs = keras.layers.Dense(10, activation="softmax")(h)
    return base(inputs, outputs, name=f"digits_cnn_{base.__name__}")


class EpochTimer(keras.callbacks.Callback):
    """Wall-clock seconds of each epoch (training and validation)."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds: list[float] = []

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.seconds.append(time.perf_counter() - self._start)


def train(base: type, data: tuple[np.ndarray, ...], *, seed: int, epochs: int, batch_size: int, verbose: int) -> dict:
    """Trains the CNN on ``base`` from ``seed``; returns its model, history, timings and test scores."""
    x_train, y_train, x_test, y_test = data
    keras.utils.set_random_seed(seed)
    model = build_cnn(base)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    timer = EpochTimer()
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
        "epoch_seconds": timer.seconds,
        "test_loss": float(test_loss),
        "test_accuracy": float(test_accuracy),
    }


def report(custom: dict, plain: dict, n_train: int, n_test: int) -> str:
    """The side-by-side text report."""
    pairs = zip(custom["model"].get_weights(), plain["model"].get_weights(), strict=True)
    weight_delta = max(float(np.max(np.abs(a - b))) for a, b in pairs)

    def later_epochs(run: dict) -> float:  # the first epoch also traces and compiles the step
        seconds = run["epoch_seconds"][1:] or run["epoch_seconds"]
        return statistics.median(seconds)

    rows = [
        ("test accuracy", *(f"{r['test_accuracy']:.4f}" for r in (custom, plain))),
        ("test loss", *(f"{r['test_loss']:.4f}" for r in (custom, plain))),
        ("final training loss", *(f"{r['history']['loss'][-1]:.4f}" for r in (custom, plain))),
        ("final validation loss", *(f"{r['history']['val_loss'][-1]:.4f}" for r in (custom, plain))),
        ("first epoch (traces the step)", *(f"{r['epoch_seconds'][0]:.2f} s" for r in (custom, plain))),
        ("median time per later epoch", *(f"{later_epochs(r):.3f} s" for r in (custom, plain))),
    ]
    verdict = "bit-for-bit identical" if weight_delta == 0.0 else "DIFFERENT"
    lines = [
        "",
        f"custom_fit demo: CNN on scikit-learn digits ({n_train} train incl. 15% validation, {n_test} test, 8x8x1)",
        "",
        f"{'':<32}{'CustomModel.fit':>18}{'keras.Model.fit':>18}",
        *(f"{name:<32}{a:>18}{b:>18}" for name, a, b in rows),
        "",
        f"max |weight difference| between the two runs: {weight_delta:.3g} ({verdict})",
        f"time ratio CustomModel / keras.Model (later epochs): {later_epochs(custom) / later_epochs(plain):.2f}",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict:
    """Runs the demo; returns the two runs and the report (used by the tests)."""
    parser = argparse.ArgumentParser(prog="python -m custom_fit.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)

    data = load_digits_split(args.seed)
    verbose = 0 if args.quiet else 1
    runs = {}
    for base in (CustomModel, keras.Model):
        if verbose:
            print(f"\n== {base.__module__.split('.')[0]}.{base.__name__}.fit ==")
        runs[base] = train(base, data, seed=args.seed, epochs=args.epochs, batch_size=args.batch_size, verbose=verbose)
    text = report(runs[CustomModel], runs[keras.Model], len(data[0]), len(data[2]))
    print(text)
    return {"custom": runs[CustomModel], "keras": runs[keras.Model], "report": text}


if __name__ == "__main__":
    main()
