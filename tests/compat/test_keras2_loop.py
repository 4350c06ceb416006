"""custom_fit._compat.keras2_loop (tf_keras only): tf_keras' data handler and checks in custom_fit's loop."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from tensorflow import keras

from tests.trainer.test_loop import X, Y, _error_of, small_model  # the loop's helpers, shared


@pytest.mark.keras2
def test_keras_2_fit_that_runs_no_step_raises_what_tf_keras_raises() -> None:
    # Of unknown length (filtered), so that the data handler cannot tell it is empty in advance.
    empty = tf.data.Dataset.from_tensor_slices((X, Y)).filter(lambda x, y: False).batch(2)
    theirs = _error_of(lambda: small_model(keras.Model).fit(empty, verbose=0))
    ours = _error_of(lambda: small_model().fit(empty, verbose=0))
    assert type(ours) is type(theirs) is ValueError
    assert "Unexpected result of `train_function` (Empty logs)" in str(ours)


@pytest.mark.keras2
def test_keras_2_refuses_parameter_server_coordinators_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    model = small_model()
    monkeypatch.setattr(model.distribute_strategy, "_should_use_with_coordinator", True)
    for method, arguments in (("fit", (X, Y)), ("evaluate", (X, Y)), ("predict", (X,))):
        with pytest.raises(NotImplementedError, match=rf"ParameterServerStrategy's coordinator in {method}\(\)"):
            getattr(model, method)(*arguments, verbose=0)


@pytest.mark.keras2
def test_keras_2_data_loading_arguments_are_taken_by_keyword() -> None:
    """tf_keras' ``max_queue_size``, ``workers`` and ``use_multiprocessing`` reach its data handler."""
    model = small_model()
    options = {"max_queue_size": 4, "workers": 1, "use_multiprocessing": False}
    history = model.fit(X, Y, batch_size=4, epochs=2, verbose=0, validation_data=(X, Y), **options)
    assert len(history.history["val_loss"]) == 2
    assert np.isfinite(model.evaluate(X, Y, verbose=0, **options))
    assert model.predict(X, verbose=0, **options).shape == (8, 1)


@pytest.mark.keras2
def test_keras_2_array_pipelines_run_without_tf_data_autotuning():
    """The loop builds tf_keras' data handler and turns autotuning off on arrays (a user's dataset keeps its own)."""
    from custom_fit._compat.keras2_loop import EpochIterator

    model = small_model()
    arrays = EpochIterator(model, plan=lambda remaining: 1, x=X, y=Y, batch_size=4)
    assert arrays._handler._dataset.options().autotune.enabled is False
    dataset = EpochIterator(model, plan=lambda remaining: 1, x=tf.data.Dataset.from_tensor_slices((X, Y)).batch(4))
    assert dataset._handler._dataset.options().autotune.enabled is not False


@pytest.mark.keras2
@pytest.mark.filterwarnings("ignore:`Model.state_updates` will be removed")  # tf_keras' v1 engine, any model
def test_keras_2_in_a_tf1_graph_runs_tf_keras_v1_engine_as_for_tf_keras_models() -> None:
    """tf_keras gives models built in a TF1 graph its v1 engine; custom_fit's TF2 loop hands such calls to it."""
    with tf.Graph().as_default():
        model = small_model()
        history = model.fit(X, Y, batch_size=4, epochs=2, verbose=0, validation_data=(X, Y), validation_freq=[2])
        assert len(history.history["loss"]) == 2 and len(history.history["val_loss"]) == 1
        assert np.isfinite(model.evaluate(X, Y, verbose=0))
        assert model.predict(X, verbose=0).shape == (8, 1)
