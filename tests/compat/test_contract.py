"""custom_fit._compat.contract: keras3 and keras2 declare and implement its names and signatures."""

from __future__ import annotations

import ast
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

import custom_fit

PACKAGE = pathlib.Path(custom_fit.__file__).parent


def module_all(name: str) -> list[str]:
    """A ``_compat`` module's ``__all__``, read from its source (importing keras2 or keras3 loads that Keras)."""
    tree = ast.parse((PACKAGE / "_compat" / f"{name}.py").read_text())
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.List)):
            continue
        if [t.id for t in node.targets if isinstance(t, ast.Name)] == ["__all__"]:
            return [ast.literal_eval(element) for element in node.value.elts]
    raise AssertionError(f"custom_fit._compat.{name} has no __all__")


def module_level_names(name: str) -> set[str]:
    tree = ast.parse((PACKAGE / "_compat" / f"{name}.py").read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    return names


def contract_names() -> set[str]:
    """The members of ``custom_fit._compat.contract.KerasVersion``."""
    from custom_fit._compat.contract import KerasVersion

    names = {*vars(KerasVersion), *KerasVersion.__annotations__}  # functions and properties; constants
    return {name for name in names if not name.startswith("_")}


def test_keras_modules_declare_the_contract_names():
    assert set(module_all("keras2")) == set(module_all("keras3")) == contract_names()
    for version in ("keras2", "keras3", "common", "keras3_only"):
        missing = set(module_all(version)) - module_level_names(version)
        assert not missing, f"custom_fit._compat.{version} declares but does not define {sorted(missing)}"


# Run in a process of its own: importing the other Keras' module loads that Keras.
SIGNATURES = """
import inspect, json
from custom_fit._compat import contract, keras2, keras3

def shape(function, drop_self):
    parameters = list(inspect.signature(function).parameters.values())[1 if drop_self else 0 :]
    return [(p.name, p.kind.name, p.default is not inspect.Parameter.empty) for p in parameters]

members = {name: member for name, member in vars(contract.KerasVersion).items() if callable(member)}
found = {}
for module in (keras2, keras3):
    for name, member in members.items():
        if not name.startswith("_"):
            found[f"{module.__name__}.{name}"] = [shape(member, True), shape(getattr(module, name), False)]
print(json.dumps(found))
"""


@pytest.mark.slow
def test_keras_modules_implement_the_contract_signatures():
    """Each function of keras2 and keras3 takes the parameters the contract declares (names, kinds, defaults)."""
    completed = subprocess.run(
        [sys.executable, "-c", SIGNATURES],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(PACKAGE.parent)},
    )
    found = json.loads(completed.stdout.splitlines()[-1])
    assert len(found) == 2 * len([n for n in contract_names() if not n.isupper() and n not in PROPERTIES])
    differing = {name: shapes for name, shapes in found.items() if shapes[0] != shapes[1]}
    assert not differing, f"signatures differ from custom_fit._compat.contract.KerasVersion: {differing}"


#: The contract's read-only members (a class or the module), not functions.
PROPERTIES = {"keras", "Functional", "LossScaleOptimizer", "TrainerHooks"}


def test_package_reads_only_contract_names_from_version():
    """``version.X`` outside ``_compat`` names a member of the contract (mypy checks it too)."""
    used = set()
    for path in PACKAGE.glob("*.py"):
        used |= set(re.findall(r"(?<![\w.])version\.(\w+)", path.read_text()))
    assert used and used - contract_names() == set()
