"""Every sentence of README.md and docs/ that says something raises, is refused, is not supported or fails
names the test that shows it, and every test it names exists.

A claim of that kind goes stale silently when the behaviour changes (docs/keras2_style.md once promised a
``ValueError`` for two features that had started to work). Each paragraph, list item or table row whose
prose says so carries a test id in backticks, ``tests/<path>.py::<test>`` (a parametrized test's id may
follow in brackets), and this module checks that the test is defined there. Words inside code spans and
code blocks (an error message quoted, ``raise`` in a code excerpt) are not claims. A block that records
what one run did (the counts of a test run, the log of a GPU run, tf_keras' own tests run by a tool) rather
than behaviour a test of this repository can show carries the marker ``<!-- run record -->`` (invisible
on the site); :data:`RUN_RECORDS` counts them, so that one more is a decision in a diff.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])

#: The words that make a sentence a claim about an error or a failure.
CLAIM = re.compile(r"\b(raise[sd]?|raising|refuse[sd]?|not supported|fails?|failed|failing)\b", re.IGNORECASE)

#: The marker of a block that records a run (see the module docstring).
RUN_RECORD = "<!-- run record -->"

#: How many blocks carry :data:`RUN_RECORD`, per page.
RUN_RECORDS = {"docs/performance.md": 4, "docs/saving.md": 1, "docs/testing.md": 8}

#: A test id: ``tests/...py::test_name`` (``[params]`` and a class part allowed).
TEST_ID = re.compile(r"`(tests/[\w/]+\.py)::((?:\w+::)?(test_\w+))(\[[^\]`]*\])?`")


def blocks(text: str) -> list[tuple[int, str]]:
    """``(first line, text)`` of each paragraph, list item and table row outside code blocks."""
    found: list[tuple[int, str]] = []
    current: list[str] = []
    start = 0
    fenced = False

    def flush() -> None:
        if current:
            found.append((start, " ".join(current)))
            current.clear()

    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            flush()
            fenced = not fenced
            continue
        if fenced:
            continue
        new_block = not stripped or stripped.startswith(("|", "- ", "* ", "#")) or re.match(r"\d+\. ", stripped)
        if new_block:
            flush()
        if stripped:
            if not current:
                start = number
            current.append(stripped)
            if stripped.startswith(("|", "#")):
                flush()
    flush()
    return found


def prose(block: str) -> str:
    """``block`` without its code spans and links' targets (quoted messages and code are not claims)."""
    return re.sub(r"\]\([^)]*\)", "]", re.sub(r"`[^`]*`", "", block))


@cache
def defined_tests(path: str) -> set[str]:
    """The test functions (and ``Class::method``) a test module defines."""
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.update(f"{node.name}::{item.name}" for item in node.body if isinstance(item, ast.FunctionDef))
    return names


def unproven(block: str) -> list[str]:
    """The claim words of ``block`` if it names no test and is no run record, else ``[]``."""
    if TEST_ID.search(block) or RUN_RECORD in block:
        return []
    return CLAIM.findall(prose(block))


def claims_without_a_test() -> list[str]:
    missing = []
    for page in PAGES:
        for line, block in blocks(page.read_text(encoding="utf-8")):
            words = unproven(block)
            if words:
                missing.append(f"{page.relative_to(ROOT)}:{line} ({', '.join(words)}): {block[:100]}")
    return missing


def test_every_claim_of_an_error_or_a_failure_names_its_test():
    missing = claims_without_a_test()
    assert missing == [], "name the test that shows each (`tests/...py::test_...`):\n" + "\n".join(missing)


def test_the_run_records_are_the_ones_counted():
    found = {}
    for page in PAGES:
        count = sum(RUN_RECORD in block for _, block in blocks(page.read_text(encoding="utf-8")))
        if count:
            found[page.relative_to(ROOT).as_posix()] = count
    assert found == RUN_RECORDS


def test_every_test_the_docs_name_exists():
    unknown = []
    for page in PAGES:
        for match in TEST_ID.finditer(page.read_text(encoding="utf-8")):
            path, name = match.group(1), match.group(2)
            if not (ROOT / path).is_file() or name not in defined_tests(path):
                unknown.append(f"{page.relative_to(ROOT)}: {path}::{name}")
    assert unknown == []


@pytest.mark.parametrize(
    ("text", "claims"),
    [
        ("`fit` fails with this.", ["fails"]),
        ("It raises `ValueError`.\n\nNothing here.", ["raises"]),
        ("| a row | that is refused |\n| another | row |", ["refused"]),
        ("The message `raise ValueError` is code.", []),
        ("```\nraise ValueError\n```", []),
        ("It fails (`tests/test_model.py::test_x`).", []),
        ("<!-- run record --> 5 failed.", []),
    ],
)
def test_the_checker_finds_claims_outside_code_and_without_a_test(text, claims):
    assert [word for _, block in blocks(text) for word in unproven(block)] == claims
