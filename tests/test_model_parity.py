"""Parity matrix: ``keras.Model`` / ``keras.Sequential`` vs ``CustomModel`` / ``CustomSequential``.

Every case trains from the same seed on 99 samples (a partial last batch) with
validation data and requires exact equality of final weights, history,
per-batch callback logs, ``evaluate`` and ``predict``.
"""

from __future__ import annotations

import csv

import pytest
import tensorflow as tf

import custom_fit
from custom_fit import keras
from custom_fit import _compat
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

    class Net(base):
        def __init__(self):
            super().__init__()
            self.hidden = keras.layers.Dense(16, activation="relu")
            self.dropout = keras.layers.Dropout(0.3)
            self.out = keras.layers.Dense(parity.N_CLASSES, activation="softmax")

        if training_arg:

            def call(self, x, training=None):
                return self.out(self.dropout(self.hidden(x), training=training))

        else:

            def call(self, x):
                return self.out(self.dropout(self.hidden(x)))

    return Net()


def two_outputs(base):
    inputs = keras.Input((parity.N_FEATURES,))
    h = keras.layers.Dense(16, activation="relu")(inputs)
    cls = keras.layers.Dense(parity.N_CLASSES, activation="softmax", name="cls")(h)
    reg = keras.layers.Dense(1, name="reg")(h)
    return base(inputs, {"cls": cls, "reg": reg})


CLASSIFY = dict(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])


def arrays(**extra):
    def factory():
        return dict(
            x=DATA["x"],
            y=DATA["y"],
            batch_size=BATCH,
            epochs=EPOCHS,
            shuffle=False,
            validation_data=(DATA["x_val"], DATA["y_val"]),
            **extra,
        )

    return factory


def dataset(batch=BATCH):
    return tf.data.Dataset.from_tensor_slices((DATA["x"], DATA["y"])).batch(batch)


def callbacks_case(tmp_path_factory):
    def factory():
        out = tmp_path_factory.mktemp("cb")
        return dict(
            x=DATA["x"],
            y=DATA["y"],
            batch_size=BATCH,
            epochs=6,
            shuffle=False,
            validation_data=(DATA["x_val"], DATA["y_val"]),
            callbacks=[
                keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr * 0.9),
                keras.callbacks.EarlyStopping(monitor="val_loss", patience=2, min_delta=5e-2),
                keras.callbacks.ModelCheckpoint(
                    str(out / "best.weights.h5"), monitor="val_loss", save_best_only=True, save_weights_only=True
                ),
                keras.callbacks.TerminateOnNaN(),
                keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=1, min_delta=1e-2),
                keras.callbacks.CSVLogger(str(out / "log.csv")),
            ],
        )

    return factory


# name -> (build, compile kwargs, fit-args factory, eval-args factory)
def cases(tmp_path_factory):
    val = lambda: dict(x=DATA["x_val"], y=DATA["y_val"], batch_size=BATCH)  # noqa: E731
    class_weight = {0: 0.5, 1: 2.0, 2: 1.0}
    return {
        "base": (mlp, CLASSIFY, arrays(), val),
        "shuffle+batchnorm+dropout": (
            lambda b: mlp(b, bn_dropout=True),
            CLASSIFY,
            lambda: {**arrays()(), "shuffle": True},
            val,
        ),
        "subclassed, call(x, training)": (lambda b: subclassed(b, training_arg=True), CLASSIFY, arrays(), val),
        "subclassed, call(x)": (lambda b: subclassed(b, training_arg=False), CLASSIFY, arrays(), val),
        "sample_weight + weighted_metrics": (
            mlp,
            dict(CLASSIFY, weighted_metrics=["accuracy"]),
            arrays(sample_weight=DATA["sample_weight"]),
            lambda: dict(val(), sample_weight=DATA["sample_weight"][: parity.N_VAL]),
        ),
        "class_weight (numpy)": (
            mlp,
            dict(CLASSIFY, weighted_metrics=["accuracy"]),
            arrays(class_weight=class_weight),
            val,
        ),
        "class_weight (tf.data)": (
            mlp,
            dict(CLASSIFY, weighted_metrics=["accuracy"]),
            lambda: dict(
                x=dataset(),
                epochs=EPOCHS,
                class_weight=class_weight,
                shuffle=False,
                validation_data=tf.data.Dataset.from_tensor_slices((DATA["x_val"], DATA["y_val"])).batch(BATCH),
            ),
            val,
        ),
        "regularizers + add_loss": (lambda b: mlp(b, regularized=True, extra_loss=True), CLASSIFY, arrays(), val),
        "two outputs, dict losses + loss_weights": (
            two_outputs,
            dict(
                optimizer="adam",
                loss={"cls": "sparse_categorical_crossentropy", "reg": "mse"},
                loss_weights={"cls": 1.0, "reg": 0.3},
                metrics={"cls": ["accuracy"], "reg": ["mae"]},
            ),
            lambda: dict(
                x=DATA["x"],
                y={"cls": DATA["y"], "reg": DATA["x"][:, :1]},
                batch_size=BATCH,
                epochs=EPOCHS,
                shuffle=False,
                validation_data=(DATA["x_val"], {"cls": DATA["y_val"], "reg": DATA["x_val"][:, :1]}),
            ),
            lambda: dict(x=DATA["x_val"], y={"cls": DATA["y_val"], "reg": DATA["x_val"][:, :1]}, batch_size=BATCH),
        ),
        "steps_per_execution=4": (mlp, dict(CLASSIFY, steps_per_execution=4), arrays(), val),
        "callbacks": (mlp, CLASSIFY, callbacks_case(tmp_path_factory), val),
        # tf_keras' Dropout is not deterministic under XLA (keras.Model vs itself:
        # max |delta| weights 0.0127), so on Keras 2 the XLA case has no Dropout.
        "jit_compile=True": (
            lambda b: mlp(b, bn_dropout=not _compat.KERAS_2),
            dict(CLASSIFY, jit_compile=True),
            arrays(),
            val,
        ),
        "run_eagerly=True": (lambda b: mlp(b, bn_dropout=True), dict(CLASSIFY, run_eagerly=True), arrays(), val),
        "clipnorm": (mlp, dict(CLASSIFY, optimizer=keras.optimizers.Adam(clipnorm=0.1)), arrays(), val),
        "gradient_accumulation_steps=3 + clipnorm": (
            mlp,
            dict(CLASSIFY, optimizer=lambda: keras.optimizers.Adam(gradient_accumulation_steps=3, clipnorm=0.1)),
            arrays(),
            val,
        ),
        "global_clipnorm": (
            mlp,
            dict(CLASSIFY, optimizer=keras.optimizers.SGD(0.5, global_clipnorm=0.05)),
            arrays(),
            val,
        ),
        "clipvalue": (mlp, dict(CLASSIFY, optimizer=keras.optimizers.RMSprop(clipvalue=0.01)), arrays(), val),
        "validation_split=0.2": (
            mlp,
            CLASSIFY,
            lambda: dict(
                x=DATA["x"], y=DATA["y"], batch_size=BATCH, epochs=EPOCHS, shuffle=False, validation_split=0.2
            ),
            val,
        ),
    }


KERAS3_ONLY = {"gradient_accumulation_steps=3 + clipnorm"}  # Keras 2 optimizers do not accumulate
CASE_NAMES = [pytest.param(name, marks=pytest.mark.keras3) if name in KERAS3_ONLY else name for name in cases(None)]


@pytest.mark.parametrize("case", CASE_NAMES)
def test_custom_model_matches_keras_model(case, seed, tmp_path_factory):
    build, compile_kwargs, fit_args, eval_args = cases(tmp_path_factory)[case]
    if isinstance(compile_kwargs["optimizer"], keras.optimizers.Optimizer):  # one instance per run
        optimizer = compile_kwargs["optimizer"]
        compile_kwargs = dict(compile_kwargs, optimizer=lambda: optimizer.from_config(optimizer.get_config()))
    reference = parity.train(
        build, keras.Model, seed=seed, compile_kwargs=compile_kwargs, fit_args=fit_args, eval_args=eval_args
    )
    candidate = parity.train(
        build, custom_fit.CustomModel, seed=seed, compile_kwargs=compile_kwargs, fit_args=fit_args, eval_args=eval_args
    )
    assert isinstance(candidate.model, custom_fit.CustomModel)
    parity.assert_same(f"Model: {case}", reference, candidate)


def test_callbacks_write_identical_files(seed, tmp_path_factory):
    """CSVLogger and ModelCheckpoint produce the same files for both classes."""
    build, compile_kwargs, fit_args, eval_args = cases(tmp_path_factory)["callbacks"]
    runs = {}
    for base in (keras.Model, custom_fit.CustomModel):
        kwargs = fit_args()
        run = parity.train(
            build, base, seed=seed, compile_kwargs=compile_kwargs, fit_args=lambda: kwargs, eval_args=eval_args
        )
        csv_path = kwargs["callbacks"][-1].filename
        ckpt_path = kwargs["callbacks"][2].filepath
        with open(csv_path) as f:
            rows = list(csv.reader(f))
        restored = build(base)
        restored.load_weights(ckpt_path)
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
        model.compile(**dict(CLASSIFY, weighted_metrics=["accuracy"]))
        logs = []
        for start in range(0, parity.N_TRAIN, BATCH):
            batch = slice(start, start + BATCH)
            logs.append(
                model.train_on_batch(
                    DATA["x"][batch], DATA["y"][batch], sample_weight=DATA["sample_weight"][batch], return_dict=True
                )
            )
        logs.append(
            model.train_on_batch(
                DATA["x"][:BATCH], DATA["y"][:BATCH], class_weight={0: 1.0, 1: 3.0, 2: 0.5}, return_dict=True
            )
        )
        logs.append(model.test_on_batch(DATA["x_val"], DATA["y_val"], return_dict=True))
        results[base] = (model.get_weights(), logs, model.predict_on_batch(DATA["x_val"]))
    ref, got = results[keras.Model], results[custom_fit.CustomModel]
    deltas = [parity.max_delta(a, b) for a, b in zip(ref, got)]
    parity.record("Model: train/test/predict_on_batch", weights=deltas[0], batch_logs=deltas[1], predict=deltas[2])
    assert deltas == [0.0, 0.0, 0.0]


def sequential(base, *, bn_dropout=False):
    layers = [keras.Input((parity.N_FEATURES,)), keras.layers.Dense(16, activation="relu")]
    if bn_dropout:
        layers += [keras.layers.BatchNormalization(), keras.layers.Dropout(0.3)]
    return base(layers + [keras.layers.Dense(parity.N_CLASSES, activation="softmax")])


SEQUENTIAL_CASES = {
    "base": (sequential, CLASSIFY, arrays()),
    "shuffle+batchnorm+dropout": (
        lambda b: sequential(b, bn_dropout=True),
        CLASSIFY,
        lambda: {**arrays()(), "shuffle": True},
    ),
    "sample_weight + weighted_metrics": (
        sequential,
        dict(CLASSIFY, weighted_metrics=["accuracy"]),
        arrays(sample_weight=DATA["sample_weight"]),
    ),
    "steps_per_execution=4": (sequential, dict(CLASSIFY, steps_per_execution=4), arrays()),
}


@pytest.mark.parametrize("case", [*SEQUENTIAL_CASES, "callbacks"])
def test_custom_sequential_matches_keras_sequential(case, seed, tmp_path_factory):
    if case == "callbacks":
        build, compile_kwargs, fit_args = sequential, CLASSIFY, callbacks_case(tmp_path_factory)
    else:
        build, compile_kwargs, fit_args = SEQUENTIAL_CASES[case]
    val = lambda: dict(x=DATA["x_val"], y=DATA["y_val"], batch_size=BATCH)  # noqa: E731
    reference = parity.train(
        build, keras.Sequential, seed=seed, compile_kwargs=compile_kwargs, fit_args=fit_args, eval_args=val
    )
    candidate = parity.train(
        build, custom_fit.CustomSequential, seed=seed, compile_kwargs=compile_kwargs, fit_args=fit_args, eval_args=val
    )
    assert isinstance(candidate.model, custom_fit.CustomSequential)
    parity.assert_same(f"Sequential: {case}", reference, candidate)


def test_parity_runs_actually_train(seed):
    """Guards the harness: weights move and the loss falls, so equality is not vacuous."""
    val = lambda: dict(x=DATA["x_val"], y=DATA["y_val"])  # noqa: E731
    run = parity.train(
        mlp, custom_fit.CustomModel, seed=seed, compile_kwargs=CLASSIFY, fit_args=arrays(), eval_args=val
    )
    keras.utils.set_random_seed(seed)
    initial = mlp(keras.Model).get_weights()
    assert parity.max_delta(initial, run.weights) > 1e-3
    assert run.history["loss"][-1] < run.history["loss"][0]
    assert sorted(run.history) == ["accuracy", "loss", "val_accuracy", "val_loss"]
    assert len([1 for kind, _, _ in run.batch_logs if kind == "train"]) == EPOCHS * 7


@pytest.fixture
def mixed_float16():
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_mixed_precision_matches_keras_model(seed, mixed_float16):
    """Under mixed_float16 the step scales the loss exactly like keras.Model's."""
    val = lambda: dict(x=DATA["x_val"], y=DATA["y_val"], batch_size=BATCH)  # noqa: E731
    reference = parity.train(mlp, keras.Model, seed=seed, compile_kwargs=CLASSIFY, fit_args=arrays(), eval_args=val)
    candidate = parity.train(
        mlp, custom_fit.CustomModel, seed=seed, compile_kwargs=CLASSIFY, fit_args=arrays(), eval_args=val
    )
    assert candidate.model.compute_dtype == "float16"
    assert isinstance(candidate.model.optimizer, keras.mixed_precision.LossScaleOptimizer)
    scale = lambda optimizer: float(optimizer.loss_scale if _compat.KERAS_2 else optimizer.dynamic_scale)  # noqa: E731
    assert scale(candidate.model.optimizer) == scale(reference.model.optimizer) > 1
    parity.assert_same("Model: mixed_float16", reference, candidate)
