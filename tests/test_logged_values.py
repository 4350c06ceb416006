"""custom_fit._logged_values: values a custom step reports, tracked as batch-weighted epoch means."""

from __future__ import annotations

import pytest

import custom_fit
from custom_fit import keras
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
