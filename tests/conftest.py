"""Shared test setup: quiet TensorFlow, a parity harness, and a parity table in the summary."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import pytest  # noqa: E402

from custom_fit import _compat  # noqa: E402
from tests import parity  # noqa: E402

# Tests of features only one Keras has. The other configuration deselects them
# (they are counted as "deselected" in the summary, not skipped): `make test`
# runs the suite once on Keras 3 and once with TF_USE_LEGACY_KERAS=1.
ONLY = {"keras3": not _compat.KERAS_2, "keras2": _compat.KERAS_2}


def pytest_collection_modifyitems(config, items):
    """Deselects tests marked for the Keras that is not in use."""
    deselected = [item for item in items if any(not ONLY[m.name] for m in item.iter_markers() if m.name in ONLY)]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if item not in deselected]


def pytest_report_header(config):
    return f"custom_fit runs on {_compat.KERAS_VERSION}"


def pytest_terminal_summary(terminalreporter):
    """Prints every parity comparison made in this run (case -> max |delta|)."""
    if not parity.RESULTS:
        return
    terminalreporter.section(f"parity on {_compat.KERAS_VERSION}: keras reference vs custom_fit (max |delta|)")
    width = max(52, *(len(name) for name in parity.RESULTS))
    terminalreporter.write_line(
        f"{'case':<{width}} {'weights':>9} {'history':>9} {'evaluate':>9} {'predict':>9} {'batch logs':>10}"
    )
    for name, deltas in sorted(parity.RESULTS.items()):
        terminalreporter.write_line(
            f"{name:<{width}} "
            + " ".join(f"{deltas[k]:>9.3g}" for k in ("weights", "history", "evaluate", "predict"))
            + f" {deltas['batch_logs']:>10.3g}"
        )


@pytest.fixture
def seed() -> int:
    """The seed every parity run starts from."""
    return 1234
