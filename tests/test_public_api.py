"""The public API by intent: what is public, the 0.2 module paths as deprecated aliases, custom_fit.random."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil

import numpy as np
import pytest
import tensorflow as tf

import custom_fit
from custom_fit import keras, random
from custom_fit._deprecated import RENAMED

#: The modules a user imports by name; every other module is private (a leading underscore).
PUBLIC_MODULES = {"gan", "gan_samples", "random"}


def test_only_the_intended_modules_are_public():
    public = {m.name for m in pkgutil.iter_modules(custom_fit.__path__) if not m.name.startswith("_")}
    assert public == PUBLIC_MODULES


@pytest.mark.parametrize(
    ("old", "name"),
    [
        ("custom_fit.model", "CustomModel"),
        ("custom_fit.backup_store", "BackupStore"),
        ("custom_fit.step_fusion", "StepsPerExecutionTuner"),
        ("custom_fit.optimizers", "NamedOptimizers"),
    ],
)
def test_a_0_2_import_path_still_works_and_names_the_new_one(old, name):
    module = importlib.import_module(old)
    with pytest.warns(DeprecationWarning, match=rf"{old} is deprecated .*Expected `from custom_fit import {name}`"):
        value = getattr(module, name)
    assert value is getattr(custom_fit, name)
    with pytest.warns(DeprecationWarning, match=f"{old} is deprecated"):  # the attribute path of the package too
        assert getattr(getattr(custom_fit, old.split(".")[1]), name) is value


@pytest.mark.parametrize(("old", "new"), sorted(RENAMED.items()))
def test_every_0_2_path_leads_to_a_module_that_exists(old: str, new: str) -> None:
    """A module renamed again (``_configs`` became ``_saving``) must take its alias along."""
    assert importlib.util.find_spec(f"custom_fit.{new}") is not None, f"custom_fit.{old} -> custom_fit.{new}"


def test_a_0_2_path_to_a_private_name_says_it_is_private():
    module = importlib.import_module("custom_fit.callbacks")
    with pytest.warns(DeprecationWarning, match=r"Expected `custom_fit._trainer.callbacks.LazyLogs` \(private\)"):
        module.LazyLogs  # noqa: B018


def test_an_unknown_attribute_of_the_package_is_an_attribute_error():
    with pytest.raises(AttributeError, match="has no attribute 'no_such_module'"):
        custom_fit.no_such_module  # noqa: B018


def test_random_draws_are_reproducible_from_an_int_seed_and_advance_with_a_generator():
    np.testing.assert_array_equal(random.normal((3, 2), seed=5), random.normal((3, 2), seed=5))
    uniform = np.asarray(random.uniform((1000,), seed=5))
    assert uniform.min() >= 0 and uniform.max() < 1 and abs(uniform.mean() - 0.5) < 0.05
    generator = random.SeedGenerator(7)
    first, second = np.asarray(random.normal((4,), seed=generator)), np.asarray(random.normal((4,), seed=generator))
    assert not np.array_equal(first, second)
    again = random.SeedGenerator(7)
    np.testing.assert_array_equal(random.normal((4,), seed=again), first)


class NoisyAutoencoder(custom_fit.CustomModel):
    """A denoising step that draws its noise from a seed generator the model owns."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.noise = random.SeedGenerator(3)
        self.dense = keras.layers.Dense(4)

    def call(self, x):
        return self.dense(x)

    def train_step(self, data):
        x = data[0] if isinstance(data, tuple) else data
        noisy = x + 0.1 * random.normal(tf.shape(x), seed=self.noise)
        return super().train_step((noisy, x))


def test_a_seed_generator_in_a_step_resumes_from_a_saved_model(tmp_path):
    """Its state is saved with the model: a loaded model continues with the same noise as the original."""
    x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
    keras.utils.set_random_seed(1)
    model = NoisyAutoencoder()
    model.compile(optimizer="sgd", loss="mse")
    model.fit(x, epochs=1, batch_size=8, verbose=0, shuffle=False)
    model.save(tmp_path / "noisy.keras")
    loaded = keras.models.load_model(tmp_path / "noisy.keras", custom_objects={"NoisyAutoencoder": NoisyAutoencoder})
    for trained in (model, loaded):
        trained.fit(x, epochs=1, batch_size=8, verbose=0, shuffle=False)
    for expected, got in zip(model.get_weights(), loaded.get_weights(), strict=True):
        np.testing.assert_array_equal(got, expected)
