"""Parity matrix: ``keras.Model`` / ``keras.Sequential`` vs ``CustomModel`` / ``CustomSequential``.

Every case trains from the same seed on 99 samples (a partial last batch) with
validation data and requires exact equality of final weights, history,
per-batch callback logs, ``evaluate`` and ``predict``.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import functools
import pathlib
import tempfile

import numpy as np
import pytest
import tensorflow as tf

import custom_fit
from custom_fit import keras
from tests import parity

DATA = parity.classification_data()
BATCH = 16
EPOCHS = 3


def mlp(base, *, bn_dropout=False, regularized=False, extra_loss=False):
    """A small functional classifier on top of ``base``."""
    inputs = keras.Input((parity.N_FEATURES,))
    reg = (
        dict(kernel_regularizer=keras.regularizers.L2(1e-2), activity_regularizer=keras.regularizers.L1(1e-3))
        if regularized
        else {}
    )
    h = keras.layers.Dense(16, activation="relu", **reg)(inputs)
    if bn_dropout:
        h = keras.layers.BatchNormalization()(h)
        h = keras.layers.Dropout(0.3)(h)
    if extra_loss:
        h = AddsLoss()(h)
    outputs = keras.layers.Dense(parity.N_CLASSES, activation="softmax")(h)
    return base(inputs, outputs)


class AddsLoss(keras.layers.Layer):
    """Calls ``add_loss`` on its activations."""

    def call(self, x):
        self.add_loss(1e-2 * tf.reduce_mean(tf.square(x)))
        return x


def subclassed(base, *, training_arg: bool):
    """A subclassed model with Dropout; its ``call`` takes ``training`` or not."""

    class Layers(base):
        def __init__(self):
            super().__init__()
            self.hidden = keras.layers.Dense(16, activation="relu")
            self.dropout = keras.layers.Dropout(0.3)
            self.out = keras.layers.Dense(parity.N_CLASSES, activation="softmax")

    class Net(Layers):
        def call(self, x, training=None):
            return self.out(self.dropout(self.hidden(x), training=training))

    class NetWithoutTraining(Layers):
        def call(self, x):
            return self.out(self.dropout(self.hidden(x)))

    return Net() if training_arg else NetWithoutTraining()


def two_outputs(base):
    inputs = keras.Input((parity.N_FEATURES,))
    h = keras.layers.Dense(16, activation="relu")(inputs)
    cls = keras.layers.Dense(parity.N_CLASSES, activation="softmax", name="cls")(h)
    reg = keras.layers.Dense(1, name="reg")(h)
    return base(inputs, {"cls": cls, "reg": reg})


CLASSIFY = dict(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
WEIGHTED = dict(CLASSIFY, weighted_metrics=["accuracy"])
CLASS_WEIGHT = {0: 0.5, 1: 2.0, 2: 1.0}


def arrays(**extra):
    """Fit arguments: the NumPy training arrays in batches of 16, with validation data."""

    def factory():
        validation = (DATA["x_val"], DATA["y_val"])
        return (
            dict(x=DATA["x"], y=DATA["y"], batch_size=BATCH, epochs=EPOCHS, shuffle=False, validation_data=validation)
            | extra
        )

    return factory


def validation(**extra):
    return lambda: dict(x=DATA["x_val"], y=DATA["y_val"], batch_size=BATCH) | extra


def datasets():
    train = tf.data.Dataset.from_tensor_slices((DATA["x"], DATA["y"])).batch(BATCH)
    val = tf.data.Dataset.from_tensor_slices((DATA["x_val"], DATA["y_val"])).batch(BATCH)
    return dict(x=train, epochs=EPOCHS, class_weight=CLASS_WEIGHT, shuffle=False, validation_data=val)


# Removed when the test process exits.
CALLBACK_FILES = tempfile.TemporaryDirectory(prefix="custom_fit_parity_")


def with_callbacks():
    """Fit arguments with the common callbacks, writing into a fresh directory."""
    out = pathlib.Path(tempfile.mkdtemp(dir=CALLBACK_FILES.name))
    callbacks = [
        keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr * 0.9),
        keras.callbacks.EarlyStopping(monitor="val_loss", patience=2, min_delta=5e-2),
        keras.callbacks.ModelCheckpoint(
            str(out / "best.weights.h5"), monitor="val_loss", save_best_only=True, save_weights_only=True
        ),
        keras.callbacks.TerminateOnNaN(),
        keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=1, min_delta=1e-2),
        keras.callbacks.CSVLogger(str(out / "log.csv")),
    ]
    return arrays(epochs=6, callbacks=callbacks)()


TWO_OUTPUTS = dict(
    optimizer="adam",
    loss={"cls": "sparse_categorical_crossentropy", "reg": "mse"},
    loss_weights={"cls": 1.0, "reg": 0.3},
    metrics={"cls": ["accuracy"], "reg": ["mae"]},
)


def two_output_targets(split=""):
    return {"cls": DATA["y" + split], "reg": DATA["x" + split][:, :1]}


Case = parity.Case
MODEL_CASES = {
    "base": Case(mlp, arrays(), CLASSIFY, validation()),
    "shuffle+batchnorm+dropout": Case(lambda b: mlp(b, bn_dropout=True), arrays(shuffle=True), CLASSIFY, validation()),
    "subclassed, call(x, training)": Case(lambda b: subclassed(b, training_arg=True), arrays(), CLASSIFY, validation()),
    "subclassed, call(x)": Case(lambda b: subclassed(b, training_arg=False), arrays(), CLASSIFY, validation()),
    "sample_weight + weighted_metrics": Case(
        mlp,
        arrays(sample_weight=DATA["sample_weight"]),
        WEIGHTED,
        validation(sample_weight=DATA["sample_weight"][: parity.N_VAL]),
    ),
    "class_weight (numpy)": Case(mlp, arrays(class_weight=CLASS_WEIGHT), WEIGHTED, validation()),
    "class_weight (tf.data)": Case(mlp, datasets, WEIGHTED, validation()),
    "regularizers + add_loss": Case(
        lambda b: mlp(b, regularized=True, extra_loss=True), arrays(), CLASSIFY, validation()
    ),
    "two outputs, dict losses + loss_weights": Case(
        two_outputs,
        lambda: arrays(y=two_output_targets(), validation_data=(DATA["x_val"], two_output_targets("_val")))(),
        TWO_OUTPUTS,
        lambda: dict(x=DATA["x_val"], y=two_output_targets("_val"), batch_size=BATCH),
    ),
    "steps_per_execution=4": Case(mlp, arrays(), dict(CLASSIFY, steps_per_execution=4), validation()),
    "callbacks": Case(mlp, with_callbacks, CLASSIFY, validation()),
    # tf_keras' Dropout is not deterministic under XLA (keras.Model vs itself:
    # max |delta| weights 0.0127), so on Keras 2 the XLA case has no Dropout.
    "jit_compile=True": Case(
        lambda b: mlp(b, bn_dropout=not custom_fit.KERAS_2),
        arrays(),
        dict(CLASSIFY, jit_compile=True),
        validation(),
        slow=True,
    ),
    "run_eagerly=True": Case(
        lambda b: mlp(b, bn_dropout=True), arrays(), dict(CLASSIFY, run_eagerly=True), validation()
    ),
    "clipnorm": Case(
        mlp, arrays(), dict(CLASSIFY, optimizer=lambda: keras.optimizers.Adam(clipnorm=0.1)), validation()
    ),
    "gradient_accumulation_steps=3 + clipnorm": Case(  # Keras 2 optimizers do not accumulate
        mlp,
        arrays(),
        dict(CLASSIFY, optimizer=lambda: keras.optimizers.Adam(gradient_accumulation_steps=3, clipnorm=0.1)),
        validation(),
        keras3_only=True,
    ),
    "global_clipnorm": Case(
        mlp, arrays(), dict(CLASSIFY, optimizer=lambda: keras.optimizers.SGD(0.5, global_clipnorm=0.05)), validation()
    ),
    "use_ema=True (averages swapped in when fit ends)": Case(
        mlp, arrays(), dict(CLASSIFY, optimizer=lambda: keras.optimizers.Adam(use_ema=True)), validation()
    ),
    "clipvalue": Case(
        mlp, arrays(), dict(CLASSIFY, optimizer=lambda: keras.optimizers.RMSprop(clipvalue=0.01)), validation()
    ),
    "validation_split=0.2": Case(mlp, arrays(validation_data=None, validation_split=0.2), CLASSIFY, validation()),
}


def params(cases: dict[str, parity.Case]) -> list:
    def marks(case: parity.Case) -> list:
        return [
            mark for mark, wanted in ((pytest.mark.keras3, case.keras3_only), (pytest.mark.slow, case.slow)) if wanted
        ]

    return [pytest.param(name, marks=marks(case)) for name, case in cases.items()]


@pytest.mark.parametrize("name", params(MODEL_CASES))
def test_custom_model_matches_keras_model(name, seed):
    parity.compare(f"Model: {name}", MODEL_CASES[name], keras.Model, custom_fit.CustomModel, seed)


def test_callbacks_write_identical_files(seed):
    """CSVLogger and ModelCheckpoint produce the same files for both classes."""
    runs = {}
    for base in (keras.Model, custom_fit.CustomModel):
        fit_args = with_callbacks()
        case = dataclasses.replace(MODEL_CASES["callbacks"], fit=functools.partial(dict, fit_args))
        run = case.train(base, seed)
        csv_logger, checkpoint = fit_args["callbacks"][-1], fit_args["callbacks"][2]
        with open(csv_logger.filename) as f:
            rows = list(csv.reader(f))
        restored = mlp(base)
        restored.load_weights(checkpoint.filepath)
        runs[base] = (run, rows, restored.get_weights())
    (_, rows_ref, best_ref), (run, rows, best) = runs[keras.Model], runs[custom_fit.CustomModel]
    assert len(run.history["loss"]) < 6, "EarlyStopping should have stopped the run early"
    assert "learning_rate" in rows[0] or "lr" in rows[0]  # the LR callbacks' log key (Keras 3 / Keras 2)
    assert rows == rows_ref
    assert parity.max_delta(best_ref, best) == 0.0


def test_on_batch_methods_match(seed):
    """``train_on_batch`` / ``test_on_batch`` / ``predict_on_batch`` equal keras.Model's."""
    results = {}
    for base in (keras.Model, custom_fit.CustomModel):
        keras.utils.set_random_seed(seed)
        model = mlp(base, bn_dropout=True)
        model.compile(**WEIGHTED)
        logs = []
        for start in range(0, parity.N_TRAIN, BATCH):
            batch = slice(start, start + BATCH)
            x, y, weights = DATA["x"][batch], DATA["y"][batch], DATA["sample_weight"][batch]
            logs.append(model.train_on_batch(x, y, sample_weight=weights, return_dict=True))
        class_weight = {0: 1.0, 1: 3.0, 2: 0.5}
        logs.append(
            model.train_on_batch(DATA["x"][:BATCH], DATA["y"][:BATCH], class_weight=class_weight, return_dict=True)
        )
        logs.append(model.test_on_batch(DATA["x_val"], DATA["y_val"], return_dict=True))
        results[base] = (model.get_weights(), logs, model.predict_on_batch(DATA["x_val"]))
    ref, got = results[keras.Model], results[custom_fit.CustomModel]
    deltas = [parity.max_delta(a, b) for a, b in zip(ref, got, strict=True)]
    parity.record("Model: train/test/predict_on_batch", weights=deltas[0], batch_logs=deltas[1], predict=deltas[2])
    assert deltas == [0.0, 0.0, 0.0]


def sequential(base, *, bn_dropout=False):
    layers = [keras.Input((parity.N_FEATURES,)), keras.layers.Dense(16, activation="relu")]
    if bn_dropout:
        layers += [keras.layers.BatchNormalization(), keras.layers.Dropout(0.3)]
    return base([*layers, keras.layers.Dense(parity.N_CLASSES, activation="softmax")])


SEQUENTIAL_CASES = {
    "base": Case(sequential, arrays(), CLASSIFY, validation()),
    "shuffle+batchnorm+dropout": Case(
        lambda b: sequential(b, bn_dropout=True), arrays(shuffle=True), CLASSIFY, validation()
    ),
    "sample_weight + weighted_metrics": Case(
        sequential, arrays(sample_weight=DATA["sample_weight"]), WEIGHTED, validation()
    ),
    "steps_per_execution=4": Case(sequential, arrays(), dict(CLASSIFY, steps_per_execution=4), validation()),
    "callbacks": Case(sequential, with_callbacks, CLASSIFY, validation()),
}


@pytest.mark.parametrize("name", params(SEQUENTIAL_CASES))
def test_custom_sequential_matches_keras_sequential(name, seed):
    parity.compare(f"Sequential: {name}", SEQUENTIAL_CASES[name], keras.Sequential, custom_fit.CustomSequential, seed)


def test_parity_runs_actually_train(seed):
    """Guards the harness: weights move and the loss falls, so equality is not vacuous."""
    run = MODEL_CASES["base"].train(custom_fit.CustomModel, seed)
    keras.utils.set_random_seed(seed)
    initial = mlp(keras.Model).get_weights()
    assert parity.max_delta(initial, run.weights) > 1e-3
    assert run.history["loss"][-1] < run.history["loss"][0]
    assert sorted(run.history) == ["accuracy", "loss", "val_accuracy", "val_loss"]
    assert len([1 for kind, _, _ in run.batch_logs if kind == "train"]) == EPOCHS * 7


def test_mixed_precision_matches_keras_model(seed, mixed_float16):
    """Under mixed_float16 the step scales the loss exactly like keras.Model's."""
    candidate = parity.compare("Model: mixed_float16", MODEL_CASES["base"], keras.Model, custom_fit.CustomModel, seed)
    optimizer = candidate.model.optimizer
    assert candidate.model.compute_dtype == "float16"
    assert isinstance(optimizer, keras.mixed_precision.LossScaleOptimizer)
    assert float(optimizer.loss_scale if custom_fit.KERAS_2 else optimizer.dynamic_scale) > 1


@pytest.mark.keras3
def test_per_output_losses_weigh_batches_as_the_keras_in_use_does():
    """Keras' own difference: 3.16 weighs batches in ``cls_loss``/``reg_loss`` by the traced batch size.

    From Keras 3.16 (keras-team/keras#23179) a step per execution runs on a
    batch fetched before the compiled step, so the step is traced with the
    first batch's static size, and the per-output loss trackers (weighted by
    that static size) weigh a batch of that size by its size and, after a
    batch of another size makes ``reduce_retracing`` relax the shape, that
    batch by 1. Keras 3.8-3.15 fetch inside the compiled step (no static
    size): every batch weighs 1. ``loss`` and the metrics weigh every batch
    by its size on all versions. custom_fit does what the Keras in use does.
    """
    x, y = DATA["x_val"], two_output_targets("_val")  # 30 samples: batches of 16 and 14
    results = {}
    for base in (keras.Model, custom_fit.CustomModel):
        keras.utils.set_random_seed(1)
        model = two_outputs(base)
        model.compile(**TWO_OUTPUTS)
        results[base] = model.evaluate(x, y, batch_size=16, verbose=0, return_dict=True)
    squared_error = (model.predict(x, verbose=0)["reg"] - y["reg"]) ** 2
    batch_means = np.array([squared_error[:16].mean(), squared_error[16:].mean()])
    traced_with_batch_size = tuple(int(p) for p in keras.version().split(".")[:2]) >= (3, 16)
    weights = np.array([16.0, 1.0]) if traced_with_batch_size else np.array([1.0, 1.0])
    assert results[custom_fit.CustomModel] == results[keras.Model]
    assert np.isclose(results[keras.Model]["reg_loss"], np.dot(weights, batch_means) / weights.sum(), rtol=1e-6)


def runs_dry(kind):
    """Fit arguments: 8 batches of 8 of unknown length, ``steps_per_epoch=4``: the third epoch finds no batch."""

    def factory():
        x, y = DATA["x"][:64], DATA["y"][:64]
        if kind == "generator":
            data = ((x[i : i + 8], y[i : i + 8]) for i in range(0, 64, 8))
        else:
            data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8).filter(lambda x, y: True)
        stop = keras.callbacks.EarlyStopping(monitor="loss", patience=0)
        return dict(x=data, epochs=5, steps_per_epoch=4, shuffle=False, callbacks=[stop])

    return factory


@pytest.mark.parametrize("kind", ["tf.data .filter", "generator"])
def test_epoch_without_a_batch_logs_what_keras_model_logs(kind, seed):
    """An epoch that runs no step logs the reset metrics (0.0), not the epoch before's values.

    ``EarlyStopping(monitor="loss", patience=0)`` sees that 0.0 as an improvement,
    so both train on (Keras 3 makes a new iterator for the fourth epoch; Keras 2
    stops when the data runs out).
    """
    case = Case(mlp, runs_dry(kind), CLASSIFY, validation())
    runs = {}
    for base in (keras.Model, custom_fit.CustomModel):
        # Keras 3 warns (UserWarning) when the data runs out; Keras 2 logs it.
        with contextlib.nullcontext() if custom_fit.KERAS_2 else pytest.warns(UserWarning, match="ran out of data"):
            runs[base] = case.train(base, seed)
    expected, got = runs[keras.Model], runs[custom_fit.CustomModel]
    parity.assert_same(f"Model: an epoch without a batch ({kind})", expected, got)
    assert expected.history["loss"][2] == 0.0
    iterations = [int(run.model.optimizer.iterations) for run in (expected, got)]
    assert iterations[0] == iterations[1]
