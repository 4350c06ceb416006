"""Parity harness: train the same model with a reference class and with custom_fit, compare.

A run records everything a user can observe: final weights, ``History``,
per-batch callback logs (train and test), ``evaluate`` and ``predict``.
``assert_same`` requires exact equality and stores the measured max |delta|
per quantity in ``RESULTS`` so the suite can print a parity table.
"""

from __future__ import annotations

import dataclasses
import math
import types
from collections.abc import Callable
from typing import Any

import numpy as np

from custom_fit import keras

RESULTS: dict[str, dict[str, float]] = {}
QUANTITIES = ("weights", "history", "evaluate", "predict", "batch_logs")

N_TRAIN, N_VAL, N_FEATURES, N_CLASSES = 99, 30, 8, 3  # 99 = 6 batches of 16 + 3


def classification_data(seed: int = 0) -> dict[str, np.ndarray]:
    """99 training and 30 validation samples of a 3-class problem (float32, int labels)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(N_TRAIN + N_VAL, N_FEATURES)).astype("float32")
    w = rng.normal(size=(N_FEATURES, N_CLASSES))
    y = np.argmax(x @ w + 0.5 * rng.normal(size=(N_TRAIN + N_VAL, N_CLASSES)), axis=1)
    return {
        "x": x[:N_TRAIN],
        "y": y[:N_TRAIN].astype("int32"),
        "x_val": x[N_TRAIN:],
        "y_val": y[N_TRAIN:].astype("int32"),
        "sample_weight": rng.uniform(0.2, 2.0, size=N_TRAIN).astype("float32"),
    }


class BatchLogRecorder(keras.callbacks.Callback):
    """Records the logs of every train and test batch, as Python floats."""

    def __init__(self):
        super().__init__()
        self.logs: list[tuple[str, int, dict[str, float]]] = []

    def _record(self, kind, batch, logs):
        self.logs.append((kind, batch, {k: float(v) for k, v in (logs or {}).items()}))

    def on_train_batch_end(self, batch, logs=None):
        self._record("train", batch, logs)

    def on_test_batch_end(self, batch, logs=None):
        self._record("test", batch, logs)


@dataclasses.dataclass
class Run:
    """What one training run produced."""

    weights: list[np.ndarray]
    history: dict[str, list[float]]
    batch_logs: list[tuple[str, int, dict[str, float]]]
    evaluate: dict[str, float]
    predict: Any
    model: keras.Model


@dataclasses.dataclass(frozen=True)
class Case:
    """One row of a parity matrix: how to build, compile, fit and evaluate a model.

    ``fit`` and ``evaluate`` are factories, so that each run gets fresh
    callbacks and datasets; ``compile`` values that are functions (an
    optimizer factory) are called once per run.
    """

    build: Callable[[type], keras.Model]
    fit: Callable[[], dict]
    compile: dict = dataclasses.field(default_factory=dict)
    evaluate: Callable[[], dict] | None = None
    keras3_only: bool = False
    slow: bool = False

    def train(self, base: type, seed: int) -> Run:
        """Trains this case on ``base`` from ``seed``."""
        return train(
            self.build, base, seed=seed, compile_kwargs=self.compile, fit_args=self.fit, eval_args=self.evaluate
        )


def compare(name: str, case: Case, reference: type, candidate: type, seed: int) -> Run:
    """Trains ``case`` on ``reference`` and on ``candidate``; requires every quantity to be equal."""
    expected, got = case.train(reference, seed), case.train(candidate, seed)
    assert isinstance(got.model, candidate)
    assert_same(name, expected, got)
    return got


def train(
    build: Callable[[type], keras.Model],
    base: type,
    *,
    seed: int,
    compile_kwargs: dict,
    fit_args: Callable[[], dict],
    eval_args: Callable[[], dict] | None = None,
) -> Run:
    """Builds ``build(base)`` from ``seed``, compiles, fits, evaluates and predicts.

    ``fit_args`` / ``eval_args`` are factories so that each run gets fresh
    callbacks and datasets.
    """
    keras.utils.set_random_seed(seed)
    model = build(base)
    compile_kwargs = dict(compile_kwargs)
    if isinstance(compile_kwargs.get("optimizer"), types.FunctionType):  # a factory: one optimizer per run
        compile_kwargs["optimizer"] = compile_kwargs["optimizer"]()
    model.compile(**compile_kwargs)
    recorder = BatchLogRecorder()
    kwargs = dict(fit_args())
    kwargs["callbacks"] = [recorder, *kwargs.get("callbacks", [])]
    history = model.fit(verbose=0, **kwargs)
    eval_kwargs = eval_args() if eval_args else {}
    evaluation = model.evaluate(verbose=0, return_dict=True, **eval_kwargs)
    x_pred = eval_kwargs.get("x", kwargs.get("x"))
    predictions = model.predict(x_pred, verbose=0)
    return Run(
        weights=[np.array(w) for w in model.get_weights()],
        history={k: [float(v) for v in vs] for k, vs in history.history.items()},
        batch_logs=recorder.logs,
        evaluate={k: float(v) for k, v in evaluation.items()},
        predict=predictions,
        model=model,
    )


def max_delta(a: Any, b: Any) -> float:
    """Max |a - b| over matching nested structures of numbers and arrays (inf on mismatch)."""
    if isinstance(a, dict):
        if not isinstance(b, dict) or set(a) != set(b):
            return math.inf
        return max((max_delta(a[k], b[k]) for k in a), default=0.0)
    if isinstance(a, (list, tuple)) and not isinstance(a, np.ndarray):
        if not isinstance(b, (list, tuple)) or len(a) != len(b):
            return math.inf
        return max((max_delta(x, y) for x, y in zip(a, b, strict=True)), default=0.0)
    if isinstance(a, str):
        return 0.0 if a == b else math.inf
    a, b = np.asarray(a, dtype="float64"), np.asarray(b, dtype="float64")
    if a.shape != b.shape:
        return math.inf
    if a.size == 0:
        return 0.0
    both_nan = np.isnan(a) & np.isnan(b)
    return float(np.max(np.where(both_nan, 0.0, np.abs(a - b))))


def assert_same(name: str, reference: Run, candidate: Run, tolerance: float = 0.0) -> None:
    """Requires ``candidate`` to equal ``reference`` everywhere (within ``tolerance``).

    Records the measured deltas under ``name`` in ``RESULTS``.
    """
    deltas = {
        "weights": max_delta(reference.weights, candidate.weights),
        "history": max_delta(reference.history, candidate.history),
        "evaluate": max_delta(reference.evaluate, candidate.evaluate),
        "predict": max_delta(reference.predict, candidate.predict),
        "batch_logs": max_delta(
            [(k, b, logs) for k, b, logs in reference.batch_logs],
            [(k, b, logs) for k, b, logs in candidate.batch_logs],
        ),
    }
    record(name, **deltas)
    assert sorted(reference.history) == sorted(candidate.history), (
        f"history keys differ: {sorted(reference.history)} vs {sorted(candidate.history)}"
    )
    bad = {k: v for k, v in deltas.items() if not v <= tolerance}
    assert not bad, f"{name}: max |delta| above {tolerance}: {bad}"


def record(name: str, **deltas: float) -> None:
    """Stores measured max |delta| values for the parity table.

    Quantities not measured print as "-"; keys other than ``QUANTITIES`` are ignored.
    """
    RESULTS[name] = {k: float(deltas[k]) for k in QUANTITIES if k in deltas}


class StopAt(keras.callbacks.Callback):
    """Simulates a crash at the start of ``epoch`` (for resume tests)."""

    def __init__(self, epoch: int):
        super().__init__()
        self.epoch = epoch

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:
            raise RuntimeError("simulated interruption")
