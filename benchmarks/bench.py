"""Throughput of custom_fit against keras.Model.fit and a hand-written loop, by paired, interleaved rounds.

Run ``make bench`` (or ``python benchmarks/bench.py [--quick] [--only aa ...] [--threads T] [--out DIR]``).
With ``TF_USE_LEGACY_KERAS=1`` it measures on Keras 2 (tf_keras) into ``OUT/results_keras2.*``.

Method, built to resolve a 2% difference in throughput on a shared machine:

* **Threads.** Before TensorFlow does any work, its intra-op and inter-op thread pools
  are pinned to ``--threads`` threads (default 1), so that every variant gets the same
  parallelism and a neighbour's load changes less; the values are recorded under
  ``threads`` (``pinned`` is false where the runtime was already running, e.g. inside
  a test process). ``tf.data``'s own threads and Python are not covered by the pin.
* **Samples.** A workload trains one model several ways (its *variants*). Each variant
  is built once (same seed, same data) and warmed up by one untimed run (tracing,
  optimizer creation). A *sample* is then one timed call of the variant's ``run()``:
  one epoch over a fixed dataset of N training examples (``fit(..., epochs=1,
  verbose=0, shuffle=False)`` or one pass of the hand-written loop), N chosen per
  workload so that a run takes about 0.3-0.8 s on a 2-core CPU with one thread: short
  samples let most of them run undisturbed (see Statistics), and each includes
  what a ``fit`` call costs besides its steps once (Keras' data pipeline, its iterators,
  the callbacks: 0.07 s more than a pass of the loop, workload "fit call cost"). Each sample
  records wall time (``time.perf_counter``) and process CPU time
  (``time.process_time``, all threads); ``gc.collect()`` runs, untimed, before each
  (with the variants frozen out of the collector, ``gc.freeze``, so that it is quick).
  "samples/s" in the results counts training examples: N / wall time.
* **Paired rounds in random order.** In each round every variant runs one sample,
  in an order shuffled anew each round (seeded ``random.Random``, ``--seed``), so
  slow phases of a shared machine and position effects fall on all variants alike.
  Within a round, the ratio of variant V to reference R is the throughput ratio
  ``(N / t_V) / (N / t_R) = t_R / t_V`` (> 1: V is faster than R). Pairing within a
  round cancels the load that both saw.
* **Statistics.** The reported ratio is the median of the per-round ratios, with its
  distribution-free 95% confidence interval: the order statistics ``x_(k)`` and
  ``x_(n+1-k)`` of the n per-round ratios, ``k`` from Binomial(n, 1/2) (the sign
  test's interval; :func:`median_ci_ranks`). On a shared virtual machine per-sample
  times have heavy tails (some epochs wait 1.7 times as long at unchanged CPU
  time), which the median ignores and a mean does not; the geometric mean with its Student-t
  interval is recorded too (``*_geomean``, ``*_geomean_ci``). The same is done for
  process CPU time (``cpu_ratio_*``), which does not count time the process waited
  but is blind to idle time.
* **Stop rule.** After at least ``--min-rounds`` rounds (default 8), rounds stop
  once every wall-time ratio the workload reports (each variant to the reference
  and to the hand-written loop) has a median CI within ±2% (each side at most
  ``log(1.02)`` in log units); or at ``--max-rounds`` (default 1000), or when the
  workload has run ``--max-seconds`` (default 600). ``ci_target_met`` says whether
  a variant's wall-time CIs reached that width; ``stopped_by`` why rounds stopped.
* **A/A check.** The workload "A/A (keras.Model.fit vs itself)" builds the MLP's
  ``keras.Model.fit`` variant twice (two identical, independently built models) and
  measures one against the other like any variant. The true ratio is 1, so the
  expected result is 1.00 within ±0.02, with a CI that contains 1 (a 95% CI misses
  in one run out of twenty by chance). A larger deviation is a bias of the method
  or of the machine (position, memory layout, load), and differences of that size
  elsewhere in the same run cannot be trusted.

Per workload (Keras 3), the variants are ``keras.Model.fit`` (the reference; the
keras.io GAN on ``keras.Model`` for the GAN), ``CustomModel.fit`` (``custom_fit.GAN``),
the same with ``compile(steps_per_execution="auto")`` (recorded as unavailable, with
the error, where that option fails) and the hand-written ``tf.function`` loop of
``benchmarks/baselines.py`` (``ratio_to_loop`` is relative to it). The CNN and the MLP
also measure ``CustomModel.fit`` given Keras' own ``CallbackList``, whose logs become
Python numbers after every step: its ratio to ``CustomModel.fit`` is what the lazy
callbacks of :mod:`custom_fit._trainer.callbacks` gain. The workload "fit call cost" is the CNN's
with one step per sample: its ratios to the loop show what each ``fit`` call costs
besides its steps, which every short sample of the other workloads pays once; "cnn, 4
epochs per fit call" trains the CNN's epochs four to a ``fit`` call (and four passes of the
loop), as training runs do. On Keras 2 the keras.io GAN, that variant (tf_keras has no
per-step wait to remove) and the loops (Keras 3 code) are left out. The four "gradient
contract" workloads (Keras 3; ``--only contract-...``) train the MLP and the GAN in float32 and
``mixed_float16`` with and without the gradient contract (:func:`keras_gradient_order`): its cost.
The "progress bar" workload (Keras 3; ``--only progbar``) trains the MLP with ``verbose=1`` (the bar
written to ``os.devnull``), with Keras' ``ProgbarLogger`` handed the step's tensors (custom_fit's
choice: it converts them when it redraws) and handed logs converted every step (as in Keras):
what the copy ``k3-progbar`` gains. The "backups" workload (``--only backup``) trains a 2.4M-parameter
MLP with ``custom_fit.BackupAndRestore`` every 10 or 50 steps, its files written in the background or
before training goes on, against no backups. Results go to
``OUT/results.json``, ``OUT/results.md`` and ``OUT/throughput.png``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import math
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import tensorflow as tf

import custom_fit
from custom_fit import keras

HERE = Path(__file__).resolve().parent
KERAS_2 = custom_fit.KERAS_VERSION.startswith("tf_keras")
STEM = "results_keras2" if KERAS_2 else "results"
CI_TARGET = 0.02  # relative half-width of the 95% CI of every wall-time ratio
AUTO = 'steps_per_execution="auto"'
STATS = ("median", "ci", "half_width", "geomean", "geomean_ci")  # of each ratio; see ratio_stats
EAGER_LOGS = "CustomModel.fit, Keras' CallbackList (logs read every step)"
FIT_COST = "fit call cost (the cnn, one step per fit call)"
CNN_EPOCHS = "cnn, 4 epochs per fit call"
PROGBAR = "progress bar (the mlp, fit(verbose=1))"
PROGBAR_LAZY = "CustomModel.fit, verbose=1, progress bar reads converted logs"

Run = Callable[[], object]  # trains on a workload's N examples once
Builder = Callable[[], Run]  # builds and compiles a variant's model, returns its run()

# Student's t quantiles t(0.975, df) for df = 1..60 (two-sided 95%), to 4 decimals. Hand-written
# because scipy is not a dependency of this project (nor of its venv) and a 60-entry table is all
# the confidence intervals need; values computed from the regularized incomplete beta function.
_T_975 = (
    12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
    2.2010, 2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
    2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423,
    2.0395, 2.0369, 2.0345, 2.0322, 2.0301, 2.0281, 2.0262, 2.0244, 2.0227, 2.0211,
    2.0195, 2.0181, 2.0167, 2.0154, 2.0141, 2.0129, 2.0117, 2.0106, 2.0096, 2.0086,
    2.0076, 2.0066, 2.0057, 2.0049, 2.0040, 2.0032, 2.0025, 2.0017, 2.0010, 2.0003,
)  # fmt: skip
_Z_975 = 1.959963984540054


def t_quantile_975(df: int) -> float:
    """The 0.975 quantile of Student's t distribution with ``df`` degrees of freedom.

    Args:
        df: Degrees of freedom, at least 1.

    Returns:
        The table value for ``df <= 60``; beyond, the normal quantile with the first two
        Cornish-Fisher terms (within 2e-5 of the exact value there).
    """
    if df < 1:
        raise ValueError(f"t_quantile_975 expected df >= 1, received {df}")
    if df <= len(_T_975):
        return _T_975[df - 1]
    z = _Z_975
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def median_ci_ranks(n: int, confidence: float = 0.95) -> tuple[int, int]:
    """The 1-based ranks ``(k, n + 1 - k)`` of the order statistics bounding the median's CI.

    The interval ``[x_(k), x_(n+1-k)]`` holds the true median with probability
    ``1 - 2 P(B < k)``, ``B ~ Binomial(n, 1/2)``, whatever the distribution (the
    sign test's interval); ``k`` is the largest with that probability >= ``confidence``.

    Args:
        n: Number of observations, at least 1.
        confidence: The coverage wanted.

    Returns:
        ``(k, n + 1 - k)``; ``(1, n)`` (the range, less coverage) when ``n`` is too
        small for ``confidence`` (n < 6 at 95%).

    Example:
        >>> median_ci_ranks(6), median_ci_ranks(60), median_ci_ranks(200)
        ((1, 6), (22, 39), (86, 115))
    """
    if n < 1:
        raise ValueError(f"median_ci_ranks expected n >= 1, received {n}")
    tail, k = 0.0, 0  # tail = P(B < k + 1) as k grows; stop before it passes (1 - confidence) / 2
    while k < n // 2:
        tail += math.comb(n, k) / 2**n
        if tail > (1 - confidence) / 2:
            break
        k += 1
    k = max(k, 1)
    return k, n + 1 - k


def ratio_stats(log_ratios: Sequence[float]) -> dict[str, Any]:
    """The median of per-round ratios with its 95% CI, and their geometric mean with its t-interval.

    Per-round times on a shared virtual machine have heavy tails: most samples run
    undisturbed, some wait (1.7 times as long at unchanged CPU time). The median and its
    distribution-free interval ignore those few; the mean and its t-interval do not
    (on this project's 2-core machine, A/A runs' t-intervals were 1.5 to 3.4 times as
    wide as the median's from the same rounds). The median is the reported ratio.

    Args:
        log_ratios: ``log(t_reference / t_variant)`` for each round; at least two.

    Returns:
        ``median`` (the median ratio), ``ci`` (its 95% interval, ``[low, high]``,
        from :func:`median_ci_ranks`), ``half_width`` (the interval's larger side, in
        log units: ``max(log(median / low), log(high / median))``), ``geomean``
        (``exp`` of the mean log) and ``geomean_ci`` (Student's t interval of the mean log).
    """
    n = len(log_ratios)
    ordered = sorted(log_ratios)
    median = statistics.median(ordered)
    low, high = median_ci_ranks(n)
    mean = statistics.fmean(ordered)
    t_half = t_quantile_975(n - 1) * statistics.stdev(ordered) / math.sqrt(n)
    return {
        "median": math.exp(median),
        "ci": [math.exp(ordered[low - 1]), math.exp(ordered[high - 1])],
        "half_width": max(median - ordered[low - 1], ordered[high - 1] - median),
        "geomean": math.exp(mean),
        "geomean_ci": [math.exp(mean - t_half), math.exp(mean + t_half)],
    }


IDENTITY = {"median": 1.0, "ci": [1.0, 1.0], "half_width": 0.0, "geomean": 1.0, "geomean_ci": [1.0, 1.0]}


def pin_threads(threads: int) -> dict[str, Any]:
    """Sets TensorFlow's intra-op and inter-op thread pools to ``threads`` (0: TensorFlow's default).

    Args:
        threads: Threads per pool.

    Returns:
        ``requested``, the ``intra_op`` and ``inter_op`` values in effect, ``pinned`` (they
        are the requested ones) and ``note`` (why not, e.g. the runtime was already running).
    """
    note = None
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    except RuntimeError as error:  # the runtime is initialized: pools are fixed for this process
        note = str(error)
    intra = tf.config.threading.get_intra_op_parallelism_threads()
    inter = tf.config.threading.get_inter_op_parallelism_threads()
    return {
        "requested": threads,
        "intra_op": intra,
        "inter_op": inter,
        "pinned": intra == threads and inter == threads,
        "note": note,
    }


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


def gan_parts(latent: int) -> tuple[keras.Model, keras.Model]:
    """The digits GAN's generator (latent -> 64) and discriminator (64 -> logit)."""
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


@dataclass
class Workload:
    """One model trained several ways on the same data.

    Attributes:
        title: The name in the results.
        samples: Training examples per run (N).
        reference: The variant every ratio_to_reference is relative to.
        loop: The variant every ratio_to_loop is relative to (None: no loop).
        builders: Variant name -> builder, in report order.
        gains: What a feature gains, as ``(label, variant, base)``: the throughput ratio
            of ``variant`` to ``base``, reported with its CI like the other ratios.
    """

    title: str
    samples: int
    reference: str
    loop: str | None
    builders: dict[str, Builder]
    gains: list[tuple[str, str, str]] = field(default_factory=list)


def fit_builder(
    build: Callable[[type], keras.Model],
    base: type,
    x,
    y,
    batch: int,
    keras_callbacks: bool = False,
    epochs: int = 1,
    **compile_kwargs,
) -> Builder:
    """A builder of ``build(base)``, compiled as the seeds do, whose run is one ``fit`` call of ``epochs``.

    ``keras_callbacks=True`` hands ``fit`` Keras' own ``CallbackList`` (with ``History``, as
    Keras makes it), which ``CustomModel`` uses as it is: its logs become Python numbers after
    every step, the host wait per step that custom_fit's lazy callbacks avoid.
    """

    def make() -> Run:
        keras.utils.set_random_seed(0)
        model = build(base)
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"], **compile_kwargs)
        callbacks = keras.callbacks.CallbackList(add_history=True, model=model) if keras_callbacks else None
        return lambda: model.fit(x, y, batch_size=batch, epochs=epochs, verbose=0, shuffle=False, callbacks=callbacks)

    return make


def classification(kind: str, n: int, batch: int = 32, title: str | None = None, epochs: int = 1) -> Workload:
    """The CNN or MLP workload: keras.Model.fit, CustomModel.fit (twice) and, on Keras 3, two more.

    On Keras 3 the workload also measures ``CustomModel.fit`` with Keras' own ``CallbackList``
    (what the lazy callbacks save) and the hand-written loop. A run trains ``epochs`` epochs
    over the ``n`` examples (one ``fit`` call, or that many passes of the loop). ``title``
    names it in the results (default: the model and the batch size).
    """
    build = seed_cnn if kind == "cnn" else small_mlp
    rng = np.random.default_rng(0)
    if kind == "cnn":
        x, y = rng.random((n, 32, 32, 3), dtype=np.float32), rng.integers(0, 100, n).astype("int32")
        title = title or "cnn (seed 000: 32x32x3, 100 classes, batch 32)"
    else:
        x, y = rng.normal(size=(n, 16)).astype("float32"), rng.integers(0, 10, n).astype("int32")
        title = title or "mlp (16-32-10, batch 32)"
    builders = {
        "keras.Model.fit": fit_builder(build, keras.Model, x, y, batch, epochs=epochs),
        "CustomModel.fit": fit_builder(build, custom_fit.CustomModel, x, y, batch, epochs=epochs),
        f"CustomModel.fit, {AUTO}": fit_builder(
            build, custom_fit.CustomModel, x, y, batch, epochs=epochs, steps_per_execution="auto"
        ),
    }
    gains = [(AUTO, f"CustomModel.fit, {AUTO}", "CustomModel.fit")]
    if KERAS_2:  # tf_keras skips batch hooks nobody implements itself: custom_fit changes nothing there
        return Workload(title, n * epochs, "keras.Model.fit", None, builders, gains)
    builders[EAGER_LOGS] = fit_builder(build, custom_fit.CustomModel, x, y, batch, keras_callbacks=True, epochs=epochs)
    gains.append(("lazy callbacks", "CustomModel.fit", EAGER_LOGS))

    def loop() -> Run:
        from benchmarks import baselines  # Keras 3 code

        keras.utils.set_random_seed(0)
        run_epoch = baselines.tf_function_loop(build(keras.Model), batch)

        def run() -> None:
            for _ in range(epochs):
                run_epoch(x, y)

        return run

    return Workload(
        title, n * epochs, "keras.Model.fit", "tf.function loop", {**builders, "tf.function loop": loop}, gains
    )


def gan(n: int, batch: int = 64, latent: int = 16) -> Workload:
    """The digits GAN (Keras 3): keras.io GAN, custom_fit.GAN (twice) and the hand-written loop."""
    from sklearn.datasets import load_digits

    from benchmarks import baselines  # Keras 3 code

    digits = (load_digits().data / 8.0 - 1.0).astype("float32")
    x = np.tile(digits, (-(-n // len(digits)), 1))[:n]

    def keras_io() -> Run:
        keras.utils.set_random_seed(0)
        generator, discriminator = gan_parts(latent)
        model = baselines.keras_io_gan()(discriminator=discriminator, generator=generator, latent_dim=latent)
        model.compile(
            d_optimizer=keras.optimizers.Adam(2e-4, beta_1=0.5),
            g_optimizer=keras.optimizers.Adam(2e-4, beta_1=0.5),
            loss_fn=keras.losses.BinaryCrossentropy(from_logits=True),
        )
        return lambda: model.fit(x, batch_size=batch, epochs=1, verbose=0, shuffle=False)

    def custom(**compile_kwargs) -> Builder:
        def make() -> Run:
            keras.utils.set_random_seed(0)
            model = custom_fit.GAN(*gan_parts(latent), latent, seed=0)
            model.compile(**compile_kwargs)
            return lambda: model.fit(x, batch_size=batch, epochs=1, verbose=0, shuffle=False)

        return make

    def loop() -> Run:
        keras.utils.set_random_seed(0)
        run_epoch = baselines.tf_function_gan_loop(*gan_parts(latent), latent, batch)
        return lambda: run_epoch(x)

    builders = {
        "keras.io GAN (keras.Model)": keras_io,
        "custom_fit.GAN": custom(),
        f"custom_fit.GAN, {AUTO}": custom(steps_per_execution="auto"),
        "tf.function GAN loop": loop,
    }
    return Workload(
        "digits GAN (MLP, batch 64, two optimizers)",
        n,
        "keras.io GAN (keras.Model)",
        "tf.function GAN loop",
        builders,
        [(AUTO, f"custom_fit.GAN, {AUTO}", "custom_fit.GAN")],
    )


KERAS_ORDER = "Keras' gradient order (custom_fit 0.2)"
#: ``--only`` key -> (model, dtype policy) of the workloads that measure the gradient contract (Keras 3).
CONTRACT_WORKLOADS = {
    "contract-mlp-float32": ("mlp", "float32"),
    "contract-mlp-mixed": ("mlp", "mixed_float16"),
    "contract-gan-float32": ("gan", "float32"),
    "contract-gan-mixed": ("gan", "mixed_float16"),
}


@contextlib.contextmanager
def keras_gradient_order() -> Iterator[None]:
    """While inside, ``minimize`` takes custom_fit 0.2's path on Keras 3: no gradient contract.

    The transform then gets what the tape returned (loss-scaled under
    ``mixed_float16``) and the optimizer unscales, as in Keras' own step: the
    work the contract adds (unscale, finite check, rescale) is left out.
    Measurement code only: ``GradientPath``'s two methods are swapped back on exit.
    """
    from custom_fit._gradient_contract import GradientPath

    saved = GradientPath.true_gradients, GradientPath.apply

    def as_taped(path: GradientPath, grads_and_vars: Any) -> Any:
        return grads_and_vars  # nothing to undo: not finite-checked, not summed

    def as_is(path: GradientPath, grads_and_vars: Any) -> None:
        path.used = True
        path.optimizer.apply_gradients(grads_and_vars)

    GradientPath.true_gradients, GradientPath.apply = as_taped, as_is  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        GradientPath.true_gradients, GradientPath.apply = saved  # type: ignore[method-assign]


def in_keras_gradient_order(builder: Builder) -> Builder:
    """``builder``'s variant built, traced and run inside :func:`keras_gradient_order`."""

    def make() -> Run:
        with keras_gradient_order():
            run = builder()

        def run_in_order() -> None:
            with keras_gradient_order():
                run()

        return run_in_order

    return make


def under_policy(builder: Builder, policy: str) -> Builder:
    """``builder``'s model made under the dtype policy ``policy`` (its layers keep it)."""

    def make() -> Run:
        keras.mixed_precision.set_global_policy(policy)
        try:
            return builder()
        finally:
            keras.mixed_precision.set_global_policy("float32")

    return make


def gradient_contract(kind: str, policy: str, n: int) -> Workload:
    """What the gradient contract costs (Keras 3): the MLP or the GAN under ``policy``, with and without it.

    The contract's gain is ``CustomModel.fit`` (``custom_fit.GAN``) over the same
    model in :func:`keras_gradient_order`. On one device in float32 the contract
    adds no operation; under ``mixed_float16`` it adds an unscale, a finite check
    and a rescale per optimizer and step.
    """
    source = classification("mlp", n) if kind == "mlp" else gan(n)
    custom = "CustomModel.fit" if kind == "mlp" else "custom_fit.GAN"
    without = f"{custom}, {KERAS_ORDER}"
    # The keras.io GAN mixes float16 and float32 tensors under mixed_float16 (it fails in tf.concat):
    # the GAN's reference is custom_fit.GAN itself.
    reference = source.reference if kind == "mlp" else custom
    builders = {
        reference: under_policy(source.builders[reference], policy),
        custom: under_policy(source.builders[custom], policy),
        without: under_policy(in_keras_gradient_order(source.builders[custom]), policy),
    }
    title = f"gradient contract: {source.title}, {policy}"
    return Workload(title, source.samples, reference, None, builders, [("gradient contract", custom, without)])


def aa(n: int, batch: int = 32) -> Workload:
    """The A/A check: the MLP's keras.Model.fit, built twice, against itself."""
    mlp = classification("mlp", n, batch).builders["keras.Model.fit"]
    builders = {"keras.Model.fit (A)": mlp, "keras.Model.fit (B)": mlp}
    return Workload("A/A (keras.Model.fit vs itself)", n, "keras.Model.fit (A)", None, builders)


VALIDATION = "validation every N steps (the mlp, 4 validation runs per fit call)"
ACCUMULATION = "gradient accumulation (the mlp, Adam, the same updates)"


def validation_every_n_steps(n: int, batch: int = 32) -> Workload:
    """What ``validation_freq=custom_fit.Steps(N)`` and named validation sets cost, with the same runs.

    A run is 4 epochs over ``n / 4`` examples (one ``fit`` call) validated 4
    times on ``n / 4`` examples: at each epoch's end (``validation_freq=1``),
    or after every ``n / (4 * batch)`` steps with ``Steps``: the same moments
    and the same work, so the ratio is what the mechanism adds (each run
    happens at the end of the epoch's last execution, inside the epoch: the
    training metrics are kept across it, the monitors get it as an epoch end,
    the other callbacks the data's epoch end). A third variant validates the
    same examples as two named sets of half the size: what a second set costs
    (one more ``evaluate`` per run, on half the batches).
    """
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(n, 16)).astype("float32"), rng.integers(0, 10, n).astype("int32")
    quarter = n // 4
    validation = (x[:quarter], y[:quarter])
    eighth = quarter // 2
    halves = {"first": (x[:eighth], y[:eighth]), "second": (x[eighth:quarter], y[eighth:quarter])}
    every = custom_fit.Steps(quarter // batch)

    def builder(validation_freq: Any, validation_data: Any = validation) -> Builder:
        def make() -> Run:
            keras.utils.set_random_seed(0)
            model = small_mlp(custom_fit.CustomModel)
            model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
            return lambda: model.fit(
                x[:quarter], y[:quarter], batch_size=batch, epochs=4, verbose=0, shuffle=False,
                validation_data=validation_data, validation_freq=validation_freq,
            )  # fmt: skip

        return make

    epochs_variant = "CustomModel.fit, validation_freq=1"
    steps_variant = f"CustomModel.fit, validation_freq=custom_fit.Steps({every.every})"
    named_variant = f"{steps_variant}, two named validation sets of half the size"
    builders = {epochs_variant: builder(1), steps_variant: builder(every), named_variant: builder(every, halves)}
    gains = [
        ("Steps(N), the same runs", steps_variant, epochs_variant),
        ("two named sets / one set of the same size", named_variant, steps_variant),
    ]
    return Workload(VALIDATION, n, epochs_variant, None, builders, gains)


def gradient_accumulation(n: int, micro_batch: int = 32, steps: int = 4) -> Workload:
    """What ``gradient_accumulation_steps`` costs (Keras 3): ``steps`` micro-batches per update vs one larger batch.

    Both variants make the same updates of ``CustomModel`` with Adam (``n / (micro_batch * steps)``
    per run); the accumulating one runs ``steps`` times as many steps, each on a ``steps`` times
    smaller batch. ``keras.Model`` accumulating runs the same code on one device (custom_fit
    changes the path only under a multi-replica strategy).
    """
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(n, 16)).astype("float32"), rng.integers(0, 10, n).astype("int32")

    def builder(base: type, batch: int, accumulate: int | None) -> Builder:
        def make() -> Run:
            keras.utils.set_random_seed(0)
            model = small_mlp(base)
            accumulation = {"gradient_accumulation_steps": accumulate} if accumulate else {}
            model.compile(optimizer=keras.optimizers.Adam(**accumulation), loss="sparse_categorical_crossentropy")
            return lambda: model.fit(x, y, batch_size=batch, epochs=1, verbose=0, shuffle=False)

        return make

    large = f"CustomModel.fit, batch {micro_batch * steps}"
    accumulating = f"CustomModel.fit, {steps} x batch {micro_batch}, gradient_accumulation_steps={steps}"
    builders = {
        large: builder(custom_fit.CustomModel, micro_batch * steps, None),
        accumulating: builder(custom_fit.CustomModel, micro_batch, steps),
        f"keras.Model.fit, {steps} x batch {micro_batch}, accumulating": builder(keras.Model, micro_batch, steps),
    }
    gains = [("accumulation (vs one large batch)", accumulating, large)]
    return Workload(ACCUMULATION, n, large, None, builders, gains)


BACKUP = "backups (a 2.4M-parameter MLP, Adam; one backup every N steps)"
WRITES_ONLY = "a thread writes 28 MB every 10 steps (the floor: no backup taken, nothing copied)"


class _WritesOnly(keras.callbacks.Callback):
    """The file work of a backup every ``every`` steps, in ``BackupAndRestore``'s writer thread, nothing copied.

    What a backup written in the background costs training on this machine
    however little the training thread does: arrays of the backup's size
    (the weights three times: Adam keeps two moments of each), written as
    HDF5 through ``BackupStore.write`` (checksums, ``fsync``, the rename,
    the old backup removed) by a ``BackgroundWriter``.
    """

    def __init__(self, directory: str, arrays: list[np.ndarray], every: int):
        from custom_fit._background_write import BackgroundWriter  # what is measured is custom_fit's private part
        from custom_fit._backup_store import BackupStore

        super().__init__()
        self.store, self.writer = BackupStore(directory), BackgroundWriter()
        self.arrays, self.every, self.steps = arrays, every, 0

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.steps += 1
        if self.steps % self.every == 0:
            self.writer.submit(self._write, f"write {self.steps}")

    def on_train_end(self, logs: Any = None) -> None:
        self.writer.wait()
        self.store.clear()

    def _write(self) -> None:
        self.store.write(self._fill)

    def _fill(self, directory: Path) -> None:
        import h5py  # Keras' dependency, which writes its weights files

        with h5py.File(directory / "model.weights.h5", "w") as file:
            for i, array in enumerate(self.arrays):
                file.create_dataset(str(i), data=array)


def backups(n: int, batch: int = 32) -> Workload:
    """What ``custom_fit.BackupAndRestore`` costs, written in the background or before training goes on.

    The model of issue 54: a 2.4M-parameter MLP (512 -> 1536 -> 1024 -> 10)
    with Adam, whose backup (weights and both Adam moments: 28 MB) takes tens
    of milliseconds to write, about ten of its steps. Each run is one ``fit``
    call over ``n`` examples with a backup every 10 or 50 steps (the ``fit``
    call's end deletes them). The reference trains without backups. A last
    variant writes files of the same size as often, in the same writer thread,
    without taking any backup: the least a background write costs here.
    """
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(n, 512)).astype("float32"), rng.integers(0, 10, n).astype("int32")

    def builder(save_freq: int | None, in_background: bool = True, writes_only: bool = False) -> Builder:
        def make() -> Run:
            keras.utils.set_random_seed(0)
            model = custom_fit.CustomSequential(
                [keras.Input((512,)), keras.layers.Dense(1536, activation="relu"),
                 keras.layers.Dense(1024, activation="relu"), keras.layers.Dense(10)]
            )  # fmt: skip
            model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            callbacks: list[keras.callbacks.Callback] = []
            if save_freq is not None:
                # Its own directory, which the callback removes when fit ends (the backups deleted).
                where = tempfile.mkdtemp(prefix="custom_fit-bench-backups-")
                if writes_only:
                    callbacks = [_WritesOnly(where, [weight.numpy() for weight in model.weights] * 3, save_freq)]
                else:
                    callbacks = [custom_fit.BackupAndRestore(where, save_freq, write_in_background=in_background)]
            return lambda: model.fit(x, y, batch_size=batch, epochs=1, verbose=0, shuffle=False, callbacks=callbacks)

        return make

    none = "CustomModel.fit, no backups"
    builders = {none: builder(None)}
    gains = []
    for every in (10, 50):
        background = f"BackupAndRestore(save_freq={every}), written in the background"
        waits = f"BackupAndRestore(save_freq={every}, write_in_background=False)"
        builders.update({background: builder(every), waits: builder(every, in_background=False)})
        gains.append((f"background writes, every {every} steps", background, waits))
    builders[WRITES_ONLY] = builder(10, writes_only=True)
    return Workload(BACKUP, n, none, None, builders, gains)


def sizes(quick: bool) -> dict[str, int]:
    """Training examples per run (N) for each workload."""
    if quick:
        return dict(cnn=64, mlp=256, gan=256, backup=320)
    # 0.3-0.8 s per run with one thread on a 2-core AMD EPYC (a fit call's own cost, about 0.1 s,
    # included): 32 steps of the CNN, 128 of the MLP and of the GAN; whole batches only.
    # The backup workload: 100 steps, 10 or 2 backups per run.
    return dict(cnn=1024, mlp=4096, gan=8192, backup=3200)


@contextlib.contextmanager
def _progress_bar_reads_converted_logs() -> Iterator[None]:
    """``CustomModel.fit`` with its lazy callbacks, less the raw tensors handed to Keras' progress bar."""
    from custom_fit._trainer import callbacks as _callbacks  # what is measured is custom_fit's private choice
    from custom_fit._trainer import loop as _loop

    class ConvertedForProgbar(_callbacks.LazyCallbackList):
        tensors_for = ()

    original = _loop.LazyCallbackList
    _loop.LazyCallbackList = ConvertedForProgbar  # type: ignore[misc]
    try:
        yield
    finally:
        _loop.LazyCallbackList = original  # type: ignore[misc]


def progress_bar(n: int) -> Workload:
    """The MLP with ``fit(verbose=1)``: the progress bar handed tensors, or logs converted every step."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(n, 16)).astype("float32"), rng.integers(0, 10, n).astype("int32")

    def builder(base: type, converted: bool = False) -> Builder:
        def make() -> Run:
            keras.utils.set_random_seed(0)
            model = small_mlp(base)
            model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])

            def run() -> None:
                with (
                    open(os.devnull, "w") as sink,
                    contextlib.redirect_stdout(sink),
                    _progress_bar_reads_converted_logs() if converted else contextlib.nullcontext(),
                ):
                    model.fit(x, y, batch_size=32, epochs=1, verbose=1, shuffle=False)

            return run

        return make

    builders = {
        "keras.Model.fit, verbose=1": builder(keras.Model),
        "CustomModel.fit, verbose=1": builder(custom_fit.CustomModel),
        PROGBAR_LAZY: builder(custom_fit.CustomModel, converted=True),
    }
    gains = [("tensors to the progress bar", "CustomModel.fit, verbose=1", PROGBAR_LAZY)]
    return Workload(PROGBAR, n, "keras.Model.fit, verbose=1", None, builders, gains)


def workloads(quick: bool) -> dict[str, Callable[[], Workload]]:
    """The workloads of this Keras, by ``--only`` key, in run order (the A/A check first)."""
    s = sizes(quick)
    result: dict[str, Callable[[], Workload]] = {
        "aa": lambda: aa(s["mlp"]),
        "cnn": lambda: classification("cnn", s["cnn"]),
        # One step per sample: what each fit call costs besides its steps (Keras builds the data
        # pipeline and its iterators anew), the cost that many short epochs pay again and again.
        "fit-cost": lambda: classification("cnn", 32, title=FIT_COST),
        # The CNN's epochs in fit calls of four: that cost paid once per four epochs, as in training.
        "cnn-epochs": lambda: classification("cnn", s["cnn"], title=CNN_EPOCHS, epochs=4),
        "mlp": lambda: classification("mlp", s["mlp"]),
        "validation": lambda: validation_every_n_steps(s["mlp"]),
        "backup": lambda: backups(s["backup"]),
    }
    if not KERAS_2:
        result["gan"] = lambda: gan(s["gan"])
        result["progbar"] = lambda: progress_bar(s["mlp"])
        result["accumulation"] = lambda: gradient_accumulation(s["mlp"])
        for key, (kind, policy) in CONTRACT_WORKLOADS.items():
            result[key] = functools.partial(gradient_contract, kind, policy, s[kind])
    return result


# -- measurement ----------------------------------------------------------------


def measure(workload: Workload, settings: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """Builds and warms up the variants, runs rounds until the stop rule, summarizes.

    Args:
        workload: What to measure.
        settings: ``min_rounds``, ``max_rounds`` and ``max_seconds``.
        rng: Shuffles the order of the variants in each round.

    Returns:
        The workload's entry of ``results["workloads"]``.
    """
    started = time.perf_counter()
    runs: dict[str, Run] = {}
    errors: dict[str, str] = {}
    for name, build in workload.builders.items():
        try:
            run = build()
            run()  # warm-up, untimed: tracing, optimizer and data-adapter creation
        except Exception as error:  # an option not (yet) supported: reported, not fatal
            if name in (workload.reference, workload.loop):
                raise
            errors[name] = f"{type(error).__name__}: {error}"[:2000]
            print(f"  {name}: unavailable ({errors[name].splitlines()[0][:200]})", flush=True)
            continue
        runs[name] = run
    # The variants' models, graphs and data now exist for the whole measurement: freezing them
    # out of the collector makes the gc.collect() before each sample cheap (else ~0.3 s each).
    gc.collect()
    gc.freeze()
    wall: dict[str, list[float]] = {name: [] for name in runs}
    cpu: dict[str, list[float]] = {name: [] for name in runs}
    bases = [b for b in (workload.reference, workload.loop) if b is not None]
    rounds, stopped_by = 0, ""
    while not stopped_by:
        order = list(runs)
        rng.shuffle(order)
        for name in order:
            gc.collect()
            cpu_start, wall_start = time.process_time(), time.perf_counter()
            runs[name]()
            wall[name].append(time.perf_counter() - wall_start)
            cpu[name].append(time.process_time() - cpu_start)
        rounds += 1
        if rounds < 2:  # a CI needs two rounds
            continue
        widths = [
            ratio_stats(log_ratios(wall, base, name))["half_width"] for base in bases for name in runs if name != base
        ]
        worst = max(widths, default=0.0)
        print(f"  round {rounds}: widest wall-time CI ±{math.expm1(worst):.1%}", flush=True)
        if rounds >= settings["min_rounds"] and worst <= math.log1p(CI_TARGET):
            stopped_by = "ci_target"
        elif rounds >= settings["max_rounds"]:
            stopped_by = "max_rounds"
        elif time.perf_counter() - started >= settings["max_seconds"]:
            stopped_by = "max_seconds"
    gc.unfreeze()
    variants = {}
    for name in workload.builders:
        if name in errors:
            variants[name] = {"available": False, "error": errors[name]}
        else:
            variants[name] = summarize(name, workload, wall, cpu)
    return {
        "reference": workload.reference,
        "loop": workload.loop,
        "samples_per_run": workload.samples,
        "rounds": rounds,
        "stopped_by": stopped_by,
        "ci_target_met": all(v.get("ci_target_met", True) for v in variants.values()),
        "seconds": time.perf_counter() - started,
        "variants": variants,
        "gains": {
            label: {"variant": name, "base": base, **ratio_stats(log_ratios(wall, base, name))}
            for label, name, base in workload.gains
            if name in runs and base in runs
        },
    }


def log_ratios(times: dict[str, list[float]], base: str, name: str) -> list[float]:
    """Per-round ``log(t_base / t_name)``: the log of name's throughput relative to base's."""
    return [math.log(b / t) for b, t in zip(times[base], times[name], strict=True)]


def summarize(name: str, workload: Workload, wall: dict[str, list[float]], cpu: dict[str, list[float]]) -> dict:
    """One variant's entry: throughput, its ratios to the reference and the loop, and the raw times."""
    entry: dict[str, Any] = {
        "available": True,
        "error": None,
        "samples_per_s_median": statistics.median(workload.samples / t for t in wall[name]),
        "wall_s_median": statistics.median(wall[name]),
        "cpu_s_median": statistics.median(cpu[name]),
    }
    met = cpu_met = True
    for key, base in (("reference", workload.reference), ("loop", workload.loop)):
        for prefix, times in (("", wall), ("cpu_", cpu)):
            stats: dict[str, Any] | None = None
            if base == name:
                stats = IDENTITY
            elif base is not None:
                stats = ratio_stats(log_ratios(times, base, name))
                if prefix:
                    cpu_met = cpu_met and stats["half_width"] <= math.log1p(CI_TARGET)
                else:
                    met = met and stats["half_width"] <= math.log1p(CI_TARGET)
            for stat in STATS:
                entry[f"{prefix}ratio_to_{key}_{stat}"] = None if stats is None else stats[stat]
    entry.update(ci_target_met=met, cpu_ci_target_met=cpu_met, rounds=len(wall[name]))
    entry.update(wall_s=wall[name], cpu_s=cpu[name])
    return entry


def machine() -> str:
    """CPU, cores and the versions that matter."""
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


def method(settings: dict[str, Any]) -> str:
    """The one-paragraph description stored with the results."""
    return (
        "Each variant built once and warmed up (one untimed run); then rounds in which every variant runs one "
        "sample (one epoch over the workload's N examples, wall and process CPU time, gc.collect() before), in "
        "a random order per round (seeded); per-round ratio = t_reference / t_variant; reported: the median of "
        "the per-round ratios with its distribution-free 95% CI (order statistics, Binomial(n, 1/2)), and the "
        "geometric mean with its Student-t CI; rounds stop when every wall-time ratio's median CI is within "
        f"±{CI_TARGET:.0%} (after {settings['min_rounds']} rounds), or at {settings['max_rounds']} rounds or "
        f"{settings['max_seconds']:g} s per workload."
    )


# -- reports --------------------------------------------------------------------


def _ratio(v: dict, key: str) -> str:
    if v.get(f"{key}_median") is None:
        return "-"
    lo, hi = v[f"{key}_ci"]
    return f"{v[f'{key}_median']:.3f} [{lo:.3f}, {hi:.3f}]"


def markdown(results: dict) -> str:
    """The results as a Markdown table, one row per variant."""
    threads = results["threads"]
    lines = [
        f"Measured on: {results['machine']}; TensorFlow threads: intra-op {threads['intra_op']}, "
        f"inter-op {threads['inter_op']} ({'quick' if results['quick'] else 'full'} sizes).",
        "",
        "| workload | variant | samples/s (median) | ratio to reference [95% CI] | ratio to loop [95% CI] "
        "| CPU-time ratio to reference [95% CI] | rounds | CI within ±2% |",
        "|---|---|---:|---:|---:|---:|---:|:---:|",
    ]
    for workload, result in results["workloads"].items():
        for name, v in result["variants"].items():
            role = " (reference)" if name == result["reference"] else " (loop)" if name == result["loop"] else ""
            if not v["available"]:
                error = v["error"].splitlines()[0][:120].replace("|", "/")
                lines.append(f"| {workload} | {name} | unavailable: {error} | - | - | - | - | - |")
                continue
            lines.append(
                f"| {workload} | {name}{role} | {v['samples_per_s_median']:,.0f} | {_ratio(v, 'ratio_to_reference')} | "
                f"{_ratio(v, 'ratio_to_loop')} | {_ratio(v, 'cpu_ratio_to_reference')} | {v['rounds']} | "
                f"{'yes' if v['ci_target_met'] else 'no'} |"
            )
    gains = [(w, label, g) for w, r in results["workloads"].items() for label, g in r["gains"].items()]
    if gains:
        lines += ["", "| workload | gain of | throughput ratio [95% CI] |", "|---|---|---:|"]
        for workload, label, g in gains:
            ratio = f"{g['median']:.3f} [{g['ci'][0]:.3f}, {g['ci'][1]:.3f}]"
            lines.append(f"| {workload} | {label} ({g['variant']} / {g['base']}) | {ratio} |")
    lines += [
        "",
        "Ratios are throughput relative to the reference (keras.Model.fit; the keras.io GAN for the GAN) or to the "
        "hand-written tf.function loop: the median of per-round ratios t_reference / t_variant, with its "
        "distribution-free 95% CI. CPU-time ratios use process CPU seconds instead of wall time.",
    ]
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> None:
    """Ratios to the reference (median, 95% CI whiskers), one row per available variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [
        (f"{w.split(' (')[0]}: {n}", v)
        for w, r in results["workloads"].items()
        for n, v in r["variants"].items()
        if v["available"]
    ]
    fig, ax = plt.subplots(figsize=(10, 0.3 * len(rows) + 1.4))
    centers = [v["ratio_to_reference_median"] for _, v in rows]
    errors = [
        [c - v["ratio_to_reference_ci"][0] for c, (_, v) in zip(centers, rows, strict=True)],
        [v["ratio_to_reference_ci"][1] - c for c, (_, v) in zip(centers, rows, strict=True)],
    ]
    ax.axvspan(1 - CI_TARGET, 1 + CI_TARGET, color="0.9")
    ax.axvline(1.0, color="black", linewidth=0.8)
    for i, ((name, _), center) in enumerate(zip(rows, centers, strict=True)):
        color = "tab:orange" if "custom" in name.lower() else "tab:gray"
        ax.errorbar(center, i, xerr=[[errors[0][i]], [errors[1][i]]], fmt="o", color=color, capsize=3)
    ax.set_yticks(range(len(rows)), [n for n, _ in rows], fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel(
        "throughput / reference (keras.Model.fit; keras.io GAN for the GAN), log scale;\n"
        "points: median of per-round ratios, whiskers: its 95% CI, band: ±2%"
    )
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")  # long variant names are not cut off
    plt.close(fig)


def write(results: dict, out: Path, stem: str) -> None:
    """Writes ``out/<stem>.json``, ``out/<stem>.md`` and the plot of the results so far."""
    (out / f"{stem}.json").write_text(json.dumps(results, indent=1))
    (out / f"{stem}.md").write_text(markdown(results))
    plot(results, out / f"{stem.replace('results', 'throughput')}.png")


def main(argv: Sequence[str] | None = None) -> dict:
    """Runs the benchmark and writes ``OUT/<stem>.json``, ``.md`` and the plot.

    Args:
        argv: Command-line arguments (default ``sys.argv[1:]``).

    Returns:
        The results, as written to the JSON file.
    """
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 2 rounds (used by the tests)")
    parser.add_argument("--out", type=Path, default=HERE / "results", help="output folder")
    parser.add_argument(
        "--only",
        nargs="+",
        # Every workload's key on either Keras ("gan" and the contract's only measured on Keras 3:
        # asked for on Keras 2, they get the error below rather than argparse's "invalid choice").
        choices=list(dict.fromkeys([*workloads(quick=False), "gan", "progbar", "accumulation", *CONTRACT_WORKLOADS])),
        help="only these workloads (aa: the A/A check); results go to <stem>_<names>.*",
    )
    parser.add_argument("--threads", type=int, default=1, help="TensorFlow intra- and inter-op threads (0: default)")
    parser.add_argument("--min-rounds", type=int, default=8, help="rounds before the CI stop rule applies")
    parser.add_argument("--max-rounds", type=int, default=1000, help="rounds at most, per workload")
    parser.add_argument("--max-seconds", type=float, default=600.0, help="seconds at most, per workload")
    parser.add_argument("--seed", type=int, default=0, help="seed of the per-round random order")
    args = parser.parse_args(argv)
    settings = {"min_rounds": args.min_rounds, "max_rounds": args.max_rounds, "max_seconds": args.max_seconds}
    if args.quick:
        settings.update(min_rounds=2, max_rounds=2)
    if not 2 <= settings["min_rounds"] <= settings["max_rounds"]:
        parser.error(f"expected 2 <= --min-rounds <= --max-rounds, received {args.min_rounds}, {args.max_rounds}")
    threads = pin_threads(args.threads)  # before TensorFlow runs anything
    if not threads["pinned"]:
        print(f"threads not pinned to {args.threads}: {threads['note']}", flush=True)
    started = time.perf_counter()
    available = workloads(args.quick)
    unknown = sorted(set(args.only or []) - set(available))
    if unknown:
        parser.error(
            f"--only {' '.join(unknown)}: not measured on {custom_fit.KERAS_VERSION}; "
            f"expected some of: {' '.join(available)}"
        )
    results: dict[str, Any] = {
        "machine": machine(),
        "threads": threads,
        "method": method(settings),
        "quick": args.quick,
        "seed": args.seed,
        "settings": {**settings, "ci_target": CI_TARGET, "confidence": 0.95},
        "workloads": {},
    }
    stem = STEM + "".join(f"_{key}" for key in available if args.only and key in args.only)
    args.out.mkdir(parents=True, exist_ok=True)
    for key, make in available.items():
        if args.only and key not in args.only:
            continue
        workload = make()
        print(f"{workload.title}: {len(workload.builders)} variants, {workload.samples} examples per run", flush=True)
        results["workloads"][workload.title] = measure(workload, settings, random.Random(f"{args.seed}/{key}"))
        del workload
        gc.collect()
        results["seconds"] = time.perf_counter() - started
        write(results, args.out, stem)  # after each workload: an interrupted run keeps what it measured
    print(markdown(results))
    print(f"wrote {args.out / stem}.json, .md and .png in {results['seconds']:.0f} s")
    return results


if __name__ == "__main__":
    main()
