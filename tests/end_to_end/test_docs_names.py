"""Every name of custom_fit's code that README.md and docs/ quote resolves, and the counts they quote from the
code and its data are the ones the code gives.

**Names.** A code span (single backticks, outside fenced code blocks) is a name of custom_fit's code when it
is a dotted Python name (a call's arguments dropped: ``custom_fit.GAN(...)`` is ``custom_fit.GAN``) whose
first part is

- ``custom_fit``: ``custom_fit.random.SeedGenerator``;
- a private module of the package, ``_`` and a lower-case letter, relative to the package:
  ``_compat.keras3.snapshot_weights``, ``_trainer.loop.Loop``, ``_backup_store.BackupStore``;
- a module of ``custom_fit._compat`` by its own name, as the docs write them in ``_compat``'s
  context: ``keras3_only.EpochIterator``, ``common.in_one_merge_call``;
- a class custom_fit defines: ``CustomModel.fit``, ``TrainerHooks._get_optimizer``,
  ``LazyCallbackList._batch_hook`` (every class of that name is tried).

A span whose last part is ``py`` or ``json`` names a file of the package (``internals.json``,
``keras3.py``): the file must exist in ``custom_fit/`` or ``custom_fit/_compat/``.

A name resolves when the longest prefix that is a module of the package imports and the rest is an
attribute (for a class, an annotated instance attribute or a dataclass field counts). A module of the
other Keras (one that imports ``tf_keras`` while Keras 3 runs, or ``keras`` while Keras 2 runs) is not
imported: the rest is looked up in its syntax tree. ``_compat.version``, ``_compat.loop`` and
``_compat.TrainerHooks`` are the Keras in use's (:data:`FACADE`): a name through them resolves when
either Keras' module has it, so a name only one Keras has is looked up at run time on that Keras' run
(CI runs the suite on both) and in the source on the other. :data:`EXEMPT` lists the few names that
need not resolve, each with its reason; an exemption no longer needed fails too.

**Counts.** A count a page quotes that the code or ``internals.json`` determines (copies in the
registry, upstream functions watched, copies changed per Keras 3 minor, ``_compat``'s names, the
bases of ``CustomModel``, ...) is computed here and compared with the page's text around it
(:data:`QUOTES`: the page, a pattern around the number, what it counts). Run records (benchmarks,
test runs) and the columns about past commits are not counted here.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import re
import statistics
from collections.abc import Callable, Iterator, Sequence
from functools import cache
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

import custom_fit
from custom_fit import _compat
from custom_fit._compat import internals

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "custom_fit"
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])

#: A dotted Python name, with a call's arguments (dropped) allowed after it.
DOTTED = re.compile(r"(?P<name>[A-Za-z_]\w*(?:\.\w+)+)(?:\(.*\))?", re.DOTALL)

#: The last part of a span that names a file of the package rather than code.
FILE_SUFFIXES = ("py", "json")

#: The names custom_fit._compat chooses at import, and where each Keras' implementation lives: Keras 3's
#: first, Keras 2's second (``test_the_facade_map_is_the_facades`` checks it against the package).
FACADE = {
    "version": ("custom_fit._compat.keras3", "custom_fit._compat.keras2"),
    "loop": ("custom_fit._compat.keras3_only", "custom_fit._compat.keras2_loop"),
    "TrainerHooks": ("custom_fit._compat.keras3.TrainerHooks", "custom_fit._compat.keras2.TrainerHooks"),
}

#: ``(page, name)``: names a page quotes that need not resolve, with the reason.
EXEMPT = {
    # The loop-redesign table's da0308e column: the modules and functions as they were at that commit.
    ("docs/testing.md", "_loop.fit_position"): "the da0308e column: the loop module before issue 41",
    ("docs/testing.md", "EpochPosition.resume"): "the da0308e column: the resume before a fit owned its Progress",
}


# --------------------------------------------------------------------------
# Code spans and the names they quote
# --------------------------------------------------------------------------


def code_spans(text: str) -> Iterator[tuple[int, str]]:
    """``(line, span)`` of each inline code span of ``text`` outside fenced code blocks."""
    kept: list[str] = []
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            kept.append("")
        else:
            kept.append("" if fenced else line)
    prose = "\n".join(kept)
    for match in re.finditer(r"`([^`]+)`", prose):
        yield prose.count("\n", 0, match.start()) + 1, match.group(1)


@cache
def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__.py``)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


@cache
def classes() -> dict[str, list[str]]:
    """Each class custom_fit defines at a module's top level: the dotted names of its definitions."""
    found: dict[str, list[str]] = {}
    for module, path in modules().items():
        for name, node in definitions(ast.parse(path.read_text(encoding="utf-8")).body).items():
            if isinstance(node, ast.ClassDef):
                found.setdefault(name, []).append(f"{module}.{name}")
    return found


def compat_modules() -> set[str]:
    """The submodules of ``custom_fit._compat`` by their own names (``keras3``, ``common``, ...)."""
    return {name.rsplit(".", 1)[1] for name in modules() if name.startswith("custom_fit._compat.")}


def quoted_name(span: str) -> str | None:
    """The dotted name of custom_fit's code ``span`` quotes, in full (``custom_fit.``...), else ``None``."""
    match = DOTTED.fullmatch(span.strip())
    if match is None:
        return None
    name = match.group("name")
    first = name.split(".", 1)[0]
    if first == "custom_fit":
        return name
    if re.fullmatch(r"_[a-z]\w*", first):
        return f"custom_fit.{name}"
    if first in compat_modules():
        return f"custom_fit._compat.{name}"
    if first in classes():
        return name
    return None


# --------------------------------------------------------------------------
# Resolving a name
# --------------------------------------------------------------------------


def keras_of(module: str) -> str | None:
    """``"keras"`` or ``"tf_keras"``: the Keras ``module`` imports unconditionally at its top level, else ``None``."""
    tree = ast.parse(modules()[module].read_text(encoding="utf-8"))
    for node in tree.body:
        names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        for package in ("keras", "tf_keras"):
            if any(name == package or name.startswith(f"{package}.") for name in names):
                return package
    return None


def importable(module: str) -> bool:
    """Whether ``module`` may be imported here: it needs no Keras, or the one in use."""
    return keras_of(module) in (None, "tf_keras" if custom_fit.KERAS_2 else "keras")


def definitions(body: Sequence[ast.stmt]) -> dict[str, ast.AST]:
    """The names a module or class body defines (in ``if``/``try`` too, not under ``if TYPE_CHECKING``)."""
    found: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            found[node.name] = node
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found.update((target.id, node) for target in targets if isinstance(target, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            found.update(((alias.asname or alias.name).split(".")[0], node) for alias in node.names)
        elif isinstance(node, ast.If):
            checking = isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
            found.update(definitions(node.orelse if checking else [*node.body, *node.orelse]))
        elif isinstance(node, ast.Try):
            found.update(definitions([*node.body, *node.orelse, *node.finalbody]))
            for handler in node.handlers:
                found.update(definitions(handler.body))
    return found


def in_source(module: str, body: Sequence[ast.stmt], attributes: Sequence[str]) -> bool:
    """Whether ``attributes`` (one or more) are defined in ``body`` of ``module``, read from the source only.

    A class is searched with its bases defined or imported from custom_fit; an imported name is resolved in
    the module it comes from. What a function or a Keras base defines is not known: ``False``.
    """
    node = definitions(body).get(attributes[0])
    rest = attributes[1:]
    if node is None:
        return False
    if not rest:
        return True
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in modules():
        original = next(alias.name for alias in node.names if (alias.asname or alias.name) == attributes[0])
        return resolves(f"{node.module}.{original}.{'.'.join(rest)}")
    if isinstance(node, ast.ClassDef):
        if in_source(module, node.body, rest):
            return True
        bases = [base.id for base in node.bases if isinstance(base, ast.Name)]
        tree = ast.parse(modules()[module].read_text(encoding="utf-8")).body
        return any(in_source(module, tree, [base, *rest]) for base in bases)
    return False


def has_attribute(owner: object, name: str) -> bool:
    """``getattr`` succeeds, or ``owner`` is a class that declares ``name`` (annotation, dataclass field)."""
    if hasattr(owner, name):
        return True
    return isinstance(owner, type) and any(name in vars(cls).get("__annotations__", {}) for cls in owner.__mro__)


def resolves(name: str) -> bool:
    """Whether the dotted ``name`` (``custom_fit...`` or a class custom_fit defines, then attributes) exists."""
    parts = name.split(".")
    if parts[0] != "custom_fit":
        return any(resolves(".".join([definition, *parts[1:]])) for definition in classes().get(parts[0], []))
    if parts[:2] == ["custom_fit", "_compat"] and len(parts) > 3 and parts[2] in FACADE:
        return any(resolves(".".join([implementation, *parts[3:]])) for implementation in FACADE[parts[2]])
    if parts[-1] in FILE_SUFFIXES:
        stem = "/".join(parts[1:-1]) + "." + parts[-1]
        return (PACKAGE / stem).is_file() or (PACKAGE / "_compat" / stem).is_file()
    cut = max(i for i in range(1, len(parts) + 1) if ".".join(parts[:i]) in modules())
    module, attributes = ".".join(parts[:cut]), parts[cut:]
    if not attributes:
        return True
    if not importable(module):
        return in_source(module, ast.parse(modules()[module].read_text(encoding="utf-8")).body, attributes)
    owner: Any = importlib.import_module(module)
    for attribute in attributes:
        if not has_attribute(owner, attribute):
            return False
        owner = getattr(owner, attribute, None)
    return True


def unresolved(text: str, page: str = "") -> list[str]:
    """``"page:line name"`` for each name of custom_fit's code ``text`` quotes that does not resolve."""
    missing = []
    for line, span in code_spans(text):
        name = quoted_name(span)
        if name is not None and (page, span.split("(")[0]) not in EXEMPT and not resolves(name):
            missing.append(f"{page}:{line} {span.split('(')[0]}")
    return missing


def test_every_name_of_custom_fits_code_the_docs_quote_resolves() -> None:
    missing = []
    for path in PAGES:
        missing += unresolved(path.read_text(encoding="utf-8"), path.relative_to(ROOT).as_posix())
    assert missing == [], "rename these to the code's names (or add a reason to EXEMPT):\n" + "\n".join(missing)


def test_every_exemption_is_still_needed() -> None:
    stale = []
    for (page, span), reason in EXEMPT.items():
        spans = [found.split("(")[0] for _, found in code_spans((ROOT / page).read_text(encoding="utf-8"))]
        name = quoted_name(span)
        if span not in spans or name is None or resolves(name):
            stale.append(f"{page}: {span} ({reason})")
    assert stale == [], "no longer quoted, or resolves: remove from EXEMPT:\n" + "\n".join(stale)


def lookup(name: str) -> Any:
    """The object ``name`` (``custom_fit....``) is: its longest module prefix imported, the rest read."""
    parts = name.split(".")
    cut = max(i for i in range(1, len(parts) + 1) if ".".join(parts[:i]) in modules())
    found: Any = importlib.import_module(".".join(parts[:cut]))
    for attribute in parts[cut:]:
        found = getattr(found, attribute)
    return found


def test_the_facade_map_is_the_facades() -> None:
    in_use = 1 if custom_fit.KERAS_2 else 0
    for attribute, implementations in FACADE.items():
        assert getattr(_compat, attribute) is lookup(implementations[in_use]), attribute
        assert [keras_of(name.split(".TrainerHooks")[0]) for name in implementations] == ["keras", "tf_keras"]
    assert set(FACADE) <= set(_compat.__all__)


@pytest.mark.parametrize(
    ("text", "missing"),
    [
        ("Read `_compat.keras3.snapshot_weights` and `custom_fit._trainer.loop.Loop`.", []),
        ("`_compat.version.RUNS_OWN_LOOP` is gone.", [":1 _compat.version.RUNS_OWN_LOOP"]),
        ("A renamed module:\n`_loop.Loop` (was `custom_fit._loop`).", [":2 _loop.Loop", ":2 custom_fit._loop"]),
        ("`custom_fit.GAN(generator, discriminator, latent_dim)` and `CustomModel.fit(x, y)`", []),
        ("`CustomModel.no_such_method()`", [":1 CustomModel.no_such_method"]),
        ("Keras' own: `keras.Model.fit`, `Layer.build`, `model._initial_epoch`, `tf.function`.", []),
        ("```python\nx = custom_fit.no_such_name\n```\n`common.no_such_helper`", [":4 common.no_such_helper"]),
        ("Files: `internals.json`, `keras3.py`, `_host.py`; `_hosts.py`.", [":1 _hosts.py"]),
        ("Both Kerases: `_compat.keras2_loop.EpochIterator.__init__`, `keras3_only.EpochIterator`.", []),
        ("Either Keras: `_compat.version.snapshot_weights`, `TrainerHooks._get_optimizer`.", []),
        # One of each pair is read at run time, the other from the source (the other Keras' module).
        ("`_compat.keras2.TrainerHooks._updated_config`, `_compat.keras3.TrainerHooks._maybe_symbolic_build`", []),
        (
            "`_compat.keras2.no_such_function`, `_compat.keras3.no_such_function`",
            [":1 _compat.keras2.no_such_function", ":1 _compat.keras3.no_such_function"],
        ),
        ("`_compat.version.no_such_function`", [":1 _compat.version.no_such_function"]),
    ],
)
def test_the_checker_finds_names_that_do_not_resolve(text: str, missing: list[str]) -> None:
    assert unresolved(text) == missing


# --------------------------------------------------------------------------
# Counts computed from the code and from internals.json
# --------------------------------------------------------------------------


def keras3_versions() -> list[Version]:
    """The Keras 3 versions ``internals.json`` records, oldest first."""
    return sorted({Version(v) for copy in internals.copies_of("keras") for v in copy.versions()})


def minor(version: Version) -> str:
    """``3.9``, or ``3.16-dev`` for a nightly build: how the pages name a Keras 3 minor."""
    return f"{version.major}.{version.minor}" + ("-dev" if version.is_devrelease else "")


def changed_minors(copy: internals.Copy) -> list[str]:
    """The Keras 3 minors in whose upstream source ``copy``'s hash differs from the minor before."""
    versions = keras3_versions()

    def hash_of(version: Version) -> str | None:
        return next((h for h, listed in copy.hashes.items() if version in {Version(v) for v in listed}), None)

    return [minor(new) for old, new in pairwise(versions) if hash_of(old) != hash_of(new)]


def churn() -> list[int]:
    """How many Keras 3 copies changed upstream in each minor after the oldest recorded one."""
    changes = [changed_minors(copy) for copy in internals.copies_of("keras")]
    return [sum(minor(version) in changed for changed in changes) for version in keras3_versions()[1:]]


def copy_by_id(id: str) -> internals.Copy:
    return next(copy for copy in internals.COPIES if copy.id == id)


def upstream_count(package: str) -> int:
    return sum(len(copy.upstream) for copy in internals.copies_of(package))


def calls_of(function: str) -> int:
    """Calls of ``function`` (by name, or as an attribute) in the package's source."""
    count = 0
    for path in modules().values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                callee = node.func
                called = callee.attr if isinstance(callee, ast.Attribute) else getattr(callee, "id", None)
                count += called == function
    return count


def keras2_branches_outside_compat() -> int:
    """``if`` statements and expressions outside ``_compat`` whose test reads ``KERAS_2``."""
    count = 0
    for module, path in modules().items():
        if module.startswith("custom_fit._compat"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.If | ast.IfExp):
                names = {n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)}
                names |= {n.attr for n in ast.walk(node.test) if isinstance(n, ast.Attribute)}
                count += "KERAS_2" in names
    return count


def lines(paths: Sequence[Path]) -> int:
    """The lines of ``paths``, as ``wc -l`` counts them."""
    return sum(len(path.read_text(encoding="utf-8").splitlines()) for path in paths)


def compat_share() -> int:
    """``_compat``'s share of the package's lines, in whole percent."""
    every = sorted(PACKAGE.rglob("*.py"))
    return round(100 * lines([path for path in every if "_compat" in path.parts]) / lines(every))


def layout_constant(name: str) -> int:
    """An integer constant of ``tests/end_to_end/test_layout.py``, read from its source."""
    tree = ast.parse((ROOT / "tests" / "end_to_end" / "test_layout.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return int(ast.literal_eval(node.value))
    raise LookupError(name)


def custom_model_shape() -> tuple[int, int]:
    """``CustomModel``'s direct bases, and the custom_fit classes in its MRO (itself not counted)."""
    model = custom_fit.CustomModel
    ours = [cls for cls in model.__mro__[1:] if cls.__module__.startswith("custom_fit")]
    return len(model.__bases__), len(ours)


def on_this_keras(keras3: str, keras2: str) -> str:
    """The half of a ``Keras 3 / Keras 2`` pair that this run can check."""
    return keras2 if custom_fit.KERAS_2 else keras3


@dataclasses.dataclass(frozen=True)
class Quote:
    """A count a page quotes, found by a pattern around it, and the value the code gives.

    Attributes:
        page: The page, relative to the repository.
        pattern: A regular expression around the quote (whitespace as single spaces: the page's runs of
            whitespace, line breaks included, are read as one space); its groups are the values quoted.
        what: What is counted, and from where (for the failure message).
        computed: The values the groups must read, as the page writes them.
        said: What the page's groups are turned into before they are compared (default: as written).
        about: For a quote the page gives as "about N": how far off (a fraction of N) the code's count may be.
            Line counts move with every change; the page gives them rounded, and this test fails once they
            have moved further than that.
    """

    page: str
    pattern: str
    what: str
    computed: Callable[[], tuple[str, ...]]
    said: Callable[[tuple[str, ...]], tuple[str, ...]] = lambda groups: groups
    about: float = 0.0

    def agrees(self, said: tuple[str, ...], computed: tuple[str, ...]) -> bool:
        """Whether the page's values are the code's (within :attr:`about` of each number)."""
        if not self.about:
            return said == computed
        numbers = [(float(a.replace(",", "")), float(b.replace(",", ""))) for a, b in zip(said, computed, strict=True)]
        return all(abs(a - b) <= self.about * a for a, b in numbers)


def listed(text: str) -> list[str]:
    """``"1, 5 and 7"`` as ``["1", "5", "7"]``."""
    return [item for item in re.split(r",\s*|\s+and\s+", text.strip()) if item]


def as_list(values: Sequence[object]) -> str:
    """``[1, 5, 7]`` as ``"1, 5, 7"``: how the pages write a list of counts or minors."""
    return ", ".join(str(value) for value in values)


def median(values: Sequence[int]) -> str:
    middle = statistics.median(values)
    return str(int(middle)) if middle == int(middle) else str(middle)


def normalized(text: str) -> str:
    return re.sub(r"\s+", " ", text)


KI = "docs/keras_internals.md"
TESTING = "docs/testing.md"

#: Every count the pages quote from the code or from internals.json, with where the code gives it.
QUOTES = {
    "registry copies": Quote(
        KI,
        r"\| copied or patched Keras internals in the registry \|[^|]*\| (\d+) \((\d+) Keras 3, (\d+) tf_keras\) \|",
        "copies in internals.json: all, Keras 3's, tf_keras'",
        lambda: tuple(
            str(n) for n in (len(internals.COPIES), *map(len, map(internals.copies_of, ("keras", "tf_keras"))))
        ),
    ),
    "upstream functions": Quote(
        KI,
        r"\| upstream functions they watch \(Keras 3 / tf_keras\) \|[^|]*\| (\d+) \((\d+) / (\d+)\) \|",
        "upstream functions the copies of internals.json watch: all, Keras 3's, tf_keras'",
        lambda: tuple(
            str(n)
            for n in (
                upstream_count("keras") + upstream_count("tf_keras"),
                upstream_count("keras"),
                upstream_count("tf_keras"),
            )
        ),
    ),
    "churn in the table": Quote(
        KI,
        r"\| copies changed per Keras 3 minor \(median; ([\w.-]+) … ([\w.-]+)\) \|[^|]*\| ([\d.]+) \(([\d, ]+)\) \|",
        "copies of internals.json whose Keras 3 hash changed per minor: the first and last minor, the median, each",
        lambda: (minor(keras3_versions()[1]), minor(keras3_versions()[-1]), median(churn()), as_list(churn())),
    ),
    "churn's range": Quote(
        KI,
        r"upstream hash changed from one Keras 3 minor to the next, ([\w.-]+) … ([\w.-]+)\)",
        "the Keras 3 minors internals.json records: the first and the last",
        lambda: (minor(keras3_versions()[0]), minor(keras3_versions()[-1])),
    ),
    "churn in the prose": Quote(
        KI,
        r"The copies changed per Keras 3 minor \(([\d, ]+)\)",
        "copies of internals.json whose Keras 3 hash changed, per minor",
        lambda: (as_list(churn()),),
    ),
    "copies for Keras 2": Quote(
        KI,
        r"Of the (\d+) copies, (\d+) exist for Keras 2",
        "copies in internals.json: all, tf_keras'",
        lambda: (str(len(internals.COPIES)), str(len(internals.copies_of("tf_keras")))),
    ),
    "upstream functions in the prose": Quote(
        KI,
        r"\(the (\d+) upstream functions watched stay\)",
        "upstream functions the copies of internals.json watch",
        lambda: (str(upstream_count("keras") + upstream_count("tf_keras")),),
    ),
    "copies hashed at import": Quote(
        KI,
        r"\(Keras 3, (\d+) copies;",
        "Keras 3 copies in internals.json",
        lambda: (str(len(internals.copies_of("keras"))),),
    ),
    "recorded releases": Quote(
        KI,
        r"the hashes of all (\d+) recorded releases",
        "Keras and tf_keras versions internals.json records",
        lambda: (str(len({v for copy in internals.COPIES for v in copy.versions()})),),
    ),
    "the loop's churn": Quote(
        KI,
        r"`k3-loop` changes when `fit` or the epoch iterator does \(([^)]*)\)",
        "the Keras 3 minors in which k3-loop's upstream hash changed",
        lambda: (as_list(changed_minors(copy_by_id("k3-loop"))),),
        lambda groups: (as_list(listed(groups[0])),),
    ),
    "the loop's share of the churn": Quote(
        KI,
        r"the loop \((\d+) of (\d+) minors\)",
        "the Keras 3 minors in which k3-loop's upstream hash changed, of all",
        lambda: (str(len(changed_minors(copy_by_id("k3-loop")))), str(len(keras3_versions()) - 1)),
    ),
    "the progress bar's churn": Quote(
        KI,
        r"`k3-progbar` \(upstream changed in (\d+) of (\d+) minors\)",
        "the Keras 3 minors in which k3-progbar's upstream hash changed, of all",
        lambda: (str(len(changed_minors(copy_by_id("k3-progbar")))), str(len(keras3_versions()) - 1)),
    ),
    "the copies added since 7a9ee83": Quote(
        KI,
        r"\(`k3-loss-scale-apply`, changed upstream in ([^)]*)\), the step's returned values "
        r"\(`k3-metrics-result-or-logs`, changed upstream in ([^)]*)\) and the backups' workaround of Keras' "
        r"saving cache \(`k3-saving-skipsets`, changed upstream in ([^)]*)\)",
        "the Keras 3 minors in which these copies' upstream hashes changed",
        lambda: tuple(
            as_list(changed_minors(copy_by_id(id)) or ["none"])
            for id in ("k3-loss-scale-apply", "k3-metrics-result-or-logs", "k3-saving-skipsets")
        ),
        lambda groups: tuple(as_list(listed(group)) for group in groups),
    ),
    "set_untracked calls": Quote(
        KI,
        r"\| `set_untracked` calls \|[^|]*\| (\d+) \(",
        "calls of _compat.common.set_untracked in custom_fit/",
        lambda: (str(calls_of("set_untracked")),),
    ),
    "bases of CustomModel": Quote(
        KI,
        r"\| direct bases of `CustomModel` \(Keras 3 / Keras 2; [^|]*\) \|[^|]*\| (\d+) / (\d+):",
        "len(CustomModel.__bases__) on this Keras (the other Keras' half is checked on its run)",
        lambda: (str(custom_model_shape()[0]),),
        lambda groups: (on_this_keras(*groups),),
    ),
    "custom_fit classes in the MRO": Quote(
        KI,
        r"\| custom_fit classes in `CustomModel`'s method resolution order \(Keras 3 / Keras 2\) \|[^|]*\| "
        r"(\d+) / (\d+) \|",
        "custom_fit classes in CustomModel.__mro__, less CustomModel, on this Keras (the other on its run)",
        lambda: (str(custom_model_shape()[1]),),
        lambda groups: (on_this_keras(*groups),),
    ),
    "KERAS_2 branches": Quote(
        KI,
        r"\| `KERAS_2` branches outside `_compat` \|[^|]*\| (\d+) \(",
        "if statements and expressions outside custom_fit/_compat whose test reads KERAS_2",
        lambda: (str(keras2_branches_outside_compat()),),
    ),
    "public modules": Quote(
        KI,
        r"\| implementation modules public by name \|[^|]*\| \d+ \(public: ([^)]*)\) \|",
        "the modules of custom_fit/ whose names do not start with _",
        lambda: (as_list(sorted(f"`{p.stem}`" for p in PACKAGE.glob("*.py") if not p.stem.startswith("_"))),),
        lambda groups: (as_list(sorted(listed(groups[0]))),),
    ),
    "_compat's share": Quote(
        KI,
        r"\| `_compat` share of the package's lines \|[^|]*\| about (\d+)% of [^|]* \|",
        "lines of custom_fit/_compat/*.py in those of custom_fit/**/*.py, in whole percent; 3% off allowed",
        lambda: (str(compat_share()),),
        about=0.03,
    ),
    "_compat's names": Quote(
        TESTING,
        r"\| names `_compat/__init__.py` re-exports by assignment \(`__all__`\) \|[^|]*\| \d+ \((\d+): ([^;]*); "
        r"`tests/end_to_end/test_layout.py` allows (\d+)\) \|",
        "custom_fit._compat.__all__: how many, which; test_layout.MAX_COMPAT_NAMES",
        lambda: (
            str(len(_compat.__all__)),
            as_list(sorted(f"`{name}`" for name in _compat.__all__)),
            str(layout_constant("MAX_COMPAT_NAMES")),
        ),
        lambda groups: (groups[0], as_list(sorted(listed(groups[1]))), groups[2]),
    ),
    "the trainer package": Quote(
        TESTING,
        r"the package `_trainer` \([^)]*: (\d+) modules, about ([\d,]+) lines incl. docstrings\)",
        "modules of custom_fit/_trainer/ (less __init__.py), and the lines (wc -l) of its files; 10% off allowed",
        lambda: (
            str(len([p for p in (PACKAGE / "_trainer").glob("*.py") if p.stem != "__init__"])),
            str(lines(sorted((PACKAGE / "_trainer").glob("*.py")))),
        ),
        about=0.1,
    ),
    "each Keras' loop pieces": Quote(
        TESTING,
        r"\(`_compat/keras3_only`, about ([\d,]+) lines, of which the pieces are about half; "
        r"`_compat/keras2_loop`, about ([\d,]+)\)",
        "lines (wc -l) of custom_fit/_compat/keras3_only.py and keras2_loop.py; 10% off allowed",
        lambda: tuple(str(lines([PACKAGE / "_compat" / f"{name}.py"])) for name in ("keras3_only", "keras2_loop")),
        about=0.1,
    ),
}


def disagreement(quote: Quote, text: str) -> str | None:
    """What is wrong with ``quote`` in the page's ``text``; ``None`` when the page says what the code gives."""
    found = re.findall(quote.pattern, normalized(text))
    if len(found) != 1:
        return (
            f"{quote.page}: the pattern of this quote matches {len(found)} times (once expected); if the sentence "
            f"was reworded, update the pattern in tests/end_to_end/test_docs_names.py: {quote.pattern}"
        )
    groups = tuple(found[0]) if isinstance(found[0], tuple) else (found[0],)
    said, computed = quote.said(groups), quote.computed()
    if quote.agrees(said, computed):
        return None
    return (
        f"{quote.page} says {', '.join(said)} ({quote.what}); the code gives {', '.join(computed)}. "
        f"Fix the number in {quote.page} (the pattern: {quote.pattern})"
    )


@pytest.mark.parametrize("name", sorted(QUOTES))
def test_the_counts_the_docs_quote_are_the_codes(name: str) -> None:
    quote = QUOTES[name]
    problem = disagreement(quote, (ROOT / quote.page).read_text(encoding="utf-8"))
    assert problem is None, problem


@pytest.mark.parametrize(
    ("text", "wrong"),
    [
        ("Of the 67 copies,\n29 exist for Keras 2", False),
        ("Of the 64 copies, 29 exist for Keras 2", True),
        ("Of the 67 copies, 28 exist for Keras 2", True),
        ("Of 67 copies, 29 are Keras 2's", True),  # the pattern no longer matches: a reworded sentence
    ],
)
def test_the_checker_finds_a_count_the_code_does_not_give(text: str, wrong: bool) -> None:
    problem = disagreement(QUOTES["copies for Keras 2"], text)
    assert (problem is not None) == wrong, problem
