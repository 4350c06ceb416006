"""custom_fit._compat.keras3 (Keras 3 only): the Keras 3 private names custom_fit reads, each behind one helper.

Imported inside the tests: importing the module on Keras 2 would load Keras 3's internals.
"""

from __future__ import annotations

import numpy as np
import pytest

import custom_fit
from custom_fit import keras

pytestmark = pytest.mark.keras3


def small_model(base=custom_fit.CustomModel):
    inputs = keras.Input((3,))
    return base(inputs, keras.layers.Dense(1)(inputs))


def test_is_compiled_follows_compile():
    from custom_fit._compat import keras3

    model = small_model()
    assert keras3.is_compiled(model) is False
    model.compile(optimizer="sgd", loss="mse")
    assert keras3.is_compiled(model) is True


def test_call_accepts_training_reads_the_signature_of_call():
    from custom_fit._compat import keras3

    class WithTraining(custom_fit.CustomModel):
        def call(self, x, training=False):
            return x

    class WithoutTraining(custom_fit.CustomModel):
        def call(self, x):
            return x

    assert keras3.call_accepts_training(WithTraining()) is True
    assert keras3.call_accepts_training(WithoutTraining()) is False


def test_scaling_for_distribution_is_the_identity_on_one_replica_and_undone_by_its_inverse():
    from custom_fit._compat import keras3

    loss = np.float32(2.5)
    assert float(keras3.scale_loss_for_distribution(loss)) == 2.5
    assert float(keras3.unscale_loss_for_distribution(keras3.scale_loss_for_distribution(loss))) == 2.5


def test_is_functional_call_is_keras_own_test_of_the_arguments():
    from custom_fit._compat import keras3

    inputs = keras.Input((3,))
    outputs = keras.layers.Dense(1)(inputs)
    assert keras3.is_functional_call((inputs, outputs), {}) is True
    assert keras3.is_functional_call((), {"inputs": inputs, "outputs": outputs}) is True
    assert keras3.is_functional_call((), {"name": "net"}) is False


def test_variable_names_are_the_variables_paths():
    from custom_fit._compat import keras3

    model = small_model()
    assert keras3.variable_names(model, model.trainable_variables) == [v.path for v in model.trainable_variables]


def test_after_a_snapshot_keras_saving_reuses_the_skip_sets_it_computed(tmp_path):
    """k3-saving-skipsets: Keras caches ``get_attr_skipset`` under one name and reads another, so each
    ``save_weights`` builds a Layer, an Optimizer and Metrics to compute them again; after a backup's
    snapshot the lookups hit (the same set back, nothing built)."""
    from keras.src.saving import saving_lib

    from custom_fit._compat import keras3

    model = small_model()
    model.compile(optimizer="adam", loss="mse")
    model.fit(np.zeros((4, 3)), np.zeros((4, 1)), verbose=0)
    keras3.snapshot_weights(model, str(tmp_path / "model.weights.h5"))()
    for kind in ("Functional", "Layer", "Optimizer", "Metric"):
        assert saving_lib.get_attr_skipset(kind) is saving_lib.get_attr_skipset(kind), kind
    model.save_weights(tmp_path / "saved.weights.h5")  # Keras' own save, with the reused sets: the same file
    assert (tmp_path / "saved.weights.h5").read_bytes() == (tmp_path / "model.weights.h5").read_bytes()


def test_a_snapshot_copies_into_the_memory_of_the_one_before_once_that_one_is_written(tmp_path):
    from custom_fit._compat import keras3

    model = small_model()
    model.compile(optimizer="adam", loss="mse")
    model.fit(np.zeros((4, 3)), np.zeros((4, 1)), verbose=0)
    first = keras3.snapshot_weights(model, str(tmp_path / "first.weights.h5"))
    unwritten = keras3.snapshot_weights(model, str(tmp_path / "second.weights.h5"), reuse=first)
    assert isinstance(first, keras3._WeightsFile) and isinstance(unwritten, keras3._WeightsFile)
    assert not any(np.shares_memory(a, b) for a in first.copied.arrays for b in unwritten.copied.arrays)
    first()
    third = keras3.snapshot_weights(model, str(tmp_path / "third.weights.h5"), reuse=first)
    assert isinstance(first, keras3._WeightsFile) and isinstance(third, keras3._WeightsFile)
    assert all(a is b for a, b in zip(first.copied.arrays, third.copied.arrays, strict=True))


def test_a_private_keras_attribute_gone_is_an_attribute_error():
    """docs/keras_internals.md: a private name custom_fit reads, renamed by Keras, fails loudly instead of drifting."""
    model = small_model()
    model.compile(optimizer="sgd", loss="mse")
    model._renamed_loss_tracker = model._loss_tracker  # as a Keras release that renamed it would have it
    del model._loss_tracker
    with pytest.raises(AttributeError, match="has no attribute '_loss_tracker'"):
        model.fit(np.zeros((4, 3)), np.zeros((4, 1)), verbose=0)


def test_scalar_logs_are_averaged_across_workers_where_keras_reduce_fails(monkeypatch):
    """Keras' ``reduce_per_replica`` under ``MultiWorkerMirroredStrategy`` reduces with ``axis=0``: not a scalar.

    The multi-worker branch is taken on one in-process ``MirroredStrategy`` by patching Keras' check.
    """
    import tensorflow as tf
    from keras.src.backend.tensorflow import trainer

    from custom_fit._compat import keras3

    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    monkeypatch.setattr(trainer, "_collective_all_reduce_multi_worker", lambda strategy: True)
    logs = strategy.run(lambda: {"loss": tf.constant(2.5)})
    with pytest.raises(ValueError, match="Invalid reduction dimension 0 for input with 0 dimensions"):
        trainer.reduce_per_replica(logs, strategy, reduction="auto")
    assert float(keras3._reduce_logs(strategy, logs)["loss"]) == 2.5
