"""Callbacks see what they see with keras.Model, and nothing makes the host wait per step (Keras 3)."""

from __future__ import annotations

import contextlib
import io
import json
import re

import numpy as np
import pytest
import tensorflow as tf

import custom_fit
from custom_fit import keras
from custom_fit._trainer.callbacks import LazyLogs
from tests import parity

pytestmark = pytest.mark.keras3  # Keras 2's CallbackList skips unused hooks and passes tensors itself

DATA = parity.classification_data()


def train(base, verbose=0, callbacks=(), epochs=2, x=DATA["x"], **fit_kwargs):
    keras.utils.set_random_seed(1)
    inputs = keras.Input((parity.N_FEATURES,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    model = base(inputs, keras.layers.Dense(parity.N_CLASSES, activation="softmax")(hidden))
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        history = model.fit(
            x, DATA["y"], batch_size=16, epochs=epochs, verbose=verbose, callbacks=list(callbacks),
            validation_data=(DATA["x_val"], DATA["y_val"]), **fit_kwargs,
        )  # fmt: skip
    return model, history.history, output.getvalue()


class KeepsBatchLogs(keras.callbacks.Callback):
    """Keeps each training batch's logs object and reads the keys in ``reads`` from it."""

    def __init__(self, reads=()):
        super().__init__()
        self.reads, self.logs, self.seen = reads, [], []

    def on_train_batch_end(self, batch, logs=None):
        self.logs.append(logs)
        self.seen += [logs[key] for key in self.reads]

    def converted(self):
        """The keys of each batch's logs whose values became Python numbers (a tensor is left alone)."""
        return [sorted(k for k, v in logs.raw().items() if isinstance(v, float)) for logs in self.logs]


def test_no_log_value_is_read_per_step_when_no_callback_needs_it():
    kept = KeepsBatchLogs()
    train(custom_fit.CustomModel, verbose=0, callbacks=[keras.callbacks.EarlyStopping(patience=5), kept])
    assert len(kept.logs) == 2 * 7 and all(
        isinstance(logs, custom_fit._trainer.callbacks.LazyLogs) for logs in kept.logs
    )
    assert kept.converted() == [[]] * len(kept.logs), "batch logs were converted although no callback reads them"


def test_a_callback_that_reads_one_value_converts_that_value_only():
    kept = KeepsBatchLogs(reads=["loss"])
    train(custom_fit.CustomModel, callbacks=[kept])
    assert len(kept.seen) == 2 * 7 and all(isinstance(v, float) for v in kept.seen)
    assert kept.converted() == [["loss"]] * len(kept.logs)


def test_callbacks_reading_batch_logs_see_every_value_of_keras_model():
    recorders = {base: parity.BatchLogRecorder() for base in (keras.Model, custom_fit.CustomModel)}
    results = {base: train(base, callbacks=[recorder]) for base, recorder in recorders.items()}
    reference, candidate = recorders[keras.Model].logs, recorders[custom_fit.CustomModel].logs
    assert len(candidate) == len(reference) == 2 * (7 + 2)
    assert parity.max_delta(reference, candidate) == 0.0
    assert results[keras.Model][1] == results[custom_fit.CustomModel][1]


def test_terminate_on_nan_stops_at_the_same_step():
    # A NaN sample weight makes the loss of the batch holding sample 40 NaN, on every CPU. (A NaN
    # input does not: where TensorFlow fuses Dense + ReLU with oneDNN, the fused ReLU maps NaN to 0.)
    sample_weight = np.ones(len(DATA["x"]), "float32")
    sample_weight[40] = np.nan
    stops = {}
    for base in (keras.Model, custom_fit.CustomModel):
        recorder = parity.BatchLogRecorder()
        callbacks = [recorder, keras.callbacks.TerminateOnNaN()]
        _, history, _ = train(base, callbacks=callbacks, sample_weight=sample_weight, shuffle=False)
        stops[base] = ([b for kind, b, _ in recorder.logs if kind == "train"], history)
    assert stops[custom_fit.CustomModel][0] == stops[keras.Model][0] == [0, 1, 2]  # batch 2: samples 32-47
    assert parity.max_delta(stops[keras.Model][1], stops[custom_fit.CustomModel][1]) == 0.0


def final_lines(output: str) -> list[str]:
    """What a terminal shows at the end: the last redraw of each line, timings blanked."""
    output = re.sub(r"\d+(ms|s|us)(/step)?", "T", output)
    return [line.split("\r")[-1].rstrip() for line in output.split("\n")]


@pytest.mark.parametrize("verbose", [1, 2])
def test_progress_bar_shows_what_keras_shows(verbose):
    _, _, plain = train(keras.Model, verbose=verbose)
    _, _, custom = train(custom_fit.CustomModel, verbose=verbose)
    assert final_lines(custom) == final_lines(plain)
    assert "Epoch 2/2" in custom and "val_loss" in custom


def test_evaluate_progress_bar_and_results_match():
    model, _, _ = train(custom_fit.CustomModel)
    reference, _, _ = train(keras.Model)
    outputs = []
    for m in (reference, model):
        output = io.StringIO()
        with contextlib.redirect_stdout(output):
            result = m.evaluate(DATA["x_val"], DATA["y_val"], batch_size=8, verbose=1, return_dict=True)
        outputs.append((result, final_lines(output.getvalue())))
    assert outputs[0] == outputs[1]


def test_a_callback_list_given_by_the_user_is_used_as_it_is():
    recorder = parity.BatchLogRecorder()
    model, _, _ = train(custom_fit.CustomModel, callbacks=(), epochs=1)
    callbacks = keras.callbacks.CallbackList([recorder], add_history=True, model=model, epochs=1, steps=7, verbose=0)
    model.fit(DATA["x"], DATA["y"], batch_size=16, epochs=1, verbose=0, callbacks=callbacks)
    assert len(recorder.logs) == 7 and type(callbacks) is keras.callbacks.CallbackList


def test_lazy_logs_behave_like_the_dict_keras_would_pass():
    tensors = {"loss": tf.constant(0.25), "nested": {"mae": tf.constant(2.0)}, "text": "kept"}
    assert tf.is_tensor(LazyLogs(tensors).raw()["loss"]), "raw() keeps what the step returned"
    logs = LazyLogs(tensors)
    expected = {"loss": 0.25, "mae": 2.0, "text": "kept"}  # flattened, sorted, Python numbers
    assert isinstance(logs, dict) and list(logs) == ["loss", "mae", "text"]
    assert dict(logs) == {**logs} == logs.copy() == expected and logs == expected
    assert json.loads(json.dumps(logs)) == expected
    assert logs.get("mae") == 2.0 and logs.get("absent", 7) == 7 and "loss" in logs
    assert list(logs.items()) == list(expected.items()) and logs.values() == list(expected.values())
    logs["learning_rate"] = 0.1  # callbacks add entries (LR callbacks do at epoch end)
    assert logs.pop("learning_rate") == 0.1 and logs.pop("absent", None) is None
