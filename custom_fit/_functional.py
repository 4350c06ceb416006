"""``CustomModel(inputs, outputs)`` without rewriting any class' bases, picklable.

``keras.Model(inputs, outputs)`` on a subclass makes Keras splice ``Functional``
into that subclass' bases, for the rest of the process: afterwards any
subclass with its own ``__init__`` fails ("Functional.__init__() missing 2
required positional arguments"), also when the functional construction itself
raised. A ``CustomModel`` called with functional arguments instead moves only
the new instance to a *twin* class: a subclass of its class that also derives
from ``Functional``, made once per class. ``isinstance`` checks hold,
``type(model).__name__`` is kept, and it serializes under the class'
registered name.

Twins live in this module under names made from their class' module and
qualified name (module ``__getattr__`` makes them on first use), so pickle,
``copy.deepcopy`` and ``multiprocessing`` with ``spawn`` find them in any
process.
"""

from __future__ import annotations

import importlib
from typing import Any

from custom_fit._compat import version

__all__ = ["functional_twin", "is_twin"]

# Twin names: "<module>··<qualname>" with "." written "·"; pickle splits names on ".".
_DOT, _SEPARATOR = "·", "··"

_twins: dict[type, type] = {}


def functional_twin(cls: type) -> type:
    """The subclass of ``cls`` that is also ``Functional`` (made once per class)."""
    twin = _twins.get(cls)
    if twin is None:
        name = f"{cls.__module__.replace('.', _DOT)}{_SEPARATOR}{cls.__qualname__.replace('.', _DOT)}"
        attributes = {"__module__": __name__, "__qualname__": name, "__doc__": cls.__doc__}
        twin = type(cls.__name__, (cls, version.Functional), attributes)
        version.share_registered_name(twin, cls)
        _twins[cls] = twin
    return twin


def is_twin(cls: type) -> bool:
    """Whether ``cls`` is a twin made by :func:`functional_twin`."""
    return cls in _twins.values()


def __getattr__(name: str) -> type:
    """Makes the twin ``name`` refers to (unpickling in a process that has not made it yet)."""
    module_name, separator, qualname = name.partition(_SEPARATOR)
    if not separator:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    owner: Any = importlib.import_module(module_name.replace(_DOT, "."))
    for part in qualname.split(_DOT):
        owner = getattr(owner, part)
    return functional_twin(owner)
