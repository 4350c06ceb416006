"""The only package that knows which Keras runs, and Keras' private names.

TensorFlow decides what ``tf.keras`` is: Keras 3 (the ``keras`` package) by
default, Keras 2 (``tf_keras``) when the environment sets
``TF_USE_LEGACY_KERAS=1`` before TensorFlow first loads Keras. custom_fit
follows TensorFlow, so code written against ``tf.keras`` gets a ``CustomModel``
of the same Keras. Everything that differs between the two lives in
:mod:`~custom_fit._compat.keras3` and :mod:`~custom_fit._compat.keras2`, which
both implement :class:`~custom_fit._compat.contract.KerasVersion`. This
package picks one of them, once, and hands it to the rest of custom_fit as
:data:`version`, typed as the contract: callers write ``version.build_optimizer(...)``,
and type checkers check each call against the contract. Adding an adapter is
the contract and the two version modules; nothing here changes. Bodies the two
share, and helpers that do not depend on the Keras version, live once in
:mod:`~custom_fit._compat.common`, which callers import directly;
Keras-3-only code paths use :mod:`~custom_fit._compat.keras3_only`.

The package itself defines few names (``__all__``, each with its reason below,
``tests/end_to_end/test_layout.py`` keeps them at most 15): no re-exported functions and
no capability flags, which are ``version.X`` reads.

Where custom_fit copies, rewrites, replaces or wraps a Keras internal,
:mod:`~custom_fit._compat.internals` lists it with the upstream functions it
was made from, and ``tests/compat/test_internals.py`` fails when the installed
Keras changed one of them since the version it was reviewed against
(docs/keras_internals.md: every copy, what it changes and why).

Nothing in this package is public API.
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

import tensorflow as _tf

from custom_fit._compat import contract, internals

#: Whether ``tf.keras`` is Keras 2 (``tf_keras``, ``TF_USE_LEGACY_KERAS=1``) rather than Keras 3: the one
#: choice this package makes (custom_fit exports it; tests and Keras-2-only paths branch on it).
KERAS_2: bool = _tf.keras.__name__.startswith("tf_keras")

# Before the version module reads Keras' private names: on a Keras release the recorded hashes do
# not list, say which copied internals changed (a warning) or are gone (an ImportError).
internals.check_installed("tf_keras" if KERAS_2 else "keras")

# `TrainerHooks` (a base class of CustomModel) and `keras` (a module) are imported by name, so that
# type checkers see a class and a module; everything else is read from `version`.
if KERAS_2:
    from custom_fit._compat import keras2 as _module
    from custom_fit._compat import keras2_loop as _loop
    from custom_fit._compat.keras2 import TrainerHooks, keras
else:
    from custom_fit._compat import keras3 as _module
    from custom_fit._compat import keras3_only as _loop
    from custom_fit._compat.keras3 import TrainerHooks, keras

#: The version module in use (:mod:`~custom_fit._compat.keras3` or :mod:`~custom_fit._compat.keras2`),
#: typed as the contract, so that callers see the contract's signatures rather than one Keras' own.
version: contract.KerasVersion = _module

#: The version's pieces of custom_fit's ``fit``/``evaluate``/``predict`` loop
#: (:mod:`~custom_fit._compat.keras3_only` or :mod:`~custom_fit._compat.keras2_loop`), typed as
#: :class:`~custom_fit._compat.contract.LoopParts`: one loop runs on both Kerases.
loop: contract.LoopParts = _loop

if _TYPE_CHECKING:
    from custom_fit._compat import keras3_only  # noqa: F401  # `_compat.keras3_only` for mypy; see __getattr__


def __getattr__(name: str) -> _Any:
    """``keras3_only`` on Keras 2: a Keras-3-only code path was reached, which is a bug in custom_fit."""
    if name == "keras3_only":
        raise AttributeError(
            f"custom_fit._compat.keras3_only is Keras 3's, but this process runs {version.KERAS_VERSION}: a "
            "Keras-3-only code path of custom_fit ran on Keras 2. Please report it with the traceback."
        )
    raise AttributeError(f"module 'custom_fit._compat' has no attribute {name!r}")


#: The names the rest of custom_fit imports from this package, and why each is here rather than read
#: from `version` or imported from a submodule. Submodules (`common`, `contract`, `internals`,
#: `keras3_only`, ...) are imported by their own names; `_compat.keras3_only` on Keras 2 is the error
#: of `__getattr__` above.
__all__ = [
    "KERAS_2",  # the choice between the version modules, made here once
    "TrainerHooks",  # a base class of CustomModel: a class to type checkers, not a contract property
    "keras",  # the Keras module in use: a module to type checkers (`keras.Model` in annotations)
    "loop",  # the version's pieces of the one fit/evaluate/predict loop, typed as contract.LoopParts
    "version",  # the version module in use, typed as custom_fit._compat.contract.KerasVersion
]
