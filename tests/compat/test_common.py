"""custom_fit._compat.common: the helpers both Kerases share."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from custom_fit import keras
from custom_fit._compat import common


def test_is_scalar_takes_python_numbers_and_rank_0_tensors_only():
    assert all(common.is_scalar(v) for v in (3, 2.5, tf.constant(1.0), np.float32(1.0)))
    assert not any(common.is_scalar(v) for v in (np.ones(2), tf.ones((1,)), "3"))


def test_batch_size_of_reads_the_first_input_that_is_there():
    assert int(common.batch_size_of((None, {"a": np.ones((5, 2)), "b": np.ones((7, 1))}))) == 5


def test_dataset_without_autotuning_keeps_the_batches_and_passes_anything_else_through():
    dataset = tf.data.Dataset.range(10).map(lambda i: i * 2, num_parallel_calls=tf.data.AUTOTUNE).batch(4)
    untuned = common.dataset_without_autotuning(dataset)
    assert untuned.options().autotune.enabled is False and dataset.options().autotune.enabled is not False
    assert [b.tolist() for b in untuned.as_numpy_iterator()] == [b.tolist() for b in dataset.as_numpy_iterator()]
    other = object()
    assert common.dataset_without_autotuning(other) is other


def test_set_untracked_keeps_a_layer_out_of_what_keras_tracks():
    layer, other = keras.layers.Dense(1), keras.layers.Dense(2)
    layer.build((None, 3))
    other.build((None, 3))
    common.set_untracked(layer, "_peer", other)
    assert layer._peer is other
    assert len(layer.weights) == 2, "the peer's kernel and bias must not become the layer's"


def test_counting_call_counts_and_returns_what_it_wraps():
    penalty = common.CountingCall(lambda x: 2 * x)
    assert [penalty(1), penalty(3)] == [2, 6] and penalty.calls == 2


def test_pop_fit_validation_removes_fits_keyword_and_says_whether_it_was_set():
    kwargs = {"_use_cached_eval_dataset": True, "verbose": 0}
    assert common.pop_fit_validation(kwargs) is True and kwargs == {"verbose": 0}
    assert common.pop_fit_validation(kwargs) is False


def test_recording_reenters_a_tape_only_when_it_is_not_recording():
    x = tf.Variable(3.0)
    with tf.GradientTape() as finished:
        pass
    with common.recording(finished):  # its context has ended: recorded again
        y = x * x
    assert float(finished.gradient(y, x)) == 6.0
    with tf.GradientTape() as active, common.recording(active):  # recording already: entering it again would raise
        z = 2 * x
    assert float(active.gradient(z, x)) == 2.0


def test_not_compiled_error_names_the_method_and_the_fix():
    inputs = keras.Input((2,))
    model = keras.Model(inputs, keras.layers.Dense(1)(inputs), name="net")
    assert str(common.not_compiled_error(model, "fit")).startswith("Functional.fit() needs a compiled model")
    assert "model 'net' was never compiled" in str(common.not_compiled_error(model, None))
