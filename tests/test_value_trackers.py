"""custom_fit._value_trackers: one batch-size weighted ``Mean`` per logged name, made by ``compile()``."""

from __future__ import annotations

import custom_fit
from custom_fit import keras
from custom_fit._value_trackers import LoggedValues


def test_one_mean_tracker_per_name_and_what_they_add_to_the_metrics():
    trackers = LoggedValues(["d_loss", "g_loss"])
    assert "d_loss" in trackers and "g_loss" in trackers and "loss" not in trackers
    assert isinstance(trackers["d_loss"], keras.metrics.Mean) and trackers["d_loss"].name == "d_loss"
    trackers["d_loss"].update_state(2.0, sample_weight=3)
    trackers["d_loss"].update_state(6.0, sample_weight=1)
    assert float(trackers["d_loss"].result()) == 3.0
    assert trackers.metrics_entries, "the trackers must reach model.metrics (Keras resets them there)"
    assert LoggedValues([]).metrics_entries == []


def test_a_compiled_loss_keeps_loss_in_keras_own_tracker():
    class Logs(custom_fit.CustomModel):
        logged_values = ("loss", "d_loss")

    inputs = keras.Input((3,))
    model = Logs(inputs, keras.layers.Dense(1)(inputs))
    model.compile(optimizer="sgd", loss="mse")
    trackers = LoggedValues.for_model(model)
    assert "d_loss" in trackers and "loss" not in trackers
