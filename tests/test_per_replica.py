"""``PerReplica``: a trace's hand-over values, one per replica, copied empty (no ``threading.local``)."""

from __future__ import annotations

import copy
import pickle
import threading
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import custom_fit
from custom_fit import keras
from custom_fit._per_replica import PerReplica
from tests import parity


def test_each_replica_context_has_its_own_value():
    values: PerReplica[list[Any]] = PerReplica(list)
    values.get().append("default")
    seen = []

    def replica_fn():
        seen.append(list(values.get()))
        values.get().append("replica")
        return tf.constant(0)

    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    strategy.run(replica_fn)
    assert seen == [[]]  # the replica did not see the default context's value
    assert values.get() == ["default"]


def test_a_value_follows_the_replica_not_the_thread():
    """Python code of one replica may run in another thread (a callback, TensorFlow's own)."""
    values: PerReplica[set[str]] = PerReplica(set)
    values.get().add("minimize")
    other = []
    thread = threading.Thread(target=lambda: other.append(set(values.get())))
    thread.start()
    thread.join()
    assert other == [{"minimize"}]  # both threads run in the default replica context


def test_pop_forgets_the_value():
    values: PerReplica[list[Any]] = PerReplica(list)
    values.get().append(1)
    assert values.pop() == [1] and values.get() == []


@pytest.mark.parametrize("copy_values", [copy.deepcopy, lambda v: pickle.loads(pickle.dumps(v))])
def test_a_copy_starts_empty(copy_values):
    values: PerReplica[list[Any]] = PerReplica(list)
    values.get().append(1)
    copied = copy_values(values)
    assert copied.get() == [] and values.get() == [1]


def unbuilt_net(base: Any) -> Any:
    """A subclass as keras.io writes one (layers made in ``__init__``), registered: Keras 3 copies by config."""

    @keras.saving.register_keras_serializable(package="custom_fit_tests", name=f"UnbuiltNet{base.__name__}")
    class UnbuiltNet(base):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.hidden = keras.layers.Dense(8, activation="relu")
            self.out = keras.layers.Dense(parity.N_CLASSES, activation="softmax")

        def call(self, x):
            return self.out(self.hidden(x))

    return UnbuiltNet


def test_an_unbuilt_subclass_deep_copies_and_trains_as_keras_models_copy():
    """On Keras 2 this failed (``cannot pickle '_thread._local' object``); ``tf_keras.Model`` deep-copies."""
    data = parity.classification_data()
    results = []
    for base in (keras.Model, custom_fit.CustomModel):
        keras.utils.set_random_seed(3)
        copied = copy.deepcopy(unbuilt_net(base)())
        keras.utils.set_random_seed(7)
        copied.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        history = copied.fit(data["x"], data["y"], batch_size=32, epochs=2, verbose=0)
        results.append((history.history["loss"], copied.get_weights()))
    assert results[0][0] == results[1][0]
    for a, b in zip(results[0][1], results[1][1], strict=True):
        np.testing.assert_array_equal(a, b)
