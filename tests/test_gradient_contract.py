"""The gradient contract: ``transform_gradients`` receives the true gradient of the global batch's loss.

The same number on every precision, replica count and Keras (the multi-replica
rows are in ``tests/end_to_end/test_distribute.py``, group ``mirrored_contract``). On
7a9ee83 the transform received the loss-scaled gradient under Keras 3's
``mixed_float16`` (``inf`` on the first steps) and one replica's share under
Keras 3's ``MirroredStrategy``.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import custom_fit
from custom_fit import keras
from tests import parity
from tests.strategy_cases import contract_run

# Float16 forward passes round the gradient: measured relative differences from float32 of
# 2e-4 in the norm (0.254 in 252.8 at one step) and 1.1e-4 in the total weight movement.
FLOAT16_ROUNDING = 2e-3


def test_the_transform_receives_the_unscaled_gradient_in_mixed_precision():
    """Fails on 7a9ee83 (Keras 3): the loss-scaled gradient, 32768 times too large."""
    float32 = contract_run(policy="float32", learning_rate=0.0, epochs=1)
    mixed = contract_run(policy="mixed_float16", learning_rate=0.0, epochs=1)
    assert len(mixed["norms"]) == len(float32["norms"]) == 6
    assert mixed["loss_scale"] == 2.0**15, "no step was skipped"
    np.testing.assert_allclose(mixed["norms"], float32["norms"], rtol=FLOAT16_ROUNDING)


def test_steps_the_loss_scale_optimizer_skips_reach_the_transform_as_zeros():
    """Fails on 7a9ee83 (Keras 3): the transform received inf; the step is still skipped and the scale lowered."""
    mixed = contract_run(policy="mixed_float16", learning_rate=0.0, epochs=1, scale=10.0)
    float32 = contract_run(policy="float32", learning_rate=0.0, epochs=1, scale=10.0)
    skipped = [n for n in mixed["norms"] if n == 0.0]
    assert skipped and len(skipped) < len(mixed["norms"]), mixed["norms"]
    assert all(np.isfinite(mixed["norms"]))
    assert mixed["loss_scale"] == 2.0**15 / 2 ** len(skipped)
    finite = len(skipped)
    np.testing.assert_allclose(mixed["norms"][finite:], float32["norms"][finite:], rtol=FLOAT16_ROUNDING)


def test_a_clip_in_the_transform_moves_the_weights_as_in_float32():
    """Fails on 7a9ee83 (Keras 3): under mixed_float16 the clip cut the update to 1/1,650 of float32's."""
    float32 = contract_run(policy="float32", clip=0.5)
    mixed = contract_run(policy="mixed_float16", clip=0.5)
    assert mixed["loss_scale"] == 2.0**15, "no step was skipped"
    assert mixed["moved"] == pytest.approx(float32["moved"], rel=FLOAT16_ROUNDING)


@pytest.mark.parametrize("scale", [1.0, 10.0], ids=["finite", "with-skipped-steps"])
def test_an_identity_transform_equals_keras_model_in_mixed_precision(scale):
    """The unscale before the transform and the rescale after it are exact: bit for bit, skipped steps included."""
    custom = contract_run(policy="mixed_float16", scale=scale)
    plain = contract_run(policy="mixed_float16", base="keras", scale=scale)
    assert custom["loss_scale"] == plain["loss_scale"]
    assert parity.max_delta(custom["weights"], plain["weights"]) == 0.0


class BypassingApply(custom_fit.CustomModel):
    """An ``apply_gradients`` override that calls the optimizer itself instead of ``super()``."""

    def apply_gradients(self, grads_and_vars, optimizer=None):
        self.optimizer.apply_gradients(grads_and_vars)


def bypassing_model():
    inputs = keras.Input((parity.N_FEATURES,))
    return BypassingApply(inputs, keras.layers.Dense(1, dtype="float32")(keras.layers.Dense(4)(inputs)))


def test_an_apply_gradients_override_that_bypasses_the_handover_is_refused_under_loss_scaling(mixed_float16):
    """Keras 3's loss-scale optimizer would divide the true gradient by the scale a second time."""
    data = parity.classification_data()
    model = bypassing_model()
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ValueError, match=r"BypassingApply.apply_gradients\(\) did not hand.*loss scale restored.*Fix"):
        model.fit(data["x"], data["y"].astype("float32"), epochs=1, verbose=0)


def test_an_apply_gradients_override_may_call_the_optimizer_without_loss_scaling_or_replicas():
    data = parity.classification_data()
    keras.utils.set_random_seed(0)
    model = bypassing_model()
    model.compile(optimizer="sgd", loss="mse")
    before = model.get_weights()
    model.fit(data["x"], data["y"].astype("float32"), epochs=1, verbose=0)
    assert parity.max_delta(before, model.get_weights()) > 0


def test_apply_gradients_called_by_a_step_itself_reaches_the_optimizer_as_is():
    """Outside minimize() there is nothing to undo: the pairs go to the optimizer as Keras would pass them."""

    class OwnStep(custom_fit.CustomModel):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = self.compute_loss(x, y, self(x, training=True))
            gradients = tape.gradient(loss, self.trainable_variables)
            self.apply_gradients(list(zip(gradients, self.trainable_variables, strict=True)))
            return {"loss": loss}

    data = parity.classification_data()
    results = {}
    for base in (keras.Model, OwnStep):
        keras.utils.set_random_seed(0)
        inputs = keras.Input((parity.N_FEATURES,))
        model = base(inputs, keras.layers.Dense(1)(inputs))
        model.compile(optimizer="sgd", loss="mse")
        model.fit(data["x"], data["y"].astype("float32"), epochs=2, shuffle=False, verbose=0)
        results[base] = model.get_weights()
    assert parity.max_delta(results[keras.Model], results[OwnStep]) == 0.0


def test_minimize_resolves_its_optimizer_once(monkeypatch):
    """``apply_gradients`` takes the optimizer ``minimize`` resolved; called on its own it resolves it."""
    from custom_fit import _optimizers

    resolved = []
    resolve = _optimizers.resolve

    def counting(model, optimizer, variables=()):
        resolved.append(optimizer)
        return resolve(model, optimizer, variables)

    monkeypatch.setattr(_optimizers, "resolve", counting)
    data = parity.classification_data()
    inputs = keras.Input((parity.N_FEATURES,))
    model = custom_fit.CustomModel(inputs, keras.layers.Dense(1)(inputs))
    model.compile(optimizer="sgd", loss="mse", run_eagerly=True)
    model.fit(data["x"][:8], data["y"][:8].astype("float32"), batch_size=4, epochs=1, verbose=0)
    assert resolved == [None, None], "one resolution per minimize(), two steps"
    model.apply_gradients([(tf.ones_like(v), v) for v in model.trainable_variables])
    assert resolved == [None, None, None]


@pytest.mark.skipif(custom_fit.KERAS_2, reason="compile(auto_scale_loss=...) is Keras 3's")
def test_an_optimizer_compiled_without_loss_scaling_equals_keras_model_in_mixed_precision(mixed_float16):
    """Fails on e9d4b79 (Keras 3): apply_gradients resolved the compiled SGD a second time, into a
    LossScaleOptimizer of its own that divided the unscaled gradient by 2**15."""
    data = parity.classification_data()
    results = {}
    for base in (keras.Model, custom_fit.CustomModel):
        keras.utils.set_random_seed(0)
        inputs = keras.Input((parity.N_FEATURES,))
        model = base(inputs, keras.layers.Dense(1, dtype="float32")(keras.layers.Dense(4)(inputs)))
        model.compile(optimizer="sgd", loss="mse", auto_scale_loss=False)
        model.fit(data["x"], data["y"].astype("float32"), epochs=2, shuffle=False, verbose=0)
        assert type(model.optimizer).__name__ == "SGD"
        results[base] = model.get_weights()
    assert parity.max_delta(results[keras.Model], results[custom_fit.CustomModel]) == 0.0


@pytest.mark.keras3
@pytest.mark.parametrize("policy", ["float32", "mixed_float16"])
def test_gradient_accumulation_on_one_device_equals_keras_model(policy):
    """Keras 3's ``gradient_accumulation_steps``: one device runs Keras' own accumulation, bit for bit.

    Under a strategy the same update runs in one cross-replica ``merge_call`` (group
    ``mirrored_accumulation`` in ``tests/end_to_end/test_distribute.py``); here the path is Keras'.
    """
    from tests.strategy_cases import data

    d = data()
    results = []
    keras.mixed_precision.set_global_policy(policy)
    try:
        for base in (keras.Model, custom_fit.CustomModel):
            keras.utils.set_random_seed(4)
            inputs = keras.Input((8,))
            outputs = keras.layers.Dense(1, dtype="float32")(keras.layers.Dense(16, activation="tanh")(inputs))
            model = base(inputs, outputs)
            model.compile(optimizer=keras.optimizers.Adam(0.01, gradient_accumulation_steps=3), loss="mse")
            history = model.fit(d["x"] * 100.0, d["y"][:, None], batch_size=16, epochs=2, shuffle=False, verbose=0)
            results.append((model, history))
    finally:
        keras.mixed_precision.set_global_policy("float32")
    (plain, plain_history), (custom, custom_history) = results
    assert int(custom.optimizer.iterations) == int(plain.optimizer.iterations)
    if policy == "float32":  # (Keras 3.8's LossScaleOptimizer reports 0 iterations with accumulation)
        assert int(custom.optimizer.iterations) == 4  # 12 steps, 3 per update
    assert custom_history.history == plain_history.history
    mine, theirs = custom.optimizer.variables + custom.weights, plain.optimizer.variables + plain.weights
    for have, want in zip(mine, theirs, strict=True):
        np.testing.assert_array_equal(np.asarray(have), np.asarray(want))


def test_gradient_accumulation_under_a_one_replica_strategy_equals_no_strategy():
    """``MirroredStrategy()`` on a machine with one device: the update still goes the strategy's way (one
    ``merge_call``), so accumulation trains there as on one device (Keras 3's own option fails there too)."""
    from tests.strategy_cases import data

    d = data()

    def run(strategy):
        keras.utils.set_random_seed(4)
        with strategy.scope():
            inputs = keras.Input((8,))
            model = custom_fit.CustomModel(
                inputs, keras.layers.Dense(1)(keras.layers.Dense(16, activation="tanh")(inputs))
            )
            accumulating = {"gradient_accumulation_steps": 3}  # Keras 2: compile's option; Keras 3: the optimizer's
            on_compile, on_optimizer = (accumulating, {}) if custom_fit.KERAS_2 else ({}, accumulating)
            model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.5, **on_optimizer), loss="mse", **on_compile)
        history = model.fit(d["x"], d["y"][:, None], batch_size=16, epochs=2, shuffle=False, verbose=0).history
        return model, history

    single, single_history = run(tf.distribute.get_strategy())
    mirrored, mirrored_history = run(tf.distribute.MirroredStrategy(["/cpu:0"]))
    assert int(mirrored.optimizer.iterations.numpy()) == int(single.optimizer.iterations.numpy()) == 4
    assert parity.max_delta(single.get_weights(), mirrored.get_weights()) <= 1e-6
    assert parity.max_delta(single_history, mirrored_history) <= 1e-6
