"""Several named validation sets in one ``fit`` (``custom_fit._trainer.validation_sets``), on both Kerases.

Each set's values equal ``evaluate`` on that set with that run's weights, exactly; training equals a
``fit`` without validation, exactly; every consumer of ``val_*`` sees the sets' names; bad input
gets a clear error.
"""

from __future__ import annotations

import csv
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import custom_fit
from custom_fit import keras
from tests import crash_cases

RNG = np.random.default_rng(0)
X, Y = RNG.normal(size=(48, 4)).astype("float32"), RNG.integers(0, 3, 48).astype("int32")
EASY = (RNG.normal(size=(20, 4)).astype("float32"), RNG.integers(0, 3, 20).astype("int32"))
HARD = (RNG.normal(size=(28, 4)).astype("float32"), RNG.integers(0, 3, 28).astype("int32"))


def model(steps_per_execution: int = 1) -> keras.Model:
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,))
    outputs = keras.layers.Dense(3, activation="softmax")(keras.layers.Dense(8, activation="relu")(inputs))
    built = custom_fit.CustomModel(inputs, outputs)
    built.compile(
        optimizer="adam",
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
        steps_per_execution=steps_per_execution,
    )
    return built


def hard_dataset() -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices(HARD).batch(6)


class WeightsAtRuns(keras.callbacks.Callback):
    """Keeps the weights at each validation run (a callback with ``monitor`` sees each run's end)."""

    monitor = "val_easy_loss"

    def __init__(self) -> None:
        super().__init__()
        self.weights: list[list[np.ndarray]] = []

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.weights.append(self.model.get_weights())


@pytest.mark.parametrize("steps_per_execution", [1, 3], ids=["steps_per_execution=1", "steps_per_execution=3"])
@pytest.mark.parametrize("freq", ["epochs", "steps"])
def test_each_set_equals_evaluate_on_it_with_that_runs_weights(freq: str, steps_per_execution: int) -> None:
    validation_freq = custom_fit.Steps(4) if freq == "steps" else 1
    recorder = WeightsAtRuns()
    fitted = model(steps_per_execution)
    history = fitted.fit(
        X, Y, batch_size=8, epochs=2, verbose=0, shuffle=False, callbacks=[recorder],
        validation_data={"easy": EASY, "hard": hard_dataset()}, validation_freq=validation_freq,
    )  # fmt: skip
    runs = len(history.history["val_easy_loss"])
    assert runs == (3 if freq == "steps" else 2) and len(recorder.weights) == runs  # 12 steps: after 4, 8, 12
    checked = model(steps_per_execution)
    for run, weights in enumerate(recorder.weights):
        checked.set_weights(weights)
        easy = checked.evaluate(*EASY, batch_size=8, verbose=0, return_dict=True)
        hard = checked.evaluate(hard_dataset(), verbose=0, return_dict=True)
        for name in ("loss", "accuracy"):
            assert history.history[f"val_easy_{name}"][run] == easy[name]  # exactly
            assert history.history[f"val_hard_{name}"][run] == hard[name]


@pytest.mark.parametrize("freq", ["epochs", "steps"])
def test_training_equals_a_fit_without_validation(freq: str) -> None:
    plain = model()
    plain_history = plain.fit(X, Y, batch_size=8, epochs=2, verbose=0, shuffle=False)
    validated = model()
    history = validated.fit(
        X, Y, batch_size=8, epochs=2, verbose=0, shuffle=False, validation_data={"easy": EASY, "hard": HARD},
        validation_freq=custom_fit.Steps(4) if freq == "steps" else 1,
    )  # fmt: skip
    for ours, theirs in zip(validated.get_weights(), plain.get_weights(), strict=True):
        np.testing.assert_array_equal(ours, theirs)
    for name in ("loss", "accuracy"):
        assert history.history[name] == plain_history.history[name]


def test_one_set_keeps_keras_names_and_values() -> None:
    one = model().fit(X, Y, batch_size=8, verbose=0, shuffle=False, validation_data=EASY)
    named = model().fit(X, Y, batch_size=8, verbose=0, shuffle=False, validation_data={"easy": EASY})
    assert sorted(one.history) == ["accuracy", "loss", "val_accuracy", "val_loss"]
    assert one.history["val_loss"] == named.history["val_easy_loss"]


def test_names_are_normalised_and_steps_and_batch_sizes_go_per_set() -> None:
    fitted = model()
    history = fitted.fit(
        X, Y, batch_size=8, verbose=0, shuffle=False,
        validation_data={" hard set ": HARD, "easy-one": EASY},
        validation_steps={"hard set ": 2}, validation_batch_size={"easy-one": 5},
    )  # fmt: skip
    assert {"val_hard_set_loss", "val_easy_one_loss"} <= set(history.history)
    hard = fitted.evaluate(*HARD, batch_size=8, steps=2, verbose=0, return_dict=True)
    easy = fitted.evaluate(*EASY, batch_size=5, verbose=0, return_dict=True)
    assert history.history["val_hard_set_loss"] == [hard["loss"]]
    assert history.history["val_easy_one_loss"] == [easy["loss"]]


def test_a_dict_of_the_models_inputs_is_keras_validation_data() -> None:
    inputs = {"a": keras.Input((2,), name="a"), "b": keras.Input((2,), name="b")}
    outputs = keras.layers.Dense(1)(keras.layers.Concatenate()([inputs["a"], inputs["b"]]))
    built = custom_fit.CustomModel(inputs, outputs)
    built.compile(optimizer="sgd", loss="mse")
    data = {"a": np.ones((8, 2), "float32"), "b": np.ones((8, 2), "float32")}
    history = built.fit(data, np.ones((8, 1)), verbose=0, validation_data=(data, np.ones((8, 1))))
    assert "val_loss" in history.history


def test_a_monitor_of_a_sets_loss_needs_its_mode_on_keras_3_as_for_an_outputs() -> None:
    """Keras 3 infers "min" for ``val_loss`` only (and for compiled metrics' names): ``val_hard_loss`` needs a mode.

    The same as for a multi-output model's ``val_b_loss``; tf_keras infers "min" for any name without "acc".
    """
    stopper = keras.callbacks.EarlyStopping(monitor="val_hard_loss")
    fit = lambda: model().fit(X, Y, batch_size=8, verbose=0, validation_data={"hard": HARD}, callbacks=[stopper])  # noqa: E731
    if custom_fit.KERAS_2:
        fit()
        assert stopper.monitor_op == np.less
    else:
        with pytest.raises(ValueError, match=r"monitor=val_hard_loss, but Keras isn't able to automatically"):
            fit()


def test_monitors_checkpoints_csv_and_the_progress_bar_see_each_set(tmp_path: Any, capsys: Any) -> None:
    stopper = keras.callbacks.EarlyStopping(monitor="val_hard_loss", patience=0, mode="max")  # stops at run 2
    # Halves the learning rate where val_hard_loss does not rise: at the same run.
    plateau = keras.callbacks.ReduceLROnPlateau(monitor="val_hard_loss", mode="max", patience=0, factor=0.5)
    checkpoint = keras.callbacks.ModelCheckpoint(
        str(tmp_path / "run-{epoch}-{val_hard_loss:.4f}.weights.h5"),
        monitor="val_easy_loss",
        mode="min",  # Keras 3 infers a mode only for val_loss and the compiled metrics' names
        save_weights_only=True,
    )
    log = tmp_path / "log.csv"
    fitted = model()
    history = fitted.fit(
        X, Y, batch_size=8, epochs=5, verbose=2, shuffle=False, validation_data={"easy": EASY, "hard": HARD},
        callbacks=[stopper, plateau, checkpoint, keras.callbacks.CSVLogger(str(log))],
    )  # fmt: skip
    assert len(history.history["loss"]) == 2  # val_hard_loss fell at the second epoch: "max" stops
    assert history.history["val_hard_loss"][1] < history.history["val_hard_loss"][0]
    assert float(np.asarray(fitted.optimizer.learning_rate)) == pytest.approx(0.0005)
    saved = sorted(path.name for path in tmp_path.glob("run-*.weights.h5"))
    assert saved == [
        f"run-{epoch + 1}-{value:.4f}.weights.h5" for epoch, value in enumerate(history.history["val_hard_loss"])
    ]
    with log.open() as file:
        rows = list(csv.DictReader(file))
    assert {"val_easy_loss", "val_hard_accuracy"} <= set(rows[0])
    assert [float(row["val_easy_loss"]) for row in rows] == pytest.approx(history.history["val_easy_loss"])
    printed = capsys.readouterr().out
    assert "val_easy_loss" in printed and "val_hard_accuracy" in printed


def test_tensorboard_writes_each_set_to_the_validation_writer(tmp_path: Any) -> None:
    model().fit(
        X, Y, batch_size=8, verbose=0, validation_data={"easy": EASY, "hard": HARD},
        callbacks=[keras.callbacks.TensorBoard(str(tmp_path))],
    )  # fmt: skip
    tags: set[str] = set()
    for path in (tmp_path / "validation").glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            tags.update(value.tag for value in event.summary.value)
    assert {"epoch_easy_loss", "epoch_hard_loss", "epoch_easy_accuracy"} <= tags


def test_a_resumed_fit_validates_each_set_as_the_uninterrupted_one(tmp_path: Any) -> None:
    """12 steps, Steps(4), a backup every 5 steps; stopped after step 9: the restart trains from step 6.

    Its runs after steps 8 and 12 equal the uninterrupted run's, set by set; so do the weights. (The
    SIGKILL tests of ``Steps(N)`` resume are ``tests/trainer/test_validation.py``'s; the sets change
    only what each run evaluates.)
    """
    sets = {"easy": EASY, "hard": HARD}

    def fit(callbacks: list[Any], fitted: keras.Model) -> Any:
        return fitted.fit(
            X, Y, batch_size=8, epochs=2, verbose=0, shuffle=False, validation_data=sets,
            validation_freq=custom_fit.Steps(4), callbacks=callbacks,
        )  # fmt: skip

    full = fit([], model())
    resumed_model = model()
    backup = lambda: custom_fit.BackupAndRestore(tmp_path, save_freq=5, write_in_background=False)  # noqa: E731
    with pytest.raises(KeyboardInterrupt):
        fit([backup(), crash_cases.Interrupt(9)], resumed_model)
    resumed = fit([backup()], resumed_model)
    assert resumed.history["val_step"] == [8, 12]
    for name in ("val_easy_loss", "val_easy_accuracy", "val_hard_loss", "val_hard_accuracy"):
        assert resumed.history[name] == full.history[name][1:], name
    for ours, theirs in zip(resumed_model.get_weights(), full.model.get_weights(), strict=True):
        np.testing.assert_array_equal(ours, theirs)


# --------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fit_kwargs", "message"),
    [
        ({"validation_data": {}}, r"validation_data=\{\}\) received an empty dict.*Fix: add a set"),
        ({"validation_data": {1: EASY}}, r"names its sets with strings; received the key 1 of type int"),
        ({"validation_data": {"easy": EASY, "x": X}}, r"mixes named sets \('easy'.*'x': ndarray.*Fix: give each"),
        ({"validation_data": {"easy": EASY}, "validation_split": 0.2}, r"validation_split=0.2 and named validation"),
        ({"validation_data": {"hard set": HARD, "hard-set": EASY}}, r"'hard set' and 'hard-set'.*val_hard_set_\*"),
        ({"validation_data": {"--": HARD}}, r"the set name '--', which has no letter or digit"),
        ({"validation_data": {"easy": EASY}, "validation_steps": {"hard": 2}}, r"names 'hard', which no validation"),
        (
            {"validation_data": EASY, "validation_batch_size": {"easy": 2}},
            r"validation_batch_size=dict\) gives a value",
        ),
    ],
    ids=["empty", "key-not-str", "mixed", "with-split", "twice", "no-letter", "unknown-steps", "dict-without-sets"],
)
def test_bad_validation_sets_are_refused_before_training(fit_kwargs: dict[str, Any], message: str) -> None:
    fitted = model()
    before = fitted.get_weights()
    with pytest.raises(ValueError, match=message):
        fitted.fit(X, Y, batch_size=8, verbose=0, **fit_kwargs)
    for now, then in zip(fitted.get_weights(), before, strict=True):
        np.testing.assert_array_equal(now, then)  # nothing trained


def test_a_set_that_does_not_fit_the_model_is_named_in_the_error() -> None:
    wrong = (np.ones((8, 5), "float32"), np.zeros(8, "int32"))  # 5 features, the model takes 4
    # Keras' own error, as for one set (Keras 3: TensorFlow's; tf_keras: its input check)
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match=r"incompatible") as raised:
        model().fit(X, Y, batch_size=8, verbose=0, validation_data={"easy": EASY, "wide": wrong})
    assert "while fit validated on the validation set 'wide'" in "".join(getattr(raised.value, "__notes__", []))


def test_set_names_that_would_share_log_names_with_an_output_are_refused() -> None:
    inputs = keras.Input((4,))
    built = custom_fit.CustomModel(
        inputs, {"b": keras.layers.Dense(1, name="b")(inputs), "c": keras.layers.Dense(1, name="c")(inputs)}
    )
    built.compile(optimizer="sgd", loss="mse")
    data = (X, {"b": np.ones((48, 1)), "c": np.ones((48, 1))})
    with pytest.raises(ValueError, match=r"the sets 'a' and 'a_b' would log values under the same names"):
        built.fit(*data, verbose=0, validation_data={"a": data, "a_b": data})


def test_a_metric_name_that_makes_two_sets_log_one_name_stops_fit_at_the_first_run() -> None:
    """Set "a" logs its metric "b_loss" as val_a_b_loss, set "a_b" its loss as the same: no value overwritten."""
    built = model()
    built.compile(
        optimizer="adam",
        loss="sparse_categorical_crossentropy",
        metrics=[keras.metrics.SparseCategoricalCrossentropy(name="b_loss")],
    )
    with pytest.raises(ValueError, match=r"the validation set 'a_b' logs val_a_b_loss, which an earlier set logged"):
        built.fit(X, Y, batch_size=8, verbose=0, validation_data={"a": EASY, "a_b": HARD})
