"""Throughput of custom_fit against keras.Model.fit and hand-written loops, measured side by side.

Run ``make bench`` (or ``python benchmarks/bench.py [--quick] [--out DIR]``). With
``TF_USE_LEGACY_KERAS=1`` it measures on Keras 2 (tf_keras): ``CustomModel.fit``
against tf_keras' ``Model.fit`` only (the keras.io step and GAN and the
hand-written loops are Keras 3 code), into ``OUT/results_keras2.*``.

Every variant of a workload is built and warmed up (one untimed epoch: tracing,
optimizer creation), then the variants run one timed epoch each, in turn,
``--repeats`` times (A B C A B C ...), so that load on a shared machine hits
them alike. Reported: median samples/s and spread (min-max) per variant, the
median of the per-round ratios to ``keras.Model.fit`` (each ratio from the
same round), and the peak resident-memory growth while the variant ran (one
process, so approximate). Results go to ``OUT/results.json``, ``OUT/results.md``
and ``OUT/throughput.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import tensorflow as tf

import custom_fit
from custom_fit import keras

HERE = Path(__file__).resolve().parent
KERAS_2 = custom_fit.KERAS_VERSION.startswith("tf_keras")
STEM = "results_keras2" if KERAS_2 else "results"


class PeakMemory:
    """Samples this process' resident memory every 5 ms; ``peak_mb`` is the growth over the start."""

    def __enter__(self):
        self.start = self.peak = _rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, _rss_bytes())

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_bytes())
        self.peak_mb = (self.peak - self.start) / 2**20


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# -- workloads ------------------------------------------------------------------


def seed_cnn(base: type) -> keras.Model:
    """Seed 000's CNN: 32x32x3 inputs, 100 classes."""
    inputs = keras.Input((32, 32, 3))
    h = keras.layers.Conv2D(16, 3, activation="relu")(inputs)
    h = keras.layers.MaxPool2D((2, 2))(h)
    h = keras.layers.Conv2D(32, 3, activation="relu")(h)
    h = keras.layers.MaxPool2D((2, 2))(h)
    h = keras.layers.Flatten()(h)
    h = keras.layers.Dense(256, activation="relu")(h)
    return base(inputs, keras.layers.Dense(100, activation="softmax")(h))


def small_mlp(base: type) -> keras.Model:
    """A small MLP whose step time is dominated by per-step overhead."""
    inputs = keras.Input((16,))
    h = keras.layers.Dense(32, activation="relu")(inputs)
    return base(inputs, keras.layers.Dense(10, activation="softmax")(h))


def classification_data(kind: str, n: int):
    rng = np.random.default_rng(0)
    if kind == "cnn":
        return rng.random((n, 32, 32, 3), dtype=np.float32), rng.integers(0, 100, n).astype("int32")
    return rng.normal(size=(n, 16)).astype("float32"), rng.integers(0, 10, n).astype("int32")


def fit_variant(build: Callable, base: type, x, y, batch: int, **compile_kwargs) -> Callable[[], None]:
    keras.utils.set_random_seed(0)
    model = build(base)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"], **compile_kwargs)
    return lambda: model.fit(x, y, batch_size=batch, epochs=1, verbose=0, shuffle=False)


def classification_variants(kind: str, n: int, batch: int, eager_n: int) -> dict:
    """The five ways of training the same model; each entry: (run_epoch, samples per epoch)."""
    from benchmarks import baselines  # Keras 3 code

    build = seed_cnn if kind == "cnn" else small_mlp
    x, y = classification_data(kind, n)
    keras.utils.set_random_seed(0)
    loop = baselines.tf_function_loop(build(keras.Model), batch)
    keras.utils.set_random_seed(0)
    eager = baselines.eager_per_sample_loop(build(keras.Model), batch)
    return {
        "keras.Model.fit": (fit_variant(build, keras.Model, x, y, batch), n),
        "CustomModel.fit": (fit_variant(build, custom_fit.CustomModel, x, y, batch), n),
        "keras.io train_step": (fit_variant(build, baselines.keras_io_step_model(), x, y, batch), n),
        "tf.function loop": (lambda: loop(x, y), n),
        "eager per-sample loop (seeds)": (lambda: eager(x[:eager_n], y[:eager_n]), eager_n),
    }


def gan_parts(latent: int) -> tuple[keras.Model, keras.Model]:
    generator = keras.Sequential(
        [
            keras.Input((latent,)),
            keras.layers.Dense(128),
            keras.layers.LeakyReLU(0.2),
            keras.layers.Dense(64, activation="tanh"),
        ]
    )
    discriminator = keras.Sequential(
        [keras.Input((64,)), keras.layers.Dense(128), keras.layers.LeakyReLU(0.2), keras.layers.Dense(1)]
    )
    return generator, discriminator


def gan_variants(n_repeat: int, batch: int) -> dict:
    from sklearn.datasets import load_digits

    from benchmarks import baselines  # Keras 3 code

    x = np.tile((load_digits().data / 8.0 - 1.0).astype("float32"), (n_repeat, 1))
    latent = 16
    keras.utils.set_random_seed(0)
    gan = custom_fit.GAN(*gan_parts(latent), latent, seed=0)
    gan.compile()
    keras.utils.set_random_seed(0)
    generator, discriminator = gan_parts(latent)
    io_gan = baselines.keras_io_gan()(discriminator=discriminator, generator=generator, latent_dim=latent)
    io_gan.compile(
        d_optimizer=keras.optimizers.Adam(2e-4, beta_1=0.5),
        g_optimizer=keras.optimizers.Adam(2e-4, beta_1=0.5),
        loss_fn=keras.losses.BinaryCrossentropy(from_logits=True),
    )
    keras.utils.set_random_seed(0)
    loop = baselines.tf_function_gan_loop(*gan_parts(latent), latent, batch)
    n = len(x)
    return {
        "keras.io GAN (keras.Model)": (lambda: io_gan.fit(x, batch_size=batch, epochs=1, verbose=0, shuffle=False), n),
        "custom_fit.GAN": (lambda: gan.fit(x, batch_size=batch, epochs=1, verbose=0, shuffle=False), n),
        "tf.function GAN loop": (lambda: loop(x), n),
    }


def options_variants(kind: str, n: int, batch: int, **compile_kwargs) -> dict:
    """keras.Model.fit vs CustomModel.fit under one compile setting."""
    build = seed_cnn if kind == "cnn" else small_mlp
    x, y = classification_data(kind, n)
    return {
        "keras.Model.fit": (fit_variant(build, keras.Model, x, y, batch, **compile_kwargs), n),
        "CustomModel.fit": (fit_variant(build, custom_fit.CustomModel, x, y, batch, **compile_kwargs), n),
    }


# -- measurement ----------------------------------------------------------------


def measure(variants: dict, repeats: int, reference: str) -> dict:
    """Warm up every variant, then time them interleaved; summarize per variant."""
    for run, _ in variants.values():
        run()
    rates: dict[str, list[float]] = {name: [] for name in variants}
    memory = dict.fromkeys(variants, 0.0)
    for _ in range(repeats):
        for name, (run, samples) in variants.items():
            with PeakMemory() as peak:
                start = time.perf_counter()
                run()
                seconds = time.perf_counter() - start
            rates[name].append(samples / seconds)
            memory[name] = max(memory[name], peak.peak_mb)
    summary = {}
    for name, values in rates.items():
        ratios = [a / b for a, b in zip(values, rates[reference], strict=True)]
        summary[name] = {
            "samples_per_s_median": statistics.median(values),
            "samples_per_s_min": min(values),
            "samples_per_s_max": max(values),
            "ratio_to_reference_median": statistics.median(ratios),
            "ratio_to_reference_min": min(ratios),
            "ratio_to_reference_max": max(ratios),
            "peak_rss_growth_mb": memory[name],
            "runs": values,
        }
    return {"reference": reference, "repeats": repeats, "variants": summary}


def sizes(quick: bool) -> dict:
    if quick:
        return dict(repeats=1, cnn_n=128, mlp_n=512, eager_n=64, gan_repeat=1, spe=(1, 4))
    # Timed epochs of 1-3 s, so that scheduler noise on a shared machine stays small.
    return dict(repeats=9, cnn_n=8192, mlp_n=49152, eager_n=2048, gan_repeat=16, spe=(1, 4, 16, 64))


def run_all(quick: bool) -> dict:
    s = sizes(quick)
    workloads = {}
    for kind, n, title in (
        ("cnn", s["cnn_n"], "cnn (seed 000: 32x32x3, 100 classes, batch 32)"),
        ("mlp", s["mlp_n"], "mlp (16-32-10, batch 32)"),
    ):
        variants = options_variants(kind, n, 32) if KERAS_2 else classification_variants(kind, n, 32, s["eager_n"])
        workloads[title] = measure(variants, s["repeats"], "keras.Model.fit")
    if not KERAS_2:
        workloads["digits GAN (MLP, batch 64, two optimizers)"] = measure(
            gan_variants(s["gan_repeat"], 64), s["repeats"], "keras.io GAN (keras.Model)"
        )
    for spe in s["spe"]:
        workloads[f"mlp, steps_per_execution={spe}"] = measure(
            options_variants("mlp", s["mlp_n"], 32, steps_per_execution=spe), s["repeats"], "keras.Model.fit"
        )
    for kind, n in (("mlp", s["mlp_n"]), ("cnn", s["cnn_n"])):
        workloads[f"{kind}, jit_compile=True"] = measure(
            options_variants(kind, n, 32, jit_compile=True), s["repeats"], "keras.Model.fit"
        )
    return workloads


def recheck(names: list[str], repeats: int) -> dict:
    """Longer interleaved A/B runs for the named option workloads (e.g. ones below target)."""
    s = sizes(False)
    builders = {
        f"mlp, steps_per_execution={spe}": ("mlp", s["mlp_n"], dict(steps_per_execution=spe)) for spe in s["spe"]
    }
    builders.update(
        {
            f"{kind}, jit_compile=True": (kind, n, dict(jit_compile=True))
            for kind, n in (("mlp", s["mlp_n"]), ("cnn", s["cnn_n"]))
        }
    )
    unknown = [n for n in names if n not in builders]
    if unknown:
        raise SystemExit(f"--recheck expected workload names from {sorted(builders)}, received {unknown}")
    return {
        name: measure(
            options_variants(builders[name][0], builders[name][1], 32, **builders[name][2]), repeats, "keras.Model.fit"
        )
        for name in names
    }


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (
        f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"TensorFlow {tf.__version__}, {custom_fit.KERAS_VERSION}, custom_fit {custom_fit.__version__}"
    )


def markdown(results: dict) -> str:
    lines = [
        f"Measured on: {results['machine']} ({'quick' if results['quick'] else 'full'} sizes, "
        f"{results['repeats']} interleaved rounds).",
        "",
        "| workload | variant | samples/s (median) | spread (min-max) "
        "| ratio to reference (median, min-max) | peak RSS growth |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for workload, result in results["workloads"].items():
        for name, v in result["variants"].items():
            reference = " (reference)" if name == result["reference"] else ""
            lines.append(
                f"| {workload} | {name}{reference} | {v['samples_per_s_median']:,.0f} | "
                f"{v['samples_per_s_min']:,.0f}-{v['samples_per_s_max']:,.0f} | "
                f"{v['ratio_to_reference_median']:.3f} "
                f"({v['ratio_to_reference_min']:.2f}-{v['ratio_to_reference_max']:.2f}) | "
                f"{v['peak_rss_growth_mb']:.0f} MB |"
            )
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(f"{w.split(' (')[0]}: {n}", v) for w, r in results["workloads"].items() for n, v in r["variants"].items()]
    fig, ax = plt.subplots(figsize=(10, 0.3 * len(rows) + 1.2))
    medians = [v["ratio_to_reference_median"] for _, v in rows]
    errors = [
        [m - v["ratio_to_reference_min"] for m, (_, v) in zip(medians, rows, strict=True)],
        [v["ratio_to_reference_max"] - m for m, (_, v) in zip(medians, rows, strict=True)],
    ]
    ax.barh(
        range(len(rows)),
        medians,
        xerr=errors,
        color=["tab:orange" if "custom" in n.lower() else "tab:gray" for n, _ in rows],
    )
    ax.set_yticks(range(len(rows)), [n for n, _ in rows], fontsize=7)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xlabel(
        "throughput / reference (keras.Model.fit; keras.io GAN for the GAN), log scale;\n"
        "bars: median of per-round ratios, whiskers: min-max"
    )
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one round (used by the tests)")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument(
        "--recheck",
        nargs="+",
        metavar="WORKLOAD",
        help="only these option workloads (e.g. 'mlp, steps_per_execution=4'), longer",
    )
    parser.add_argument("--repeats", type=int, default=15, help="rounds for --recheck")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    stem = ("recheck_keras2" if KERAS_2 else "recheck") if args.recheck else STEM
    repeats = args.repeats if args.recheck else sizes(args.quick)["repeats"]
    workloads = recheck(args.recheck, args.repeats) if args.recheck else run_all(args.quick)
    results = {"machine": machine(), "quick": args.quick, "repeats": repeats, "workloads": workloads}
    results["seconds"] = time.perf_counter() - started
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps(results, indent=1))
    (args.out / f"{stem}.md").write_text(markdown(results))
    if not args.recheck:
        plot(results, args.out / f"throughput{'_keras2' if KERAS_2 else ''}.png")
    print(markdown(results))
    print(f"wrote {args.out / stem}.json and .md in {results['seconds']:.0f} s")
    return results


if __name__ == "__main__":
    main()
