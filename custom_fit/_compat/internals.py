"""Tripwires on the Keras internals custom_fit copies, rewrites, replaces or wraps.

custom_fit reaches into Keras where the public API cannot do what it needs
(docs/keras_internals.md says what each copy changes and why). When Keras
changes one of those functions, nothing fails loudly: a copy keeps the old
logic and parity with ``keras.Model`` drifts. :data:`COPIES` names each copy
and the upstream functions it was made from or depends on; for every
supported Keras and tf_keras version, the reviewed hash of those functions'
source. Both live in ``internals.json`` (package data). ``tests/compat/test_internals.py``
hashes the installed source and compares; ``compat/keras_internals.py``
prints the hashes of an installed (or unpacked) Keras and records them.
:func:`check_installed` does the same at import on a Keras version the data
does not list, so that a release newer than custom_fit says what changed.

The hash is of the function's syntax tree, not its text (see
:func:`normalized_source`): reformatting, comments and docstrings do not
change it; any change to the code does.

This module reads source files only (it imports neither Keras nor
TensorFlow), so the maintainer script can hash a wheel unpacked anywhere.

Nothing in this module is public API.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import importlib.util
import json
import re
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path

__all__ = [
    "ABSENT",
    "COPIES",
    "DATA_FILE",
    "OPTIONAL",
    "Copy",
    "UnreviewedKerasWarning",
    "Verdict",
    "check",
    "check_installed",
    "copies_of",
    "installed_root",
    "load",
    "missing_upstream",
    "normalized_source",
    "source_hash",
    "unlisted",
    "upstream_hash",
    "version_of",
]

#: The recorded "hash" of functions none of whose names exist in a version.
ABSENT = "absent"

#: The prefix of an upstream function custom_fit watches but does not need.
OPTIONAL = "?"

#: Files that hold each package's version string (``__version__ = "..."``).
_VERSION_FILES = {"keras": "keras/src/version.py", "tf_keras": "tf_keras/__init__.py"}


@dataclasses.dataclass(frozen=True)
class Copy:
    """custom_fit code that copies, rewrites, replaces or wraps Keras internals, and what it was made from.

    Attributes:
        id: A short stable name, e.g. ``"k3-make-function"``; the key of the recorded hashes.
        copies: The custom_fit functions, methods or classes (dotted names) made from the upstream code.
        package: ``"keras"`` (Keras 3) or ``"tf_keras"`` (Keras 2).
        upstream: The upstream functions, hashed together in this order. Each
            is ``"module:Qualified.name"``; ``|`` separates names it had in
            other versions (``"module:Old.name|New.name"``, or
            ``"|other.module:Name"``), the first one found is used. A leading
            ``?`` marks a function custom_fit does not need but watches (one
            Keras may add); every other one must exist.
        hashes: ``{hash: versions}``: the versions whose upstream functions
            hash to ``hash``, each reviewed against the copy.
    """

    id: str
    copies: tuple[str, ...]
    package: str
    upstream: tuple[str, ...]
    hashes: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)

    def upstream_names(self) -> list[str]:
        """Each upstream function as ``module:qualname`` (its first spelling), for messages."""
        return [spec.removeprefix(OPTIONAL).split("|")[0] for spec in self.upstream]

    def versions(self) -> set[str]:
        """The versions whose hashes are recorded."""
        return {version for versions in self.hashes.values() for version in versions}


#: The registry: ``{id: {"package", "upstream", "copies", "hashes"}}`` (package data, written
#: by ``compat/keras_internals.py --record``; docs/keras_internals.md describes each copy).
DATA_FILE = Path(__file__).with_name("internals.json")


def load(path: Path = DATA_FILE) -> tuple[Copy, ...]:
    """Every copy of Keras internals in custom_fit, with its reviewed hashes, read from ``path``."""
    entries = json.loads(path.read_text(encoding="utf-8"))
    return tuple(
        Copy(
            id,
            tuple(entry["copies"]),
            entry["package"],
            tuple(entry["upstream"]),
            {hash_: tuple(versions) for hash_, versions in entry["hashes"].items()},
        )
        for id, entry in entries.items()
    )


#: Every copy of Keras internals in custom_fit (tests/compat/test_internals.py checks the list).
COPIES: tuple[Copy, ...] = load()


def copies_of(package: str) -> list[Copy]:
    """The copies made from ``package`` (``"keras"`` or ``"tf_keras"``)."""
    return [copy for copy in COPIES if copy.package == package]


# --------------------------------------------------------------------------
# Hashing
# --------------------------------------------------------------------------


def _without_docstring(body: list[ast.stmt]) -> list[ast.stmt]:
    first = body[0] if body else None
    is_docstring = (
        isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)
    )
    return body[1:] if is_docstring else body


def _dump(node: object) -> str:
    """A syntax tree as text, the same on Python 3.11 to 3.13 (empty fields and positions left out)."""
    if isinstance(node, ast.AST):
        fields = []
        for name, value in ast.iter_fields(node):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and name == "body":
                value = _without_docstring(value)
            if value is None or value == [] or name == "type_comment":
                continue  # fields newer Pythons add empty (type_params), or that hold no code
            fields.append(f"{name}={_dump(value)}")
        return f"{type(node).__name__}({', '.join(fields)})"
    if isinstance(node, list):
        return "[" + ", ".join(_dump(item) for item in node) + "]"
    return repr(node)


def _find(tree: ast.Module, qualname: str) -> list[ast.AST]:
    """The definitions named ``qualname`` (a property's getter and setter are two), in source order."""
    scope: list[ast.stmt] = tree.body
    *owners, name = qualname.split(".")
    for owner in owners:
        classes = [n for n in scope if isinstance(n, ast.ClassDef) and n.name == owner]
        if not classes:
            return []
        scope = classes[-1].body
    definitions = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return [n for n in scope if isinstance(n, definitions) and n.name == name]


def normalized_source(source: str | ast.Module, qualname: str) -> str | None:
    """The normalized syntax tree of ``qualname``'s definitions in ``source``, or ``None`` if absent.

    Normalized: the tree without positions (line numbers, columns),
    docstrings, comments or formatting, and without the empty fields newer
    Pythons add, so that it is the same text on every supported Python.
    A change to the code (a statement, a name, a default, a decorator)
    changes it; a reformatting, a comment or a docstring does not.

    Example:
        >>> a = normalized_source("def f(x):\\n    '''Doc.'''\\n    return x + 1  # one\\n", "f")
        >>> b = normalized_source("def f(x):   return (x +\\n  1)\\n", "f")
        >>> a == b, a == normalized_source("def f(x):\\n    return x + 2\\n", "f")
        (True, False)
    """
    tree = ast.parse(source) if isinstance(source, str) else source
    nodes = _find(tree, qualname)
    return "\n".join(_dump(node) for node in nodes) if nodes else None


def source_hash(normalized: Iterable[str | None]) -> str:
    """A short hash of normalized sources (``None``: absent); :data:`ABSENT` when all are absent."""
    parts = list(normalized)
    if all(part is None for part in parts):
        return ABSENT
    text = "\n\n".join(ABSENT if part is None else part for part in parts)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@functools.cache
def _parsed(file: Path) -> ast.Module | None:
    """The syntax tree of a source file, parsed once (copies share files), or ``None`` if absent."""
    return ast.parse(file.read_text(encoding="utf-8")) if file.is_file() else None


@functools.cache  # missing_upstream and upstream_hash read the same functions
def _resolve(spec: str, root: Path) -> str | None:
    """The normalized source of the first spelling of ``spec`` found under ``root``."""
    spec = spec.removeprefix(OPTIONAL)
    module = spec.split(":", 1)[0]
    for alternative in spec.split("|"):
        if ":" in alternative:
            module, qualname = alternative.split(":", 1)
        else:
            qualname = alternative
        path = root / Path(*module.split("."))
        tree = _parsed(path / "__init__.py" if path.is_dir() else path.with_suffix(".py"))
        found = None if tree is None else normalized_source(tree, qualname)
        if found is not None:
            return found
    return None


def upstream_hash(copy: Copy, root: Path) -> str:
    """The hash of ``copy``'s upstream functions in the sources under ``root``.

    ``root`` is the directory that contains the ``keras`` or ``tf_keras``
    package (site-packages, an unpacked wheel, a git checkout).
    """
    return source_hash(_resolve(spec, root) for spec in copy.upstream)


def missing_upstream(copy: Copy, root: Path) -> list[str]:
    """The upstream functions ``copy`` needs that the sources under ``root`` do not define."""
    return [
        name
        for spec, name in zip(copy.upstream, copy.upstream_names(), strict=True)
        if not spec.startswith(OPTIONAL) and _resolve(spec, root) is None
    ]


def installed_root(package: str) -> Path | None:
    """The directory that contains the installed ``package`` (without importing it), or ``None``."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).parent


def version_of(package: str, root: Path) -> str:
    """``package``'s version string as written in its sources under ``root``."""
    text = (root / _VERSION_FILES[package]).read_text(encoding="utf-8")
    found = re.search(r"""^__version__\s*=\s*["']([^"']+)["']""", text, re.MULTILINE)
    if found is None:
        raise ValueError(f"no __version__ in {root / _VERSION_FILES[package]}")
    return found.group(1)


# --------------------------------------------------------------------------
# Verdicts
# --------------------------------------------------------------------------


_RELEASE = 2  # the stage of a final release, after its dev and rc builds


def _release_key(version: str) -> tuple[tuple[int, ...], int, int]:
    """Orders versions as pip does for the ones Keras publishes (``3.16.0.dev2026102704`` < ``3.16.0``)."""
    found = re.match(r"(\d+(?:\.\d+)*)(?:\.?(dev|rc)(\d+))?", version)
    if found is None:
        raise ValueError(f"cannot order the version {version!r}")
    release = tuple(int(part) for part in found.group(1).split("."))
    stage = {"dev": 0, "rc": 1, None: _RELEASE}[found.group(2)]
    return release, stage, int(found.group(3) or 0)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What the tripwire of one copy says about one installed version.

    Attributes:
        ok: Whether the installed upstream source is one the copy was reviewed against.
        message: Why not (names the copy, the upstream functions and how to
            record the hash after re-checking); empty when ``ok``.
        reviewed_as: The recorded version whose hash it was compared with (``None``: none).
        copy: The copy it is about.
    """

    ok: bool
    copy: Copy
    message: str = ""
    reviewed_as: str | None = None


def check(copy: Copy, version: str, found: str, recorded: Mapping[str, Iterable[str]]) -> Verdict:
    """Compares the hash ``found`` in ``version`` with ``recorded`` (``{hash: versions}``) for ``copy``.

    A recorded version must have its recorded hash. A version not recorded
    (a new release or nightly) passes only if its hash equals the one
    recorded for the nearest older recorded version: the functions did not
    change since a version the copy was reviewed against. A function that
    changed fails until someone re-checks the copy and records the hash.
    """
    by_version = {v: h for h, versions in recorded.items() for v in versions}
    expected: str | None
    reviewed_as: str | None
    if version in by_version:
        expected, reviewed_as = by_version[version], version
    else:
        older = [v for v in by_version if _release_key(v) < _release_key(version)]
        reviewed_as = max(older, key=_release_key) if older else None
        expected = by_version[reviewed_as] if reviewed_as else None
    if found == expected:
        return Verdict(True, copy, reviewed_as=reviewed_as)
    upstream = ", ".join(copy.upstream_names())
    if expected is None:
        seen = f"no hash is recorded for {copy.package} {version} or any older version"
    elif reviewed_as == version:
        seen = f"the recorded hash for {copy.package} {version} is {expected}"
    else:
        seen = (
            f"{copy.package} {version} has no recorded hash, and the nearest older "
            f"reviewed version, {reviewed_as}, had {expected}"
        )
    return Verdict(
        False,
        copy,
        f"Keras internal changed: {', '.join(copy.copies)} [{copy.id}] was made from {upstream}. "
        f"Its source in the installed {copy.package} {version} hashes to {found}, but {seen}. "
        f"Fix: re-check the copy against the new upstream source (docs/keras_internals.md "
        f"says what it changes and why), then record the reviewed hashes of this version "
        f"with `python compat/keras_internals.py --record`.",
        reviewed_as,
    )


# --------------------------------------------------------------------------
# The check at import
# --------------------------------------------------------------------------


class UnreviewedKerasWarning(UserWarning):
    """The installed Keras changed internals custom_fit copies, and no one has reviewed the copies against it.

    Given once, at ``import custom_fit``, on a Keras or tf_keras version that CI has not tested and
    whose source differs from the newest reviewed one in a function custom_fit copies. The message
    names each copy and its upstream functions. Training still runs; where those copies are used it
    may differ from ``keras.Model``. To silence it (after checking), filter it before the import::

        import warnings
        warnings.filterwarnings("ignore", message="custom_fit has not been reviewed against")
        import custom_fit
    """


def unlisted(copies: Iterable[Copy], version: str) -> bool:
    """Whether some copy has no hash recorded for ``version`` (a release newer than the data)."""
    return any(version not in copy.versions() for copy in copies)


@functools.cache
def check_installed(package: str, root: Path | None = None) -> tuple[Verdict, ...]:
    """Checks, at most once per process, the copies made from the installed ``package``.

    On a version the data lists (every version CI tests), this reads one
    version string and returns: nothing is hashed. On any other version it
    hashes the upstream functions from the installed source (about 0.1 s)
    and compares them with the nearest older reviewed version (:func:`check`).

    Args:
        package: ``"keras"`` or ``"tf_keras"``, the Keras that runs.
        root: The directory that holds the package (default: where it is installed).

    Returns:
        The verdicts of the copies whose upstream source changed (empty: none).

    Warns:
        UnreviewedKerasWarning: Once, naming each changed copy and what to do.

    Raises:
        ImportError: A function custom_fit needs is gone from the installed version.
    """
    root = root or installed_root(package)
    if root is None:
        raise ImportError(f"custom_fit needs {package}, which is not installed: pip install {package}")
    version = version_of(package, root)
    copies = copies_of(package)
    if not unlisted(copies, version):
        return ()
    releases = {v for copy in copies for v in copy.versions() if _release_key(v)[1] == _RELEASE}
    reviewed = max(releases, key=_release_key)
    missing = [f"{name} ({copy.id})" for copy in copies for name in missing_upstream(copy, root)]
    if missing:
        raise ImportError(
            f"custom_fit cannot run on {package} {version}: it needs Keras functions this "
            f"version no longer defines: {', '.join(missing)}. Expected them as in {package} "
            f"{reviewed}, the newest release custom_fit was reviewed against. Fix: install that "
            f'version (pip install "{package}=={reviewed}") or a custom_fit release that supports {version}.'
        )
    changed = tuple(
        verdict for copy in copies if not (verdict := check(copy, version, upstream_hash(copy, root), copy.hashes)).ok
    )
    if changed:
        names = "".join(
            f"\n  - {', '.join(copy.copies)} [{copy.id}], made from {', '.join(copy.upstream_names())}"
            for copy in (verdict.copy for verdict in changed)
        )
        warnings.warn(
            f"custom_fit has not been reviewed against {package} {version}: since {package} "
            f"{changed[0].reviewed_as}, {package} changed {len(changed)} of the {len(copies)} internals "
            f"custom_fit copies:{names}\nTraining may differ from keras.Model where these are used. To be "
            f'sure, install the newest reviewed release (pip install "{package}=={reviewed}") or a newer '
            f"custom_fit; maintainers re-check each copy (docs/keras_internals.md) and record it with "
            f"`python compat/keras_internals.py --record`.",
            UnreviewedKerasWarning,
            stacklevel=2,
        )
    return changed
