"""Parity on the GPU: CustomModel against keras.Model with ``tf.config.experimental.enable_op_determinism()``.

Each case trains the same model twice from the same seed, as ``keras.Model`` and as
``custom_fit.CustomModel`` (shuffled epochs, a partial last batch), and compares the final
weights and the history: equal, or the largest difference. Writes ``OUT/parity.json``.
No ``jit_compile=True`` case: with op determinism enabled, Keras 3 turns XLA off itself
("Model doesn't support `jit_compile=True`"), so it would repeat the case without it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import bench  # noqa: I001  (sets TF_CPP_MIN_LOG_LEVEL before TensorFlow's import)
from benchmarks.gpu import gpu_bench

import numpy as np
import tensorflow as tf

import custom_fit
from custom_fit import keras


def train(build: Callable[[type], keras.Model], base: type, x: np.ndarray, y: np.ndarray, batch: int, epochs: int,
          **compile_kwargs: Any) -> tuple[list[np.ndarray], dict[str, list[float]]]:  # fmt: skip
    keras.utils.set_random_seed(0)
    model = build(base)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"], **compile_kwargs)
    history = model.fit(x, y, batch_size=batch, epochs=epochs, verbose=0, shuffle=True)
    return [np.asarray(w) for w in model.get_weights()], {
        k: [float(v) for v in vs] for k, vs in history.history.items()
    }


def compare(build: Callable[[type], keras.Model], n: int, shape: tuple[int, ...], classes: int, batch: int,
            epochs: int, **compile_kwargs: Any) -> dict[str, Any]:  # fmt: skip
    """One case: keras.Model vs CustomModel."""
    rng = np.random.default_rng(0)
    x = rng.random((n, *shape), dtype=np.float32)
    y = rng.integers(0, classes, n).astype("int32")
    try:
        ref_w, ref_h = train(build, keras.Model, x, y, batch, epochs, **compile_kwargs)
        cus_w, cus_h = train(build, custom_fit.CustomModel, x, y, batch, epochs, **compile_kwargs)
    except Exception as error:  # e.g. an op without a deterministic GPU kernel
        return {"error": f"{type(error).__name__}: {error}"[:2000]}
    weight_diff = max(float(np.max(np.abs(a - b))) if a.size else 0.0 for a, b in zip(ref_w, cus_w, strict=True))
    history_diff = max(abs(a - b) for k in ref_h for a, b in zip(ref_h[k], cus_h[k], strict=True))
    return {
        "weights_equal": all(np.array_equal(a, b) for a, b in zip(ref_w, cus_w, strict=True)),
        "history_equal": ref_h == cus_h,
        "max_abs_weight_difference": weight_diff,
        "max_abs_history_difference": history_diff,
        "history_keras": ref_h,
        "history_custom": cus_h,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true", help="fewer examples (a CPU check)")
    args = parser.parse_args(argv)
    tf.config.experimental.enable_op_determinism()
    n = 300 if args.quick else 1000  # a partial last batch at batch 128 and 64
    cases = {
        "seed cnn, batch 128": lambda: compare(bench.seed_cnn, n, (32, 32, 3), 100, 128, 2),
        "resnet-style, batch 64": lambda: compare(gpu_bench.resnet_style, n // 2, (32, 32, 3), 100, 64, 2),
        "mlp, batch 32": lambda: compare(bench.small_mlp, n, (16,), 10, 32, 2),
    }
    results: dict[str, Any] = {"machine": bench.machine(), "device": gpu_bench.gpu_name(), "cases": {}}
    for name, case in cases.items():
        results["cases"][name] = result = case()
        summary = result.get("error") or (
            f"weights equal: {result['weights_equal']}, history equal: {result['history_equal']}, "
            f"max |dw| {result['max_abs_weight_difference']:.3g}"
        )
        print(f"{name}: {summary}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "parity.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
