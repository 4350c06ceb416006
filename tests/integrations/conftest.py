"""The integration suites: what is theirs alone (the tools' own noise, narrowed to its message)."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent

#: A tool of this suite leaves a UDP socket to the garbage collector, which may close it during any later test
#: (seen with MLflow, W&B and DVCLive tests in one process, never in a file run alone): Python warns then,
#: whichever base that test trains, so the warning is the tools', not the test's.
#: Importing W&B puts its ``wandb.util.ImportMetaHook`` on ``sys.meta_path``; it has no ``find_spec``, so every later
#: import in that process makes Python warn (seen in CI, where an MLflow test ran after a W&B test in one worker).
FILTERS = (
    "ignore:unclosed <socket.socket:ResourceWarning",
    "ignore:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning",
    r"ignore:ImportMetaHook.find_spec\(\) not found:ImportWarning",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(item.path).parents:
            for spec in FILTERS:
                item.add_marker(pytest.mark.filterwarnings(spec))
