"""Keras 2's legacy optimizers in CustomModel, as tf_keras.Model takes them (tf_keras only).

``tf_keras.optimizers.legacy.*`` (``OptimizerV2``) and ``tf.compat.v1.train.*Optimizer``
(wrapped by ``compile`` as ``TFOptimizer``): on 7a9ee83 ``fit`` raised "'RMSprop' object has no
attribute 'build'" and ``minimize(..., optimizer=<legacy optimizer>)`` "names no optimizer of this
model". About 105 of tf_keras' own engine tests failed that way with the classes swapped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import custom_fit
from custom_fit import keras
from tests import parity

pytestmark = pytest.mark.keras2

DATA = parity.classification_data()
X, Y = DATA["x"], DATA["y"]

LEGACY: dict[str, Callable[[], Any]] = {
    "legacy.SGD(momentum)": lambda: keras.optimizers.legacy.SGD(0.1, momentum=0.9),
    "legacy.RMSprop": lambda: keras.optimizers.legacy.RMSprop(0.01),
    "legacy.Adam": lambda: keras.optimizers.legacy.Adam(0.01),
    "tf.compat.v1.train.GradientDescentOptimizer": lambda: tf.compat.v1.train.GradientDescentOptimizer(0.1),
    "tf.compat.v1.train.AdamOptimizer": lambda: tf.compat.v1.train.AdamOptimizer(0.01),
}


def classifier(base: type) -> Any:
    inputs = keras.Input((parity.N_FEATURES,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    return base(inputs, keras.layers.Dense(parity.N_CLASSES, activation="softmax", dtype="float32")(hidden))


def trained(base: type, make_optimizer: Callable[[], Any], epochs: int = 2, **fit_kwargs: Any) -> tuple[Any, dict]:
    keras.utils.set_random_seed(0)
    model = classifier(base)
    model.compile(optimizer=make_optimizer(), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    history = model.fit(X, Y, batch_size=16, epochs=epochs, shuffle=False, verbose=0, **fit_kwargs)
    return model, history.history


@pytest.mark.parametrize("name", list(LEGACY))
def test_legacy_optimizers_train_exactly_as_tf_keras_model(name):
    keras_model, keras_history = trained(keras.Model, LEGACY[name])
    custom_model, custom_history = trained(custom_fit.CustomModel, LEGACY[name])
    assert custom_history == keras_history
    assert parity.max_delta(custom_model.get_weights(), keras_model.get_weights()) == 0.0
    assert parity.max_delta(custom_model.predict(X, verbose=0), keras_model.predict(X, verbose=0)) == 0.0


@pytest.mark.parametrize("name", ["legacy.SGD(momentum)", "legacy.Adam"])
def test_legacy_optimizers_are_loss_scaled_exactly_as_tf_keras_model(name, mixed_float16):
    keras_model, keras_history = trained(keras.Model, LEGACY[name])
    custom_model, custom_history = trained(custom_fit.CustomModel, LEGACY[name])
    assert isinstance(custom_model.optimizer, keras.mixed_precision.LossScaleOptimizer)
    assert custom_history == keras_history
    assert parity.max_delta(custom_model.get_weights(), keras_model.get_weights()) == 0.0


@pytest.mark.filterwarnings("ignore:You are saving your model as an HDF5 file")  # saving H5 is the point
def test_legacy_optimizer_state_is_saved_and_restored(tmp_path):
    """A model saved mid-training (H5) and trained on equals one trained straight through."""
    straight, _ = trained(custom_fit.CustomModel, LEGACY["legacy.Adam"], epochs=4)
    first, _ = trained(custom_fit.CustomModel, LEGACY["legacy.Adam"], epochs=2)
    first.save(tmp_path / "half.h5")
    resumed = keras.models.load_model(tmp_path / "half.h5", custom_objects={"CustomModel": custom_fit.CustomModel})
    assert int(resumed.optimizer.iterations) == int(first.optimizer.iterations)
    resumed.fit(X, Y, batch_size=16, epochs=4, initial_epoch=2, shuffle=False, verbose=0)
    assert parity.max_delta(resumed.get_weights(), straight.get_weights()) == 0.0


def test_the_keras_format_keeps_a_legacy_optimizer_as_tf_keras_does(tmp_path):
    """tf_keras' .keras format holds no legacy optimizer state (iterations load as 0): the same here."""
    loaded = {}
    for base in (keras.Model, custom_fit.CustomModel):
        model, _ = trained(base, LEGACY["legacy.Adam"], epochs=1)
        model.save(tmp_path / f"{base.__name__}.keras")
        loaded[base] = keras.models.load_model(tmp_path / f"{base.__name__}.keras")
        np.testing.assert_array_equal(loaded[base].predict(X, verbose=0), model.predict(X, verbose=0))
    assert type(loaded[custom_fit.CustomModel].optimizer) is type(loaded[keras.Model].optimizer)
    assert int(loaded[custom_fit.CustomModel].optimizer.iterations) == int(loaded[keras.Model].optimizer.iterations)


def test_backup_and_restore_resumes_a_legacy_optimizer_exactly(tmp_path):
    straight, _ = trained(custom_fit.CustomModel, LEGACY["legacy.Adam"], epochs=4)

    class StopAfterEpoch(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                raise KeyboardInterrupt  # an interruption after two epochs

    backup = custom_fit.BackupAndRestore(tmp_path / "backup")
    with pytest.raises(KeyboardInterrupt):
        trained(custom_fit.CustomModel, LEGACY["legacy.Adam"], epochs=4, callbacks=[backup, StopAfterEpoch()])
    resumed, _ = trained(custom_fit.CustomModel, LEGACY["legacy.Adam"], epochs=4, callbacks=[backup])
    assert parity.max_delta(resumed.get_weights(), straight.get_weights()) == 0.0


def gan(base: type, named: bool) -> Any:
    """A two-optimizer GAN with legacy optimizers, as attributes (keras.io) or named in compile."""

    class GAN(base):
        def __init__(self):
            super().__init__()
            self.discriminator = keras.Sequential([keras.Input((parity.N_FEATURES,)), keras.layers.Dense(1)])
            self.generator = keras.Sequential([keras.Input((4,)), keras.layers.Dense(parity.N_FEATURES)])

        def compile(self, d_optimizer, g_optimizer):  # keras.io's signature
            if named:
                super().compile(optimizer={"discriminator": d_optimizer, "generator": g_optimizer})
            else:
                super().compile()
                self.d_optimizer, self.g_optimizer = d_optimizer, g_optimizer

        def train_step(self, real):
            noise = tf.sin(real[:, :4])
            with tf.GradientTape() as tape:
                fake = self.generator(noise)
                d_loss = tf.reduce_mean(tf.nn.softplus(-self.discriminator(real))) + tf.reduce_mean(
                    tf.nn.softplus(self.discriminator(fake))
                )
            self.update(d_loss, tape, self.discriminator, "discriminator")
            with tf.GradientTape() as tape:
                g_loss = tf.reduce_mean(tf.nn.softplus(-self.discriminator(self.generator(noise))))
            self.update(g_loss, tape, self.generator, "generator")
            return {"d_loss": d_loss, "g_loss": g_loss}

        def update(self, loss, tape, part, name):
            variables = part.trainable_weights
            if named:
                self.minimize(loss, tape, variables, optimizer=name)
            else:
                optimizer = self.d_optimizer if name == "discriminator" else self.g_optimizer
                optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables, strict=True))

    keras.utils.set_random_seed(0)
    model = GAN()
    model.compile(keras.optimizers.legacy.Adam(1e-3), keras.optimizers.legacy.RMSprop(1e-3))
    return model


def test_a_gan_with_two_legacy_optimizers_trains_as_attributes_and_named(tmp_path):
    """Attribute optimizers equal tf_keras.Model's step; named ones (minimize) equal both."""
    weights = {}
    for base, named in ((keras.Model, False), (custom_fit.CustomModel, False), (custom_fit.CustomModel, True)):
        model = gan(base, named)
        model.fit(X, batch_size=16, epochs=2, shuffle=False, verbose=0)
        weights[(base, named)] = model.get_weights()
    reference = weights[(keras.Model, False)]
    assert parity.max_delta(weights[(custom_fit.CustomModel, False)], reference) == 0.0
    assert parity.max_delta(weights[(custom_fit.CustomModel, True)], reference) == 0.0


def test_minimize_takes_a_legacy_optimizer_instance():
    class OwnOptimizer(custom_fit.CustomModel):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = self.compute_loss(x, y, self(x, training=True))
            self.minimize(loss, tape, self.trainable_variables, optimizer=self.extra)
            return {"loss": loss}

    keras.utils.set_random_seed(0)
    model = classifier(OwnOptimizer)
    model.extra = keras.optimizers.legacy.SGD(0.1)
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    before = model.get_weights()
    model.fit(X, Y, batch_size=16, epochs=1, verbose=0)
    assert int(model.extra.iterations) > 0
    assert parity.max_delta(before, model.get_weights()) > 0
    assert np.all(np.isfinite(model.predict(X, verbose=0)))
