"""custom_fit._losses: hand-written losses reduced as Keras' own losses are (batch_mean, regularization_loss)."""

from __future__ import annotations

import numpy as np

import custom_fit
from custom_fit import keras

RNG = np.random.default_rng(0)
Y, PRED = RNG.normal(size=(8, 3)).astype("float32"), RNG.normal(size=(8, 3)).astype("float32")


def test_batch_mean_equals_a_keras_loss_on_one_device():
    expected = keras.losses.MeanAbsoluteError()(Y, PRED)
    np.testing.assert_allclose(float(custom_fit.batch_mean(np.abs(Y - PRED))), float(expected), rtol=1e-6)


def test_batch_mean_weighs_samples_as_a_keras_loss_does():
    weights = np.array([0, 1, 2, 3, 0, 1, 2, 3], "float32")
    expected = keras.losses.MeanAbsoluteError()(Y, PRED, sample_weight=weights)
    per_sample = np.abs(Y - PRED).mean(axis=1)
    got = custom_fit.batch_mean(per_sample, weights)
    assert got.dtype == "float32" and got.shape == ()
    np.testing.assert_allclose(float(got), float(expected), rtol=1e-6)


def test_regularization_loss_sums_a_layers_penalties_and_is_zero_without():
    inputs = keras.Input((3,))
    dense = keras.layers.Dense(
        2,
        kernel_regularizer=keras.regularizers.L2(0.5),
        bias_regularizer=keras.regularizers.L1(0.25),
        bias_initializer="ones",
    )
    model = keras.Model(inputs, dense(inputs))
    model(Y[:, :3])
    expected = 0.5 * np.sum(np.square(dense.kernel.numpy())) + 0.25 * 2
    np.testing.assert_allclose(float(custom_fit.regularization_loss(dense)), expected, rtol=1e-6)
    np.testing.assert_allclose(float(custom_fit.regularization_loss(model)), expected, rtol=1e-6)
    assert float(custom_fit.regularization_loss(keras.layers.Dense(2))) == 0.0
