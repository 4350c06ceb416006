"""Shared test setup: quiet TensorFlow, a parity harness, and a parity table in the summary."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import pytest  # noqa: E402

from tests import parity  # noqa: E402


def pytest_terminal_summary(terminalreporter):
    """Prints every parity comparison made in this run (case -> max |delta|)."""
    if not parity.RESULTS:
        return
    terminalreporter.section("parity: keras reference vs custom_fit (max |delta|)")
    terminalreporter.write_line(f"{'case':<52} {'weights':>9} {'history':>9} {'evaluate':>9} {'predict':>9} {'batch logs':>10}")
    for name, deltas in sorted(parity.RESULTS.items()):
        terminalreporter.write_line(
            f"{name:<52} "
            + " ".join(f"{deltas[k]:>9.3g}" for k in ("weights", "history", "evaluate", "predict"))
            + f" {deltas['batch_logs']:>10.3g}"
        )


@pytest.fixture
def seed() -> int:
    """The seed every parity run starts from."""
    return 1234
