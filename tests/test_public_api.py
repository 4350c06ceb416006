"""The public API by intent: what is public, and what the package itself answers to an unknown name."""

from __future__ import annotations

import pkgutil

import pytest

import custom_fit

#: The modules a user imports by name; every other module is private (a leading underscore).
PUBLIC_MODULES = {"gan", "gan_samples", "random"}


def test_only_the_intended_modules_are_public():
    public = {m.name for m in pkgutil.iter_modules(custom_fit.__path__) if not m.name.startswith("_")}
    assert public == PUBLIC_MODULES


def test_an_unknown_attribute_of_the_package_is_an_attribute_error():
    with pytest.raises(AttributeError, match="has no attribute 'no_such_module'"):
        custom_fit.no_such_module  # noqa: B018
