"""Functional construction (``CustomModel(inputs, outputs)``) never rewrites a class' bases; twins pickle.

Keras splices ``Functional`` into a model class' bases when it is called with
functional arguments, for good, and also when that call then fails.
``CustomModel`` moves only the instance to a twin class; these tests keep
Keras' own behaviour visible next to the fix, and check that twins survive
pickle, ``copy.deepcopy`` and a ``spawn`` process pool.
"""

from __future__ import annotations

import copy
import multiprocessing
import pickle

import numpy as np
import pytest

import custom_fit
from custom_fit import _compat, keras
from tests import parity

DATA = parity.classification_data()
X, Y = DATA["x"], DATA["y"]


def functional(base=custom_fit.CustomModel):
    inputs = keras.Input((parity.N_FEATURES,))
    return base(inputs, keras.layers.Dense(parity.N_CLASSES, activation="softmax")(inputs))


def test_functional_construction_keeps_class_bases():
    bases = custom_fit.CustomModel.__bases__
    model = functional()
    assert isinstance(model, custom_fit.CustomModel) and isinstance(model, _compat.version.Functional)
    assert type(model).__name__ == "CustomModel"
    assert custom_fit.CustomModel.__bases__ == bases


def test_subclass_with_own_init_works_after_functional_construction():
    """Plain Keras rewrites the bases here and the subclass no longer constructs."""
    functional()  # a functional CustomModel now exists in this process

    class Net(custom_fit.CustomModel):
        def __init__(self, units=4):
            super().__init__()
            self.hidden = keras.layers.Dense(units, activation="relu")
            self.out = keras.layers.Dense(parity.N_CLASSES, activation="softmax")

        def call(self, x):
            return self.out(self.hidden(x))

    model = Net(units=8)
    assert not isinstance(model, _compat.version.Functional)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    history = model.fit(X, Y, epochs=2, verbose=0)
    assert history.history["loss"][1] < history.history["loss"][0]


def test_plain_keras_subclass_breaks_after_functional_construction():
    """Keeps the upstream behaviour visible (the reason for the fix above)."""

    class Plain(keras.Model):
        pass

    functional(Plain)

    class Sub(Plain):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(1)

    with pytest.raises(TypeError, match="missing 2 required positional arguments"):
        Sub()


def test_functional_subclass_built_inside_init():
    """The ``super().__init__(inputs, outputs)`` pattern inside a subclass' ``__init__``."""

    class Wrapped(custom_fit.CustomModel):
        def __init__(self, units):
            inputs = keras.Input((parity.N_FEATURES,))
            outputs = keras.layers.Dense(units, activation="softmax")(inputs)
            super().__init__(inputs, outputs)
            self.units = units

    model = Wrapped(parity.N_CLASSES)
    assert isinstance(model, Wrapped) and isinstance(model, _compat.version.Functional)
    assert Wrapped.__bases__ == (custom_fit.CustomModel,)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    model.fit(X, Y, epochs=1, verbose=0)


def test_subclass_taking_two_plain_arguments_is_not_functional():
    class TwoArgs(custom_fit.CustomModel):
        def __init__(self, units, rate):
            super().__init__()
            self.dense = keras.layers.Dense(units)
            self.rate = rate

        def call(self, x):
            return self.dense(x)

    model = TwoArgs(3, 0.1)
    assert not isinstance(model, _compat.version.Functional)
    assert model(X).shape == (parity.N_TRAIN, 3)


def test_failed_functional_construction_leaves_bases_unchanged():
    """Keras would have spliced `Functional` in before raising; every later Sequential would fail."""
    bases = {cls: cls.__bases__ for cls in (custom_fit.CustomModel, custom_fit.CustomSequential)}
    outputs = keras.layers.Dense(1)(keras.Input((4,)))
    bad_calls = [
        lambda: custom_fit.CustomModel({"a": "a"}, outputs),
        lambda: custom_fit.CustomModel(inputs="not a tensor", outputs=outputs),
        lambda: custom_fit.CustomModel([1, 2], [3]),
    ]
    for bad_call in bad_calls:
        with pytest.raises((ValueError, TypeError)):
            bad_call()
        assert {cls: cls.__bases__ for cls in bases} == bases
    model = custom_fit.CustomSequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    model.fit(np.ones((4, 4)), np.ones((4, 1)), verbose=0)


@pytest.mark.keras3  # Keras 2 raises a different error, but splices the bases all the same
def test_plain_keras_failed_construction_rewrites_bases():
    """Keeps the upstream behaviour visible: the class is broken although construction failed."""

    class Plain(keras.Model):
        pass

    outputs = keras.layers.Dense(1)(keras.Input((4,)))
    with pytest.raises(ValueError, match="must be KerasTensors"):
        Plain({"a": "a"}, outputs)
    assert _compat.version.Functional in Plain.__bases__


# --------------------------------------------------------------------------
# Pickling, deepcopy and spawn pools
# --------------------------------------------------------------------------


@keras.saving.register_keras_serializable(package="custom_fit_tests")
class PicklableSubclass(custom_fit.CustomModel):
    """A registered subclass with its own config (pickled through Keras' serialization)."""

    def __init__(self, units=8, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.hidden = keras.layers.Dense(units, activation="relu")
        self.out = keras.layers.Dense(parity.N_CLASSES, activation="softmax")

    def call(self, x):
        return self.out(self.hidden(x))

    def get_config(self):
        return {**super().get_config(), "units": self.units}


def sequential():
    layers = [keras.Input((parity.N_FEATURES,)), keras.layers.Dense(8, activation="relu")]
    return custom_fit.CustomSequential([*layers, keras.layers.Dense(parity.N_CLASSES, activation="softmax")])


BUILDERS = {"functional": functional, "sequential": sequential, "subclassed": lambda: PicklableSubclass(units=12)}


def trained(kind):
    keras.utils.set_random_seed(5)
    model = BUILDERS[kind]()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(X, Y, batch_size=33, epochs=1, verbose=0)
    return model


@pytest.mark.parametrize("kind", list(BUILDERS))
@pytest.mark.parametrize(
    "copy_model", [lambda m: pickle.loads(pickle.dumps(m)), copy.deepcopy], ids=["pickle", "deepcopy"]
)
def test_pickle_and_deepcopy_give_equal_outputs(kind, copy_model):
    model = trained(kind)
    copied = copy_model(model)
    assert type(copied) is type(model) and copied is not model
    assert type(copied).__name__ == type(model).__name__
    np.testing.assert_array_equal(copied.predict(X, verbose=0), model.predict(X, verbose=0))
    assert copied.evaluate(X, Y, verbose=0) == model.evaluate(X, Y, verbose=0)


def test_functional_twin_class_pickles_by_reference():
    model = functional()
    assert pickle.loads(pickle.dumps(type(model))) is type(model)
    assert type(model).__module__ == "custom_fit._functional"


def predict_in_worker(pickled: bytes) -> np.ndarray:
    """Runs in a `spawn` process: a fresh interpreter that has made no twin class yet."""
    return pickle.loads(pickled).predict(X, verbose=0)


@pytest.mark.slow
def test_models_cross_a_spawn_process_pool():
    models = {kind: trained(kind) for kind in BUILDERS}
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        # Pool pickles the arguments itself; the model is pickled here only to be sent as bytes.
        results = pool.map(predict_in_worker, [pickle.dumps(model) for model in models.values()])
    for model, predictions in zip(models.values(), results, strict=True):
        np.testing.assert_array_equal(predictions, model.predict(X, verbose=0))


@pytest.mark.parametrize("kind", ["functional", "sequential"])
def test_model_from_json_rebuilds_the_same_class(kind):
    """Fails on 7a9ee83 (Keras 2): tf_keras' model_from_json returned the string "CustomModel"."""
    if kind == "functional":
        model = functional()
    else:
        model = custom_fit.CustomSequential([keras.Input((parity.N_FEATURES,)), keras.layers.Dense(parity.N_CLASSES)])
    rebuilt = keras.models.model_from_json(model.to_json())
    assert isinstance(rebuilt, custom_fit.CustomSequential if kind == "sequential" else custom_fit.CustomModel)
    rebuilt.set_weights(model.get_weights())
    np.testing.assert_array_equal(rebuilt.predict(DATA["x"], verbose=0), model.predict(DATA["x"], verbose=0))


def test_a_numpy_scalar_constructor_argument_is_a_plain_number_in_the_config():
    """Fails on 7a9ee83: the config held {"__custom_fit_keras_object__": 10}, custom_fit's wrapper, for np.int32(10)."""

    class Units(custom_fit.CustomModel):
        def __init__(self, units, **kwargs):
            super().__init__(**kwargs)
            self.units = units
            self.dense = keras.layers.Dense(int(units))

        def call(self, inputs):
            return self.dense(inputs)

    config = Units(np.int32(10)).get_config()
    assert config["units"] == 10 and type(config["units"]) is int
    assert Units.from_config(config).units == 10


def _with_kwargs(base: type) -> type:
    class WithKwargs(base):
        def __init__(self, units, **kwargs):
            super().__init__(**kwargs)
            self.units = units
            self.dense = keras.layers.Dense(units)

        def call(self, inputs):
            return self.dense(inputs)

    return WithKwargs


@pytest.mark.keras2  # Keras 3's keras.Model writes no automatic config for a model defined in a function
def test_the_constructor_config_has_the_keys_keras_writes():
    """Fails on 7a9ee83: the `dtype` key tf_keras writes for an `__init__` with **kwargs was left out.

    tf_keras' own `training_test.test_get_config_kwargs` with the swap caught it.
    """
    configs = [_with_kwargs(base)(10, name="m").get_config() for base in (keras.Model, custom_fit.CustomModel)]
    assert configs[1] == configs[0] == {"name": "m", "trainable": True, "dtype": "float32", "units": 10}


def test_a_model_with_kwargs_keeps_its_dtype_policy_through_save_and_load(tmp_path):
    """Fails on 7a9ee83: the config had no `dtype`, so a mixed_float16 model loaded as float32."""
    model_class = _with_kwargs(custom_fit.CustomModel)
    model = model_class(4, dtype="mixed_float16")
    model(DATA["x"][:2])
    model.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras", custom_objects={"WithKwargs": model_class})
    assert loaded.dtype_policy.name == model.dtype_policy.name == "mixed_float16"
    np.testing.assert_array_equal(loaded.predict(DATA["x"], verbose=0), model.predict(DATA["x"], verbose=0))


def test_an_unbuilt_sequential_reports_its_weights_as_keras_sequential_does():
    """Fails on 7a9ee83 (Keras 2): tf_keras' Sequential raises "have not yet been created", CustomSequential did not."""
    results: dict[type, int | str] = {}
    for base in (keras.Sequential, custom_fit.CustomSequential):
        model = base([keras.layers.Dense(4), keras.layers.Dense(2)])
        try:
            results[base] = len(model.weights)
        except ValueError as error:
            results[base] = "raised: " + str(error).split(" for model")[0]
    assert results[custom_fit.CustomSequential] == results[keras.Sequential]
    if custom_fit.KERAS_2:
        assert results[keras.Sequential] == "raised: Weights"
    model = custom_fit.CustomSequential([keras.layers.Dense(4), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    model.fit(DATA["x"], DATA["x"][:, :2], epochs=1, verbose=0)
    assert model.built and len(model.weights) == 4
