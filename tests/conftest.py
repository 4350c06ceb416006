"""Shared test setup: quiet TensorFlow, Keras-specific deselection, fixtures and the parity table."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import pytest
import tensorflow as tf

import custom_fit
from custom_fit import keras
from tests import parity

# Tests of features only one Keras has. The other configuration deselects them
# (they are counted as "deselected" in the summary, not skipped): `make test`
# runs the suite once on Keras 3 and once with TF_USE_LEGACY_KERAS=1.
ONLY = {"keras3": not custom_fit.KERAS_2, "keras2": custom_fit.KERAS_2}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--crash-all",
        action="store_true",
        help="also run the tests marked crash_all: the kill harness on every scenario (make test-crash)",
    )


def _deselected(config: pytest.Config, item: pytest.Item) -> bool:
    """Tests for the Keras that is not in use, and the crash_all tier unless asked for."""
    if any(not ONLY[m.name] for m in item.iter_markers() if m.name in ONLY):
        return True
    return item.get_closest_marker("crash_all") is not None and not config.getoption("--crash-all")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselects tests marked for the Keras that is not in use, and the crash_all tier (see ``--crash-all``)."""
    deselected = [item for item in items if _deselected(config, item)]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if item not in deselected]


def pytest_report_header(config: pytest.Config) -> str:
    return f"custom_fit runs on {custom_fit.KERAS_VERSION}"


# The parity table: each process records its comparisons in `parity.RESULTS`;
# under pytest-xdist the workers send theirs to the controller, which prints it.


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["parity"] = json.dumps(parity.RESULTS)


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook
def pytest_testnodedown(node: Any, error: Any) -> None:
    parity.RESULTS.update(json.loads(node.workeroutput.get("parity", "{}")))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Prints every parity comparison made in this run (case -> max |delta|; "-": not measured)."""
    if not parity.RESULTS:
        return
    terminalreporter.section(f"parity on {custom_fit.KERAS_VERSION}: keras reference vs custom_fit (max |delta|)")
    width = max(52, *(len(name) for name in parity.RESULTS))
    columns = ("weights", "history", "evaluate", "predict", "batch_logs")
    terminalreporter.write_line(f"{'case':<{width}} " + " ".join(f"{c.replace('_', ' '):>10}" for c in columns))
    for name, deltas in sorted(parity.RESULTS.items()):
        cells = ("-" if deltas.get(c) is None else f"{deltas[c]:.3g}" for c in columns)
        terminalreporter.write_line(f"{name:<{width}} " + " ".join(f"{cell:>10}" for cell in cells))


@pytest.fixture
def seed() -> int:
    """The seed every parity run starts from."""
    return 1234


@pytest.fixture
def mixed_float16() -> Iterator[None]:
    """Runs the test under the ``mixed_float16`` policy and restores ``float32`` afterwards."""
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy("float32")


@pytest.fixture
def deterministic_graph_rewrites() -> Iterator[None]:
    """Runs the test with Grappler's arithmetic optimizer off, so that Keras itself is deterministic.

    The optimizer rewrites chains of additions (a ``Mean`` tracker's total plus
    a sum of losses) in an order that varies between processes: the keras.io
    VAE on ``keras.Model`` logged ``loss`` 1 ULP apart (9.5e-7) from another
    ``keras.Model`` of the same seed in 4 of 5 processes, with identical
    weights; with the rewrite off, 0 of 8. Parity tests of such code compare
    exactly under this fixture instead of with a tolerance.
    """
    tf.config.optimizer.set_experimental_options({"arithmetic_optimization": False})
    try:
        yield
    finally:
        tf.config.optimizer.set_experimental_options({"arithmetic_optimization": True})
