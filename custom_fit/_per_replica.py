"""Values one replica's trace of a step keeps between two calls, one per replica.

A training step hands values from one call to another while it is traced:
:meth:`CustomModel.minimize <custom_fit.CustomModel.minimize>` tells
``apply_gradients`` what it must undo of the gradient contract, and the step's
diagnostics note each ``minimize``. Under ``MirroredStrategy`` every replica
traces the step at the same time, each in a thread of its own, so such a value
must belong to one replica. :class:`PerReplica` keys it by the replica's
``tf.distribute.ReplicaContext`` (``tf.distribute.get_replica_context()``),
the object TensorFlow itself gives each replica, instead of by thread: what
identifies the value is the replica, and the value is copied and pickled as
what it is, transient state of a trace (a copy starts empty), where a
``threading.local`` cannot be copied at all.

Nothing in this module is public API.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

import tensorflow as tf

__all__ = ["PerReplica"]

T = TypeVar("T")


class PerReplica(Generic[T]):
    """One value for each replica (and one for code that runs outside any strategy), made on first use.

    Args:
        factory: Makes the value of a replica that has none yet.

    Example:
        >>> records = PerReplica(list)
        >>> records.get().append("minimize")
        >>> records.get(), records.pop(), records.get()
        (['minimize'], ['minimize'], [])
    """

    def __init__(self, factory: Callable[[], T]):
        self._factory = factory
        # Keyed by the context itself, not its id: held here it cannot be replaced by another
        # context that reuses its address while a value is kept.
        self._values: dict[Any, T] = {}

    def get(self) -> T:
        """The value of the replica running this call (made if it has none)."""
        key = tf.distribute.get_replica_context()
        if key not in self._values:
            self._values[key] = self._factory()
        return self._values[key]

    def set(self, value: T) -> None:
        """Makes ``value`` the value of the replica running this call."""
        self._values[tf.distribute.get_replica_context()] = value

    def pop(self) -> T:
        """Removes and returns the value of the replica running this call (made if it had none)."""
        value = self.get()
        del self._values[tf.distribute.get_replica_context()]
        return value

    def __deepcopy__(self, memo: dict[int, Any]) -> PerReplica[T]:
        return PerReplica(self._factory)

    def __reduce__(self) -> tuple[Any, ...]:
        return (PerReplica, (self._factory,))
