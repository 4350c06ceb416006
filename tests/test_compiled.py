"""Keras-2-style steps (``self.compiled_loss`` / ``self.compiled_metrics``) on both Kerases.

On plain Keras 3 ``keras.Model`` these steps train but report the mean of the
predictions as ``loss`` and warn on every trace; on ``CustomModel`` they must
report exactly what ``keras.Model.fit`` reports, on Keras 3 and on Keras 2
(where the names are Keras' own).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import custom_fit
from custom_fit import keras
from tests import parity

SEED = 1234


# --- Seed 002 (shared/seeds/002_1dcfd687a7e3ece1.txt), unchanged but for its base class ---
class CustomModel(custom_fit.CustomModel):
    def train_step(self, data):
        # Unpack the data. Its structure depends on your model and
        # on what you pass to `fit()`.
        x, y = data

        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)  # Forward pass
            # Compute the loss value
            # (the loss function is configured in `compile()`)
            loss = self.compiled_loss(y, y_pred, regularization_losses=self.losses)

        # Compute gradients
        trainable_vars = self.trainable_variables
        gradients = tape.gradient(loss, trainable_vars)
        # Update weights
        self.optimizer.apply_gradients(zip(gradients, trainable_vars))
        # Update metrics (includes the metric that tracks the loss)
        self.compiled_metrics.update_state(y, y_pred)
        # Return a dict mapping metric names to current value
        return {m.name: m.result() for m in self.metrics}


# --- end of seed code ---


def seed_program(model_class):
    """The seed's usage code, with the model class as a parameter."""
    keras.utils.set_random_seed(SEED)
    # Construct and compile an instance of CustomModel
    inputs = keras.Input(shape=(32,))
    outputs = keras.layers.Dense(1)(inputs)
    model = model_class(inputs, outputs)
    model.compile(optimizer="adam", loss="mse", metrics=["mae"])

    # Just use `fit` as usual
    x = np.random.random((1000, 32))
    y = np.random.random((1000, 1))
    history = model.fit(x, y, epochs=3, verbose=0)
    return model, history.history


def test_seed_step_reports_the_true_loss():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no deprecation warning may be emitted by custom_fit
        # tf_keras <= 2.18 calls random.randint(1, 1e9) (fixed in 2.19): not ours.
        warnings.filterwarnings("ignore", r"non-integer arguments to randrange\(\)", DeprecationWarning)
        model, history = seed_program(CustomModel)
    reference, expected = seed_program(keras.Model)
    assert history == expected
    assert parity.max_delta(model.get_weights(), reference.get_weights()) == 0.0
    parity.record(
        "Keras-2 step: seed 002 code",
        history=parity.max_delta(history, expected),
        weights=parity.max_delta(model.get_weights(), reference.get_weights()),
    )


@pytest.mark.keras3
def test_plain_keras_reports_the_mean_prediction_as_loss():
    """Keeps the upstream problem visible: the same step on keras.Model logs a wrong loss."""

    class PlainSeedModel(keras.Model):
        train_step = CustomModel.train_step

    with pytest.warns(UserWarning, match="deprecated"):
        _, history = seed_program(PlainSeedModel)
    _, expected = seed_program(keras.Model)
    assert history["loss"] != pytest.approx(expected["loss"], rel=1e-3)


class Keras2Step(custom_fit.CustomModel):
    """The Keras 2 guide's step with sample weights, plus its Keras 2 test step."""

    def train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compiled_loss(y, y_pred, sample_weight, regularization_losses=self.losses)
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
        self.compiled_metrics.update_state(y, y_pred, sample_weight)
        return {m.name: m.result() for m in self.metrics}

    def test_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        y_pred = self(x, training=False)
        self.compiled_loss(y, y_pred, sample_weight, regularization_losses=self.losses)
        self.compiled_metrics.update_state(y, y_pred, sample_weight)
        return {m.name: m.result() for m in self.metrics}


DATA = parity.classification_data()


def regularized_mlp(base):
    inputs = keras.Input((parity.N_FEATURES,))
    h = keras.layers.Dense(
        16,
        activation="relu",
        kernel_regularizer=keras.regularizers.L2(0.05),
        activity_regularizer=keras.regularizers.L1(1e-3),
    )(inputs)
    return base(inputs, keras.layers.Dense(parity.N_CLASSES, activation="softmax")(h))


def two_outputs(base):
    inputs = keras.Input((parity.N_FEATURES,))
    h = keras.layers.Dense(16, activation="relu", kernel_regularizer=keras.regularizers.L2(0.01))(inputs)
    cls = keras.layers.Dense(parity.N_CLASSES, activation="softmax", name="cls")(h)
    reg = keras.layers.Dense(1, name="reg")(h)
    return base(inputs, {"cls": cls, "reg": reg})


def targets(n):
    return {
        "cls": DATA["y"][:n] if n == parity.N_TRAIN else DATA["y_val"],
        "reg": (DATA["x"] if n == parity.N_TRAIN else DATA["x_val"])[:, :1],
    }


KERAS2_CASES = {
    "regularizers + sample_weight": parity.Case(
        regularized_mlp,
        fit=lambda: dict(
            x=DATA["x"],
            y=DATA["y"],
            sample_weight=DATA["sample_weight"],
            batch_size=16,
            epochs=3,
            shuffle=False,
            validation_data=(DATA["x_val"], DATA["y_val"]),
        ),
        compile=dict(
            optimizer="adam",
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
            weighted_metrics=["accuracy"],
        ),
        evaluate=lambda: dict(x=DATA["x_val"], y=DATA["y_val"], batch_size=16),
    ),
    "two outputs, dict losses + loss_weights": parity.Case(
        two_outputs,
        fit=lambda: dict(
            x=DATA["x"],
            y=targets(parity.N_TRAIN),
            batch_size=16,
            epochs=3,
            shuffle=False,
            validation_data=(DATA["x_val"], targets(parity.N_VAL)),
        ),
        compile=dict(
            optimizer="adam",
            loss={"cls": "sparse_categorical_crossentropy", "reg": "mse"},
            loss_weights={"cls": 0.7, "reg": 0.3},
            metrics={"cls": ["accuracy"], "reg": ["mae"]},
        ),
        evaluate=lambda: dict(x=DATA["x_val"], y=targets(parity.N_VAL), batch_size=16),
    ),
}


@pytest.mark.keras3
def test_plain_keras_fails_on_two_outputs_with_a_dict_of_losses():
    """Keeps the upstream problem visible: the same step on keras.Model, two outputs with a dict of losses."""

    class PlainKeras2Step(keras.Model):
        train_step = Keras2Step.train_step
        test_step = Keras2Step.test_step

    case = KERAS2_CASES["two outputs, dict losses + loss_weights"]
    with (
        pytest.warns(UserWarning, match="deprecated"),
        pytest.raises(TypeError, match="Expected any non-tensor type, but got a tensor instead"),
    ):
        case.train(PlainKeras2Step, SEED)


@pytest.mark.parametrize("name", list(KERAS2_CASES))
def test_keras2_step_matches_keras_model(name):
    candidate = parity.compare(f"Keras-2 step: {name}", KERAS2_CASES[name], keras.Model, Keras2Step, SEED)
    logs: list[dict] = [candidate.history, *[entry[2] for entry in candidate.batch_logs]]
    for values in logs:
        assert all(isinstance(v, (float, list)) for v in values.values()), "logs must be flat scalars"


def test_regularization_is_counted_once():
    """``regularization_losses=self.losses`` adds the penalties once, like ``compute_loss``."""
    keras.utils.set_random_seed(SEED)
    model = regularized_mlp(Keras2Step)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    x, y = tf.constant(DATA["x"][:16]), tf.constant(DATA["y"][:16])
    y_pred = model(x, training=True)
    expected = model.compute_loss(x, y, y_pred)
    penalties = float(tf.add_n([tf.reduce_sum(loss) for loss in model.losses]))
    assert penalties > 1e-3
    assert float(model.compiled_loss(y, y_pred, regularization_losses=model.losses)) == float(expected)
    unregularized = float(model.compiled_loss(y, y_pred))
    assert unregularized == pytest.approx(float(expected) - penalties, rel=1e-6)


@pytest.mark.keras3  # on Keras 2 these are Keras' own objects
def test_compiled_metrics_view():
    keras.utils.set_random_seed(SEED)
    model = regularized_mlp(custom_fit.CustomModel)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    assert model.compiled_metrics.metrics == [] and model.compiled_metrics.result() == {}
    y_pred = model(DATA["x"])
    model.compiled_metrics.update_state(DATA["y"], y_pred)
    expected = float(keras.metrics.sparse_categorical_accuracy(DATA["y"], y_pred).numpy().mean())
    assert [m.name for m in model.compiled_metrics.metrics] == ["accuracy"]
    assert float(model.compiled_metrics.result()["accuracy"]) == pytest.approx(expected)
    assert [m.name for m in model.compiled_loss.metrics] == ["loss"]
    model.compiled_metrics.reset_state()
    assert float(model.compiled_metrics.result()["accuracy"]) == 0.0


@pytest.mark.keras3
def test_compiled_loss_without_any_loss_says_how_to_fix():
    model = regularized_mlp(custom_fit.CustomModel)
    model.compile(optimizer="adam")
    with pytest.raises(ValueError, match=r"expected a `loss` passed to `compile\(\)`.*received neither.*Fix: call"):
        model.compiled_loss(DATA["y"], model(DATA["x"]))


# --------------------------------------------------------------------------
# What a step returns is what is logged
# --------------------------------------------------------------------------


def denoiser(base: type) -> Any:
    """keras.io's DDPM pattern: a loss compiled, a step that computes and returns its own ``loss``."""

    class Denoiser(base):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.network = keras.Sequential([keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])

        def call(self, x):
            return self.network(x)

        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = self.loss(y, self.network(x, training=True))
            gradients = tape.gradient(loss, self.network.trainable_weights)
            self.optimizer.apply_gradients(zip(gradients, self.network.trainable_weights, strict=True))
            return {"loss": loss}

        def test_step(self, data):
            x, y = data
            return {"loss": self.loss(y, self.network(x))}

    return Denoiser()


DATA = parity.classification_data()
X, Y = DATA["x"], DATA["y"]


class LastBatchLogs(keras.callbacks.Callback):
    """The logs of the last training and test batch, as the step returned them."""

    def on_train_batch_end(self, batch, logs=None):
        self.train = dict(logs)

    def on_test_batch_end(self, batch, logs=None):
        self.test = dict(logs)


def fit_denoiser(base):
    keras.utils.set_random_seed(0)
    model = denoiser(base)
    model.compile(optimizer="adam", loss=keras.losses.MeanSquaredError())
    y = X[:, :1] * 2.0
    last = LastBatchLogs()
    history = model.fit(X, y, batch_size=32, epochs=2, validation_data=(X[:64], y[:64]), callbacks=[last], verbose=0)
    return model, history.history, last, y


def test_a_loss_the_step_returns_is_the_loss_logged():
    """Fails on 7a9ee83 (Keras 3): the history showed the untouched ``loss`` tracker, 0.0."""
    model, history, last, y = fit_denoiser(custom_fit.CustomModel)
    # As on Keras 2, and as for any other returned value: the epoch shows the last batch's value.
    assert history["loss"][-1] == pytest.approx(last.train["loss"], rel=0, abs=0)
    assert history["val_loss"][-1] == pytest.approx(last.test["loss"], rel=0, abs=0)
    assert min(history["loss"] + history["val_loss"]) > 0
    evaluated = model.evaluate(X[:64], y[:64], batch_size=32, callbacks=[last], verbose=0, return_dict=True)
    assert evaluated == {"loss": pytest.approx(last.test["loss"], rel=0, abs=0)}


def test_keras_model_logs_the_same_returned_loss_on_keras_2_and_zero_on_keras_3():
    """Keeps the Keras gap visible: where Keras' value is true, CustomModel's equals it."""
    _, keras_history, _, _ = fit_denoiser(keras.Model)
    _, custom_history, _, _ = fit_denoiser(custom_fit.CustomModel)
    if custom_fit.KERAS_2:
        assert custom_history == keras_history
    else:
        assert keras_history["loss"] == [0.0, 0.0] and keras_history["val_loss"] == [0.0, 0.0]
        assert min(custom_history["loss"]) > 0


@pytest.mark.keras3  # Keras 2 shows what the step returns, always
def test_a_tracker_the_step_updates_is_still_what_is_logged():
    """The step returns ``loss`` and updates Keras' tracker of that name: the epoch shows the tracker's mean."""

    class Tracked(custom_fit.CustomModel):
        logged_values = ("loss",)

        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = self.compute_loss(x, y, self(x, training=True))
            self.minimize(loss, tape, self.trainable_weights)
            self.log_values(x, loss=loss)
            return {"loss": loss * 0.0 + 1e6}  # not what the epoch shows: the tracker is

    keras.utils.set_random_seed(0)
    inputs = keras.Input((parity.N_FEATURES,))
    model = Tracked(inputs, keras.layers.Dense(parity.N_CLASSES, activation="softmax")(inputs))
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    history = model.fit(X, Y, batch_size=32, epochs=1, verbose=0).history
    assert 0 < history["loss"][0] < 1e6
