"""The GPU table (issue 44): bench.py's method and workloads, sized for one GPU, plus XLA and mixed precision.

One workload per process (``--only KEY``), so that ``run.sh`` can cap each with ``timeout``;
each writes ``DIR/gpu_<key>.json``. ``--merge DIR`` then joins them, with the GPU utilization
that ``nvidia-smi`` logged during each workload, into ``OUT/gpu.json``, ``gpu.md`` and ``gpu.png``.

Workloads: the seed CNN (32x32x3, 100 classes, batch 128), a ResNet-style CNN (batch 256), the
MLP (batch 32) and the digits GAN (batch 64). Variants: as in ``bench.py`` (``keras.Model.fit``
the reference, ``CustomModel.fit``, ``steps_per_execution="auto"``, Keras' own ``CallbackList``,
the hand-written ``tf.function`` loop), plus ``jit_compile=True`` for the reference and
``CustomModel.fit``, and on the ResNet both under ``mixed_float16``. The hand-written loop
reads a weight back after each pass, so that its time includes the GPU's work, as ``fit``'s does
(``fit`` reads its logs at the end of the epoch).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import gc
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import bench  # noqa: I001  (sets TF_CPP_MIN_LOG_LEVEL before TensorFlow's import)

import numpy as np
import tensorflow as tf

import custom_fit
from custom_fit import keras

JIT = "jit_compile=True"
MIXED = "mixed_float16"
KEYS = ("cnn", "resnet", "mlp", "gan")


def resnet_style(base: type) -> keras.Model:
    """A small ResNet for 32x32x3 images, 100 classes: 3 stages of 2 residual blocks (64, 128, 256 filters)."""
    inputs = keras.Input((32, 32, 3))
    h = keras.layers.Conv2D(64, 3, padding="same", use_bias=False)(inputs)
    h = keras.layers.ReLU()(keras.layers.BatchNormalization()(h))
    for stage, filters in enumerate((64, 128, 256)):
        for block in range(2):
            stride = 2 if stage > 0 and block == 0 else 1
            shortcut = h
            y = keras.layers.Conv2D(filters, 3, strides=stride, padding="same", use_bias=False)(h)
            y = keras.layers.ReLU()(keras.layers.BatchNormalization()(y))
            y = keras.layers.Conv2D(filters, 3, padding="same", use_bias=False)(y)
            y = keras.layers.BatchNormalization()(y)
            if stride != 1 or shortcut.shape[-1] != filters:
                shortcut = keras.layers.Conv2D(filters, 1, strides=stride, use_bias=False)(shortcut)
                shortcut = keras.layers.BatchNormalization()(shortcut)
            h = keras.layers.ReLU()(keras.layers.Add()([y, shortcut]))
    h = keras.layers.GlobalAveragePooling2D()(h)
    # float32 output under mixed_float16, as Keras' mixed-precision guide asks
    return base(inputs, keras.layers.Dense(100, activation="softmax", dtype="float32")(h))


def synced_loop(build: Any, x: np.ndarray, y: np.ndarray, batch: int) -> bench.Builder:
    """The hand-written loop of ``baselines.py``; each pass ends by reading a weight (the GPU's work done)."""

    def make() -> bench.Run:
        from benchmarks import baselines

        keras.utils.set_random_seed(0)
        model = build(keras.Model)
        run_epoch = baselines.tf_function_loop(model, batch)
        last = model.trainable_variables[-1]

        def run() -> None:
            run_epoch(x, y)
            last.numpy()

        return run

    return make


def classification(key: str, n: int, batch: int) -> bench.Workload:
    """The seed CNN, the ResNet-style CNN or the MLP, with every variant of the GPU table."""
    build = {"cnn": bench.seed_cnn, "resnet": resnet_style, "mlp": bench.small_mlp}[key]
    rng = np.random.default_rng(0)
    if key == "mlp":
        x, y = rng.normal(size=(n, 16)).astype("float32"), rng.integers(0, 10, n).astype("int32")
        title = f"mlp (16-32-10, batch {batch})"
    else:
        x, y = rng.random((n, 32, 32, 3), dtype=np.float32), rng.integers(0, 100, n).astype("int32")
        name = "cnn (seed 000" if key == "cnn" else "resnet-style (3x2 blocks, 64-256 filters"
        title = f"{name}: 32x32x3, 100 classes, batch {batch})"
    fit = bench.fit_builder
    ref, custom = keras.Model, custom_fit.CustomModel
    builders: dict[str, bench.Builder] = {
        "keras.Model.fit": fit(build, ref, x, y, batch),
        "CustomModel.fit": fit(build, custom, x, y, batch),
        f"CustomModel.fit, {bench.AUTO}": fit(build, custom, x, y, batch, steps_per_execution="auto"),
        bench.EAGER_LOGS: fit(build, custom, x, y, batch, keras_callbacks=True),
        "tf.function loop": synced_loop(build, x, y, batch),
        f"keras.Model.fit, {JIT}": fit(build, ref, x, y, batch, jit_compile=True),
        f"CustomModel.fit, {JIT}": fit(build, custom, x, y, batch, jit_compile=True),
    }
    gains = [
        (bench.AUTO, f"CustomModel.fit, {bench.AUTO}", "CustomModel.fit"),
        ("lazy callbacks", "CustomModel.fit", bench.EAGER_LOGS),
        (f"CustomModel / keras.Model, {JIT}", f"CustomModel.fit, {JIT}", f"keras.Model.fit, {JIT}"),
    ]
    if key == "resnet":
        builders[f"keras.Model.fit, {MIXED}"] = bench.under_policy(fit(build, ref, x, y, batch), MIXED)
        builders[f"CustomModel.fit, {MIXED}"] = bench.under_policy(fit(build, custom, x, y, batch), MIXED)
        gains += [
            (f"CustomModel / keras.Model, {MIXED}", f"CustomModel.fit, {MIXED}", f"keras.Model.fit, {MIXED}"),
            (f"{MIXED} / float32 (CustomModel.fit)", f"CustomModel.fit, {MIXED}", "CustomModel.fit"),
        ]
    return bench.Workload(title, n, "keras.Model.fit", "tf.function loop", builders, gains)


def sizes(quick: bool) -> dict[str, tuple[int, int]]:
    """(training examples per run, batch) per workload: 16-128 steps per sample."""
    if quick:
        return {"cnn": (256, 128), "resnet": (64, 32), "mlp": (256, 32), "gan": (256, 64)}
    return {"cnn": (128 * 64, 128), "resnet": (256 * 16, 256), "mlp": (4096, 32), "gan": (8192, 64)}


def workload(key: str, quick: bool) -> bench.Workload:
    n, batch = sizes(quick)[key]
    if key == "gan":
        return bench.gan(n, batch)
    return classification(key, n, batch)


def run_one(args: argparse.Namespace) -> dict[str, Any]:
    """Measures workload ``args.only`` into ``args.out/gpu_<key>.json``."""
    threads = bench.pin_threads(args.threads)
    settings = {"min_rounds": args.min_rounds, "max_rounds": args.max_rounds, "max_seconds": args.max_seconds}
    if args.quick:
        settings.update(min_rounds=2, max_rounds=2)
    if args.deterministic:
        tf.config.experimental.enable_op_determinism()
    load = workload(args.only, args.quick)
    print(f"{load.title}: {len(load.builders)} variants, {load.samples} examples per run", flush=True)
    started = time.time()
    result = bench.measure(load, settings, random.Random(f"{args.seed}/{args.only}"))
    result.update(started_at=started, ended_at=time.time(), title=load.title, key=args.only)
    for entry in result["variants"].values():
        if entry.get("available"):
            steps = -(-load.samples // sizes(args.quick)[args.only][1])
            entry["steps_per_s_median"] = statistics.median(steps / t for t in entry["wall_s"])
    results = {
        "machine": bench.machine(),
        "gpus": [d.name for d in tf.config.list_physical_devices("GPU")],
        "device": gpu_name(),
        "threads": threads,
        "method": bench.method(settings),
        "quick": args.quick,
        "seed": args.seed,
        "settings": {**settings, "ci_target": bench.CI_TARGET, "confidence": 0.95},
        "workloads": {load.title: result},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"gpu_{args.only}.json").write_text(json.dumps(results, indent=1))
    print(bench.markdown(results))
    return results


def gpu_name() -> str:
    """The first GPU's name as TensorFlow reports it, or 'no GPU'."""
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return "no GPU"
    details = tf.config.experimental.get_device_details(gpus[0])
    return f"{details.get('device_name', gpus[0].name)} (compute capability {details.get('compute_capability')})"


def utilization(smi_csv: Path, start: float, end: float) -> dict[str, Any] | None:
    """Mean and median GPU utilization (%) that ``nvidia-smi`` logged between ``start`` and ``end``."""
    if not smi_csv.is_file():
        return None
    values = []
    with open(smi_csv) as f:
        for row in csv.reader(f):
            try:
                stamp = datetime.datetime.strptime(row[0].strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()
                value = float(row[1])
            except (ValueError, IndexError):
                continue
            if start <= stamp <= end:
                values.append(value)
    if not values:
        return None
    return {"mean": statistics.fmean(values), "median": statistics.median(values), "samples": len(values)}


def merge(parts: Path, out: Path, smi_csv: Path | None) -> dict[str, Any]:
    """Joins ``parts/gpu_*.json`` into ``out/gpu.json``, ``gpu.md`` and ``gpu.png``."""
    merged: dict[str, Any] = {}
    for key in KEYS:
        path = parts / f"gpu_{key}.json"
        if not path.is_file():
            continue
        results = json.loads(path.read_text())
        if not merged:
            merged = {**results, "workloads": {}}
        for title, result in results["workloads"].items():
            if smi_csv is not None:
                result["gpu_utilization"] = utilization(smi_csv, result["started_at"], result["ended_at"])
            merged["workloads"][title] = result
    if not merged:
        raise SystemExit(f"no gpu_*.json in {parts}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu.json").write_text(json.dumps(merged, indent=1))
    lines = [bench.markdown(merged), "", "| workload | variant | steps/s (median) |", "|---|---|---:|"]
    for title, result in merged["workloads"].items():
        for name, v in result["variants"].items():
            if v.get("available"):
                lines.append(f"| {title} | {name} | {v['steps_per_s_median']:,.1f} |")
    lines += ["", "| workload | GPU utilization, mean % (nvidia-smi samples) |", "|---|---:|"]
    for title, result in merged["workloads"].items():
        u = result.get("gpu_utilization")
        shown = f"{u['mean']:.0f} ({u['samples']})" if u else "-"
        lines.append(f"| {title} | {shown} |")
    lines.append(f"\nDevice: {merged.get('device')}; {merged['machine']}.")
    (out / "gpu.md").write_text("\n".join(lines) + "\n")
    try:
        bench.plot(merged, out / "gpu.png")
    except ImportError as error:  # matplotlib missing on the image: the table is still written
        print(f"no plot: {error}", flush=True)
    return merged


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--only", choices=KEYS, help="the one workload to measure")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--merge", type=Path, help="join DIR/gpu_*.json into OUT/gpu.{json,md,png}")
    parser.add_argument("--smi-csv", type=Path, help="nvidia-smi's log, for --merge")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=0, help="TensorFlow's thread pools (0: its default)")
    parser.add_argument("--min-rounds", type=int, default=8)
    parser.add_argument("--max-rounds", type=int, default=1000)
    parser.add_argument("--max-seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--deterministic", action="store_true", help="enable_op_determinism() first")
    args = parser.parse_args(argv)
    if args.merge:
        merge(args.merge, args.out, args.smi_csv)
    elif args.only:
        run_one(args)
        gc.collect()
    else:
        parser.error("expected --only KEY or --merge DIR")
    return 0


if __name__ == "__main__":
    sys.exit(main())
