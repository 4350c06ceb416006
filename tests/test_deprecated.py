"""custom_fit._deprecated: the 0.2 module paths, aliases that warn and name the import to write instead."""

from __future__ import annotations

import importlib
import importlib.util

import pytest

import custom_fit
from custom_fit._deprecated import RENAMED


@pytest.mark.parametrize(
    ("old", "name"),
    [
        ("custom_fit.model", "CustomModel"),
        ("custom_fit.backup_store", "BackupStore"),
        ("custom_fit.step_fusion", "StepsPerExecutionTuner"),
        ("custom_fit.optimizers", "NamedOptimizers"),
    ],
)
def test_a_0_2_import_path_still_works_and_names_the_new_one(old, name):
    module = importlib.import_module(old)
    with pytest.warns(DeprecationWarning, match=rf"{old} is deprecated .*Expected `from custom_fit import {name}`"):
        value = getattr(module, name)
    assert value is getattr(custom_fit, name)
    with pytest.warns(DeprecationWarning, match=f"{old} is deprecated"):  # the attribute path of the package too
        assert getattr(getattr(custom_fit, old.split(".")[1]), name) is value


@pytest.mark.parametrize(("old", "new"), sorted(RENAMED.items()))
def test_every_0_2_path_leads_to_a_module_that_exists(old: str, new: str) -> None:
    """A module renamed again (``_configs`` became ``_saving``) must take its alias along."""
    assert importlib.util.find_spec(f"custom_fit.{new}") is not None, f"custom_fit.{old} -> custom_fit.{new}"


def test_a_0_2_path_to_a_private_name_says_it_is_private():
    module = importlib.import_module("custom_fit.callbacks")
    with pytest.warns(DeprecationWarning, match=r"Expected `custom_fit._trainer.callbacks.LazyLogs` \(private\)"):
        module.LazyLogs  # noqa: B018
