"""Hashes of the Keras internals custom_fit copies, for the installed (or an unpacked) Keras.

    python compat/keras_internals.py                # the installed keras and tf_keras
    python compat/keras_internals.py --root DIR     # sources under DIR (an unpacked wheel, a checkout)
    python compat/keras_internals.py --record       # after review: record this version's hashes

Prints, for every copy in custom_fit/_compat/internals.py, the hash of its
upstream functions in this version and what the tripwire test
(tests/compat/test_internals.py) says about it. Exits with 1 when a tripwire
would fail. Bumping a compat row: run it with the row's Python
(``.venv-compat/<row>/bin/python compat/keras_internals.py``); for each
CHANGED line re-check the copy against the new upstream source (diff the
function between the two versions), fix the copy if needed, then run it again
with ``--record``, which writes the hashes into custom_fit/_compat/internals.json.

Hashes of any released version, without installing it::

    pip download --no-deps keras==3.14.1 -d /tmp/w && unzip -q /tmp/w/keras-3.14.1-*.whl -d /tmp/k3.14
    python compat/keras_internals.py --root /tmp/k3.14 --package keras

Only the standard library is used: the script reads source files and imports
neither Keras nor TensorFlow, so any Python 3.11+ runs it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

REPOSITORY = Path(__file__).resolve().parent.parent
COMPAT = REPOSITORY / "custom_fit" / "_compat"
PACKAGES = ("keras", "tf_keras")


def _load(name: str, path: Path) -> ModuleType:
    """Loads one module by path (importing custom_fit would load TensorFlow)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


internals = _load("custom_fit_internals", COMPAT / "internals.py")


def recorded() -> dict[str, dict[str, tuple[str, ...]]]:
    """The recorded hashes, ``{copy id: {hash: versions}}``."""
    return {copy.id: dict(copy.hashes) for copy in internals.COPIES}


def report(package: str, root: Path, table: dict[str, dict[str, tuple[str, ...]]]) -> tuple[str, dict[str, str], bool]:
    """Prints the hashes of ``package`` under ``root``; returns its version, the hashes, and whether all pass."""
    version = internals.version_of(package, root)
    print(f"{package} {version} ({root})")
    hashes, ok = {}, True
    width = max(len(copy.id) for copy in internals.COPIES)
    for copy in internals.copies_of(package):
        found = internals.upstream_hash(copy, root)
        hashes[copy.id] = found
        verdict = internals.check(copy, version, found, table.get(copy.id, {}))
        if verdict.ok:
            status = "ok" if verdict.reviewed_as == version else f"ok (unchanged since {verdict.reviewed_as})"
        elif verdict.reviewed_as is None:
            status = "NOT RECORDED"
        else:
            status = f"CHANGED since {verdict.reviewed_as}: re-check {', '.join(copy.copies)}"
        ok = ok and verdict.ok
        print(f"  {copy.id:<{width}}  {found:<16}  {status}")
    return version, hashes, ok


def write(table: dict[str, dict[str, tuple[str, ...]]]) -> None:
    """Writes ``table`` into custom_fit/_compat/internals.json, in a stable order.

    The registry keeps its order and its other fields; each copy's hashes are
    ordered by their oldest version. One list per line keeps diffs readable.
    """
    data = json.loads(internals.DATA_FILE.read_text(encoding="utf-8"))
    lines = ["{"]
    for n, (copy_id, entry) in enumerate(data.items()):
        by_hash = sorted(table.get(copy_id, {}).items(), key=lambda item: min(map(internals._release_key, item[1])))
        hashes = [f"{json.dumps(h)}: {json.dumps(sorted(vs, key=internals._release_key))}" for h, vs in by_hash]
        lines += [
            f"  {json.dumps(copy_id)}: {{",
            f'    "package": {json.dumps(entry["package"])},',
            f'    "upstream": {json.dumps(entry["upstream"])},',
            f'    "copies": {json.dumps(entry["copies"])},',
            '    "hashes": {' + ("" if hashes else "}"),
            *[f"      {line}," for line in hashes[:-1]],
            *([f"      {hashes[-1]}", "    }"] if hashes else []),
            "  }" + ("," if n < len(data) - 1 else ""),
        ]
    lines.append("}")
    internals.DATA_FILE.write_text("\n".join(lines) + "\n", encoding="utf-8")


def record(table: dict[str, dict[str, tuple[str, ...]]], version: str, hashes: dict[str, str]) -> None:
    """Records ``hashes`` as ``version``'s in ``table`` (replacing what was recorded for it)."""
    for copy_id, found in hashes.items():
        by_hash = {h: tuple(v for v in vs if v != version) for h, vs in table.get(copy_id, {}).items()}
        by_hash[found] = (*by_hash.get(found, ()), version)
        table[copy_id] = {h: vs for h, vs in by_hash.items() if vs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, help="directory that contains the keras or tf_keras package")
    parser.add_argument("--package", choices=PACKAGES, help="only this package (default: each one found)")
    parser.add_argument("--record", action="store_true", help="record these hashes (after review)")
    args = parser.parse_args(argv)
    table = recorded()
    all_ok = True
    for package in [args.package] if args.package else PACKAGES:
        root = args.root if args.root else internals.installed_root(package)
        if root is None or not (root / package).is_dir():
            if args.package:
                parser.error(f"no {package} package under {root or 'site-packages'}")
            continue
        version, hashes, ok = report(package, root, table)
        all_ok = all_ok and ok
        if args.record:
            record(table, version, hashes)
    if args.record:
        write(table)
        print(f"recorded in {internals.DATA_FILE.relative_to(REPOSITORY)}")
        return 0
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
