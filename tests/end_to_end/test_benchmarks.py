"""``benchmarks/bench.py --quick`` runs and writes consistent results (timings are not asserted).

On Keras 2 (``TF_USE_LEGACY_KERAS=1``) it measures CustomModel against tf_keras' Model only (no loops, no GAN).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import tensorflow as tf

import custom_fit
from benchmarks import bench

pytestmark = pytest.mark.slow

AA = "A/A (keras.Model.fit vs itself)"
CNN = "cnn (seed 000: 32x32x3, 100 classes, batch 32)"
MLP = "mlp (16-32-10, batch 32)"
FIT_COST = bench.FIT_COST
CNN_EPOCHS = bench.CNN_EPOCHS
GAN = "digits GAN (MLP, batch 64, two optimizers)"
ORDER = bench.KERAS_ORDER
CONTRACT = {
    f"gradient contract: {MLP}, {policy}": {"keras.Model.fit", "CustomModel.fit", f"CustomModel.fit, {ORDER}"}
    for policy in ("float32", "mixed_float16")
} | {
    f"gradient contract: {GAN}, {policy}": {"custom_fit.GAN", f"custom_fit.GAN, {ORDER}"}
    for policy in ("float32", "mixed_float16")
}
AUTO = 'steps_per_execution="auto"'
CLASSIFICATION = {"keras.Model.fit", "CustomModel.fit", f"CustomModel.fit, {AUTO}"}
QUICK_MLP = bench.sizes(quick=True)["mlp"]
VALIDATION = set(bench.validation_every_n_steps(QUICK_MLP).builders)  # names only: nothing is built
ACCUMULATION = set(bench.gradient_accumulation(QUICK_MLP).builders)
BACKUP = set(bench.backups(bench.sizes(quick=True)["backup"]).builders)
EXPECTED = (
    {
        AA: {"keras.Model.fit (A)", "keras.Model.fit (B)"},
        CNN: CLASSIFICATION,
        FIT_COST: CLASSIFICATION,
        CNN_EPOCHS: CLASSIFICATION,
        MLP: CLASSIFICATION,
        bench.VALIDATION: VALIDATION,
        bench.BACKUP: BACKUP,
    }
    if bench.KERAS_2
    else {
        AA: {"keras.Model.fit (A)", "keras.Model.fit (B)"},
        CNN: CLASSIFICATION | {"tf.function loop", bench.EAGER_LOGS},
        FIT_COST: CLASSIFICATION | {"tf.function loop", bench.EAGER_LOGS},
        CNN_EPOCHS: CLASSIFICATION | {"tf.function loop", bench.EAGER_LOGS},
        MLP: CLASSIFICATION | {"tf.function loop", bench.EAGER_LOGS},
        GAN: {"keras.io GAN (keras.Model)", "custom_fit.GAN", f"custom_fit.GAN, {AUTO}", "tf.function GAN loop"},
        bench.VALIDATION: VALIDATION,
        bench.PROGBAR: {"keras.Model.fit, verbose=1", "CustomModel.fit, verbose=1", bench.PROGBAR_LAZY},
        bench.ACCUMULATION: ACCUMULATION,
        bench.BACKUP: BACKUP,
        **CONTRACT,
    }
)
STATS = bench.STATS


def check_ratio(variant: dict, key: str, identity: bool) -> None:
    """``key``'s statistics are consistent; exactly 1 when the variant is its own base."""
    median, (low, high), half_width = variant[f"{key}_median"], variant[f"{key}_ci"], variant[f"{key}_half_width"]
    geomean, (t_low, t_high) = variant[f"{key}_geomean"], variant[f"{key}_geomean_ci"]
    if identity:
        assert (median, low, high, half_width, geomean, t_low, t_high) == (1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0)
        return
    # Two rounds (--quick): the median's interval is their range; the median is their geometric mean.
    assert 0 < low <= median <= high and 0 < t_low <= geomean <= t_high
    assert math.isclose(median, geomean) and math.isclose(median * median, low * high)
    assert math.isclose(half_width, max(math.log(median / low), math.log(high / median)), rel_tol=1e-9)


def test_quick_benchmark_writes_consistent_results(tmp_path):
    # --threads 0 keeps TensorFlow's default pools: pinning them would outlast this test in its process.
    results = bench.main(["--quick", "--threads", "0", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / f"{bench.STEM}.json").read_text())
    assert saved == json.loads(json.dumps(results))
    assert saved["quick"] is True and saved["machine"] and saved["method"]
    assert ("tf_keras 2." in saved["machine"]) == bench.KERAS_2
    assert saved["threads"].keys() == {"requested", "intra_op", "inter_op", "pinned", "note"}
    assert saved["settings"]["min_rounds"] == saved["settings"]["max_rounds"] == 2
    assert next(iter(tmp_path.glob("throughput*.png"))).stat().st_size > 0
    table = (tmp_path / f"{bench.STEM}.md").read_text()
    assert {name: set(w["variants"]) for name, w in saved["workloads"].items()} == EXPECTED
    for name, workload in saved["workloads"].items():
        assert name in table
        assert workload["rounds"] == 2 and workload["stopped_by"] in {"ci_target", "max_rounds"}
        no_loop = bench.KERAS_2 or name in (AA, bench.PROGBAR, bench.VALIDATION, bench.ACCUMULATION, bench.BACKUP)
        no_loop = no_loop or name in CONTRACT
        assert workload["loop"] is None if no_loop else workload["loop"] in workload["variants"]
        for variant_name, variant in workload["variants"].items():
            assert variant_name in table
            # bench.py reports a variant that raised instead of stopping; here every variant must run.
            assert variant["available"], f"{name} / {variant_name} could not run: {variant.get('error')}"
            assert variant["samples_per_s_median"] > 0 and variant["rounds"] == 2
            assert len(variant["wall_s"]) == len(variant["cpu_s"]) == 2 and min(variant["wall_s"]) > 0
            for prefix in ("", "cpu_"):
                check_ratio(variant, f"{prefix}ratio_to_reference", variant_name == workload["reference"])
                if workload["loop"] is None:
                    assert all(variant[f"{prefix}ratio_to_loop_{s}"] is None for s in STATS)
                else:
                    check_ratio(variant, f"{prefix}ratio_to_loop", variant_name == workload["loop"])
            assert isinstance(variant["ci_target_met"], bool) and isinstance(variant["cpu_ci_target_met"], bool)
        gains = (
            set()
            if name == AA
            else {"gradient contract"}
            if name in CONTRACT
            else {"tensors to the progress bar"}
            if name == bench.PROGBAR
            else {"Steps(N), the same runs", "two named sets / one set of the same size"}
            if name == bench.VALIDATION
            else {"accumulation (vs one large batch)"}
            if name == bench.ACCUMULATION
            else {"background writes, every 10 steps", "background writes, every 50 steps"}
            if name == bench.BACKUP
            else {AUTO}
            if bench.KERAS_2 or name == GAN
            else {AUTO, "lazy callbacks"}
        )
        assert set(workload["gains"]) == gains
        for label, gain in workload["gains"].items():
            assert {gain["variant"], gain["base"]} <= set(workload["variants"])
            assert 0 < gain["ci"][0] <= gain["median"] <= gain["ci"][1] and f"{label} ({gain['variant']}" in table
        assert workload["ci_target_met"] == all(v.get("ci_target_met", True) for v in workload["variants"].values())


def test_only_accepts_the_workloads_this_keras_measures(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--only", "resnet", "--threads", "0"])
    assert "invalid choice: 'resnet'" in capsys.readouterr().err
    if bench.KERAS_2:  # the GAN is Keras 3 code: named, not measured
        with pytest.raises(SystemExit):
            bench.main(["--only", "gan", "--threads", "0"])
        err = capsys.readouterr().err
        assert "--only gan: not measured on tf_keras" in err and "expected some of: aa cnn" in err


def test_t_quantiles():
    assert bench.t_quantile_975(1) == 12.7062 and bench.t_quantile_975(30) == 2.0423
    assert bench.t_quantile_975(60) > bench.t_quantile_975(61) > bench.t_quantile_975(1000) > 1.96
    assert math.isclose(bench.t_quantile_975(120), 1.9799, abs_tol=1e-4)
    with pytest.raises(ValueError, match="expected df >= 1"):
        bench.t_quantile_975(0)


def test_ratio_stats():
    stats = bench.ratio_stats([math.log(r) for r in (1.0, 1.1, 0.9, 1.05)])
    assert stats["median"] == pytest.approx(math.sqrt(1.0 * 1.05))
    assert stats["ci"] == pytest.approx([0.9, 1.1])  # n < 6: the range
    assert stats["half_width"] == pytest.approx(math.log(stats["median"] / 0.9))
    assert stats["geomean"] == pytest.approx((1.0 * 1.1 * 0.9 * 1.05) ** 0.25)
    low, high = stats["geomean_ci"]
    assert low * high == pytest.approx(stats["geomean"] ** 2) and low < 1 < high


def test_the_median_interval_ignores_a_few_disturbed_rounds():
    # 60 rounds: 54 within ±1%, 6 a neighbour slowed down by half, on either side.
    rounds = [1.0 + 0.01 * math.sin(i) for i in range(54)] + [0.5, 2.0] * 3
    stats = bench.ratio_stats([math.log(r) for r in rounds])
    assert 0.99 <= stats["ci"][0] <= stats["median"] <= stats["ci"][1] <= 1.01
    t_low, t_high = stats["geomean_ci"]
    assert t_high / t_low > 1.1  # the t-interval of the mean is widened by the six


@pytest.mark.parametrize(
    ("n", "ranks"),
    [(1, (1, 1)), (5, (1, 5)), (6, (1, 6)), (10, (2, 9)), (20, (6, 15)), (60, (22, 39)), (100, (40, 61))],
)
def test_median_ci_ranks_match_the_sign_test_table(n, ranks):
    # Ranks of the distribution-free 95% interval, as tabulated (e.g. Conover, Practical Nonparametric Statistics).
    assert bench.median_ci_ranks(n) == ranks
    k = ranks[0]
    if n >= 6:  # coverage 1 - 2 P(B < k) >= 95%, and no narrower interval has it
        below = sum(math.comb(n, j) for j in range(k)) / 2**n
        assert 1 - 2 * below >= 0.95 > 1 - 2 * (below + math.comb(n, k) / 2**n)
    with pytest.raises(ValueError, match="expected n >= 1, received 0"):
        bench.median_ci_ranks(0)


def test_threads_stay_when_the_runtime_is_running():
    tf.constant(0.0)  # the runtime runs: its thread pools are fixed
    current = tf.config.threading.get_intra_op_parallelism_threads()
    threads = bench.pin_threads(current + 1)
    assert threads["pinned"] is False and "after initialization" in threads["note"]
    assert tf.config.threading.get_intra_op_parallelism_threads() == threads["intra_op"] == current


@pytest.mark.keras3
def test_the_measured_alternative_to_keras_3s_swapped_gradient_sum_is_what_the_code_says(tmp_path):
    """``benchmarks/summed_gradients.py``, quick: the reason next to ``keras3._gradients_already_summed``.

    Dividing the sum by N and letting the optimizer sum again all-reduces twice the values per step, gives
    the same weights on 2 and 4 replicas and other weights on 3 (timings are not asserted).
    """
    command = [sys.executable, str(bench.HERE / "summed_gradients.py"), "--steps", "3", "--rounds", "2"]
    command += ["--out", str(tmp_path)]
    subprocess.run(command, check=True, capture_output=True, timeout=600)
    result = json.loads((tmp_path / "results_summed_gradients.json").read_text())
    rows = {row["replicas"]: row for row in result["exactness_and_traffic"]}
    assert sorted(rows) == [2, 3, 4]
    for row in rows.values():
        swap, other = row["all_reduced_values_per_step"].values()
        assert (swap, other) == (row["weights"], 2 * row["weights"])
    assert rows[2]["weights_that_differ"] == rows[4]["weights_that_differ"] == 0
    assert rows[3]["weights_that_differ"] > 0 and 0 < rows[3]["max_abs_difference"] < 1e-6
    assert result["time"]["rounds"] == 2 and (tmp_path / "results_summed_gradients.md").exists()


def test_the_measured_ways_without_the_other_trace_time_swaps_are_what_the_code_says(tmp_path):
    """``benchmarks/trace_time_swaps.py`` on the Keras under test: the reasons next to the other kept swaps.

    Keras 3 names none of a penalty's ops for its regularizer (tf_keras names every one, but a step
    run eagerly makes no graph); on Keras 3 both ways to update in one merge call without the swap
    fail; on tf_keras accumulating above the loss scale throws away finite micro-steps with a
    non-finite one and shows the loss scale one step in 4.
    """
    command = [sys.executable, str(bench.HERE / "trace_time_swaps.py"), "--out", str(tmp_path)]
    subprocess.run(command, check=True, capture_output=True, timeout=600)
    name = "keras2" if custom_fit.KERAS_2 else "keras3"
    result = json.loads((tmp_path / f"results_trace_time_swaps_{name}.json").read_text())
    assert (tmp_path / f"results_trace_time_swaps_{name}.md").exists()
    penalty = result["penalty_in_graph"]
    assert penalty["ops"] > 0
    assert penalty["named_for_a_regularizer"] == (penalty["ops"] if custom_fit.KERAS_2 else 0)
    if not custom_fit.KERAS_2:
        swap, cross_replica, in_replicas = result["merge_call"]
        assert (swap["ends"], swap["updates"]) == ("trains", 2)  # 4 steps, one update per 2
        assert cross_replica["ends"].startswith("AttributeError") and "merge_call" in cross_replica["ends"]
        assert in_replicas["ends"].startswith("RuntimeError") and "inside a tf.cond" in in_replicas["ends"]
        return
    below, above = result["accumulation_and_loss_scale"]
    assert below["loss_scale_steps"] == below["micro_steps"] == 12 and above["loss_scale_steps"] == 3
    assert below["skipped_by_the_finite_check"] >= 1 and below["accumulated_non_finite"] == 0
    assert below["finite_micro_steps_thrown_away"] == 0
    assert above["accumulated_non_finite"] >= 1 and above["finite_micro_steps_thrown_away"] > 0
    assert below["weights_finite"] and above["weights_finite"]
