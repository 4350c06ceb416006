"""A griffe extension (mkdocs.yml) that lets mkdocstrings render custom_fit's docstrings as written.

custom_fit's docstrings are Google style with a few Sphinx habits, which
griffe's Google parser does not know:

* ``Example:`` (singular) would be an admonition whose ``>>>`` lines Markdown
  reads as nested block quotes; it becomes an ``Examples:`` section (doctests
  rendered as code).
* Sphinx roles (``:class:``, ``:meth:``, ... followed by a name in
  backquotes) become code spans of that name (its last part after ``~``).
* An attribute documented by ``#:`` comments above it (Sphinx' autodoc
  convention, e.g. ``CustomModel.logged_values``) gets them as its docstring.

Only the text griffe parses changes; the source is untouched.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_EXAMPLE_SECTION = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)
_SPHINX_ROLE = re.compile(r":(?:class|meth|func|mod|attr|data|exc|obj):`(~?)([^`]+)`")


def _code_span(match: re.Match[str]) -> str:
    """The code span for one role: the target, or its last part after ``~`` (as Sphinx shows it)."""
    target = match.group(2)
    return f"`{target.rsplit('.', 1)[-1] if match.group(1) else target}`"


def markdown_docstring(text: str) -> str:
    """``text`` with ``Example:`` sections renamed ``Examples:`` and Sphinx roles as code spans.

    Examples:
        >>> markdown_docstring("See :class:`~custom_fit.GAN`.\\n\\nExample:\\n    >>> 1\\n")
        'See `GAN`.\\n\\nExamples:\\n    >>> 1\\n'
    """
    return _SPHINX_ROLE.sub(_code_span, _EXAMPLE_SECTION.sub(r"\1Examples:", text))


def comment_docstring(lines: list[str], lineno: int) -> str | None:
    """The ``#:`` comment lines right above line ``lineno`` (1-based) as text, or ``None``.

    Examples:
        >>> comment_docstring(["#: The answer,", "#: always.", "ANSWER = 42"], 3)
        'The answer,\\nalways.'
    """
    comments: list[str] = []
    index = lineno - 2
    while index >= 0 and lines[index].strip().startswith("#:"):
        comments.insert(0, lines[index].strip()[2:].strip())
        index -= 1
    return "\n".join(comments) or None


class MarkdownDocstrings(griffe.Extension):
    """Rewrites every docstring with :func:`markdown_docstring` before it is parsed."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is None and obj.is_attribute and obj.lineno and obj.filepath in obj.lines_collection:
            text = comment_docstring(obj.lines_collection[obj.filepath], obj.lineno)
            if text:
                obj.docstring = griffe.Docstring(text, lineno=obj.lineno, parent=obj)
        if obj.docstring is not None:
            obj.docstring.value = markdown_docstring(obj.docstring.value)
