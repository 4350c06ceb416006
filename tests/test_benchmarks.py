"""``benchmarks/bench.py --quick`` runs and writes valid results (timings are not asserted).

On Keras 2 (``TF_USE_LEGACY_KERAS=1``) it measures CustomModel against tf_keras' Model only.
"""

from __future__ import annotations

import json

import pytest

from benchmarks import bench

pytestmark = pytest.mark.slow


def test_quick_benchmark_writes_valid_results(tmp_path):
    results = bench.main(["--quick", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / f"{bench.STEM}.json").read_text())
    assert saved["quick"] is True and saved["machine"]
    assert next(iter(tmp_path.glob("throughput*.png"))).stat().st_size > 0
    table = (tmp_path / f"{bench.STEM}.md").read_text()
    for workload, result in saved["workloads"].items():
        assert workload in table
        assert result["variants"][result["reference"]]["ratio_to_reference_median"] == 1.0
        for variant in result["variants"].values():
            assert variant["samples_per_s_median"] > 0
            assert variant["samples_per_s_min"] <= variant["samples_per_s_median"] <= variant["samples_per_s_max"]
    assert results["workloads"].keys() == saved["workloads"].keys()
    mlp = set(saved["workloads"]["mlp (16-32-10, batch 32)"]["variants"])
    if bench.KERAS_2:
        assert mlp == {"keras.Model.fit", "CustomModel.fit"} and "tf_keras 2." in saved["machine"]
    else:
        assert {"CustomModel.fit", "keras.io train_step", "tf.function loop", "eager per-sample loop (seeds)"} <= mlp
        assert "custom_fit.GAN" in saved["workloads"]["digits GAN (MLP, batch 64, two optimizers)"]["variants"]


def test_recheck_rejects_unknown_workloads():
    with pytest.raises(
        SystemExit,
        match=r"--recheck expected workload names from \[.*'mlp, steps_per_execution=4'.*\], received \['mlp, spe=4'\]",
    ):
        bench.recheck(["mlp, spe=4"], repeats=1)
