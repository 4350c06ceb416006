"""Keras 2's optimizer idioms inside CustomModel steps and their callbacks, on both Kerases.

On Keras 3 (7a9ee83) each raised ``AttributeError``: ``get_scaled_loss`` /
``get_unscaled_gradients`` (TensorFlow's mixed-precision guide),
``optimizer.minimize(loss, var_list, tape=tape)`` (tf.keras 2.11+) and
``optimizer.lr`` (read, assigned, ``tf.keras.backend.set_value``). On Keras 2
they are tf_keras' own, so the same tests check that they behave alike.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import custom_fit
from custom_fit import keras
from tests import parity

DATA = parity.classification_data()
X, Y = DATA["x"], DATA["y"].astype("float32")[:, None]


def default_step(model, x, y):
    """CustomModel's own update: minimize() with loss scaling, as keras.Model's step."""
    with tf.GradientTape() as tape:
        loss = model.compute_loss(x, y, model(x, training=True))
    model.minimize(loss, tape, model.trainable_variables)
    return loss


def mixed_precision_guide_step(model, x, y):
    """TensorFlow's mixed-precision guide, written for Keras 2's LossScaleOptimizer."""
    with tf.GradientTape() as tape:
        loss = model.compute_loss(x, y, model(x, training=True))
        scaled_loss = model.optimizer.get_scaled_loss(loss)
    scaled_gradients = tape.gradient(scaled_loss, model.trainable_variables)
    gradients = model.optimizer.get_unscaled_gradients(scaled_gradients)
    model.optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
    return loss


def optimizer_minimize_step(model, x, y):
    """tf.keras 2.11+: ``optimizer.minimize(loss, var_list, tape=tape)``."""
    with tf.GradientTape() as tape:
        loss = model.compute_loss(x, y, model(x, training=True))
    model.optimizer.minimize(loss, model.trainable_variables, tape=tape)
    return loss


def train(step, epochs=3, scale=1.0, callbacks=()):
    class Stepped(custom_fit.CustomModel):
        def train_step(self, data):
            x, y = data
            return {"loss": step(self, x, y), "lr": self.optimizer.lr}

    keras.utils.set_random_seed(0)
    inputs = keras.Input((parity.N_FEATURES,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    model = Stepped(inputs, keras.layers.Dense(1, dtype="float32")(hidden))
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    history = model.fit(X * scale, Y, batch_size=16, epochs=epochs, shuffle=False, verbose=0, callbacks=list(callbacks))
    return model, history.history


def loss_scale_of(optimizer: Any) -> float:
    scale = getattr(optimizer, "dynamic_scale", None)
    return float(scale if scale is not None else optimizer.loss_scale)


def test_the_mixed_precision_guide_step_equals_the_same_step_without_it(mixed_float16):
    """Fails on 7a9ee83 (Keras 3): 'LossScaleOptimizer' object has no attribute 'get_scaled_loss'."""
    reference, _ = train(default_step, scale=30.0)
    guide, _ = train(mixed_precision_guide_step, scale=30.0)
    assert loss_scale_of(guide.optimizer) == loss_scale_of(reference.optimizer) < 2.0**15, "steps were skipped"
    assert parity.max_delta(guide.get_weights(), reference.get_weights()) <= 1e-6


@pytest.mark.parametrize("policy", ["float32", "mixed_float16"])
def test_optimizer_minimize_with_a_tape_equals_apply_gradients(policy):
    """Fails on 7a9ee83 (Keras 3): 'Adam' object has no attribute 'minimize'."""
    keras.mixed_precision.set_global_policy(policy)
    try:
        reference, _ = train(default_step, scale=30.0)
        minimized, _ = train(optimizer_minimize_step, scale=30.0)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert parity.max_delta(minimized.get_weights(), reference.get_weights()) == 0.0


def test_optimizer_minimize_without_a_tape_says_how_to_fix():
    model, _ = train(default_step, epochs=1)
    loss = tf.constant(1.0)
    with pytest.raises(ValueError, match=r"tape"):
        model.optimizer.minimize(loss, model.trainable_variables)


class HalvingRate(keras.callbacks.Callback):
    """A Keras 2 callback: ``set_value(self.model.optimizer.lr, ...)`` after each epoch, and ``lr = ...`` once."""

    def on_epoch_end(self, epoch, logs=None):
        tf.keras.backend.set_value(self.model.optimizer.lr, 0.01 * 0.5 ** (epoch + 1))

    def on_train_end(self, logs=None):
        self.model.optimizer.lr = 0.5


def test_optimizer_lr_is_read_in_a_step_and_set_by_a_keras_2_callback():
    """Fails on 7a9ee83 (Keras 3): 'Adam' object has no attribute 'lr'."""
    model, history = train(default_step, epochs=3, callbacks=[HalvingRate()])
    np.testing.assert_allclose(history["lr"], [0.01, 0.005, 0.0025], rtol=1e-6)
    assert float(model.optimizer.learning_rate) == pytest.approx(0.5)
    assert float(model.optimizer.lr) == pytest.approx(0.5)


def test_optimizers_outside_custom_fit_are_unchanged_and_save_as_before(tmp_path):
    """The Keras 2 names are given to the optimizers a CustomModel compiled, not to Keras' classes."""
    fresh = keras.optimizers.Adam(0.01)
    model, _ = train(default_step, epochs=1)
    assert type(model.optimizer).__name__ == "Adam" and isinstance(model.optimizer, keras.optimizers.Adam)
    if not custom_fit.KERAS_2:
        assert not hasattr(fresh, "lr") and not hasattr(keras.optimizers.Adam, "minimize")
        expected = keras.saving.serialize_keras_object(fresh)
        saved = keras.saving.serialize_keras_object(model.optimizer)
        assert {k: v for k, v in saved.items() if k != "config"} == {k: v for k, v in expected.items() if k != "config"}
    model.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras", custom_objects={"Stepped": type(model)})
    assert type(loaded.optimizer).__name__ == "Adam"
    for expected_variable, loaded_variable in zip(model.optimizer.variables, loaded.optimizer.variables, strict=True):
        np.testing.assert_array_equal(np.asarray(loaded_variable), np.asarray(expected_variable))


# --------------------------------------------------------------------------
# Several optimizers: named, and kept as attributes (keras.io)
# --------------------------------------------------------------------------


def two_towers():
    discriminator = keras.Sequential([keras.Input((parity.N_FEATURES,)), keras.layers.Dense(1)], name="discriminator")
    generator = keras.Sequential([keras.Input((4,)), keras.layers.Dense(parity.N_FEATURES)], name="generator")
    return discriminator, generator


def gan_losses(model, real, tape_d, tape_g):
    noise = tf.sin(real[:, :4])
    with tape_d:
        fake = model.generator(noise, training=True)
        d_loss = tf.reduce_mean(tf.nn.softplus(-model.discriminator(real))) + tf.reduce_mean(
            tf.nn.softplus(model.discriminator(fake))
        )
    with tape_g:
        g_loss = tf.reduce_mean(tf.nn.softplus(-model.discriminator(model.generator(noise, training=True))))
    return d_loss, g_loss


def attribute_gan(keras2_idioms: bool):
    class GAN(custom_fit.CustomModel):
        def __init__(self, discriminator, generator):
            super().__init__()
            self.discriminator = discriminator
            self.generator = generator

        def compile(self, d_optimizer, g_optimizer):  # type: ignore[override]  # keras.io's signature
            super().compile()
            self.d_optimizer = d_optimizer
            self.g_optimizer = g_optimizer

        def train_step(self, real):
            tape_d, tape_g = tf.GradientTape(), tf.GradientTape()
            d_loss, g_loss = gan_losses(self, real, tape_d, tape_g)
            d_vars, g_vars = self.discriminator.trainable_weights, self.generator.trainable_weights
            if keras2_idioms:
                self.d_optimizer.minimize(d_loss, d_vars, tape=tape_d)
                self.g_optimizer.minimize(g_loss, g_vars, tape=tape_g)
            else:
                self.d_optimizer.apply_gradients(zip(tape_d.gradient(d_loss, d_vars), d_vars, strict=True))
                self.g_optimizer.apply_gradients(zip(tape_g.gradient(g_loss, g_vars), g_vars, strict=True))
            return {"d_loss": d_loss, "g_loss": g_loss, "d_lr": self.d_optimizer.lr}

    keras.utils.set_random_seed(0)
    gan = GAN(*two_towers())
    gan.compile(keras.optimizers.Adam(1e-3), keras.optimizers.Adam(2e-3))
    return gan


def test_attribute_optimizers_of_a_keras_io_gan_have_the_keras_2_api():
    """``self.d_optimizer.minimize(..., tape=...)`` and ``.lr`` equal the Keras 3 way, bit for bit."""
    results = {}
    for keras2_idioms in (False, True):
        gan = attribute_gan(keras2_idioms)
        history = gan.fit(X, batch_size=16, epochs=2, shuffle=False, verbose=0, callbacks=[HalvingRate()]).history
        results[keras2_idioms] = (gan.get_weights(), history)
    assert parity.max_delta(results[True][0], results[False][0]) == 0.0
    np.testing.assert_allclose(results[True][1]["d_lr"], [1e-3, 0.005], rtol=1e-6)  # set_value(group.lr) scales
    assert float(gan.g_optimizer.lr) == pytest.approx(0.5 * 2e-3 / 1e-3)  # both members, ratio kept


def test_named_optimizers_have_the_keras_2_api():
    class Named(custom_fit.CustomModel):
        def __init__(self, discriminator, generator):
            super().__init__()
            self.discriminator = discriminator
            self.generator = generator

        def train_step(self, real):
            tape_d, tape_g = tf.GradientTape(), tf.GradientTape()
            d_loss, g_loss = gan_losses(self, real, tape_d, tape_g)
            self.optimizer["discriminator"].minimize(d_loss, self.discriminator.trainable_weights, tape=tape_d)
            self.optimizer["generator"].minimize(g_loss, self.generator.trainable_weights, tape=tape_g)
            return {"g_lr": self.optimizer["generator"].lr}

    keras.utils.set_random_seed(0)
    model = Named(*two_towers())
    model.compile(optimizer={"discriminator": keras.optimizers.Adam(1e-3), "generator": keras.optimizers.Adam(2e-3)})
    history = model.fit(X, batch_size=16, epochs=1, verbose=0).history
    assert history["g_lr"] == [pytest.approx(2e-3)]
    assert float(model.optimizer.lr) == pytest.approx(1e-3)  # the group: its first member's rate
