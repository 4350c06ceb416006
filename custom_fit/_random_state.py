"""Python's and NumPy's global random state: captured, restored, and written as arrays.

A resumed ``fit`` must draw the random numbers the interrupted one would
have drawn: ``fit(shuffle=True)`` orders a ``PyDataset``'s batches with
Python's ``random`` (Keras 3.8-3.15), and a ``PyDataset`` may reshuffle with
NumPy in its epoch hooks. :class:`RandomState` captures both generators'
state; :func:`random_state_arrays` and :func:`random_states` write and read
them as plain arrays (an ``.npz`` file, no pickling) for
:class:`custom_fit.BackupAndRestore`'s backups.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import numpy as np

__all__ = ["RandomState", "random_state_arrays", "random_states"]


@dataclasses.dataclass(frozen=True)
class RandomState:
    """Python's ``random`` and NumPy's global random state at one moment.

    Example:
        >>> import random
        >>> state = RandomState.capture()
        >>> first = random.random()
        >>> state.restore()
        >>> random.random() == first
        True
    """

    python: tuple[Any, ...]
    numpy: tuple[Any, ...]

    @classmethod
    def capture(cls) -> RandomState:
        """The state now."""
        return cls(random.getstate(), np.random.get_state(legacy=True))  # type: ignore[arg-type]

    def restore(self) -> None:
        """Makes this the state of both generators."""
        random.setstate(self.python)
        np.random.set_state(self.numpy)


def random_state_arrays(prefix: str, states: list[RandomState]) -> dict[str, np.ndarray]:
    """``states`` as arrays for an ``.npz`` file (no pickling), their names starting with ``prefix``."""
    return {
        f"{prefix}python_key": np.array([s.python[1] for s in states], np.int64).reshape(len(states), -1),
        f"{prefix}python_gauss": np.array(
            [(s.python[2] is not None, s.python[2] or 0.0) for s in states], np.float64
        ).reshape(len(states), 2),
        f"{prefix}numpy_key": np.array([s.numpy[1] for s in states], np.uint32).reshape(len(states), -1),
        f"{prefix}numpy_rest": np.array([s.numpy[2:] for s in states], np.float64).reshape(len(states), 3),
    }


def random_states(prefix: str, arrays: Any) -> list[RandomState]:
    """Inverse of :func:`random_state_arrays`: the states under ``prefix`` in ``arrays``."""
    states = []
    for key, gauss, numpy_key, (pos, has_gauss, cached) in zip(
        arrays[f"{prefix}python_key"],
        arrays[f"{prefix}python_gauss"],
        arrays[f"{prefix}numpy_key"],
        arrays[f"{prefix}numpy_rest"],
        strict=True,
    ):
        python = (3, tuple(int(k) for k in key), float(gauss[1]) if gauss[0] else None)
        states.append(RandomState(python, ("MT19937", numpy_key, int(pos), int(has_gauss), float(cached))))
    return states
