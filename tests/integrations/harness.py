"""What the integration suites share: one model, its data, and a run with each base class.

Each suite trains the same model twice, once on ``keras.Model`` and once on
``custom_fit.CustomModel``, with a real tool attached the way its documentation
attaches it, and compares what the tool recorded. ``keras.backend.clear_session()``
before each build gives both runs the same layer and optimizer names (tools log
them), and the same seed gives them the same weights.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import custom_fit
from custom_fit import keras
from tests import parity

DATA = parity.classification_data()

#: The two bases each suite compares, by the name the records are kept under.
BASES: dict[str, type] = {"keras.Model": keras.Model, "CustomModel": custom_fit.CustomModel}


def build(base: type, **compile_kwargs: Any) -> Any:
    """A small classifier on ``base`` (the functional API), compiled as keras.io examples compile."""
    keras.backend.clear_session()
    keras.utils.set_random_seed(1)
    inputs = keras.Input((parity.N_FEATURES,))
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    model = base(inputs, keras.layers.Dense(parity.N_CLASSES, activation="softmax")(hidden))
    options = {"optimizer": "adam", "loss": "sparse_categorical_crossentropy", "metrics": ["accuracy"]}
    model.compile(**{**options, **compile_kwargs})
    return model


def fit(model: Any, **kwargs: Any) -> Any:
    """``model.fit`` on the training data, quiet, batches of 16, unless ``kwargs`` say otherwise."""
    return model.fit(DATA["x"], DATA["y"], **{"batch_size": 16, "verbose": 0, **kwargs})


def for_both(run: Callable[[type], Any]) -> dict[str, Any]:
    """``{base name: run(base)}`` for ``keras.Model``, then ``CustomModel``."""
    return {name: run(base) for name, base in BASES.items()}
