"""The trace-time swaps custom_fit keeps, against the ways without them, measured.

Run ``python benchmarks/trace_time_swaps.py [--out DIR]`` on Keras 3, and again with
``TF_USE_LEGACY_KERAS=1`` for tf_keras (each under a minute on a 2-core CPU). Results:
``OUT/results_trace_time_swaps_keras3.{json,md}`` (``_keras2`` for tf_keras).

custom_fit changes a few Keras or TensorFlow objects while a step is traced (a method or attribute
put on the instance, then taken away; ``tests/end_to_end/test_layout.py`` lists them). Each stays
because the way without it was tried and measured; ``benchmarks/summed_gradients.py`` measures Keras
3's gradient sum, and this script the others, on the Keras it runs on:

* **The regularizer counter** (``_compat.keras3`` / ``_compat.keras2.counting_regularizer_calls``,
  both Kerases). It tells whether a step computed its weight penalties. A check without a counter
  would have to find the penalty in the traced graph: the ops Keras makes for one L2 penalty, and how
  many of them carry a name that says they are a regularizer's. Run eagerly (``run_eagerly=True``) a
  step makes no graph at all, and the counter still counts.
* **One merge call** (``_compat.common.in_one_merge_call``'s ``_use_merge_call``, Keras 3). An
  optimizer with ``gradient_accumulation_steps`` under ``MirroredStrategy`` on 2 logical CPUs, updated
  three ways: custom_fit's (cross-replica context, the strategy's ``_use_merge_call`` answering "no"
  while the update is traced), cross-replica context without that, and back in the replicas
  (``call_for_each_replica``). What each ends with.
* **Accumulating below the loss scale** (``_compat.keras2_accumulation._accumulating_below``,
  tf_keras). ``mixed_float16``, ``gradient_accumulation_steps=4``, inputs scaled so that the first
  scaled gradients overflow; custom_fit's way (the inner optimizer accumulates, below the
  ``LossScaleOptimizer``'s finite check) against accumulating above it (the loss-scale optimizer
  applies the mean of 4 steps): the micro-steps whose gradients are thrown away, and the steps the
  loss scale sees.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import tensorflow as tf

PARSER = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
PARSER.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
# Before anything starts TensorFlow's runtime: two replicas for the merge-call ways.
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2
)

import custom_fit
from custom_fit import keras
from custom_fit._compat import common

ANSI = re.compile(r"\x1b\[[0-9;]*m")


# -- the regularizer counter ---------------------------------------------------------------------


def penalty_in_graph() -> dict[str, Any]:
    """The ops of one L2 penalty (``layer.losses``) in a traced graph, and those named for a regularizer."""
    layer = keras.layers.Dense(3, kernel_regularizer=keras.regularizers.L2(0.01))
    layer.build((None, 4))
    graph = tf.function(lambda: tf.add_n(layer.losses)).get_concrete_function().graph
    # The captured variable handle and the function's output are the graph's frame, not the penalty.
    ops = [op for op in graph.get_operations() if op.type not in ("Placeholder", "Identity", "NoOp")]
    named = [op.name for op in ops if "regulariz" in op.name.lower()]
    return {
        "penalty_ops": sorted(collections.Counter(op.type for op in ops).items()),
        "ops": len(ops),
        "named_for_a_regularizer": len(named),
        "names": [op.name for op in ops],
    }


# -- one merge call (Keras 3) --------------------------------------------------------------------


def _without_the_swap(update: Callable[[list[Any]], None], gradients: list[Any], **_: Any) -> None:
    """Keras' update in the one merge call's cross-replica context, the strategy's ``_use_merge_call`` as it is."""
    common.in_one_merge_call(update, gradients, direct_updates=False)


def _back_in_the_replicas(update: Callable[[list[Any]], None], gradients: list[Any], **_: Any) -> None:
    """Keras' update run in each replica again from the one merge call (as tf_keras' accumulation does)."""

    def each_replica(local: list[Any]) -> None:
        tf.distribute.get_strategy().extended.call_for_each_replica(lambda: update(local))

    common.in_one_merge_call(each_replica, gradients, direct_updates=False)


MERGE_CALL_WAYS: dict[str, Callable[..., None] | None] = {
    "custom_fit (cross-replica, _use_merge_call answers no)": None,
    "cross-replica, no swap": _without_the_swap,
    "back in the replicas (call_for_each_replica)": _back_in_the_replicas,
}


def accumulating_on_two_replicas(way: str) -> dict[str, Any]:
    """``Adam(gradient_accumulation_steps=2)`` under ``MirroredStrategy`` on 2 CPUs, updated ``way``."""
    from custom_fit._compat import keras3

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype("float32")
    with strategy.scope():
        inputs = keras.Input((4,))
        model = custom_fit.CustomModel(inputs, keras.layers.Dense(1)(inputs))
        model.compile(optimizer=keras.optimizers.Adam(gradient_accumulation_steps=2), loss="mse")
    replacement = MERGE_CALL_WAYS[way]
    way_without = (
        mock.patch.object(keras3, "in_one_merge_call", replacement) if replacement else contextlib.nullcontext()
    )
    try:
        with way_without:
            model.fit(x, x.sum(axis=1), batch_size=16, epochs=1, verbose=0)
        return {"way": way, "ends": "trains", "updates": int(model.optimizer.iterations)}
    except Exception as error:  # what the way ends with is the measurement
        lines = [line for line in ANSI.sub("", str(error)).splitlines() if line.strip()]
        message = next((line for line in lines if not line.startswith("Exception encountered")), "")
        return {"way": way, "ends": f"{type(error).__name__}: {message.split('. ')[0]}", "updates": None}


# -- accumulating below the loss scale (tf_keras) ------------------------------------------------


def accumulating_above(optimizer: Any, grads_and_vars: list[Any], *, summed: bool) -> None:
    """The way without the swap: the loss-scale optimizer applies the mean of N steps itself."""
    from custom_fit._compat import keras2_accumulation as accumulation

    inner = accumulation._inner(optimizer)
    state = accumulation._ACCUMULATIONS.get(inner)
    if state is None or inner is optimizer:
        accumulation.apply_gradients(optimizer, grads_and_vars, summed=summed)
        return
    accumulation._accumulate(optimizer, state, grads_and_vars)


COUNTS = ("loss_scale_steps", "accumulated", "accumulated_non_finite")


@contextlib.contextmanager
def counting(counts: dict[str, tf.Variable], loss_scale_optimizer: Any) -> Iterator[None]:
    """While inside: the loss-scale optimizer's ``apply_gradients`` calls, and the micro-steps accumulated
    (all, and those with a non-finite gradient), counted in the graph, so per run step, not per trace."""
    from custom_fit._compat import keras2_accumulation

    own_apply, own_accumulate = loss_scale_optimizer.apply_gradients, keras2_accumulation._accumulate

    def apply_gradients(self: Any, *args: Any, **kwargs: Any) -> Any:
        counts["loss_scale_steps"].assign_add(1)
        return own_apply(self, *args, **kwargs)

    def accumulate(optimizer: Any, accumulation: keras2_accumulation._Accumulators, grads_and_vars: list[Any]) -> None:
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g, _ in grads_and_vars if g is not None])
        counts["accumulated"].assign_add(1)
        counts["accumulated_non_finite"].assign_add(1 - tf.cast(finite, tf.int64))
        own_accumulate(optimizer, accumulation, grads_and_vars)

    with (
        mock.patch.object(loss_scale_optimizer, "apply_gradients", apply_gradients),
        mock.patch.object(keras2_accumulation, "_accumulate", accumulate),
    ):
        yield


def mixed_precision_accumulation(way: str) -> dict[str, Any]:
    """12 steps of 8, ``gradient_accumulation_steps=4``, inputs x 20000 (the first scaled gradients overflow)."""
    from custom_fit._compat import keras2

    rng = np.random.default_rng(0)
    x = rng.normal(size=(96, 4)).astype("float32")
    y = (x @ rng.normal(size=(4, 1))).astype("float32")
    counts = {name: tf.Variable(0, dtype=tf.int64) for name in COUNTS}
    above = mock.patch.object(keras2, "apply_gradients", accumulating_above)
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        keras.utils.set_random_seed(1)
        model = custom_fit.CustomSequential(
            [keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1, dtype="float32")]
        )
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", gradient_accumulation_steps=4)
        with above if way == "above" else contextlib.nullcontext(), counting(counts, type(model.optimizer)):
            model.fit(x * 2e4, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    optimizer = model.optimizer
    measured = {name: int(count.numpy()) for name, count in counts.items()}
    scale = float(optimizer.loss_scale.numpy())
    skipped = round(np.log2(2.0**15 / scale))  # dynamic_growth_steps is 2000: here the scale only halves
    # Accumulating above, a skipped step is a mean of 4: its micro-steps, finite or not, are thrown away.
    thrown_away = skipped if way == "below" else 4 * skipped
    non_finite_thrown_away = skipped if way == "below" else measured["accumulated_non_finite"]
    return {
        "way": way,
        "micro_steps": len(x) // 8,
        **measured,
        "skipped_by_the_finite_check": skipped,
        "micro_steps_thrown_away": thrown_away,
        "finite_micro_steps_thrown_away": thrown_away - non_finite_thrown_away,
        "updates_applied": int(optimizer.iterations) - skipped,  # tf_keras counts a skipped step as an iteration
        "loss_scale_after": scale,
        "weights_finite": all(bool(np.all(np.isfinite(w))) for w in model.get_weights()),
    }


# -- report --------------------------------------------------------------------------------------


def main() -> None:
    args = PARSER.parse_args()
    name = "keras2" if custom_fit.KERAS_2 else "keras3"
    result: dict[str, Any] = {
        "keras": keras.__version__,
        "tensorflow": tf.__version__,
        "penalty_in_graph": penalty_in_graph(),
    }
    if custom_fit.KERAS_2:
        result["accumulation_and_loss_scale"] = [mixed_precision_accumulation(way) for way in ("below", "above")]
    else:
        result["merge_call"] = [accumulating_on_two_replicas(way) for way in MERGE_CALL_WAYS]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"results_trace_time_swaps_{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    text = report(result)
    (args.out / f"results_trace_time_swaps_{name}.md").write_text(text)
    print(text)


def report(result: dict[str, Any]) -> str:
    penalty = result["penalty_in_graph"]
    lines = [
        "# The trace-time swaps, against the ways without them (benchmarks/trace_time_swaps.py)",
        "",
        f"keras {result['keras']}, TensorFlow {result['tensorflow']}.",
        "",
        "## The regularizer counter: one L2 penalty in a traced graph",
        "",
        f"{penalty['ops']} ops ({', '.join(f'{t} x{n}' for t, n in penalty['penalty_ops'])}), "
        f"**{penalty['named_for_a_regularizer']} of {penalty['ops']}** named for a regularizer: "
        f"`{'`, `'.join(penalty['names'])}`. Run eagerly, a step makes no graph.",
    ]
    if "merge_call" in result:
        lines += [
            "",
            "## One merge call: `Adam(gradient_accumulation_steps=2)`, `MirroredStrategy` on 2 logical CPUs",
            "",
            "| way | ends | updates |",
            "|---|---|---|",
        ]
        lines += [f"| {r['way']} | {r['ends']} | {r['updates']} |" for r in result["merge_call"]]
    if "accumulation_and_loss_scale" in result:
        rows = result["accumulation_and_loss_scale"]
        lines += [
            "",
            "## Accumulating below or above the loss scale: `mixed_float16`, 12 steps, `gradient_accumulation_steps=4`",
            "",
            "| accumulating | steps the loss scale saw | micro-steps accumulated (non-finite) "
            "| skipped by the finite check | micro-steps thrown away (finite) | updates applied "
            "| loss scale after | weights finite |",
            "|---|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['way']} | {r['loss_scale_steps']} of {r['micro_steps']} "
            f"| {r['accumulated']} ({r['accumulated_non_finite']}) | {r['skipped_by_the_finite_check']} "
            f"| {r['micro_steps_thrown_away']} ({r['finite_micro_steps_thrown_away']}) | {r['updates_applied']} "
            f"| {r['loss_scale_after']:g} | {r['weights_finite']} |"
            for r in rows
        ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
