"""custom_fit.random: seeded draws in a step, the same code on both Kerases, resumed from a saved model."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

import custom_fit
from custom_fit import keras, random


def test_random_draws_are_reproducible_from_an_int_seed_and_advance_with_a_generator():
    np.testing.assert_array_equal(random.normal((3, 2), seed=5), random.normal((3, 2), seed=5))
    uniform = np.asarray(random.uniform((1000,), seed=5))
    assert uniform.min() >= 0 and uniform.max() < 1 and abs(uniform.mean() - 0.5) < 0.05
    generator = random.SeedGenerator(7)
    first, second = np.asarray(random.normal((4,), seed=generator)), np.asarray(random.normal((4,), seed=generator))
    assert not np.array_equal(first, second)
    again = random.SeedGenerator(7)
    np.testing.assert_array_equal(random.normal((4,), seed=again), first)


class NoisyAutoencoder(custom_fit.CustomModel):
    """A denoising step that draws its noise from a seed generator the model owns."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.noise = random.SeedGenerator(3)
        self.dense = keras.layers.Dense(4)

    def call(self, x):
        return self.dense(x)

    def train_step(self, data):
        x = data[0] if isinstance(data, tuple) else data
        noisy = x + 0.1 * random.normal(tf.shape(x), seed=self.noise)
        return super().train_step((noisy, x))


def test_a_seed_generator_in_a_step_resumes_from_a_saved_model(tmp_path):
    """Its state is saved with the model: a loaded model continues with the same noise as the original."""
    x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
    keras.utils.set_random_seed(1)
    model = NoisyAutoencoder()
    model.compile(optimizer="sgd", loss="mse")
    model.fit(x, epochs=1, batch_size=8, verbose=0, shuffle=False)
    model.save(tmp_path / "noisy.keras")
    loaded = keras.models.load_model(tmp_path / "noisy.keras", custom_objects={"NoisyAutoencoder": NoisyAutoencoder})
    for trained in (model, loaded):
        trained.fit(x, epochs=1, batch_size=8, verbose=0, shuffle=False)
    for expected, got in zip(model.get_weights(), loaded.get_weights(), strict=True):
        np.testing.assert_array_equal(got, expected)
