"""custom_fit._extra_state: state Keras leaves out of the weights file, saved beside the model's variables."""

from __future__ import annotations

import numpy as np
import pytest

import custom_fit
from custom_fit import _extra_state, keras, random


def test_split_takes_each_parts_entries_out_and_leaves_keras_own():
    store = {
        "0": "kernel",
        "1": "bias",
        "optimizer_variables_generator": "a",
        "attribute_optimizer_variables_d": "b",
        "untracked_variable_0_noise": "c",
        "seed_generator_state_0": "d",
    }
    own, parts = _extra_state.split(store)
    assert own == {"0": "kernel", "1": "bias"}
    assert parts == {
        "optimizer_variables_": {"generator": "a"},
        "attribute_optimizer_variables_": {"d": "b"},
        "untracked_variable_": {"0_noise": "c"},
        "seed_generator_state_": {"0": "d"},
    }


class Noisy(custom_fit.CustomModel):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.noise = random.SeedGenerator(3)
        self.dense = keras.layers.Dense(2)

    def call(self, x):
        return self.dense(x)


@pytest.mark.keras3  # Keras 2's SeedGenerator is a layer: its state is one of the model's own variables
def test_a_seed_generators_state_is_saved_and_loaded_back():
    model = Noisy()
    model(np.ones((1, 2), "float32"))
    random.normal((2,), seed=model.noise)
    store: dict = {}
    _extra_state.save(model, store)
    store = {key: np.array(value) for key, value in store.items()}  # the values, as a weights file holds them
    assert "seed_generator_state_0" in store
    saved = np.array(store["seed_generator_state_0"])
    expected = np.asarray(random.normal((2,), seed=model.noise))  # what the next draw after the save is
    _extra_state.load(model, _extra_state.split(store)[1])
    np.testing.assert_array_equal(np.array(model.noise.state), saved)
    np.testing.assert_array_equal(np.asarray(random.normal((2,), seed=model.noise)), expected)


def test_a_saved_tf_variable_the_model_does_not_have_is_named():
    model = Noisy()
    model(np.ones((1, 2), "float32"))
    parts: dict[str, dict[str, np.ndarray]] = {part.prefix: {} for part in _extra_state.PARTS}
    parts["untracked_variable_"] = {"0_scale": np.ones(1)}
    with pytest.raises(ValueError, match=r"tf.Variables that Noisy '.*' does not have now: \['scale of layer #0'\]"):
        _extra_state.load(model, parts)
