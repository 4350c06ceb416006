"""CustomModel construction, override points and error messages."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import tensorflow as tf

import custom_fit
from custom_fit import _compat, keras
from tests import parity

DATA = parity.classification_data()
X, Y = DATA["x"], DATA["y"]


def functional(base=custom_fit.CustomModel):
    inputs = keras.Input((parity.N_FEATURES,))
    return base(inputs, keras.layers.Dense(parity.N_CLASSES, activation="softmax")(inputs))


# --------------------------------------------------------------------------
# Override points
# --------------------------------------------------------------------------


class Recording(custom_fit.CustomModel):
    """Records the order in which ``train_step`` calls the override points."""

    calls: list

    def compute_loss(self, *args, **kwargs):
        self.calls.append("compute_loss")
        return super().compute_loss(*args, **kwargs)

    def minimize(self, loss, tape, variables, optimizer=None):
        self.calls.append("minimize")
        return super().minimize(loss, tape, variables, optimizer)

    def compute_gradients(self, loss, tape, variables):
        self.calls.append("compute_gradients")
        return super().compute_gradients(loss, tape, variables)

    def transform_gradients(self, grads_and_vars):
        self.calls.append("transform_gradients")
        return super().transform_gradients(grads_and_vars)

    def apply_gradients(self, grads_and_vars, optimizer=None):
        self.calls.append("apply_gradients")
        return super().apply_gradients(grads_and_vars, optimizer)

    def compute_metrics(self, *args, **kwargs):
        self.calls.append("compute_metrics")
        return super().compute_metrics(*args, **kwargs)


def test_override_points_are_called_in_order():
    model = functional(Recording)
    model.calls = []
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", run_eagerly=True)
    model.train_on_batch(X[:8], Y[:8])
    assert model.calls == [
        "compute_loss",
        "minimize",
        "compute_gradients",
        "transform_gradients",
        "apply_gradients",
        "compute_metrics",
    ]
    model.calls = []
    model.test_on_batch(X[:8], Y[:8])
    assert model.calls == ["compute_loss", "compute_metrics"]


def test_transform_gradients_changes_the_update():
    class Frozen(custom_fit.CustomModel):
        def transform_gradients(self, grads_and_vars):
            return [(tf.zeros_like(g), v) for g, v in super().transform_gradients(grads_and_vars)]

    model = functional(Frozen)
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    before = model.get_weights()
    model.fit(X, Y, epochs=1, batch_size=16, verbose=0)
    assert parity.max_delta(before, model.get_weights()) == 0.0
    assert int(model.optimizer.iterations) == 7


def test_minimize_with_two_optimizers_in_one_step():
    """A step can minimize two losses with two optimizer instances (GAN-style)."""

    class TwoParts(custom_fit.CustomModel):
        def __init__(self):
            super().__init__()
            self.a = keras.layers.Dense(4)
            self.b = keras.layers.Dense(1)
            self.opt_b = keras.optimizers.SGD(0.1)

        def call(self, x):
            return self.b(self.a(x))

        def train_step(self, data):
            x, y = data
            with tf.GradientTape(persistent=True) as tape:
                y_pred = self(x)
                loss = tf.reduce_mean(tf.square(y_pred - y))
            self.minimize(loss, tape, self.a.trainable_weights)
            self.minimize(loss, tape, self.b.trainable_weights, optimizer=self.opt_b)
            return {"loss": loss}

    model = TwoParts()
    model.compile(optimizer=keras.optimizers.SGD(0.01))
    model.fit(X, X[:, :1], epochs=1, batch_size=33, verbose=0)
    assert int(model.optimizer.iterations) == 3 and int(model.opt_b.iterations) == 3


# --------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------


def test_fit_before_compile_says_how_to_fix():
    model = functional()
    with pytest.raises(
        ValueError,
        match=(
            r"CustomModel.fit\(\) needs a compiled model: expected `model.compile\(optimizer=..., "
            r"loss=...\)`.*was never compiled. Fix: call `model.compile"
        ),
    ):
        model.fit(X, Y, verbose=0)
    with pytest.raises(ValueError, match=r"evaluate\(\) needs a compiled model"):
        model.evaluate(X, Y, verbose=0)
    with pytest.raises(ValueError, match=r"CustomModel.train_on_batch\(\) needs a compiled model"):
        model.train_on_batch(X[:4], Y[:4])
    with pytest.raises(ValueError, match=r"CustomModel.test_on_batch\(\) needs a compiled model"):
        model.test_on_batch(X[:4], Y[:4])


def test_minimize_with_unknown_optimizer_name():
    class Named(custom_fit.CustomModel):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = self.compute_loss(x, y, self(x))
            self.minimize(loss, tape, self.trainable_weights, optimizer="generator")
            return {}

    model = functional(Named)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    with pytest.raises(
        ValueError,
        match=(
            r"received optimizer='generator', which names no optimizer of this model \(compiled "
            r"optimizer: Adam; name optimizers with compile\(optimizer=\{name: ...\}\)\)\. Expected "
            r"`None`.*Fix: omit"
        ),
    ):
        model.fit(X, Y, verbose=0)


def test_minimize_without_any_optimizer():
    model = functional()
    model.compile(optimizer=None, loss="sparse_categorical_crossentropy")
    with pytest.raises(ValueError, match=r"has no optimizer: expected `compile\(optimizer=...\)`.*Fix: call"):
        model.fit(X, Y, verbose=0)


def test_model_without_loss_trains_on_add_loss():
    """No ``y`` is fine when no loss is compiled: the loss comes from ``add_loss``."""

    class Autoencoder(custom_fit.CustomModel):
        def __init__(self):
            super().__init__()
            self.code = keras.layers.Dense(3)
            self.decode = keras.layers.Dense(parity.N_FEATURES)

        def call(self, x):
            reconstruction = self.decode(self.code(x))
            self.add_loss(tf.reduce_mean(tf.square(reconstruction - x)))
            return reconstruction

    keras.utils.set_random_seed(0)
    model = Autoencoder()
    model.compile(optimizer=keras.optimizers.Adam(1e-2))

    def reconstruction_error():
        return float(tf.reduce_mean(tf.square(model(X) - X)))

    before = reconstruction_error()
    history = model.fit(X, epochs=3, batch_size=16, shuffle=False, verbose=0)
    # The error on all of X, not the logged epoch means: with no compiled loss
    # tf_keras averages batches unweighted, so a shuffled partial batch of 3
    # samples made those means rise now and then while the model improved.
    assert reconstruction_error() < 0.9 * before
    assert history.history["loss"][-1] < history.history["loss"][0]


# --------------------------------------------------------------------------
# Mixed precision, and the data a fit holds
# --------------------------------------------------------------------------


def test_second_optimizer_is_loss_scaled_under_mixed_precision(mixed_float16):
    """A float16 gradient of 1e-9 underflows to zero unless the loss is scaled."""

    class TinyLoss(custom_fit.CustomModel):
        def __init__(self):
            super().__init__()
            self.body = keras.layers.Dense(8)
            self.head = keras.layers.Dense(1, dtype="float32")
            self.head_optimizer = keras.optimizers.SGD(1.0)

        def call(self, x):
            return self.head(self.body(x))

        def train_step(self, data):
            x, y = data
            with tf.GradientTape(persistent=True) as tape:
                loss = 1e-9 * tf.reduce_mean(tf.square(self(x) - y))
            self.minimize(loss, tape, self.head.trainable_weights)
            self.minimize(loss, tape, self.body.trainable_weights, optimizer=self.head_optimizer)
            return {"loss": loss}

    model = TinyLoss()
    model.compile(optimizer=keras.optimizers.SGD(1.0))
    model(X[:1])
    body_before = [np.array(w) for w in model.body.get_weights()]
    model.fit(X, X[:, :1] * 100, batch_size=33, epochs=1, verbose=0)
    wrapper = _compat.version.loss_scaled(model, model.head_optimizer)
    assert (
        isinstance(wrapper, keras.mixed_precision.LossScaleOptimizer)
        and wrapper.inner_optimizer is model.head_optimizer
    )
    assert int(model.head_optimizer.iterations) == 3
    assert parity.max_delta(body_before, model.body.get_weights()) > 0, "float16 gradients underflowed"


@pytest.mark.parametrize(
    ("base", "steps_per_execution", "backup"),
    [(keras.Model, 1, False), (custom_fit.CustomModel, 1, False), (custom_fit.CustomModel, "auto", True)],
    ids=["keras.Model", "CustomModel", "CustomModel-auto-backup"],
)
def test_fit_frees_its_data_when_it_returns(base, steps_per_execution, backup, tmp_path):
    """Nothing of a fit's data outlives the call (the model keeps no reference, and no cycle waits for gc).

    Keras frees the data adapter, its ``tf.data`` pipeline and the iterators
    (one prefetching the next epoch) when ``fit`` returns; a large dataset
    must not stay in memory until the next garbage collection, or the next fit.
    """
    model = functional(base)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", steps_per_execution=steps_per_execution)
    save_freq = "epoch" if custom_fit.KERAS_2 else 3  # mid-epoch backups are Keras 3's
    callbacks = [custom_fit.BackupAndRestore(tmp_path, save_freq=save_freq)] if backup else []
    model.fit(X, Y, batch_size=16, epochs=1, verbose=0)  # traced, built: later fits make only data objects
    x, y, x_val, y_val = (np.array(a) for a in (X, Y, DATA["x_val"], DATA["y_val"]))
    data = [weakref.ref(a) for a in (x, y, x_val, y_val)]
    gc.collect()
    gc.disable()
    try:
        model.fit(x, y, batch_size=16, epochs=2, validation_data=(x_val, y_val), callbacks=callbacks, verbose=0)
        del x, y, x_val, y_val
        assert [ref() is None for ref in data] == [True] * 4
    finally:
        gc.enable()


def _datasets_each_fit_iterates(monkeypatch, fit_kwargs, *, dataset=None):
    """``{"Model": [...], "CustomModel": [...]}``: each ``tf.data.Dataset`` an iterator was made of, per ``fit``.

    Both models fit ``dataset`` if given (with ``shuffle=False``), else the
    arrays ``X, Y`` in batches of 16, with ``fit_kwargs``.
    """
    iterated: dict[str, list[tf.data.Dataset]] = {"Model": [], "CustomModel": []}
    fitting: list[str] = []  # the class of the model whose fit runs
    original_iter = tf.data.Dataset.__iter__

    def recorded_iter(iterated_dataset):
        iterated[fitting[-1]].append(iterated_dataset)
        return original_iter(iterated_dataset)

    monkeypatch.setattr(tf.data.Dataset, "__iter__", recorded_iter)
    for base in (keras.Model, custom_fit.CustomModel):
        model = functional(base)
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        fitting.append(base.__name__)
        if dataset is not None:
            model.fit(dataset, shuffle=False, verbose=0, **fit_kwargs)
        else:
            model.fit(X, Y, batch_size=16, verbose=0, **fit_kwargs)
    return iterated


@pytest.mark.keras3
@pytest.mark.parametrize(("data", "iterators"), [("arrays", 3), ("dataset", 6)])
def test_fit_makes_no_iterator_that_no_epoch_reads(data, iterators, monkeypatch):
    """Keras makes, at each epoch's end, an iterator the next epoch drops unread; custom_fit not for arrays.

    For arrays ``fit`` builds the pipeline itself and that iterator only costs
    time; a user's ``tf.data.Dataset`` still gets it, since each iterator of a
    seeded, reshuffling dataset draws the next order (what a later ``fit`` reads).
    """
    dataset = tf.data.Dataset.from_tensor_slices((X, Y)).shuffle(64, seed=1).batch(16) if data == "dataset" else None
    iterated = _datasets_each_fit_iterates(monkeypatch, {"epochs": 3}, dataset=dataset)
    assert {name: len(datasets) for name, datasets in iterated.items()} == {"Model": 6, "CustomModel": iterators}


@pytest.mark.parametrize("data", ["arrays", "dataset"])
def test_fit_turns_autotuning_off_only_for_the_pipelines_it_builds(data, monkeypatch):
    """TF 2.21 can block for the age of an autotuned iterator when deleting it (once per epoch).

    custom_fit turns tf.data autotuning off for the pipelines Keras builds
    from arrays (training and validation); a user's ``tf.data.Dataset`` keeps
    its options. ``keras.Model`` leaves every pipeline autotuned.
    """
    dataset = tf.data.Dataset.from_tensor_slices((X, Y)).batch(16) if data == "dataset" else None
    fit_kwargs = {"epochs": 2, "validation_data": (X[:32], Y[:32])}
    iterated = _datasets_each_fit_iterates(monkeypatch, fit_kwargs, dataset=dataset)
    autotuned = {
        name: [iterated_dataset.options().autotune.enabled is not False for iterated_dataset in datasets]
        for name, datasets in iterated.items()
    }
    assert autotuned["Model"] and all(autotuned["Model"])
    if data == "arrays":
        assert autotuned["CustomModel"] and not any(autotuned["CustomModel"])
    else:  # the user's training dataset keeps autotuning; the validation arrays' pipeline does not
        assert True in autotuned["CustomModel"] and False in autotuned["CustomModel"]


@pytest.mark.keras3
def test_predict_on_data_without_a_batch_names_the_problem():
    """keras.Model.predict raises UnboundLocalError ('batch_outputs') here (Keras 3.15)."""
    inputs = keras.Input((3,))
    model = custom_fit.CustomModel(inputs, keras.layers.Dense(1)(inputs))
    empty = tf.data.Dataset.from_tensor_slices(np.zeros((0, 3), "float32")).batch(4)
    with (
        pytest.warns(UserWarning, match="ran out of data"),
        pytest.raises(
            ValueError, match=r"predict\(\) received no data: the input yielded no batch\. Expected at least one batch"
        ),
    ):
        model.predict(empty, verbose=0)
