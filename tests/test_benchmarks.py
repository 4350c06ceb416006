"""``benchmarks/bench.py --quick`` runs and writes valid results (timings are not asserted)."""

from __future__ import annotations

import json

import pytest

from benchmarks import bench

pytestmark = pytest.mark.keras3  # the benchmarks compare against Keras 3 baselines


def test_quick_benchmark_writes_valid_results(tmp_path):
    results = bench.main(["--quick", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["quick"] is True and saved["machine"]
    assert (tmp_path / "throughput.png").stat().st_size > 0
    table = (tmp_path / "results.md").read_text()
    for workload, result in saved["workloads"].items():
        assert workload in table
        assert result["variants"][result["reference"]]["ratio_to_reference_median"] == 1.0
        for variant in result["variants"].values():
            assert variant["samples_per_s_median"] > 0
            assert variant["samples_per_s_min"] <= variant["samples_per_s_median"] <= variant["samples_per_s_max"]
    assert {"CustomModel.fit", "keras.io train_step", "tf.function loop", "eager per-sample loop (seeds)"} <= set(
        saved["workloads"]["mlp (16-32-10, batch 32)"]["variants"])
    assert "custom_fit.GAN" in saved["workloads"]["digits GAN (MLP, batch 64, two optimizers)"]["variants"]
    assert results["workloads"].keys() == saved["workloads"].keys()


def test_recheck_rejects_unknown_workloads():
    import pytest

    with pytest.raises(SystemExit, match=r"--recheck expected workload names from \[.*'mlp, steps_per_execution=4'.*\], received \['mlp, spe=4'\]"):
        bench.recheck(["mlp, spe=4"], repeats=1)
