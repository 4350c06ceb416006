"""The integration suites: what is theirs alone (the tools' own noise, narrowed to its message)."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent

#: A tool (found in psutil's interface listing, which W&B and MLflow call) leaves a UDP socket for the garbage
#: collector, which may close it during any later test: Python warns then, whichever base ran.
FILTERS = (
    "ignore:unclosed <socket.socket:ResourceWarning",
    "ignore:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(item.path).parents:
            for spec in FILTERS:
                item.add_marker(pytest.mark.filterwarnings(spec))
