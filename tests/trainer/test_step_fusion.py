"""``compile(steps_per_execution="auto")``: tuned during fit, and training identical to one step at a time."""

from __future__ import annotations

import contextlib
import gc
import io
import re
import warnings
import weakref

import numpy as np
import pytest
import tensorflow as tf

import custom_fit
from custom_fit import keras
from custom_fit._trainer.step_fusion import StepsPerExecutionTuner
from tests import parity

DATA = parity.classification_data()
X, Y = np.tile(DATA["x"], (4, 1)), np.tile(DATA["y"], 4)  # 396 samples: 25 batches of 16 (last partial)


def fast_tuner(window_executions: int = 2) -> StepsPerExecutionTuner:
    """A tuner that measures every ``window_executions`` executions and keeps every doubling (climbs fast)."""
    return StepsPerExecutionTuner(
        max_steps=8,
        window_executions=window_executions,
        window_seconds=0.0,
        improvement=-1.0,
        short_execution_seconds=0.0,
    )


def train(steps_per_execution, verbose=0, epochs=3):
    keras.utils.set_random_seed(3)
    inputs = keras.Input((parity.N_FEATURES,))
    hidden = keras.layers.BatchNormalization()(keras.layers.Dense(16, activation="relu")(inputs))
    outputs = keras.layers.Dense(parity.N_CLASSES, activation="softmax")(keras.layers.Dropout(0.3)(hidden))
    model = custom_fit.CustomModel(inputs, outputs)
    if steps_per_execution == "auto":
        steps_per_execution = fast_tuner()  # climbs to 8 within the first epoch (any gain counts)
    model.compile(
        optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"],
        steps_per_execution=steps_per_execution,
    )  # fmt: skip
    recorder, output = parity.BatchLogRecorder(), io.StringIO()
    with contextlib.redirect_stdout(output):
        history = model.fit(
            X, Y, batch_size=16, epochs=epochs, shuffle=True, verbose=verbose,
            validation_data=(DATA["x_val"], DATA["y_val"]), callbacks=[recorder],
        )  # fmt: skip
    return model, history.history, recorder.logs, output.getvalue()


# Keras 3.8-3.10 give batch callbacks and the progress bar the first step of each execution; Keras
# 3.11+ (whose epoch iterator yields first and last steps) and tf_keras give its last. Any
# steps_per_execution > 1 shows it, fixed or "auto": keras.Model with steps_per_execution=8 on 25
# steps reports [0, 8, 16, 24] on 3.8 and [7, 15, 23, 31] on 3.15.
BATCH_HOOKS_SEE_THE_LAST_STEP = custom_fit.KERAS_2 or tuple(int(p) for p in keras.version().split(".")[:2]) >= (3, 11)


# 25 steps per epoch: a window of 2 executions reaches 8 steps in the first epoch; one of 8
# executions reaches 2 steps in the first epoch, 4 in the second, 8 in the third, so that each
# validation (through the one epoch iterator fit keeps for it) fuses another number.
@pytest.mark.parametrize("window_executions", [2, 8], ids=["tuned_in_epoch_1", "tuned_across_epochs"])
def test_auto_trains_exactly_like_one_step_per_execution(window_executions):
    one, one_history, one_logs, _ = train(1)
    tuner = fast_tuner(window_executions)
    auto, auto_history, auto_logs, _ = train(tuner)
    assert tuner.steps == 8, "the tuner should have fused more steps"
    deltas = {
        "weights": parity.max_delta(one.get_weights(), auto.get_weights()),
        "history": parity.max_delta(one_history, auto_history),
        "evaluate": parity.max_delta(
            one.evaluate(DATA["x_val"], DATA["y_val"], verbose=0),
            auto.evaluate(DATA["x_val"], DATA["y_val"], verbose=0),
        ),
    }
    parity.record('steps_per_execution="auto" vs 1', **deltas)
    assert deltas == {"weights": 0.0, "history": 0.0, "evaluate": 0.0}
    assert int(auto.optimizer.iterations) == int(one.optimizer.iterations) == 3 * 25
    # Batch callbacks run once per execution; from Keras 3.11 on its last step, so each epoch ends
    # on step 24 (before, on its first step, so each epoch starts on step 0).
    train_steps = [batch for kind, batch, _ in auto_logs if kind == "train"]
    assert len(train_steps) < len([1 for kind, _, _ in one_logs if kind == "train"]) == 3 * 25
    epochs: list[list[int]] = [[]]
    for step in train_steps:
        if epochs[-1] and step < epochs[-1][-1]:
            epochs.append([])
        epochs[-1].append(step)
    assert len(epochs) == 3 and all(epoch == sorted(set(epoch)) for epoch in epochs)
    if BATCH_HOOKS_SEE_THE_LAST_STEP:
        assert all(epoch[-1] == 24 for epoch in epochs)
    else:
        assert all(epoch[0] == 0 for epoch in epochs)


def unknown_length(batches):
    """``batches`` batches of 8 through ``.filter``: a ``tf.data`` pipeline whose length nobody knows in advance."""
    x, y = DATA["x"][: 8 * batches], DATA["y"][: 8 * batches]
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(8).filter(lambda x, y: True)


@pytest.mark.parametrize(
    ("batches", "fit_args"),
    [(5, dict(epochs=3)), (10, dict(epochs=4, steps_per_epoch=4))],
    ids=["runs_dry_each_epoch", "steps_per_epoch_runs_dry"],
)
def test_auto_equals_one_step_on_data_of_unknown_length(batches, fit_args):
    """Where the data may end, "auto" runs one step per execution, so the end of the data counts as with 1.

    With one step per execution, the execution that finds the data exhausted still counts an
    optimizer iteration (and draws Dropout's seeds): Keras' step is a graph whose state updates do
    not wait for the batch. A fused execution stops before its loop body instead.
    """
    runs = {}
    for steps_per_execution in (1, "auto"):
        keras.utils.set_random_seed(3)
        inputs = keras.Input((parity.N_FEATURES,))
        hidden = keras.layers.Dropout(0.3)(keras.layers.Dense(16, activation="relu")(inputs))
        model = custom_fit.CustomModel(inputs, keras.layers.Dense(parity.N_CLASSES, activation="softmax")(hidden))
        tuner = fast_tuner(window_executions=1) if steps_per_execution == "auto" else None
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", steps_per_execution=tuner or 1)
        with warnings.catch_warnings():  # Keras 3 warns each time data of unknown length ends an epoch
            warnings.filterwarnings("ignore", "Your input ran out of data", UserWarning)
            history = model.fit(unknown_length(batches), shuffle=False, verbose=0, **fit_args).history
        runs[steps_per_execution] = (model, history, tuner)
    (one, one_history, _), (auto, auto_history, tuner) = runs[1], runs["auto"]
    assert tuner is not None and tuner.steps > 1, "the tuner should have fused more steps"
    delta = parity.max_delta(one.get_weights(), auto.get_weights())
    parity.record(f'steps_per_execution="auto" vs 1, unknown length ({batches} batches)', weights=delta)
    assert delta == 0.0
    assert parity.max_delta(one_history, auto_history) == 0.0
    assert int(auto.optimizer.iterations) == int(one.optimizer.iterations)


def test_auto_fits_data_of_unknown_length_after_tuning():
    """A second ``fit``, on data of unknown length, after the tuner fused 8 steps (tf_keras refused it)."""
    models = {}
    for steps_per_execution in (1, "auto"):
        keras.utils.set_random_seed(3)
        inputs = keras.Input((parity.N_FEATURES,))
        model = custom_fit.CustomModel(inputs, keras.layers.Dense(parity.N_CLASSES, activation="softmax")(inputs))
        tuner = fast_tuner() if steps_per_execution == "auto" else None
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", steps_per_execution=tuner or 1)
        model.fit(X, Y, batch_size=16, epochs=1, verbose=0)
        assert tuner is None or tuner.steps == 8
        with warnings.catch_warnings():  # Keras 3 warns each time data of unknown length ends an epoch
            warnings.filterwarnings("ignore", "Your input ran out of data", UserWarning)
            model.fit(unknown_length(5), shuffle=False, epochs=2, verbose=0)
        models[steps_per_execution] = model
    assert parity.max_delta(models[1].get_weights(), models["auto"].get_weights()) == 0.0
    assert int(models["auto"].optimizer.iterations) == int(models[1].optimizer.iterations)


def test_steps_per_execution_reads_what_auto_fuses_now():
    """``model.steps_per_execution`` is the tuner's choice (Keras 3); ``evaluate`` and ``predict`` equal one step."""
    keras.utils.set_random_seed(3)
    inputs = keras.Input((parity.N_FEATURES,))
    model = custom_fit.CustomModel(inputs, keras.layers.Dense(parity.N_CLASSES, activation="softmax")(inputs))
    tuner = fast_tuner()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", steps_per_execution=tuner)
    assert int(model.steps_per_execution) == 1
    # Functions made before tuning (for one step) must follow the tuned number afterwards.
    before = model.predict(X, batch_size=16, verbose=0), model.evaluate(X, Y, batch_size=16, verbose=0)
    model.fit(X, Y, batch_size=16, epochs=3, verbose=0, validation_data=(DATA["x_val"], DATA["y_val"]))
    assert tuner.steps == 8
    # Keras 3: the tuner's choice. Keras 2: tf_keras' variable, which the loop sets before each
    # execution (the tuner's choice in fit) and gives its compiled value back after.
    assert int(model.steps_per_execution) == (1 if custom_fit.KERAS_2 else 8)
    assert (model.get_compile_config() or {}).get("steps_per_execution") == "auto"

    weights = model.get_weights()
    fixed = keras.models.clone_model(model)
    fixed.compile(optimizer="adam", loss="sparse_categorical_crossentropy", steps_per_execution=1)
    fixed.set_weights(weights)
    assert before[0].shape == (len(X), parity.N_CLASSES)
    for steps in (None, 3):  # all batches, and fewer than the fused steps
        predictions = model.predict(X, batch_size=16, steps=steps, verbose=0)
        assert parity.max_delta(predictions, fixed.predict(X, batch_size=16, steps=steps, verbose=0)) == 0
        loss = model.evaluate(X, Y, batch_size=16, steps=steps, verbose=0)
        assert loss == fixed.evaluate(X, Y, batch_size=16, steps=steps, verbose=0)


@pytest.mark.skipif(
    not BATCH_HOOKS_SEE_THE_LAST_STEP,
    reason="Keras < 3.11 updates the progress bar with each execution's first step: its running means "
    "differ from one step per execution for any steps_per_execution > 1 (keras.Model alike)",
)
def test_progress_bar_ends_each_epoch_like_one_step():
    def final_lines(output):
        output = re.sub(r"\d+(ms|s|us)(/step)?", "T", output)
        return [line.split("\r")[-1].rstrip() for line in output.split("\n")]

    assert final_lines(train("auto", verbose=1)[3]) == final_lines(train(1, verbose=1)[3])


def test_gan_auto_logs_the_same_epoch_means():
    x = np.random.default_rng(0).normal(size=(200, 2)).astype("float32")
    histories, weights = [], []
    for steps in (1, "auto"):
        keras.utils.set_random_seed(0)
        generator = keras.Sequential(
            [keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2)]
        )
        discriminator = keras.Sequential(
            [keras.Input((2,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)]
        )
        gan = custom_fit.GAN(generator, discriminator, latent_dim=4, seed=0)
        gan.compile(steps_per_execution=fast_tuner() if steps == "auto" else steps)
        histories.append(gan.fit(x, batch_size=16, epochs=2, verbose=0).history)
        weights.append(gan.get_weights())
    assert parity.max_delta(histories[0], histories[1]) == 0.0
    assert parity.max_delta(weights[0], weights[1]) == 0.0


def test_auto_survives_save_and_load(tmp_path):
    model, _, _, _ = train("auto", epochs=1)
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    assert loaded.get_compile_config()["steps_per_execution"] == "auto"
    assert isinstance(loaded.steps_tuner, StepsPerExecutionTuner)
    loaded.fit(X, Y, batch_size=16, epochs=1, verbose=0)


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def run(tuner, clock, seconds_per_step, executions, overhead=0.01):
    """Feeds ``tuner`` executions whose time is ``overhead + steps * seconds_per_step(steps)``."""
    for _ in range(executions):
        steps = tuner.plan(remaining=1000)
        clock.now += overhead + steps * seconds_per_step(steps)
        tuner.executed(steps, sync=lambda: None)


def test_tuner_climbs_while_fusing_pays_and_settles_on_the_best():
    clock = FakeClock()
    tuner = StepsPerExecutionTuner(max_steps=256, window_executions=4, window_seconds=0.0, clock=clock)
    # Per-step overhead of 10 ms is amortized by fusing; above 16 steps each step gets slower.
    run(tuner, clock, lambda steps: 0.001 if steps <= 16 else 0.003, executions=100)
    assert tuner.steps == 16
    assert tuner.settled


def test_tuner_climbs_a_plateau_while_executions_are_short():
    """Steps of 20 ms and 3 ms per execution (the benchmark's CNN on a CPU): each doubling gains 1-4%.

    No single doubling gains 5%, but together they gain 10% (1 step: 43.5 steps/s, 16: 49.5).
    The tuner doubles while executions last under 0.25 s, then keeps 32 only if it pays 5% (0.5%).
    """
    clock = FakeClock()
    tuner = StepsPerExecutionTuner(max_steps=256, window_executions=4, window_seconds=0.0, clock=clock)
    run(tuner, clock, lambda steps: 0.020, executions=60, overhead=0.003)
    assert (tuner.steps, sorted(tuner.rates)) == (16, [1, 2, 4, 8, 16, 32])
    # Doubling that measurably hurts is undone even while executions are short.
    clock = FakeClock()
    tuner = StepsPerExecutionTuner(max_steps=256, window_executions=4, window_seconds=0.0, clock=clock)
    run(tuner, clock, lambda steps: 0.020 if steps < 4 else 0.025, executions=60, overhead=0.003)
    assert (tuner.steps, sorted(tuner.rates)) == (2, [1, 2, 4])


def test_tuner_reprobes_after_a_while_and_stays_capped():
    clock = FakeClock()
    tuner = StepsPerExecutionTuner(
        max_steps=8, window_executions=2, window_seconds=0.0, clock=clock, reprobe_seconds=1.0
    )
    run(tuner, clock, lambda steps: 0.001, executions=200)  # fusing always pays: up to the cap
    assert tuner.steps == 8
    assert tuner.plan(remaining=3) == 3 and tuner.plan(remaining=None) == 1
    with pytest.raises(ValueError, match="max_steps must be a power of two >= 1, received 6"):
        StepsPerExecutionTuner(max_steps=6)


def tune_over_epochs(new_iterator_each_epoch: bool) -> int:
    """Tunes over 40 epochs of 64 steps with 2 s between epochs; returns the steps an epoch execution fuses."""
    clock = FakeClock()
    tuner = StepsPerExecutionTuner(max_steps=256, window_executions=4, window_seconds=0.0, clock=clock)
    for _ in range(40):
        source = object() if new_iterator_each_epoch else None
        remaining = 64
        while remaining:
            steps = tuner.plan(remaining)
            clock.now += 0.01 + steps * 0.001  # 10 ms per execution, 1 ms per step: fusing pays up to the epoch
            tuner.executed(steps, sync=lambda: None, source=source)
            remaining -= steps
        clock.now += 2.0  # validation, epoch-end callbacks, or another model's fit (the benchmark)
    return tuner.plan(remaining=64)


def test_tuner_does_not_count_the_time_between_epochs():
    assert tune_over_epochs(new_iterator_each_epoch=True) == 64
    # Counting the 2 s gaps (as when every execution reports the same source) makes fusing look worse.
    assert tune_over_epochs(new_iterator_each_epoch=False) < 64


def test_tuner_does_not_keep_a_finished_epochs_iterator_alive():
    class Iterator:
        pass

    tuner, iterator = StepsPerExecutionTuner(), Iterator()
    tuner.executed(1, sync=lambda: None, source=iterator)
    freed = weakref.ref(iterator)
    del iterator
    gc.collect()
    assert freed() is None
