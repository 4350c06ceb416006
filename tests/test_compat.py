"""custom_fit follows the Keras TensorFlow is configured with; Keras-3-only features say so.

``make test`` runs the suite twice: on Keras 3, and with ``TF_USE_LEGACY_KERAS=1``
(``tf.keras`` is then ``tf_keras``, Keras 2, while ``import keras`` stays Keras 3).
"""

from __future__ import annotations

import collections

import keras as keras3
import numpy as np
import pytest
import tensorflow as tf
from tensorflow import keras

import custom_fit
from custom_fit import _compat

KERAS_3_NEEDED = (
    r"needs Keras 3 \(keras>=3.0\); this process runs Keras 2 \(tf_keras [\d.]+\) because TF_USE_LEGACY_KERAS=1"
)


def test_custom_model_subclasses_the_keras_tensorflow_uses():
    assert issubclass(custom_fit.CustomModel, tf.keras.Model)
    assert issubclass(custom_fit.CustomSequential, tf.keras.Sequential)
    assert _compat.KERAS_2 == tf.keras.__name__.startswith("tf_keras")
    assert _compat.KERAS_VERSION.startswith("tf_keras 2." if _compat.KERAS_2 else "keras 3.")


def small_model():
    inputs = keras.Input((4,))
    return custom_fit.CustomModel(inputs, keras.layers.Dense(1)(inputs))


@pytest.mark.keras2
def test_keras3_optimizer_with_gradient_accumulation_names_the_keras_version():
    model = small_model()
    with pytest.raises(
        ValueError,
        match=r"An optimizer with gradient_accumulation_steps=4 \(received for CustomModel '.*', a tf_keras model\) "
        + KERAS_3_NEEDED
        + r".*Fix: pass a tf.keras optimizer, e.g. tf.keras.optimizers.Adam\(\) and accumulate gradients in train_step",
    ):
        model.compile(optimizer=keras3.optimizers.Adam(gradient_accumulation_steps=4), loss="mse")


@pytest.mark.keras2
def test_keras3_objects_in_compile_name_the_keras_version():
    model = small_model()
    with pytest.raises(
        ValueError, match=r"The Keras 3 optimizer SGD .*" + KERAS_3_NEEDED + r".*tf.keras.optimizers.SGD\(\)"
    ):
        model.compile(optimizer={"generator": keras3.optimizers.SGD()}, loss="mse")
    with pytest.raises(
        ValueError,
        match=r"The Keras 3 object MeanSquaredError passed as compile\(loss=...\) "
        + KERAS_3_NEEDED
        + r".*Fix: use tf.keras.losses.MeanSquaredError",
    ):
        model.compile(optimizer="sgd", loss=keras3.losses.MeanSquaredError())
    with pytest.raises(ValueError, match=r"compile\(auto_scale_loss=...\) " + KERAS_3_NEEDED + r".*Fix: leave it out"):
        model.compile(optimizer="sgd", loss="mse", auto_scale_loss=False)


@pytest.mark.keras2
def test_per_replica_clipping_names_the_keras_version():
    with pytest.raises(
        ValueError,
        match=r"compile\(clip_after_aggregation=False\).*"
        + KERAS_3_NEEDED
        + r".*Fix: leave clip_after_aggregation out",
    ):
        small_model().compile(optimizer="sgd", loss="mse", clip_after_aggregation=False)


@pytest.mark.keras2
def test_keras3_tensors_are_rejected_before_keras2_rewrites_the_class():
    inputs = keras3.Input((4,))
    with pytest.raises(
        ValueError,
        match=r"received are Keras 3 tensors \(keras.*KerasTensor, from `import keras`\)\. Expected tensors from tf.keras.Input\(...\)\. Fix:",
    ):
        custom_fit.CustomModel(inputs, keras3.layers.Dense(1)(inputs))
    # The class is intact: a subclass with its own __init__ still works.
    model = small_model()
    model.compile(optimizer="sgd", loss="mse")
    model.fit(np.ones((4, 4)), np.ones((4, 1)), verbose=0)
    assert custom_fit.CustomModel.__bases__ == (_compat.TrainerHooks, keras.Model)


@pytest.mark.keras2
def test_keras2_clips_the_summed_gradient_by_default():
    model = small_model()
    model.compile(optimizer="sgd", loss="mse")
    assert model.clip_after_aggregation is True


def test_both_keras_modules_define_every_helper_the_package_uses():
    """Code outside ``_compat`` may use a helper only if both Keras versions define it."""
    import importlib
    import pathlib
    import re

    package = pathlib.Path(custom_fit.__file__).parent
    used = set()
    for path in package.glob("*.py"):
        if path.name != "compiled.py":  # Keras 3 only: Keras 2 has its own compiled_loss/metrics
            used |= set(re.findall(r"_compat\.(\w+)", path.read_text()))
    common = importlib.import_module("custom_fit._compat.common")
    for version in ("keras3", "keras2"):
        module = importlib.import_module(f"custom_fit._compat.{version}")
        missing = sorted(name for name in used if not hasattr(module, name) and name not in common.__all__)
        assert not missing, f"custom_fit._compat.{version} lacks {missing}"


def _op_types(graph) -> collections.Counter:
    """Op types in ``graph`` and in every function it calls."""
    counts = collections.Counter(op.type for op in graph.get_operations())
    for function in graph._functions.values():
        if hasattr(function, "graph"):
            counts.update(_op_types(function.graph))
    return counts


@pytest.mark.keras2
@pytest.mark.parametrize("steps_per_execution", [1, 4])
def test_keras2_training_graph_has_the_same_ops_as_tf_keras(steps_per_execution):
    """Speed parity without timing: the traced train function is tf_keras' own, op for op."""
    x, y = np.random.default_rng(0).normal(size=(64, 4)).astype("float32"), np.zeros((64, 1), "float32")
    graphs = {}
    for base in (keras.Model, custom_fit.CustomModel):
        inputs = keras.Input((4,))
        model = base(inputs, keras.layers.Dense(1)(keras.layers.Dense(8, activation="relu")(inputs)))
        model.compile(optimizer="adam", loss="mse", metrics=["mae"], steps_per_execution=steps_per_execution)
        model.fit(x, y, batch_size=16, epochs=1, verbose=0)
        functions = model.train_tf_function._list_all_concrete_functions()
        graphs[base] = (len(functions), sum((_op_types(f.graph) for f in functions), collections.Counter()))
    assert graphs[custom_fit.CustomModel] == graphs[keras.Model]
