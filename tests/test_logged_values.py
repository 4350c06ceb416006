"""custom_fit._logged_values: values a custom step reports, tracked as batch-weighted epoch means."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import custom_fit
from custom_fit import keras
from custom_fit._logged_values import flattened_logs, trackers_of
from tests import parity

DATA = parity.classification_data()
X, Y = DATA["x"], DATA["y"]


def functional(base=custom_fit.CustomModel):
    inputs = keras.Input((parity.N_FEATURES,))
    return base(inputs, keras.layers.Dense(parity.N_CLASSES, activation="softmax")(inputs))


def test_log_values_needs_compile():
    class Logs(custom_fit.CustomModel):
        logged_values = ("d_loss",)

    model = functional(Logs)
    with pytest.raises(
        ValueError,
        match=(
            r"log_values\(\) needs a compiled model: expected `compile\(\)` to have created trackers "
            r"for \['d_loss'\].*Fix: call `model.compile"
        ),
    ):
        model.log_values(X, d_loss=1.0)


class TwoLosses(custom_fit.CustomModel):
    logged_values = ("d_loss", "g_loss")


def test_logged_values_are_batch_size_weighted_means():
    model = functional(TwoLosses)
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    model.log_values(np.zeros((2, parity.N_FEATURES), "float32"), d_loss=1.0, g_loss=4.0)
    model.log_values(6, d_loss=3.0)  # a batch given by its size
    trackers = trackers_of(model)
    assert float(trackers["d_loss"].result()) == (2 * 1.0 + 6 * 3.0) / 8
    assert float(trackers["g_loss"].result()) == 4.0


def test_log_values_refuses_a_name_the_model_does_not_declare():
    model = functional(TwoLosses)
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    with pytest.raises(ValueError, match=r"log_values\(\) received 'kl_loss', which is not in .*Fix: add 'kl_loss'"):
        model.log_values(4, kl_loss=1.0)


def test_flattened_logs_lifts_nested_dicts_into_the_logs():
    logs = {"loss": 1.0, "compile_metrics": {"accuracy": 0.5, "mae": 2.0}}
    assert flattened_logs(logs) == {"loss": 1.0, "accuracy": 0.5, "mae": 2.0}
    assert flattened_logs([1.0]) == [1.0]  # not a dict: as it is


@pytest.mark.keras3
def test_get_metrics_result_leaves_out_compiled_metrics_no_step_updated():
    """A step that updates no compiled metric: Keras 3's get_metrics_result raises, CustomModel's leaves it out."""

    def own_step(base: Any) -> Any:
        class OwnStep(base):
            def train_step(self, data):
                x, y = data
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean(tf.square(self(x, training=True) - y))
                gradients = tape.gradient(loss, self.trainable_variables)
                self.optimizer.apply_gradients(zip(gradients, self.trainable_variables, strict=True))
                return self.get_metrics_result()

        inputs = keras.Input((2,))
        model = OwnStep(inputs, keras.layers.Dense(1)(inputs))
        model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
        return model

    x, y = np.ones((8, 2), "float32"), np.ones((8, 1), "float32")
    with pytest.raises(ValueError, match=r"Cannot get result\(\) since the metric has not yet been built"):
        own_step(keras.Model).fit(x, y, verbose=0)
    history = own_step(custom_fit.CustomModel).fit(x, y, epochs=2, verbose=0).history
    assert "mae" not in history and len(history["loss"]) == 2
