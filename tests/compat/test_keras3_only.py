"""custom_fit._compat.keras3_only (Keras 3 only): Keras 3 pieces of features and of the loop only Keras 3 has.

Imported inside the tests: importing the module on Keras 2 would load Keras 3's internals.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import tensorflow as tf

pytestmark = pytest.mark.keras3


def test_sum_losses_returns_a_single_loss_as_it_is_and_adds_several():
    from custom_fit._compat import keras3_only

    one = tf.constant(1.5)
    assert keras3_only.sum_losses([one]) is one
    assert float(keras3_only.sum_losses([one, tf.constant(2.0), tf.constant(0.5)])) == 4.0


def test_batch_end_step_is_the_one_the_keras_in_use_passes():
    from custom_fit._compat import keras3_only

    expected = 10 + 4 - 1 if keras3_only.VERSION >= (3, 11) else 10
    assert keras3_only.batch_end_step(10, 4) == expected
    assert keras3_only.batch_end_step(0, 1) == 0


def test_capped_epochs_follows_keras_max_epochs_with_its_warning():
    from custom_fit._compat import keras3_only

    assert keras3_only.capped_epochs(5) == 5
    config = keras3_only.keras.config
    if not hasattr(config, "set_max_epochs"):
        # Keras 3.8-3.9 (the 3.8 compat row) have no epoch cap to follow; the uncapped case is checked above.
        pytest.skip("keras.config.set_max_epochs exists from Keras 3.10: no cap to follow on this Keras")
    config.set_max_epochs(2)
    try:
        with pytest.warns(UserWarning, match="Limiting epochs to 2"):
            assert keras3_only.capped_epochs(5) == 2
        assert keras3_only.capped_epochs(1) == 1
    finally:
        config.set_max_epochs(None)


def test_train_validation_split_takes_the_last_fraction_unshuffled():
    from custom_fit._compat import keras3_only

    x, y = np.arange(10).reshape(10, 1), np.arange(10)
    (x_train, y_train), (x_val, y_val) = keras3_only.train_validation_split((x, y), 0.2)
    assert y_train.tolist() == list(range(8)) and y_val.tolist() == [8, 9]
    assert x_train.shape == (8, 1) and x_val[:, 0].tolist() == [8, 9]


def test_concat_predictions_joins_executions_along_the_batch_axis_as_numpy():
    from custom_fit._compat import keras3_only

    outputs = [{"a": tf.ones((2, 3)), "b": tf.zeros((2,))}, {"a": 2 * tf.ones((1, 3)), "b": tf.ones((1,))}]
    joined = keras3_only.concat_predictions(outputs)
    assert isinstance(joined["a"], np.ndarray) and joined["a"].shape == (3, 3)
    assert joined["a"][:, 0].tolist() == [1.0, 1.0, 2.0] and joined["b"].tolist() == [0.0, 0.0, 1.0]


def test_data_epoch_reads_the_count_only_where_the_adapter_keeps_one():
    from custom_fit._compat import keras3_only

    assert keras3_only.data_epoch(types.SimpleNamespace(_epoch=3)) == 3
    assert keras3_only.data_epoch(types.SimpleNamespace()) is None
    assert keras3_only._infinite(tf.data.Dataset.range(3).repeat()) is True
    assert keras3_only._infinite(tf.data.Dataset.range(3)) is False
