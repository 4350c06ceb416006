"""tf_keras' own engine, saving and callback tests, run as they are and with CustomModel swapped in (Keras 2 peer run).

    python compat/keras2_peer.py --repo DIR [--tag v2.21.0] [--out DIR] [--only FILE ...] [-k EXPR]

``DIR`` is a git checkout (or bare clone) of keras-team/tf-keras; the tag should match the
installed tf_keras. The four engine test files (``training_test.py``, ``training_eager_test.py``,
``sequential_test.py``, ``functional_test.py``), the saving tests (``saving_lib_test.py``,
``pickle_utils_test.py``, ``legacy/save_test.py``, ``legacy/save_weights_test.py``) and
``callbacks_test.py`` are exported from the tag and their imports rewritten as tf-keras' pip
build does (``tf_keras.engine`` becomes ``tf_keras.src.engine``). ``--only`` takes a path under
``tf_keras/`` (``saving/legacy/save_test.py``) or a file name when it is unique
(``training_test.py``).
Each file is run twice with pytest in TF2 modes only (the ``v1_session``/``graph`` test
combinations are deselected): once as it is (``plain``) and once with ``tf_keras.Model``,
``Sequential`` and ``Functional`` replaced by ``CustomModel`` / ``CustomSequential``
(``swapped``): the public ``tf_keras.Model``/``Sequential`` names, the constructor calls and class
bases the tests write against the engine modules, and the test utilities' model factories.

Writes ``OUT/<file>.<run>.xml`` (JUnit), ``OUT/summary.json`` and prints, per file, how many
tests pass in each run and which passing-as-they-are tests fail with the swap (the
regressions), with the first line of each error. tf_keras' tests are not part of custom_fit:
nothing here is committed from that repository; this script only reads it.

Only the standard library is used here; pytest, absl-py and tf_keras come from the venv that runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

# Paths under tf_keras/ at the tag.
FILES = (
    "engine/training_test.py",
    "engine/training_eager_test.py",
    "engine/sequential_test.py",
    "engine/functional_test.py",
    "saving/saving_lib_test.py",
    "saving/pickle_utils_test.py",
    "saving/legacy/save_test.py",
    "saving/legacy/save_weights_test.py",
    "callbacks_test.py",
)
# Deselected: TF1 graph-mode combinations (not a drop-in concern for TF2 code).
TF2_ONLY = "not v1_session and not graph and not _v1"

# The modules (as the tests import them) whose `Model` the tests construct or subclass.
_MODEL_MODULES = r"(?:training_module|training_lib|training|models|keras\.models)"
_ENGINE_MODEL = re.compile(rf"\b{_MODEL_MODULES}\.Model\b(?=[(.])")
_ENGINE_SEQUENTIAL = re.compile(r"\b(?:sequential|models|keras\.models)\.Sequential\b(?=[(.])")
_ENGINE_FUNCTIONAL = re.compile(r"\bfunctional\.Functional\((?=[^)])")
_CLASS_BASE = re.compile(rf"^(\s*class \w+\()(?:{_MODEL_MODULES}|keras)\.Model\)", re.M)
_CLASS_BASE_SEQUENTIAL = re.compile(r"^(\s*class \w+\()(?:sequential|keras)\.Sequential\)", re.M)

# Both runs: public names the tests read that tf_keras' pip package does not export.
COMMON_CONFTEST = '''
"""Names tf_keras' tests read from its public API that the pip package leaves out (written by keras2_peer.py)."""
import tf_keras
from tf_keras.src import callbacks as _callbacks
from tf_keras.src import engine as _engine
from tf_keras.src import layers as _layers
from tf_keras.src.utils import data_utils as _data_utils
from tf_keras.src.utils import np_utils as _np_utils

for _name in ("CuDNNGRU", "CuDNNLSTM"):  # saving/legacy/save_weights_test.py
    if not hasattr(tf_keras.layers, _name):
        setattr(tf_keras.layers, _name, getattr(_layers, _name))
if not hasattr(tf_keras, "engine"):  # saving/saving_lib_test.py: keras.engine.compile_utils
    tf_keras.engine = _engine
for _module, _name, _value in (  # callbacks_test.py
    (tf_keras.utils, "data_utils", _data_utils),
    (tf_keras.utils, "np_utils", _np_utils),
    (tf_keras.callbacks, "keras_model_summary", _callbacks.keras_model_summary),
):
    if not hasattr(_module, _name):
        setattr(_module, _name, _value)
'''

SWAP_CONFTEST = '''
"""Swaps CustomModel / CustomSequential in for tf_keras' Model / Sequential (written by keras2_peer.py)."""
import types

import tf_keras

import custom_fit
from tf_keras.src import models as _models
from tf_keras.src.testing_infra import test_utils as _test_utils

tf_keras.Model = tf_keras.models.Model = custom_fit.CustomModel
tf_keras.Sequential = tf_keras.models.Sequential = custom_fit.CustomSequential
# The test utilities' model factories read `models.Model` / `models.Sequential` from their module.
_proxy = types.ModuleType("tf_keras.src.models")
_proxy.__dict__.update(vars(_models))
_proxy.Model, _proxy.Sequential = custom_fit.CustomModel, custom_fit.CustomSequential
_test_utils.models = _proxy
'''


def export(repo: Path, tag: str, path: str) -> str:
    """The test file ``tf_keras/<path>`` at ``tag``, its imports rewritten for the pip package (``tf_keras.src``)."""
    source = subprocess.run(
        ["git", "--git-dir", str(_git_dir(repo)), "show", f"{tag}:tf_keras/{path}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return re.sub(r"^from tf_keras(\.| )", lambda m: "from tf_keras.src" + m.group(1), source, flags=re.M)


def swapped(source: str) -> str:
    """``source`` with the engine's Model, Sequential and Functional constructed as custom_fit's classes."""
    source = _CLASS_BASE.sub(r"\1custom_fit.CustomModel)", source)
    source = _CLASS_BASE_SEQUENTIAL.sub(r"\1custom_fit.CustomSequential)", source)
    source = _ENGINE_MODEL.sub("custom_fit.CustomModel", source)
    source = _ENGINE_SEQUENTIAL.sub("custom_fit.CustomSequential", source)
    source = _ENGINE_FUNCTIONAL.sub("custom_fit.CustomModel(", source)
    return "import custom_fit\n" + source


def _test_file(argument: str) -> str:
    """The entry of :data:`FILES` that ``argument`` names: its path, or its file name when unique."""
    matches = [f for f in FILES if argument in (f, Path(f).name)]
    if len(matches) != 1:
        raise argparse.ArgumentTypeError(f"expected one of {FILES} (or a unique file name), received {argument!r}")
    return matches[0]


def _git_dir(repo: Path) -> Path:
    return repo / ".git" if (repo / ".git").exists() else repo


def run(directory: Path, name: str, xml: Path, keyword: str, jobs: int) -> None:
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-W", "default"]
    command += ["-n", str(jobs)] if jobs > 1 else []
    command += ["-k", keyword, f"--junitxml={xml}", name]
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="3")
    subprocess.run(command, cwd=directory, env=env, check=False, capture_output=True, text=True)


def outcomes(xml: Path) -> dict[str, str]:
    """Test id -> "passed", "skipped" or the first line of its failure."""
    results: dict[str, str] = {}
    if not xml.exists():
        return results
    for case in ElementTree.parse(xml).getroot().iter("testcase"):
        test = f"{case.get('classname')}::{case.get('name')}"
        problem = case.find("failure") if case.find("failure") is not None else case.find("error")
        if problem is not None:
            results[test] = (problem.get("message") or "failed").strip().splitlines()[0][:200]
        elif case.find("skipped") is not None:
            results[test] = "skipped"
        else:
            results[test] = "passed"
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, required=True, help="a checkout or bare clone of keras-team/tf-keras")
    parser.add_argument("--tag", default="v2.21.0")
    parser.add_argument("--out", type=Path, default=Path("keras2-peer"))
    parser.add_argument("--only", nargs="+", type=_test_file, default=list(FILES), help="paths under tf_keras/")
    parser.add_argument("-k", dest="keyword", default="", help="a further pytest -k expression")
    parser.add_argument("--jobs", type=int, default=2, help="pytest-xdist workers per run")
    args = parser.parse_args(argv)
    keyword = f"({TF2_ONLY}) and ({args.keyword})" if args.keyword else TF2_ONLY
    summary = {}
    for path in args.only:
        source = export(args.repo, args.tag, path)
        name = Path(path).name
        for mode, text in (("plain", source), ("swapped", swapped(source))):
            directory = args.out / mode
            directory.mkdir(parents=True, exist_ok=True)
            (directory / "conftest.py").write_text(COMMON_CONFTEST + (SWAP_CONFTEST if mode == "swapped" else ""))
            (directory / name).write_text(text)
            run(directory, name, (args.out / f"{name}.{mode}.xml").resolve(), keyword, args.jobs)
        plain = outcomes(args.out / f"{name}.plain.xml")
        swap = outcomes(args.out / f"{name}.swapped.xml")
        passing = {t for t, r in plain.items() if r == "passed"}
        regressions = {t: swap.get(t, "not run") for t in sorted(passing) if swap.get(t) != "passed"}
        summary[name] = {
            "plain_passed": len(passing),
            "swapped_passed": sum(1 for t in passing if swap.get(t) == "passed"),
            "regressions": regressions,
        }
        print(f"{name}: {summary[name]['swapped_passed']} of {len(passing)} pass with the swap", flush=True)
        for test, error in regressions.items():
            print(f"  {test}: {error}")
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True))
    total = sum(s["plain_passed"] for s in summary.values())
    print(f"total: {sum(s['swapped_passed'] for s in summary.values())} of {total} pass with the swap")
    empty = [name for name, s in summary.items() if not s["plain_passed"]]
    if empty:  # a file that does not import collects nothing: not a pass
        print(f"no test passed as it is in {empty}: see the pytest output above", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
