"""The package's shape, as DESIGN.md fixes it: no import circle, no frame inspection, no ``threading.local``,
one place that creates optimizer state; and tests/ mirrors the package (a test module per module).

Checked on the source (``ast``), so a change that brings one back fails here
with the module and line, whichever Keras runs.
"""

from __future__ import annotations

import ast
import itertools
import re
from pathlib import Path

import custom_fit

PACKAGE = Path(custom_fit.__file__).parent
ROOT = PACKAGE.parent


def _modules() -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its own name)."""
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = ("custom_fit", *path.relative_to(PACKAGE).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports anywhere (inside functions and ``TYPE_CHECKING`` too)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parents = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parents, base] if base else parents)
            found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m in modules and m != name}


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in sorted(edges[module]):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = stack[stack.index(module) :]
            del stack[stack.index(module) :]
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return circles


def test_no_import_circle_typing_only_imports_included() -> None:
    modules = _modules()
    edges = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert _circles(edges) == []


def test_the_checker_finds_a_circle() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_frame_inspection_and_no_thread_locals() -> None:
    """State travels as arguments and objects the loop owns, not through stacks or threads."""
    banned = {("sys", "_getframe"), ("sys", "_current_frames"), ("inspect", "stack"), ("inspect", "currentframe")}
    banned |= {("threading", "local")}
    found = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute):
                owner = node.value.id if isinstance(node.value, ast.Name) else None
                if node.attr == "f_back" or (owner, node.attr) in banned:
                    found.append(f"{name}:{node.lineno} {owner}.{node.attr}")
    assert found == []


#: The most names ``custom_fit._compat`` may define besides its submodules (the issue's bound).
MAX_COMPAT_NAMES = 15


def _compat_submodules() -> set[str]:
    return {name.rsplit(".", 1)[1] for name in _modules() if name.startswith("custom_fit._compat.")}


def test_compat_facade_is_small() -> None:
    """``custom_fit._compat`` picks the version module and hands it out as ``version``: few names besides.

    A Keras-dependent function or flag belongs to the contract (``version.X``) or to a submodule, so
    that adding one takes the contract and the two version modules, not a re-export here too.
    """
    from custom_fit import _compat

    submodules = _compat_submodules()
    public = {name for name in vars(_compat) if not name.startswith("_") and name not in submodules}
    assert public == set(_compat.__all__)
    assert len(_compat.__all__) <= MAX_COMPAT_NAMES, sorted(_compat.__all__)


def test_compat_names_used_elsewhere_are_declared() -> None:
    """Outside ``_compat`` (the package and the tests), ``_compat.X`` and ``from custom_fit._compat import X``
    name a declared name or a submodule."""
    from custom_fit import _compat

    allowed = {*_compat.__all__, *_compat_submodules(), "__all__"}
    paths = [p for n, p in _modules().items() if not n.startswith("custom_fit._compat")]
    paths += sorted(Path(__file__).parents[1].rglob("*.py"))
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "custom_fit._compat":
                found += [f"{path.name}:{node.lineno} {a.name}" for a in node.names if a.name not in allowed]
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "_compat":
                found += [f"{path.name}:{node.lineno} _compat.{node.attr}"] if node.attr not in allowed else []
    assert found == []


def _declaration_only(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A body of ``...`` (after a docstring): a type declaration (``_host.ModelHost``), not a definition."""
    body = [s for s in node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    return not body and isinstance(node.body[-1].value, ast.Constant) and node.body[-1].value.value is ...  # type: ignore[attr-defined]


def test_private_names_outside_compat_are_custom_fits_own() -> None:
    """Outside ``_compat``, every ``obj._name`` read (or ``_name=`` keyword) is a name custom_fit defines there.

    Defined: a function or class, an attribute assigned (``self._x = ...``), or named by
    ``setattr``/``set_untracked(obj, "_x", ...)`` in those modules; a declaration for type checkers
    (``_host.ModelHost``) is not a definition. Keras' private names are read in ``custom_fit._compat``
    (``keras3_only``, the version modules' ``TrainerHooks``) and nowhere else.
    """
    outside = [path for name, path in _modules().items() if not name.startswith("custom_fit._compat")]
    defined: set[str] = set()
    read: list[str] = []
    for path in outside:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) or (
                isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not _declaration_only(node)
            ):
                defined.add(node.name)
            elif isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] in ("setattr", "set_untracked"):
                defined.update(str(a.value) for a in node.args[1:2] if isinstance(a, ast.Constant))
            elif isinstance(node, ast.keyword) and (node.arg or "").startswith("_"):
                read.append(f"{path.name}:{node.value.lineno} {node.arg}=")
            elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                if isinstance(node.ctx, ast.Store):
                    defined.add(node.attr)
                else:
                    read.append(f"{path.name}:{node.lineno} .{node.attr}")
    assert [entry for entry in read if entry.split(" ")[1].strip(".=") not in defined] == []


def _calls_by_function(path: Path, names: set[str]) -> list[tuple[str, int]]:
    """``(enclosing function, line)`` of each call in ``path`` to a function or method named in ``names``."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else function
            if isinstance(child, ast.Call):
                func = child.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
                if called in names:
                    found.append((inner, child.lineno))
            visit(child, inner)

    visit(ast.parse(path.read_text()), "<module>")
    return found


def test_one_place_creates_optimizer_state() -> None:
    """Only ``_optimizers.ensure_state`` builds an optimizer or a named group's member (callers go through it)."""
    builders = {"build_optimizer", "build_member", "_assign_member"}
    found = {
        f"{name}.{function}" for name, path in _modules().items() for function, _ in _calls_by_function(path, builders)
    }
    assert found == {"custom_fit._optimizers.ensure_state"}


# The Keras and TensorFlow objects custom_fit changes while a step is traced (a method or attribute put
# on the instance, then taken away), each with its measured reason next to it in the code. Issue
# 50 asked for none; these are what could not go. tf_keras' gradient sum, swapped here before, now
# takes tf_keras' own argument (``keras2_accumulation._without_second_sum``).
TRACE_TIME_SWAPS = {
    # Keras 3 sums in TFOptimizer._all_reduce_sum_gradients with no argument to skip it (3.8 to 3.16-dev);
    # the way without a swap (the sum divided by N, summed again) was measured: twice the all-reduced values,
    # inexact for 3 replicas (benchmarks/summed_gradients.py).
    "custom_fit._compat.keras3._gradients_already_summed",
    # tf_keras' LossScaleOptimizer calls its inner optimizer's apply_gradients from its own cross-replica
    # branch; the alternatives are a copy of that branch (its loss-scale state, _UnwrapPreventer) or
    # accumulating above it, measured: the loss scale sees 3 steps of 12, and a non-finite step throws
    # away the finite ones accumulated with it (benchmarks/trace_time_swaps.py).
    "custom_fit._compat.keras2_accumulation._accumulating_below",
    # The warning for a step that never computes the weight penalties: Keras computes one only by
    # calling the regularizer (Keras 2: a layer's closure) when `losses` is read, and records nothing.
    # Measured: Keras 3 names none of a penalty's graph ops for it, and run eagerly there is no graph.
    "custom_fit._compat.keras3.counting_regularizer_calls",
    "custom_fit._compat.keras2.counting_regularizer_calls",
    # An accumulating update in cross-replica context: Keras' maybe_merge_call asks the strategy's
    # _use_merge_call, which has no public switch (TensorFlow sets it so for XLA on GPUs). Measured:
    # without it the update fails in cross-replica context and back in the replicas alike.
    "custom_fit._compat.common.in_one_merge_call",
}


SWAPPER = "shared_while_inside"  # custom_fit._compat.common's installer of a change for the time of a trace


def _trace_time_swaps(name: str, path: Path) -> set[str]:
    """``name.X`` for ``X = shared_while_inside(...)``, and ``name.f`` for a module-level function that deletes
    an attribute of an object other than ``self`` (putting a method back), or a class' method that does."""
    found: set[str] = set()
    tree = ast.parse(path.read_text())
    for node in tree.body:
        value = getattr(node, "value", None)
        if isinstance(node, ast.Assign) and isinstance(value, ast.Call) and ast.unparse(value.func).endswith(SWAPPER):
            found.update(f"{name}.{ast.unparse(target)}" for target in node.targets)
    kinds = ast.FunctionDef | ast.AsyncFunctionDef
    functions = [(f"{name}.{f.name}", f) for f in tree.body if isinstance(f, kinds)]
    functions += [
        (f"{name}.{c.name}.{f.name}", f)
        for c in tree.body
        if isinstance(c, ast.ClassDef)
        for f in c.body
        if isinstance(f, kinds)
    ]
    for qualified, function in functions:  # a module's function or a class' method, nested functions included
        deletions = [n for n in ast.walk(function) if isinstance(n, ast.Delete)]
        if any(isinstance(t, ast.Attribute) and ast.unparse(t.value) != "self" for d in deletions for t in d.targets):
            found.add(qualified)
    return found


def test_keras_objects_are_changed_while_a_step_is_traced_only_where_listed() -> None:
    found = set().union(*(_trace_time_swaps(name, path) for name, path in _modules().items()))
    assert found == TRACE_TIME_SWAPS


def _reason(name: str, path: Path) -> str:
    """The ``#:`` comment block above ``X = ...``, or the docstring of ``def X``: where a swap's reason is written."""
    attribute = name.rsplit(".", 1)[1]
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == attribute:
            return ast.get_docstring(node) or ""
        if isinstance(node, ast.Assign) and any(ast.unparse(t) == attribute for t in node.targets):
            lines = path.read_text().splitlines()[: node.lineno - 1]
            block = list(itertools.takewhile(lambda line: line.startswith("#:"), reversed(lines)))
            return "\n".join(reversed(block))
    return ""


def test_each_swap_kept_cites_the_measurement_of_the_way_without_it() -> None:
    """Issue 50: a swap that could not go has its measured reason next to it, from a script in benchmarks/."""
    modules = _modules()
    for name in sorted(TRACE_TIME_SWAPS):
        reason = _reason(name, modules[name.rsplit(".", 1)[0]])
        scripts = re.findall(r"benchmarks/(\w+\.py)", reason)
        assert scripts, f"{name}: its reason cites no measurement (benchmarks/<script>.py): {reason!r}"
        assert all((ROOT / "benchmarks" / script).exists() for script in scripts), (name, scripts)


def test_the_swap_finder_finds_both_forms(tmp_path: Path) -> None:
    source = tmp_path / "module.py"
    source.write_text(
        "swapped = shared_while_inside(install, uninstall)\n"
        "def f(strategy):\n    def inner():\n        del strategy.x\n    strategy.x = 1\n    inner()\n"
        "def g(self):\n    del self._own\n"
        "class C:\n    def h(self, optimizer):\n        del optimizer.apply\n"
    )
    assert _trace_time_swaps("m", source) == {"m.swapped", "m.f", "m.C.h"}


def test_the_call_finder_names_the_enclosing_function(tmp_path: Path) -> None:
    source = tmp_path / "module.py"
    source.write_text("def f(o):\n    g(o.build_optimizer(1))\n\nclass C:\n    def m(self):\n        build_member()\n")
    assert _calls_by_function(source, {"build_optimizer", "build_member"}) == [("f", 2), ("m", 6)]


# --------------------------------------------------------------------------
# tests/ mirrors the package
# --------------------------------------------------------------------------

TESTS = Path(__file__).parents[1]

#: Modules with no test module of their own, each with the reason.
EXEMPT = {
    "custom_fit/_host.py": "a declaration for type checkers (``object`` at run time): mypy checks it, nothing runs",
    "custom_fit/_trainer/__init__.py": "a docstring (the trainer's map of its modules): no code",
}

#: Package ``__init__``s tested under another name.
PACKAGE_TESTS = {
    "custom_fit/__init__.py": "tests/test_public_api.py",
    "custom_fit/_compat/__init__.py": "tests/compat/test_facade.py",
}

#: The package's subpackages and the folder of tests/ that mirrors each.
SUBPACKAGES = {"_trainer": "trainer", "_compat": "compat"}

#: The suites that test across modules: parity with Keras, distributed runs, docs, examples
#: (``end_to_end``), and the tools around Keras, with their real packages (``integrations``,
#: ``make test-integrations``).
END_TO_END = ("end_to_end", "integrations")


def mirror(module: str) -> str | None:
    """The test module of ``custom_fit/...py`` (a path from the repository's root), ``None`` for a package's own.

    ``custom_fit/<name>.py`` and ``custom_fit/_<name>.py``: ``tests/test_<name>.py``;
    ``custom_fit/_trainer/<name>.py``: ``tests/trainer/test_<name>.py``; ``custom_fit/_compat/<name>.py``:
    ``tests/compat/test_<name>.py``.
    """
    *packages, file = Path(module).parts[1:]
    if file == "__init__.py":
        return PACKAGE_TESTS.get(module)
    folders = [SUBPACKAGES[package] for package in packages]
    return Path("tests", *folders, "test_" + file.removeprefix("_")).as_posix()


def _package_modules() -> list[str]:
    return sorted(path.relative_to(PACKAGE.parent).as_posix() for path in PACKAGE.rglob("*.py"))


def _has_test_module(module: str) -> bool:
    test_module = mirror(module)
    return test_module is not None and (PACKAGE.parent / test_module).is_file()


def test_every_module_has_its_test_module_or_a_reason_why_not() -> None:
    missing = [
        f"{module}: expected {mirror(module)}"
        for module in _package_modules()
        if module not in EXEMPT and not _has_test_module(module)
    ]
    assert missing == [], "a module without a test module: add it, or an EXEMPT entry with the reason"


def test_every_test_module_mirrors_a_module_or_is_end_to_end() -> None:
    """A test module left behind by a module's rename or removal fails here, as one no module maps to."""
    mirrors = {mirror(module) for module in _package_modules()} - {None}
    stray = [
        path.as_posix()
        for path in sorted(p.relative_to(PACKAGE.parent) for p in TESTS.rglob("test_*.py"))
        if path.as_posix() not in mirrors and path.parts[1] not in END_TO_END
    ]
    assert stray == [], f"test modules that mirror no module: move them to tests/{END_TO_END[0]}/ or rename them"


def test_exemptions_name_modules_that_exist_and_have_no_test_module() -> None:
    modules = set(_package_modules())
    assert [m for m in [*EXEMPT, *PACKAGE_TESTS] if m not in modules] == []
    assert [m for m in EXEMPT if _has_test_module(m)] == [], "exempt, yet it has a test module: drop the entry"
    assert all(reason.strip() for reason in EXEMPT.values())


def test_the_mirror_gives_each_module_its_own_test_module() -> None:
    modules = _package_modules()
    mirrors = [mirror(module) for module in modules if mirror(module)]
    assert len(mirrors) == len(set(mirrors)), "two modules map to one test module (e.g. x.py and _x.py)"
    assert mirror("custom_fit/_backup_store.py") == "tests/test_backup_store.py"
    assert mirror("custom_fit/gan.py") == "tests/test_gan.py"
    assert mirror("custom_fit/_trainer/step_fusion.py") == "tests/trainer/test_step_fusion.py"
    assert mirror("custom_fit/_compat/keras2_loop.py") == "tests/compat/test_keras2_loop.py"
    assert mirror("custom_fit/_trainer/__init__.py") is None
