"""TensorFlow Model Optimization rebuilds a ``CustomModel`` as it rebuilds a ``keras.Model`` (Keras 2).

``prune_low_magnitude`` and ``quantize_model`` clone the model layer by layer
into a new ``Functional`` model (tfmot 0.8 works on tf_keras, not on Keras 3):
the clone is Keras' own class for both bases, and trains to the same losses.
"""

from __future__ import annotations

import pytest

from tests.integrations.harness import DATA, build, for_both

pytestmark = pytest.mark.keras2  # tfmot builds on tf.keras' Keras 2 (tf_keras)


def _train(model, **fit_kwargs):
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    history = model.fit(DATA["x"], DATA["y"], batch_size=16, epochs=2, verbose=0, **fit_kwargs)
    return type(model).__name__, history.history


def test_pruning_and_quantization_aware_training_rebuild_both_bases_alike():
    tfmot = pytest.importorskip("tensorflow_model_optimization")

    def run(base):
        schedule = tfmot.sparsity.keras.ConstantSparsity(0.5, begin_step=0)
        pruned = tfmot.sparsity.keras.prune_low_magnitude(build(base), pruning_schedule=schedule)
        quantized = tfmot.quantization.keras.quantize_model(build(base))
        return _train(pruned, callbacks=[tfmot.sparsity.keras.UpdatePruningStep()]), _train(quantized)

    results = for_both(run)
    assert results["CustomModel"] == results["keras.Model"]
    (pruned_class, _), (quantized_class, _) = results["CustomModel"]
    assert pruned_class == quantized_class == "Functional"  # the clone is Keras' class, for keras.Model too
