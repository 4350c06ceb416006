"""A tool's wrapper of ``keras.Model.fit`` (``evaluate``, ``predict``) runs for ``CustomModel`` as for ``keras.Model``.

The wrappers here are installed the way experiment trackers install theirs
(MLflow's ``safe_patch``, Comet's ``Entrypoint``: the class attribute replaced by
a function that calls the one it replaced); the real tools are tested in
``tests/integrations/`` (``make test-integrations``).
"""

from __future__ import annotations

import functools
import inspect
import threading
import warnings

import numpy as np
import pytest

import custom_fit
from custom_fit import _tool_wrappers, keras
from tests import parity

DATA = parity.classification_data()


def build(base):
    keras.utils.set_random_seed(1)
    inputs = keras.Input((parity.N_FEATURES,))
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    model = base(inputs, keras.layers.Dense(parity.N_CLASSES, activation="softmax")(hidden))
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


class Recorder(keras.callbacks.Callback):
    """The callback a tracker adds: keeps each epoch's logs."""

    def __init__(self):
        super().__init__()
        self.epochs = []

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append((epoch, dict(logs)))


def tracker(name, seen):
    """A tracker's wrapper of ``keras.Model.<name>``, made as tools make theirs (a closure over the original).

    It records the call as it received it (argument names read from the
    original's signature, as MLflow does), adds a ``Recorder`` to ``fit``'s
    callbacks and records what the original returned.
    """
    original = getattr(keras.Model, name)

    @functools.wraps(original)
    def wrapper(self, *args, **kwargs):
        parameters = list(inspect.signature(original).parameters)
        seen.append(("before", type(self).__name__, parameters, len(args), sorted(kwargs)))
        if name == "fit":
            recorder = Recorder()
            kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), recorder]
            seen.append(("recorder", recorder))
        result = original(self, *args, **kwargs)
        seen.append(("after", type(self).__name__, result))
        return result

    return wrapper


@pytest.fixture
def installed(monkeypatch):
    """Installs tracker wrappers on ``keras.Model``'s methods (``installed("fit")``); the test's end removes them."""
    seen: list[tuple] = []

    def install(*names):
        for name in names:
            monkeypatch.setattr(keras.Model, name, tracker(name, seen))
        return seen

    return install


def events(seen, kind):
    return [event[1:] for event in seen if event[0] == kind]


def test_a_tracker_wrapping_fit_records_custommodel_as_it_records_keras_model(installed):
    seen = installed("fit")
    histories = {}
    for base in (keras.Model, custom_fit.CustomModel):
        model = build(base)
        history = model.fit(DATA["x"], DATA["y"], batch_size=16, epochs=2, verbose=0, validation_split=0.25)
        histories[base] = history.history
    before = events(seen, "before")
    assert [event[0] for event in before] == ["Functional", "CustomModel"]
    assert before[0][1:] == before[1][1:]  # Keras' signature, the call as made (2 positional, 4 by name)
    assert before[1][1][:3] == ["self", "x", "y"] and before[1][2:] == (
        2,
        ["batch_size", "epochs", "validation_split", "verbose"],
    )
    keras_recorder, custom_recorder = (event[0] for event in events(seen, "recorder"))
    assert custom_recorder.epochs == keras_recorder.epochs  # the same logs, bit for bit
    assert [epoch for epoch, _ in custom_recorder.epochs] == [0, 1]
    assert sorted(custom_recorder.epochs[0][1]) == ["accuracy", "loss", "val_accuracy", "val_loss"]
    after = events(seen, "after")
    assert after[1][1].history == histories[custom_fit.CustomModel] == histories[keras.Model] == after[0][1].history
    assert keras.Model.fit is not custom_fit.CustomModel.fit  # nothing was swapped back and forth


def test_evaluate_and_predict_wrappers_run_too_and_fits_validation_goes_through_evaluates(installed):
    seen = installed("evaluate", "predict")
    results = {}
    for base in (keras.Model, custom_fit.CustomModel):
        model = build(base)
        model.fit(
            DATA["x"], DATA["y"], batch_size=16, epochs=2, verbose=0, validation_data=(DATA["x_val"], DATA["y_val"])
        )
        results[base] = (
            model.evaluate(DATA["x_val"], DATA["y_val"], verbose=0),
            model.predict(DATA["x_val"], verbose=0),
        )
    before = events(seen, "before")
    assert len(before) == 2 * (2 + 2)  # per model: 2 validation runs through evaluate, then evaluate and predict
    assert [event[1:] for event in before[:4]] == [event[1:] for event in before[4:]]
    assert results[keras.Model][0] == results[custom_fit.CustomModel][0]
    np.testing.assert_array_equal(results[keras.Model][1], results[custom_fit.CustomModel][1])


def test_two_stacked_wrappers_both_run_outermost_first(monkeypatch):
    order = []

    def stack(label):
        original = keras.Model.fit

        @functools.wraps(original)
        def wrapper(self, *args, **kwargs):
            order.append(label)
            return original(self, *args, **kwargs)

        monkeypatch.setattr(keras.Model, "fit", wrapper)

    stack("first installed")
    stack("second installed")
    for base in (keras.Model, custom_fit.CustomModel):
        build(base).fit(DATA["x"], DATA["y"], epochs=1, verbose=0)
    assert order == ["second installed", "first installed"] * 2


def test_a_wrapper_that_cannot_run_is_named_in_one_warning_per_fit(monkeypatch):
    """A wrapper that reaches Keras' method other than through a closure (a class attribute): not run, and named."""

    class Profiler:
        calls = 0
        original = staticmethod(keras.Model.fit)

        @staticmethod
        def fit(self, *args, **kwargs):
            Profiler.calls += 1
            return Profiler.original(self, *args, **kwargs)

    monkeypatch.setattr(keras.Model, "fit", Profiler.fit)
    model = build(custom_fit.CustomModel)
    for _ in range(2):
        with pytest.warns(custom_fit.UnappliedWrapperWarning) as caught:
            model.fit(DATA["x"], DATA["y"], epochs=2, verbose=0, validation_split=0.25)
        assert len(caught) == 1  # one per fit call, not one per validation run
        message = str(caught[0].message)
        assert f"wrapped by {__name__}.{Profiler.fit.__qualname__} (a tool that hooks Keras" in message
        assert "could not run that wrapper around CustomModel.fit of model" in message
        assert "Fix: pass the tool's Keras callback to fit(callbacks=[...])" in message
        assert caught[0].filename == __file__  # points at the fit call
    assert Profiler.calls == 0
    assert model.history.history["loss"]  # it trained


def test_fit_warns_for_an_evaluate_wrapper_its_validation_cannot_run(monkeypatch):
    original = keras.Model.evaluate

    class Hook:
        def __call__(self, model, *args, **kwargs):
            return original(model, *args, **kwargs)

    monkeypatch.setattr(keras.Model, "evaluate", Hook())
    model = build(custom_fit.CustomModel)
    with pytest.warns(custom_fit.UnappliedWrapperWarning, match="keras.Model.evaluate is wrapped by ") as caught:
        model.fit(DATA["x"], DATA["y"], epochs=3, verbose=0, validation_split=0.25)
    assert len(caught) == 1 and "received Hook" in str(caught[0].message)
    with pytest.warns(custom_fit.UnappliedWrapperWarning, match=r"to evaluate\(callbacks=\[\.\.\.\]\)"):
        model.evaluate(DATA["x"], DATA["y"], verbose=0)


def test_no_wrapper_no_work(monkeypatch):
    """With Keras' own methods in place (no tool), the loop runs its method directly: nothing made, nothing warned."""
    monkeypatch.setattr(_tool_wrappers, "_COPIES", {})
    model = build(custom_fit.CustomModel)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.fit(DATA["x"], DATA["y"], epochs=1, verbose=0)
        model.predict(DATA["x"], verbose=0)
    assert _tool_wrappers._COPIES == {}
    assert _tool_wrappers.wrapper_around(model, "fit") is None


def test_the_copy_is_made_once_per_installed_wrapper_and_the_tools_objects_stay_as_they_are(installed):
    seen = installed("fit")
    wrapper = keras.Model.fit
    cells = [cell.cell_contents for cell in wrapper.__closure__]
    model = build(custom_fit.CustomModel)
    model.fit(DATA["x"], DATA["y"], epochs=1, verbose=0)
    first = _tool_wrappers.wrapper_around(model, "fit")
    model.fit(DATA["x"], DATA["y"], epochs=1, verbose=0)
    assert _tool_wrappers.wrapper_around(model, "fit") is first is not wrapper
    assert first.__code__ is wrapper.__code__ and first.__wrapped__ is wrapper.__wrapped__  # the tool's own code
    assert [cell.cell_contents for cell in wrapper.__closure__] == cells  # the tool's wrapper is untouched
    assert keras.Model.fit is wrapper
    assert len(events(seen, "before")) == 2


def test_another_thread_and_another_model_see_keras_and_the_tool_unchanged_while_fit_runs(installed):
    """No attribute is replaced for the duration of a call: a second model trained meanwhile in another thread
    goes through the same wrapper, and both train as they train alone."""
    seen = installed("fit")
    wrapper = keras.Model.fit
    observed = []
    alone = build(custom_fit.CustomModel).fit(DATA["x"], DATA["y"], epochs=2, verbose=0).history

    class Meanwhile(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            observed.append((keras.Model.fit is wrapper, custom_fit.CustomModel.fit.__name__))
            if epoch == 0:
                worker = threading.Thread(
                    target=lambda: other.append(build(keras.Model).fit(DATA["x"], DATA["y"], epochs=2, verbose=0))
                )
                worker.start()
                worker.join()

    other: list = []
    history = build(custom_fit.CustomModel).fit(DATA["x"], DATA["y"], epochs=2, verbose=0, callbacks=[Meanwhile()])
    assert observed == [(True, "fit"), (True, "fit")]
    assert history.history == alone == other[0].history
    assert [event[0] for event in events(seen, "before")] == ["CustomModel", "CustomModel", "Functional"]


@pytest.mark.parametrize("name", ["fit", "evaluate", "predict"])
def test_keras_own_methods_are_recognised_and_wrappers_are_not(name):
    own = getattr(keras.Model, name)
    assert _tool_wrappers.is_keras_function(own, name)
    assert not _tool_wrappers.is_keras_function(functools.wraps(own)(lambda *a, **k: None), name)
    assert not _tool_wrappers.is_keras_function(own, "something_else")


#: Keras 2 in a TF1 graph, in a process of its own: tf_keras swaps ``training_v1.Model`` into the bases of the
#: classes it builds there (``swap_class``), which would leak into the tests that run after it in a worker.
TF1_GRAPH_SCRIPT = """
import functools, json, warnings
import tensorflow as tf
import custom_fit
from custom_fit import keras
from tests.test_tool_wrappers import DATA, build

warnings.simplefilter("error", custom_fit.UnappliedWrapperWarning)  # the wrapper is not custom_fit's to run here
seen = []
original = keras.Model.fit

@functools.wraps(original)
def wrapper(self, *args, **kwargs):
    seen.append(type(self).__name__)
    return original(self, *args, **kwargs)

keras.Model.fit = wrapper
losses = []
for base in (keras.Model, custom_fit.CustomModel):
    with tf.Graph().as_default():
        losses.append(len(build(base).fit(DATA["x"], DATA["y"], batch_size=16, epochs=2, verbose=0).history["loss"]))
print(json.dumps({"seen": seen, "epochs": losses}))
"""


@pytest.mark.keras2
def test_keras_2_in_a_tf1_graph_the_v1_engine_runs_for_both_bases_as_tf_keras_decides():
    """In a TF1 graph tf_keras makes a model a ``training_v1.Model``, whose own ``fit`` comes before
    ``tf_keras.Model.fit`` and its wrapper; custom_fit hands such calls to that engine: the same for both bases."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(
        [sys.executable, "-c", TF1_GRAPH_SCRIPT], capture_output=True, text=True, cwd=root, env=env, timeout=300,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {"seen": [], "epochs": [2, 2]}


def test_custom_fits_own_method_on_keras_model_is_no_tool(monkeypatch):
    """Code that makes CustomModel's methods Keras' own (tf_keras' tests run with CustomModel swapped in) installs
    no wrapper: nothing to run, nothing to warn about."""
    monkeypatch.setattr(keras.Model, "fit", custom_fit.CustomModel.fit)
    model = build(custom_fit.CustomModel)
    assert _tool_wrappers.wrapper_around(model, "fit") is None
    with warnings.catch_warnings():
        warnings.simplefilter("error", custom_fit.UnappliedWrapperWarning)
        assert len(model.fit(DATA["x"], DATA["y"], epochs=2, verbose=0).history["loss"]) == 2
