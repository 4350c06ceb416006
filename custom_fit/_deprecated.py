"""The module paths custom_fit 0.2 made public by name, kept for one release with a warning.

In custom_fit 0.3 the implementation modules became private (``custom_fit.model``
is ``custom_fit._model``); what users need is exported by ``custom_fit`` itself.
Code that imports an old path keeps working until 0.4: the old name is an alias
module whose attributes are the new module's, and reading one warns with a
``DeprecationWarning`` that names the import to write instead. Registered in
``sys.modules`` rather than written as files, so nothing warns unless old code runs.
"""

from __future__ import annotations

import importlib
import sys
import types
import warnings
from typing import Any

__all__ = ["RENAMED", "register_aliases"]

#: Old public module -> its private module (custom_fit 0.3).
RENAMED = {
    "fit_loop": "_trainer.loop",
    "configs": "_saving",
    "callbacks": "_trainer.callbacks",
    "step_functions": "_trainer.step_functions",
    "step_fusion": "_trainer.step_fusion",
} | {
    name: f"_{name}"
    for name in (
        "backup_and_restore",
        "backup_store",
        "compiled",
        "diagnostics",
        "distribution",
        "extra_state",
        "functional",
        "gradient_contract",
        "logged_values",
        "losses",
        "model",
        "optimizers",
        "random_state",
    )
}


class _RenamedModule(types.ModuleType):
    """``custom_fit.<old>``: forwards attribute reads to its private module (:data:`RENAMED`), warning each time."""

    def __init__(self, old: str, new: str):
        super().__init__(f"custom_fit.{old}", f"Deprecated alias of custom_fit.{new}.")
        self._custom_fit_new = new

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        new = importlib.import_module(f"custom_fit.{self._custom_fit_new}")
        value = getattr(new, name)
        public = name in sys.modules["custom_fit"].__all__  # loaded by the time an alias is read: no import
        instead = (
            f"`from custom_fit import {name}`" if public else f"`custom_fit.{self._custom_fit_new}.{name}` (private)"
        )
        warnings.warn(
            f"{self.__name__} is deprecated since custom_fit 0.3 and goes in 0.4: its modules became private. "
            f"Expected {instead}; received a read of {self.__name__}.{name}.",
            DeprecationWarning,
            stacklevel=2,
        )
        return value


def register_aliases() -> None:
    """Makes each old module path importable (``import custom_fit.model``, ``from custom_fit.model import X``).

    ``custom_fit.<old>`` as an attribute of the package is the package's ``__getattr__``.
    """
    for old, new in RENAMED.items():
        sys.modules.setdefault(f"custom_fit.{old}", _RenamedModule(old, new))
