"""Tripwires: every Keras internal custom_fit copies is the source its copy was reviewed against.

custom_fit/_compat/internals.json lists the copies with the reviewed hashes
per Keras and tf_keras version (custom_fit/_compat/internals.py reads it),
docs/keras_internals.md what each copy changes and why. When a Keras release
changes one of the upstream functions, its test here fails and names the copy
to re-check; importing custom_fit on a release the data does not list warns.
"""

from __future__ import annotations

import importlib
import inspect
import os
import pkgutil
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import custom_fit
from custom_fit._compat import internals, keras

IN_USE = "tf_keras" if custom_fit.KERAS_2 else "keras"
ROOT = Path(__file__).parents[2]


@pytest.mark.parametrize("copy", internals.COPIES, ids=lambda copy: copy.id)
def test_upstream_source_is_the_one_the_copy_was_reviewed_against(copy):
    root = internals.installed_root(copy.package)
    if root is None and copy.package != IN_USE:
        # A row whose TensorFlow no tf_keras release accepts yet (compat/tensorflow-2.22-rc.txt).
        pytest.skip(f"{copy.package} is not installed in this row; its copies are checked where it is")
    assert root is not None, f"{copy.package} is not installed; install the extras: pip install -e .[test,keras2]"
    version = internals.version_of(copy.package, root)
    verdict = internals.check(copy, version, internals.upstream_hash(copy, root), copy.hashes)
    assert verdict.ok, verdict.message


def test_the_tripwires_read_the_keras_that_runs():
    root = internals.installed_root(IN_USE)
    assert root == Path(keras.__file__).resolve().parent.parent
    running = keras.__version__ if custom_fit.KERAS_2 else keras.version()
    assert internals.version_of(IN_USE, root) == running


def _resolve(name: str) -> Any:
    """The object a dotted name of ``COPIES`` names (module, then attributes)."""
    parts = name.split(".")
    for split in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attribute in parts[split:]:
            obj = getattr(obj, attribute)
        return obj
    raise ImportError(name)


def test_every_copy_named_in_the_list_exists():
    missing = []
    for copy in internals.copies_of(IN_USE):
        for name in copy.copies:
            try:
                _resolve(name)
            except (ImportError, AttributeError):
                missing.append(f"{copy.id}: {name}")
    assert not missing, f"renamed or removed; update custom_fit/_compat/internals.py: {missing}"


def test_every_extension_point_named_here_exists():
    other = "custom_fit._compat.keras3" if custom_fit.KERAS_2 else "custom_fit._compat.keras2"
    missing = []
    for name in EXTENSION_POINTS:
        if name.startswith(other):  # a Keras 2 process never loads Keras 3 (nor the reverse)
            continue
        try:
            _resolve(name)
        except (ImportError, AttributeError):
            missing.append(name)
    assert not missing, f"renamed or removed; update EXTENSION_POINTS: {missing}"


def test_every_copy_is_described_in_the_docs():
    page = (ROOT / "docs" / "keras_internals.md").read_text(encoding="utf-8")
    described = {copy.id for copy in internals.COPIES if f"`{copy.id}`" in page}
    assert described == {copy.id for copy in internals.COPIES}


def _pinned_versions() -> dict[str, set[str]]:
    """The keras and tf_keras versions CI installs (constraints.txt and every row in compat/)."""
    pinned: dict[str, set[str]] = {"keras": set(), "tf_keras": set()}
    for row in [ROOT / "constraints.txt", *(ROOT / "compat").glob("*.txt")]:
        lines = row.read_text(encoding="utf-8").splitlines()
        pins = dict(line.split("==", 1) for line in lines if "==" in line and not line.startswith("#"))
        # keras-nightly replaces the keras release install_requires pulls first, unless the row
        # keeps that release as the module (Makefile: `# keras module: keras`).
        if "keras-nightly" in pins and "# keras module: keras" not in lines:
            pins["keras"] = pins.pop("keras-nightly")
        for package, versions in pinned.items():
            if package in pins:
                versions.add(pins[package])
    return pinned


def test_every_pinned_version_has_reviewed_hashes():
    pinned = _pinned_versions()
    for copy in internals.COPIES:
        recorded = copy.versions()
        assert pinned[copy.package] <= recorded, f"{copy.id}: no hashes for {sorted(pinned[copy.package] - recorded)}"


def test_every_needed_upstream_function_exists_in_the_installed_keras():
    """What the import-time check calls gone (an ImportError) exists in every tested version."""
    root = internals.installed_root(IN_USE)
    assert root is not None
    missing = {copy.id: internals.missing_upstream(copy, root) for copy in internals.copies_of(IN_USE)}
    assert not {id: names for id, names in missing.items() if names}


# -- the check at import ------------------------------------------------------------------


def test_on_a_listed_version_the_import_check_hashes_nothing(monkeypatch):
    def hashing(*args):
        raise AssertionError("hashed a listed version")

    monkeypatch.setattr(internals, "upstream_hash", hashing)
    monkeypatch.setattr(internals, "missing_upstream", hashing)
    assert internals.check_installed.__wrapped__(IN_USE) == ()


def _next_version(version: str) -> str:
    """A version after ``version`` and before any newer recorded one (``3.15.1`` -> ``3.15.2``)."""
    head, _, last = version.rpartition(".")
    digits = last.lstrip("dev")
    return f"{head}.{last[: len(last) - len(digits)]}{int(digits) + 1}"


def _unreviewed_keras(tmp_path: Path, edit: str) -> tuple[Path, internals.Copy]:
    """A copy of the installed Keras as a newer version, with one copied internal edited.

    ``edit`` is ``"changed"`` (a statement added to the function: its hash changes, its
    behaviour does not) or ``"gone"`` (the function renamed away).
    """
    root = internals.installed_root(IN_USE)
    assert root is not None
    shutil.copytree(root / IN_USE, tmp_path / IN_USE, ignore=shutil.ignore_patterns("__pycache__"))
    version = internals.version_of(IN_USE, root)
    version_file = tmp_path / internals._VERSION_FILES[IN_USE]
    version_file.write_text(version_file.read_text().replace(f'"{version}"', f'"{_next_version(version)}"', 1))
    copy = next(c for c in internals.copies_of(IN_USE) if c.id in ("k3-make-function", "k2-make-train-function"))
    module = copy.upstream_names()[0].split(":")[0]
    file = tmp_path / Path(*module.split(".")).with_suffix(".py")
    lines = file.read_text().splitlines(keepends=True)
    tree = internals._parsed.__wrapped__(file)
    assert tree is not None
    for spelling in copy.upstream[0].split("|"):
        nodes = internals._find(tree, spelling.split(":")[-1])
        if nodes:
            break
    function: Any = nodes[0]
    if edit == "changed":
        first = function.body[0]
        start = min([first.lineno, *(d.lineno for d in getattr(first, "decorator_list", []))])
        lines.insert(start - 1, " " * first.col_offset + "pass\n")
    else:
        name = function.name
        lines[function.lineno - 1] = lines[function.lineno - 1].replace(f"def {name}(", f"def {name}_gone(", 1)
    file.write_text("".join(lines))
    return tmp_path, copy


def _import_custom_fit(path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(path), str(ROOT)])}
    code = "import warnings; warnings.simplefilter('default'); import custom_fit; print('imported')"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_an_unreviewed_keras_that_changed_a_copied_internal_warns_once_at_import(tmp_path):
    path, copy = _unreviewed_keras(tmp_path, "changed")
    result = _import_custom_fit(path)
    assert result.returncode == 0 and "imported" in result.stdout, result.stderr[-3000:]
    warned = [line for line in result.stderr.splitlines() if "UnreviewedKerasWarning" in line]
    assert len(warned) == 1, result.stderr[-3000:]
    assert "custom_fit has not been reviewed against" in warned[0]
    assert "changed 1 of the" in warned[0]
    assert f"[{copy.id}], made from {copy.upstream_names()[0]}" in result.stderr
    assert "pip install" in result.stderr


@pytest.mark.slow
def test_an_unreviewed_keras_without_a_needed_function_fails_at_import(tmp_path):
    path, copy = _unreviewed_keras(tmp_path, "gone")
    result = _import_custom_fit(path)
    assert result.returncode != 0
    assert "ImportError: custom_fit cannot run on" in result.stderr, result.stderr[-3000:]
    assert f"no longer defines: {copy.upstream_names()[0]} ({copy.id})" in result.stderr


# -- the verdicts -----------------------------------------------------------------------

COPY = internals.Copy("k3-example", ("custom_fit.example",), "keras", ("keras.src.example:Example.method",))


def test_a_recorded_version_passes_with_its_own_hash_only():
    recorded = {"aaaa": ("3.14.1", "3.15.1"), "bbbb": ("3.16.0",)}
    assert internals.check(COPY, "3.15.1", "aaaa", recorded).ok
    verdict = internals.check(COPY, "3.15.1", "bbbb", recorded)
    assert not verdict.ok
    assert "custom_fit.example [k3-example] was made from keras.src.example:Example.method" in verdict.message
    assert "the recorded hash for keras 3.15.1 is aaaa" in verdict.message
    assert "python compat/keras_internals.py --record" in verdict.message


def test_a_new_version_passes_only_while_the_functions_are_unchanged():
    recorded = {"aaaa": ("3.14.1",), "bbbb": ("3.15.1",)}
    assert internals.check(COPY, "3.16.0.dev2026102704", "bbbb", recorded).ok
    changed = internals.check(COPY, "3.16.0.dev2026102704", "cccc", recorded)
    assert not changed.ok and changed.reviewed_as == "3.15.1"
    assert "keras 3.16.0.dev2026102704 has no recorded hash" in changed.message
    # Back to an older version's source is a change too: only the nearest older version counts.
    assert not internals.check(COPY, "3.16.0", "aaaa", recorded).ok


def test_a_release_comes_after_its_nightlies():
    recorded = {"aaaa": ("3.15.1",), "bbbb": ("3.16.0.dev2026102704",)}
    assert internals.check(COPY, "3.16.0", "bbbb", recorded).ok
    assert not internals.check(COPY, "3.16.0", "aaaa", recorded).ok


def test_a_version_older_than_every_recorded_one_fails():
    verdict = internals.check(COPY, "3.7.0", "aaaa", {"aaaa": ("3.8.0",)})
    assert not verdict.ok and "no hash is recorded for keras 3.7.0 or any older version" in verdict.message


def test_the_hash_ignores_formatting_comments_and_docstrings_but_not_code():
    source = 'class A:\n    def f(self, x):\n        """Doc."""\n        return x + 1  # one\n'
    reformatted = "class A:\n    def f(self, x): return (x +\n        1)\n"
    changed = "class A:\n    def f(self, x):\n        return x - 1\n"
    hashes = [internals.source_hash([internals.normalized_source(s, "A.f")]) for s in (source, reformatted, changed)]
    assert hashes[0] == hashes[1] != hashes[2]
    assert internals.source_hash([internals.normalized_source(source, "A.g")]) == internals.ABSENT


# -- completeness: every override of a Keras method is a listed copy or a public extension point --

#: Keras methods custom_fit classes override as any user's code does (public extension
#: points whose upstream source does not matter to the override), with the reason.
EXTENSION_POINTS = {
    "custom_fit.gan.GAN": "a model written the way users write one (its own __init__, compile, call, steps, config)",
    "custom_fit.gan_samples.GenerateSamples": "a Callback: on_epoch_end is a public hook",
    "custom_fit._backup_and_restore.BackupAndRestore": "a Callback: public hooks (__init__: *-backup-and-restore)",
    "custom_fit._compat.keras3._CopiedWeights.__init__": (
        "a store that opens no file: it copies Keras' walk of the model (a backup written later); the file it writes "
        "equals save_weights' byte for byte on every Keras row (tests/test_saving.py)"
    ),
    "custom_fit._compat.keras3._CopiedWeights.make": "the same store: records each entry of the walk, in its order",
    "custom_fit._optimizers.NamedOptimizers.__init__": "an optimizer's constructor",
    "custom_fit._optimizers.NamedOptimizers.apply_gradients": "refuses: a group applies no gradients itself",
    "custom_fit._optimizers.NamedOptimizers.apply": "refuses: a group applies no gradients itself",
    "custom_fit._optimizers.NamedOptimizers.get_config": "public serialization of the group",
    "custom_fit._optimizers.NamedOptimizers.finalize_variable_values": (
        "public: hands each member its variables for the member's own finalize_variable_values"
    ),
    "custom_fit._optimizers.NamedOptimizers.from_config": "public serialization of the group",
    "custom_fit._compat.keras3._LoggedValuesList.result": "Metric.result, the public metric API",
    "custom_fit._compat.common.CountingCall.__call__": "Regularizer.__call__, the public regularizer API",
    "custom_fit._compat.keras2.SeedGenerator.__init__": "a Layer's constructor",
    "custom_fit._model.CustomSequential.build": "delegates to Sequential.build; defined as Sequential defines it",
}
if custom_fit.KERAS_2:
    EXTENSION_POINTS["custom_fit._trainer.callbacks.LazyCallbackList"] = (
        "unused on Keras 2: tf_keras skips unused hooks itself"
    )


def _custom_fit_classes() -> list[type]:
    names = [m.name for m in pkgutil.iter_modules(custom_fit.__path__)]
    modules = [importlib.import_module(f"custom_fit.{name}") for name in names]
    own = ["keras2", "keras2_loop"] if custom_fit.KERAS_2 else ["keras3", "keras3_only"]
    modules += [importlib.import_module(f"custom_fit._compat.{name}") for name in own]
    classes = {cls for module in modules for cls in vars(module).values() if inspect.isclass(cls)}
    return [cls for cls in classes if cls.__module__.startswith("custom_fit") and any(map(_is_keras, cls.__mro__))]


def _is_keras(cls: type) -> bool:
    return cls.__module__.split(".")[0] == IN_USE


def _overrides() -> set[str]:
    """``module.Class.method`` for every method a custom_fit class defines over one of its Keras bases."""
    found = set()
    for cls in _custom_fit_classes():
        keras_bases = [base for base in cls.__mro__ if _is_keras(base)]
        for owner in cls.__mro__:
            if not owner.__module__.startswith("custom_fit"):
                continue
            for name in vars(owner):
                if name.startswith("__") and name not in ("__init__", "__new__", "__call__"):
                    continue
                if any(name in vars(base) for base in keras_bases):
                    found.add(f"{owner.__module__}.{owner.__qualname__}.{name}")
    return found


def test_every_override_of_a_keras_method_is_a_listed_copy_or_a_public_extension_point():
    listed = {name for copy in internals.copies_of(IN_USE) for name in copy.copies}
    unlisted = sorted(
        name
        for name in _overrides()
        if not any(name == entry or name.startswith(entry + ".") for entry in [*listed, *EXTENSION_POINTS])
    )
    assert not unlisted, (
        f"custom_fit overrides these {IN_USE} methods without a tripwire: {unlisted}. Fix: add each to "
        "custom_fit/_compat/internals.json (and docs/keras_internals.md), or to EXTENSION_POINTS here "
        "with the reason its upstream source does not matter."
    )
