"""custom_fit._state: one ``ModelState`` per model, made on first use, outside Keras' tracking."""

from __future__ import annotations

import numpy as np

import custom_fit
from custom_fit import keras
from custom_fit._state import LoopCall, state_of


def small_model():
    inputs = keras.Input((3,))
    model = custom_fit.CustomModel(inputs, keras.layers.Dense(1)(inputs))
    model.compile(optimizer="sgd", loss="mse")
    return model


def test_each_model_has_one_state_that_keras_does_not_track():
    model, other = small_model(), small_model()
    weights = len(model.weights)
    state = state_of(model)
    assert state_of(model) is state and state_of(other) is not state
    assert state.diagnostics is not state_of(other).diagnostics
    assert len(model.weights) == weights


def test_a_running_fit_is_on_the_models_stack_of_calls_until_it_returns():
    seen = []

    class Calls(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            seen.append([call.kind for call in state_of(self.model).loop_calls])

    model = small_model()
    model.fit(np.ones((4, 3)), np.ones((4, 1)), verbose=0, callbacks=[Calls()])
    assert seen == [["fit"]]
    assert state_of(model).loop_calls == []


def test_a_loop_call_closes_each_validation_sets_iterator_once_and_is_equal_only_to_itself():
    class Iterator:
        closed = 0

        def close(self):
            Iterator.closed += 1

    first, second = Iterator(), Iterator()
    call = LoopCall("fit", validation=second, validation_name="hard", validation_iterators={0: first, 1: second})
    call.close_validation()
    call.close_validation()
    assert Iterator.closed == 2 and call.validation is None and call.validation_name is None
    assert call.validation_iterators == {}
    assert call != LoopCall("fit") and call == call
