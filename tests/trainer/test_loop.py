"""The one ``fit``/``evaluate``/``predict`` loop (``custom_fit._trainer.loop``) on both Kerases.

Parity with ``keras.Model`` is ``tests/end_to_end/test_model_parity.py``; resume is
``tests/test_backup_and_restore.py``; tf_keras' pieces of it are ``tests/compat/test_keras2_loop.py``.
Here: what the loop itself promises on each Keras (no module global of tf_keras replaced), and its
error paths, each compared with plain Keras' (never worse).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import traceback
from typing import Any

import numpy as np
import pytest
from tensorflow import keras

import custom_fit

X, Y = np.ones((8, 4), "float32"), np.zeros((8, 1), "float32")


def small_model(base: type = custom_fit.CustomModel) -> keras.Model:
    inputs = keras.Input((4,))
    model = base(inputs, keras.layers.Dense(1)(inputs))
    model.compile(optimizer="sgd", loss="mse")
    return model


def _error_of(call: Any) -> BaseException:
    """The exception ``call()`` raises (fails the test if it raises none)."""
    try:
        call()
    except Exception as error:  # any type: the test compares it with what plain Keras raises
        return error
    pytest.fail("no exception raised")


@pytest.mark.parametrize("method", ["fit", "evaluate", "predict"], ids=["fit", "evaluate", "predict"])
def test_an_unknown_keyword_raises_what_keras_raises(method: str) -> None:
    """Keras 3: ``TypeError`` (fit, predict) or ``ValueError`` (evaluate); Keras 2: ``TypeError``, as each Keras."""
    arguments: dict[str, Any] = {"x": X, "verbose": 0, "no_such_argument": 1}
    if method != "predict":
        arguments["y"] = Y
    theirs = _error_of(lambda: getattr(small_model(keras.Model), method)(**arguments))
    ours = _error_of(lambda: getattr(small_model(), method)(**arguments))
    assert type(ours) is type(theirs)
    assert "no_such_argument" in str(ours) and "no_such_argument" in str(theirs)


def test_fit_and_evaluate_before_compile_name_the_method_and_the_fix() -> None:
    inputs = keras.Input((4,))
    model = custom_fit.CustomModel(inputs, keras.layers.Dense(1)(inputs))
    for method in ("fit", "evaluate"):
        with pytest.raises(ValueError, match=rf"CustomModel\.{method}\(\) needs a compiled model.*Fix: call"):
            getattr(model, method)(X, Y, verbose=0)


@pytest.mark.keras2
def test_no_tf_keras_module_global_is_replaced_while_the_loop_runs():
    """custom_fit runs the loop on Keras 2 too: tf_keras' ``get_data_handler`` stays its own in every hook."""
    from tf_keras.src.engine import data_adapter

    keras_own = data_adapter.get_data_handler
    seen = []

    class Recorder(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            seen.append(("fit", data_adapter.get_data_handler is keras_own))

        def on_test_batch_begin(self, batch, logs=None):
            seen.append(("evaluate", data_adapter.get_data_handler is keras_own))

        def on_predict_batch_begin(self, batch, logs=None):
            seen.append(("predict", data_adapter.get_data_handler is keras_own))

    model = small_model()
    model.fit(X, Y, batch_size=4, verbose=0, validation_data=(X, Y), callbacks=[Recorder()])
    model.evaluate(X, Y, batch_size=4, verbose=0, callbacks=[Recorder()])
    model.predict(X, batch_size=4, verbose=0, callbacks=[Recorder()])
    assert sorted(set(seen)) == [("evaluate", True), ("fit", True), ("predict", True)]


def _frames_above_train_step(base: type) -> list[traceback.FrameSummary]:
    """The frames between a ``fit`` call and the eager ``train_step`` it runs (both left out)."""
    seen: list[list[traceback.FrameSummary]] = []

    class Recording(base):
        def train_step(self, data: Any) -> Any:
            seen.append(traceback.extract_stack()[:-1])
            return super().train_step(data)

    inputs = keras.Input((4,))
    model = Recording(inputs, keras.layers.Dense(1)(inputs))
    model.compile(optimizer="sgd", loss="mse", run_eagerly=True)  # a breakpoint in train_step sees this stack
    model.fit(X, Y, batch_size=4, epochs=1, verbose=0)
    stack = seen[0]
    here = max(i for i, frame in enumerate(stack) if frame.name == _frames_above_train_step.__name__)
    return stack[here + 1 :]


def test_a_breakpoint_in_train_step_sees_at_most_3_frames_more_than_keras() -> None:
    """Issue 50: between ``fit`` and an eager ``train_step``, custom_fit adds at most 3 frames to Keras' own.

    Keras 3.15: 12 frames, custom_fit 15 (was 19); tf_keras 2.21: 9, custom_fit 12 (was 15). The
    tool-wrapper hook stands where Keras has its traceback filter; ``Loop._train_epochs`` and
    ``Loop._run_epoch`` are the 2 frames Keras' ``fit`` does inline, ``_checked_train_step`` the third.
    """
    keras_frames = _frames_above_train_step(keras.Model)
    ours = _frames_above_train_step(custom_fit.CustomModel)
    assert len(ours) <= len(keras_frames) + 3, "\n".join(f"{f.filename}:{f.lineno} {f.name}" for f in ours)


def test_loop_fit_reads_as_its_phases_without_nested_functions() -> None:
    """Issue 50: ``Loop.fit`` is at most 90 lines and defines no function or lambda inside."""
    from custom_fit._trainer.loop import Loop

    source = textwrap.dedent(inspect.getsource(inspect.unwrap(Loop.fit)))
    (function,) = ast.parse(source).body
    assert isinstance(function, ast.FunctionDef)
    assert function.end_lineno is not None and function.end_lineno - function.lineno + 1 <= 90
    nested = [
        node for node in ast.walk(function) if node is not function and isinstance(node, (ast.FunctionDef, ast.Lambda))
    ]
    assert not nested, [getattr(node, "name", "lambda") for node in nested]
