"""custom_fit._diagnostics: misuse of a training step found while it is traced, and what to do about it."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import tensorflow as tf

import custom_fit
from custom_fit import keras
from tests import parity

DATA = parity.classification_data()
X, Y = DATA["x"], DATA["y"]


def functional(base=custom_fit.CustomModel):
    inputs = keras.Input((parity.N_FEATURES,))
    return base(inputs, keras.layers.Dense(parity.N_CLASSES, activation="softmax")(inputs))


class PartlyUnused(custom_fit.CustomModel):
    """Has a built layer whose variables never reach the loss."""

    def __init__(self):
        super().__init__()
        self.used = keras.layers.Dense(parity.N_CLASSES, activation="softmax")
        self.unused = keras.layers.Dense(2, name="unused")
        self.unused.build((None, parity.N_FEATURES))

    def call(self, x):
        return self.used(x)


def test_variables_without_gradient_warn_once_and_stay_unchanged():
    model = PartlyUnused()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    model(X[:1])
    unused_before = [np.array(w) for w in model.unused.get_weights()]
    used_before = [np.array(w) for w in model.used.get_weights()]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(X, Y, batch_size=16, epochs=3, verbose=0)  # partial last batch: traced twice
    ours = [w for w in caught if issubclass(w.category, custom_fit.MissingGradientWarning)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    # Keras' own per-trace warning ("Gradients do not exist for variables ...") must not come too
    # (Keras 3.12 with NumPy 2 also emits an unrelated DeprecationWarning of its own here).
    others = [str(w.message) for w in caught if w not in ours and "gradient" in str(w.message).lower()]
    assert others == [], "Keras' own per-trace warning must not be emitted as well"
    message = str(ours[0].message)
    assert "2 of 4 variables passed to minimize() got no gradient" in message
    assert "unused/kernel" in message and "unused/bias" in message and "Fix:" in message
    assert parity.max_delta(unused_before, model.unused.get_weights()) == 0.0
    assert parity.max_delta(used_before, model.used.get_weights()) > 0.0
    counters = 1 if custom_fit.KERAS_2 else 2  # iterations (and learning_rate on Keras 3)
    assert len(model.optimizer.variables) == counters + 2 * 4, "optimizer state covers every variable"


def test_no_variable_with_a_gradient_is_an_error():
    class Detached(custom_fit.CustomModel):
        def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
            return tf.constant(1.0)

    model = functional(Detached)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    with pytest.raises(
        ValueError, match=r"none of the 2 variables has a gradient. Expected a loss computed from these variables.*Fix:"
    ):
        model.fit(X, Y, verbose=0)


def test_missing_targets_say_how_to_fix():
    model = functional()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    with pytest.raises(
        ValueError,
        match=(
            r"compiled with loss='sparse_categorical_crossentropy', which needs targets: expected "
            r"batches of \(x, y\).*received batches with inputs only. Fix: pass `y`"
        ),
    ):
        model.fit(X, verbose=0)
    with pytest.raises(ValueError, match="which needs targets"):
        model.evaluate(tf.data.Dataset.from_tensor_slices(X).batch(8), verbose=0)


def test_minimize_with_no_variables_warns():
    class Empty(custom_fit.CustomModel):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = self.compute_loss(x, y, self(x))
            self.minimize(loss, tape, [])
            return {"loss": loss}

    model = functional(Empty)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    with pytest.warns(
        UserWarning,
        match=r"minimize\(\) received no variables to update, so nothing is trained. Expected trainable variables",
    ):
        model.fit(X, Y, epochs=1, verbose=0)


def test_fit_without_any_loss_says_no_loss_was_found():
    """Fails on 7a9ee83 (Keras 2): TypeError from tape.gradient(None); tf_keras.Model raises "No loss found"."""
    model = custom_fit.CustomSequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.compile("sgd")
    x = np.ones((10, 1), "float32")
    if custom_fit.KERAS_2:  # Keras 2's compute_loss returns None: the same error type and first words as tf_keras
        with pytest.raises(ValueError, match=r"No loss found\. CustomSequential\.minimize\(\) received loss=None.*Fix"):
            model.fit(x, x, epochs=1, verbose=0)
        plain = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        plain.compile("sgd")
        with pytest.raises(ValueError, match="No loss found"):
            plain.fit(x, x, epochs=1, verbose=0)
    else:  # Keras 3's own compute_loss raises first, as for keras.Model
        with pytest.raises(ValueError, match="No loss to compute"):
            model.fit(x, x, epochs=1, verbose=0)


def test_minimize_with_a_loss_of_none_says_so():
    class NoLoss(custom_fit.CustomModel):
        def train_step(self, data):
            with tf.GradientTape() as tape:
                self(data[0], training=True)
            self.minimize(None, tape, self.trainable_variables)
            return {}

    model = functional(NoLoss)
    model.compile("sgd")
    with pytest.raises(ValueError, match=r"No loss found\. NoLoss\.minimize\(\) received loss=None"):
        model.fit(X, Y, epochs=1, verbose=0)
