"""Keras 3's second gradient sum: the swap custom_fit keeps, against the one way without it, measured.

Run ``python benchmarks/summed_gradients.py [--steps S] [--rounds R] [--out DIR]`` (Keras 3; about two
minutes on a 2-core CPU). Results: ``OUT/results_summed_gradients.json`` and ``.md``.

Under a multi-replica strategy custom_fit sums each step's gradients over the replicas itself (the
gradient contract: ``transform_gradients`` sees true gradients), then has the optimizer apply that sum.
Keras 3's optimizer would sum it over the replicas again (``TFOptimizer._all_reduce_sum_gradients``,
called whenever a replica context exists, with no argument to skip it in 3.8 to 3.16-dev), so
custom_fit replaces that method on the optimizer instance while the update is traced
(``custom_fit._compat.keras3._gradients_already_summed``). Without a swap, one way is left: hand the
optimizer the sum divided by the number of replicas and let it sum again. This script trains the
same model both ways under ``MirroredStrategy`` on 2, 3 and 4 logical CPUs and measures what the
other way would change:

* **Exactness.** Weights after ``--steps`` steps of each way (max |difference|, and how many weights
  differ). Dividing by N and summing N equal values gives the sum back exactly only where N is a
  power of two; for 3 replicas (6 GPUs, 12 ...) each update is rounded twice more.
* **Traffic.** Values all-reduced per step (counted from ``ReplicaContext.all_reduce`` while the step
  is traced): the other way all-reduces every gradient a second time.
* **Time.** Seconds per step of each way on 2 logical CPUs, paired rounds in random order, the median
  ratio with its distribution-free 95% interval (``bench.measure``, ``--rounds`` rounds). On CPU an all-reduce is a
  copy in memory; across GPUs or machines it is the step's largest communication.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import tensorflow as tf

# One process per replica count (``--replicas``): TensorFlow's collective ops keep their groups per
# process, and a second MirroredStrategy over another number of devices would join the first's.
PARSER = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
PARSER.add_argument("--steps", type=int, default=20)
PARSER.add_argument("--rounds", type=int, default=30)
PARSER.add_argument("--seed", type=int, default=0)
PARSER.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
PARSER.add_argument("--replicas", type=int, help="(internal) measure this replica count, print JSON")
ARGS = PARSER.parse_args()
# Before anything starts TensorFlow's runtime.
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * (ARGS.replicas or 1)
)

import custom_fit
from benchmarks import bench
from custom_fit import keras
from custom_fit._compat import keras3

WAYS = ("swap (custom_fit)", "divide by N, Keras sums again")
BATCH_PER_REPLICA = 16


@contextlib.contextmanager
def divided_and_summed_again() -> Iterator[None]:
    """While inside, summed gradients reach the optimizer divided by the replica count, with no swap."""

    def apply_gradients(optimizer: Any, grads_and_vars: list[Any], *, summed: bool) -> None:
        if summed:
            replicas = tf.distribute.get_strategy().num_replicas_in_sync
            grads_and_vars = [(None if g is None else g / replicas, v) for g, v in grads_and_vars]
        optimizer.apply_gradients(grads_and_vars)

    with mock.patch.object(keras3, "apply_gradients", apply_gradients):
        yield


@contextlib.contextmanager
def counting_all_reduced_values(counts: list[int]) -> Iterator[None]:
    """While inside, appends the number of values each ``ReplicaContext.all_reduce`` call reduces."""
    own = tf.distribute.ReplicaContext.all_reduce

    def all_reduce(self: Any, reduce_op: Any, value: Any, options: Any = None) -> Any:
        counts.append(sum(int(np.prod(v.shape)) for v in tf.nest.flatten(value)))
        return own(self, reduce_op, value, options)

    with mock.patch.object(tf.distribute.ReplicaContext, "all_reduce", all_reduce):
        yield


def data(replicas: int, steps: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    n = BATCH_PER_REPLICA * replicas * steps
    return rng.normal(size=(n, 32)).astype("float32"), rng.integers(0, 10, size=n)


def model_in(strategy: tf.distribute.Strategy) -> custom_fit.CustomModel:
    with strategy.scope():
        keras.utils.set_random_seed(1)
        inputs = keras.Input((32,))
        hidden = keras.layers.Dense(256, activation="relu")(inputs)
        hidden = keras.layers.Dense(256, activation="relu")(hidden)
        model = custom_fit.CustomModel(inputs, keras.layers.Dense(10)(hidden))
        model.compile(
            optimizer=keras.optimizers.Adam(1e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            steps_per_execution=1,
        )
    return model


def trained(way: str, replicas: int, steps: int) -> tuple[list[np.ndarray], int]:
    """Weights after ``steps`` steps on ``replicas`` logical CPUs, and the values all-reduced per step."""
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])
    model = model_in(strategy)
    x, y = data(replicas, steps)
    counts: list[int] = []
    other = divided_and_summed_again() if way == WAYS[1] else contextlib.nullcontext()
    with other, counting_all_reduced_values(counts):
        model.fit(x, y, batch_size=BATCH_PER_REPLICA * replicas, epochs=1, shuffle=False, verbose=0)
    # Traced once per replica: what one replica all-reduces in one step.
    return model.get_weights(), sum(counts) // replicas


def timed(replicas: int, rounds: int, seed: int) -> dict[str, Any]:
    """Seconds per step of both ways, ``rounds`` paired rounds in random order (``bench.measure``)."""
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])
    steps = 50
    x, y = data(replicas, steps)

    def builder(way: str) -> bench.Builder:
        def build() -> bench.Run:
            model = model_in(strategy)
            dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH_PER_REPLICA * replicas)
            with divided_and_summed_again() if way == WAYS[1] else contextlib.nullcontext():
                model.fit(dataset, epochs=1, verbose=0)  # traced here, with its way
            return lambda: model.fit(dataset, epochs=1, verbose=0)

        return build

    workload = bench.Workload(
        title=f"summed gradients, {replicas} replicas",
        samples=steps * BATCH_PER_REPLICA * replicas,
        reference=WAYS[0],
        loop=None,
        builders={way: builder(way) for way in WAYS},
    )
    settings = {"min_rounds": rounds, "max_rounds": rounds, "max_seconds": math.inf}  # exactly `rounds`
    variants = bench.measure(workload, settings, random.Random(seed))["variants"]
    return {
        "replicas": replicas,
        "rounds": rounds,
        "seconds_per_step_median": {way: variants[way]["wall_s_median"] / steps for way in WAYS},
        "throughput_ratio_other_way_to_swap": {
            stat: variants[WAYS[1]][f"ratio_to_reference_{stat}"] for stat in bench.STATS
        },
    }


def measure(replicas: int, steps: int, rounds: int, seed: int) -> dict[str, Any]:
    """Both ways on ``replicas`` logical CPUs: exactness and traffic, and (2 replicas) time."""
    (swap, swap_values), (other, other_values) = (trained(way, replicas, steps) for way in WAYS)
    row: dict[str, Any] = {
        "replicas": replicas,
        "steps": steps,
        "weights": sum(a.size for a in swap),
        "weights_that_differ": sum(int(np.sum(a != b)) for a, b in zip(swap, other, strict=True)),
        "max_abs_difference": max(float(np.max(np.abs(a - b))) for a, b in zip(swap, other, strict=True)),
        "all_reduced_values_per_step": {WAYS[0]: swap_values, WAYS[1]: other_values},
    }
    if replicas == 2:
        row["time"] = timed(replicas, rounds, seed)
    return row


def main() -> None:
    args = ARGS
    if args.replicas:
        print(json.dumps(measure(args.replicas, args.steps, args.rounds, args.seed)))
        return
    rows = []
    for replicas in (2, 3, 4):
        command = [sys.executable, __file__, "--replicas", str(replicas), "--steps", str(args.steps)]
        command += ["--rounds", str(args.rounds), "--seed", str(args.seed)]
        output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        rows.append(json.loads(output.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    timing = rows[0].pop("time")
    result = {
        "keras": custom_fit.KERAS_VERSION,
        "tensorflow": tf.__version__,
        "command": "python benchmarks/summed_gradients.py " + " ".join(sys.argv[1:]),
        "exactness_and_traffic": rows,
        "time": timing,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results_summed_gradients.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "# Keras 3's second gradient sum: custom_fit's swap vs dividing by N (benchmarks/summed_gradients.py)",
        "",
        f"{result['keras']}, TensorFlow {result['tensorflow']}; `{result['command'].strip()}`.",
        "`MirroredStrategy` on N logical CPUs, an MLP (32-256-256-10, Adam), "
        f"{BATCH_PER_REPLICA} examples per replica and step.",
        "",
        "| replicas | steps | weights that differ | max abs difference "
        "| values all-reduced per step: swap | other way |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        values = row["all_reduced_values_per_step"]
        lines.append(
            f"| {row['replicas']} | {row['steps']} | {row['weights_that_differ']} of {row['weights']} | "
            f"{row['max_abs_difference']:.3g} | {values[WAYS[0]]} | {values[WAYS[1]]} |"
        )
    stats = timing["throughput_ratio_other_way_to_swap"]
    low, high = stats["ci"]
    per_step = timing["seconds_per_step_median"]
    lines += [
        "",
        f"Time, 2 logical CPUs, {timing['rounds']} paired rounds of 50 steps: seconds per step (median) "
        f"swap {per_step[WAYS[0]] * 1e3:.2f} ms, other way {per_step[WAYS[1]] * 1e3:.2f} ms; throughput of "
        f"the other way / swap {stats['median']:.3f} [{low:.3f}, {high:.3f}] (median, 95% CI).",
    ]
    (args.out / "results_summed_gradients.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
