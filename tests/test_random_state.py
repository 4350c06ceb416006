"""custom_fit._random_state: Python's and NumPy's global random state, captured, restored and written as arrays."""

from __future__ import annotations

import random
from typing import Any

import numpy as np

from custom_fit._random_state import RandomState, random_state_arrays, random_states


def _draws() -> tuple[list[float], list[float]]:
    """The next draws of both global generators (Gaussian ones too, which use a cached second value)."""
    return [random.random(), random.gauss(0.0, 1.0)], [*np.random.standard_normal(3), np.random.random()]


def test_restore_makes_both_generators_draw_again_what_they_drew_after_capture():
    random.seed(1)
    np.random.seed(1)
    state = RandomState.capture()
    first = _draws()
    assert _draws() != first
    state.restore()
    assert _draws() == first


def test_states_written_as_arrays_read_back_to_the_same_draws(tmp_path):
    """Through an ``.npz`` file without pickling, with and without a cached Gaussian in either generator."""
    random.seed(2)
    np.random.seed(2)
    plain = RandomState.capture()
    random.gauss(0.0, 1.0)  # leaves a cached second value in Python's generator
    np.random.standard_normal()  # and in NumPy's
    cached = RandomState.capture()
    assert cached.python[2] is not None and cached.numpy[3] == 1
    expected = []
    for state in (plain, cached):
        state.restore()
        expected.append(_draws())

    written: dict[str, Any] = random_state_arrays("random_", [plain, cached])
    np.savez(tmp_path / "states.npz", **written)
    with np.load(tmp_path / "states.npz", allow_pickle=False) as arrays:
        loaded = random_states("random_", arrays)

    assert len(loaded) == 2
    for state, draws in zip(loaded, expected, strict=True):
        state.restore()
        assert _draws() == draws


def test_the_arrays_of_each_prefix_hold_their_own_states():
    random.seed(3)
    np.random.seed(3)
    first = RandomState.capture()
    _draws()
    second = RandomState.capture()
    arrays = {**random_state_arrays("a_", [first]), **random_state_arrays("b_", [second, first])}
    assert [s.python for s in random_states("a_", arrays)] == [first.python]
    assert [s.python for s in random_states("b_", arrays)] == [second.python, first.python]
