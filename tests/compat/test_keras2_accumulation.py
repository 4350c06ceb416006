"""``compile(gradient_accumulation_steps=N)``: custom_fit's accumulation for tf_keras' optimizers, and its errors.

Keras 2 (``custom_fit._compat.keras2_accumulation``): N steps of batch b update as one step of
batch N·b would (the mean of the N mean-loss gradients is the big batch's gradient, up to float
association), ``optimizer.iterations`` counts updates, and under ``mixed_float16`` a step whose
scaled gradient overflows is skipped and not accumulated. Under ``MirroredStrategy`` and two
MWMS workers: ``tests/end_to_end/test_distribute.py``; a backup taken mid-accumulation:
``tests/test_backup_and_restore.py``. The option's errors are checked on both Kerases.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import custom_fit
from custom_fit import keras

RNG = np.random.default_rng(0)
X = RNG.normal(size=(96, 4)).astype("float32")
Y = (X @ RNG.normal(size=(4, 1))).astype("float32")

# The mean of 4 batch means against one mean over 4 times the batch: float association (measured 6e-8).
ASSOCIATION = 1e-6


def fit(optimizer: Any, batch: int, policy: str = "float32", scale: float = 1.0, **compile_kwargs: Any) -> Any:
    keras.mixed_precision.set_global_policy(policy)
    try:
        keras.utils.set_random_seed(1)
        model = custom_fit.CustomSequential(
            [keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1, dtype="float32")]
        )
        model.compile(optimizer=optimizer, loss="mse", **compile_kwargs)
        model.fit(X * scale, Y, batch_size=batch, epochs=3, shuffle=False, verbose=0)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    return model


def optimizers() -> dict[str, Any]:
    made = {
        "sgd": lambda: keras.optimizers.SGD(0.1, momentum=0.5),
        "adam_clipped": lambda: keras.optimizers.Adam(0.01, global_clipnorm=0.5),
    }
    if custom_fit.KERAS_2:
        made["legacy_adam"] = lambda: keras.optimizers.legacy.Adam(0.01)
    return made


@pytest.mark.keras2
@pytest.mark.parametrize("name", ["sgd", "adam_clipped", "legacy_adam"])
def test_four_steps_of_8_update_as_one_step_of_32(name: str) -> None:
    make = optimizers()[name]
    large = fit(make(), 32)
    accumulated = fit(make(), 8, gradient_accumulation_steps=4)
    assert int(accumulated.optimizer.iterations) == int(large.optimizer.iterations) == 9  # 3 epochs of 3 updates
    for have, want in zip(accumulated.get_weights(), large.get_weights(), strict=True):
        np.testing.assert_allclose(have, want, atol=ASSOCIATION, rtol=0)


@pytest.mark.keras2
def test_the_accumulators_are_the_optimizers_state_and_empty_after_an_update() -> None:
    model = fit(keras.optimizers.Adam(0.01), 8, gradient_accumulation_steps=4)  # 36 steps: 9 whole updates
    names = [v.name for v in model.optimizer.variables()]
    assert sum("gradient_accumulator" in n for n in names) == len(model.trainable_variables)
    assert any("accumulated_steps" in n for n in names)
    for variable in model.optimizer.variables():
        if "gradient_accumulator" in variable.name:
            assert not np.any(variable.numpy())
        if "accumulated_steps" in variable.name:
            assert int(variable.numpy()) == 36


@pytest.mark.keras2
def test_a_skipped_step_in_mixed_precision_is_not_accumulated() -> None:
    """Inputs x 20000 overflow the first scaled gradients: each skip halves the scale and accumulates nothing.

    tf_keras' loss-scale optimizer counts a skipped step as an iteration (without accumulation too),
    so ``iterations`` is the skipped steps plus the updates of the others.
    """
    model = fit(keras.optimizers.SGD(0.01), 8, policy="mixed_float16", scale=2e4, gradient_accumulation_steps=4)
    scale = float(model.optimizer.loss_scale.numpy())
    skipped = round(math.log2(2.0**15 / scale))
    assert 0 < skipped < 36, scale  # measured: 3 (32768 -> 4096)
    counter = next(v for v in model.optimizer.variables() if "accumulated_steps" in v.name)
    assert int(counter.numpy()) == 36 - skipped
    assert int(model.optimizer.iterations) == skipped + (36 - skipped) // 4
    assert all(np.all(np.isfinite(w)) for w in model.get_weights())


@pytest.mark.parametrize("steps", [1, 0, -2, 2.5, True, "4"])
def test_the_option_takes_a_whole_number_of_at_least_2(steps: Any) -> None:
    model = custom_fit.CustomSequential([keras.Input((4,)), keras.layers.Dense(1)])
    with pytest.raises(ValueError, match=r"gradient_accumulation_steps\) expects a whole number >= 2.*received"):
        model.compile(optimizer="sgd", loss="mse", gradient_accumulation_steps=steps)


def test_the_option_needs_an_optimizer() -> None:
    class NoOptimizer(custom_fit.CustomModel):
        def compile(self, *args: Any, **kwargs: Any) -> None:  # the keras.io pattern
            super().compile(**kwargs)  # no optimizer: a subclass' compile calling ours without one

    inputs = keras.Input((4,))
    model = NoOptimizer(inputs, keras.layers.Dense(1)(inputs))
    with pytest.raises(ValueError, match=r"compile received no optimizer\. Fix: pass optimizer="):
        model.compile(loss="mse", gradient_accumulation_steps=2)


def test_an_optimizer_with_state_is_refused() -> None:
    optimizer = keras.optimizers.SGD(0.1)
    fit(optimizer, 32)  # builds it
    model = custom_fit.CustomSequential([keras.Input((4,)), keras.layers.Dense(1)])
    with pytest.raises(ValueError, match=r"was built already \(it has state\)\. Fix: .*compile a new optimizer"):
        model.compile(optimizer=optimizer, loss="mse", gradient_accumulation_steps=2)


@pytest.mark.keras3
def test_keras_3_sets_the_optimizers_own_option_and_refuses_another_number() -> None:
    model = fit(keras.optimizers.Adam(0.01), 8, gradient_accumulation_steps=4)
    assert model.optimizer.gradient_accumulation_steps == 4 and int(model.optimizer.iterations) == 9
    assert model.get_compile_config()["gradient_accumulation_steps"] == 4  # load_model compiles with it
    other = custom_fit.CustomSequential([keras.Input((4,)), keras.layers.Dense(1)])
    with pytest.raises(ValueError, match=r"has gradient_accumulation_steps=3\. Fix: pass"):
        other.compile(optimizer=keras.optimizers.SGD(gradient_accumulation_steps=3), gradient_accumulation_steps=2)


@pytest.mark.keras2
def test_keras_2_refuses_a_keras_3_optimizer_and_names_the_option() -> None:
    import keras as keras3

    model = custom_fit.CustomSequential([keras.Input((4,)), keras.layers.Dense(1)])
    with pytest.raises(ValueError, match=r"compile\(gradient_accumulation_steps=4\)"):
        model.compile(optimizer=keras3.optimizers.SGD(gradient_accumulation_steps=4), loss="mse")


@pytest.mark.keras2
def test_a_step_without_a_strategy_runs_the_update_in_one_merge_call() -> None:
    """The default strategy's replica context runs the ``merge_call`` as a plain call: eager and traced alike."""
    eager = fit(keras.optimizers.SGD(0.1), 8, gradient_accumulation_steps=4, run_eagerly=True)
    traced = fit(keras.optimizers.SGD(0.1), 8, gradient_accumulation_steps=4)
    for have, want in zip(eager.get_weights(), traced.get_weights(), strict=True):
        np.testing.assert_allclose(have, want, atol=ASSOCIATION, rtol=0)
    assert tf.distribute.get_strategy().num_replicas_in_sync == 1
