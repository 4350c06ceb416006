"""The code blocks of the README and the docs run as printed, and the excerpts of the step match the source."""

from __future__ import annotations

import inspect
import pathlib
import re
import textwrap

import numpy as np
import pytest

import custom_fit
from custom_fit import keras
from tests import parity

pytestmark = pytest.mark.keras3  # the README's examples are written for Keras 3 (`import keras`)

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Each tested block follows a `<!-- block: NAME -->` line, in the README or a docs page.
FOUND = [
    (name, page.relative_to(ROOT).as_posix(), code)
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for name, code in re.findall(r"<!-- block: ([\w-]+) -->\n```python\n(.*?)```", page.read_text(), flags=re.S)
]
BLOCKS = {name: code for name, _, code in FOUND}
EXPECTED = {
    "quickstart": "README.md",
    "train-step": "README.md",
    "gan-step": "README.md",
    "gan-ema": "docs/gans.md",
    "minimize-body": "docs/step.md",
    "override-examples": "docs/step.md",
    "keras2-step": "docs/keras2_style.md",
    "scaling": "docs/scaling.md",
    "backup": "docs/saving.md",
}


def test_every_named_block_is_found_once_where_expected():
    assert sorted((name, page) for name, page, _ in FOUND) == sorted(EXPECTED.items())


def test_the_readme_is_a_front_door():
    """At most about 14 KB: what it is, the two commands, quick start, step, GAN, versions, differences (each
    claim that Keras fails naming its test, tests/end_to_end/test_docs_claims.py), links."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) <= 14_300
    for page in re.findall(r"\]\((docs/[\w.]+\.md)", readme):
        assert (ROOT / page).is_file(), page


def body(function) -> str:
    """A function's code after its docstring, dedented."""
    source = textwrap.dedent(inspect.getsource(function))
    return textwrap.dedent(source.split('"""')[-1].strip("\n")).strip()


def run_quick_start(namespace: dict) -> str:
    """Runs the quick start in ``namespace``; returns the validation accuracy it printed."""
    exec(compile(BLOCKS["quickstart"], "README quick start", "exec"), namespace)
    return f"{namespace['history'].history['val_accuracy'][-1]:.3f}"


def test_quick_start_runs_and_prints_what_it_says(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    accuracy = run_quick_start(namespace)
    assert type(namespace["restored"]) is type(namespace["model"])
    assert capsys.readouterr().out == f"validation accuracy: {accuracy}\n"
    assert f"# {accuracy}" in BLOCKS["quickstart"]  # seeded: the comment shows what it prints
    assert len(BLOCKS["quickstart"].strip().splitlines()) <= 20


@pytest.mark.parametrize("block", ["scaling", "backup"])
def test_snippet_runs_pasted_after_the_quick_start(block, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    run_quick_start(namespace)
    exec(compile(BLOCKS[block], f"README {block} snippet", "exec"), namespace)
    model = namespace["model"]
    assert len(model.history.epoch) == 3
    if block == "scaling":
        assert isinstance(model.distribute_strategy, namespace["tf"].distribute.MirroredStrategy)
    else:
        assert not (tmp_path / "backups" / "run-1").exists()  # a completed fit deletes its backups


def test_step_excerpt_is_the_real_train_step():
    excerpt = BLOCKS["train-step"].strip().splitlines()
    source = textwrap.dedent(inspect.getsource(custom_fit.CustomModel.train_step))
    assert source.startswith(excerpt[0] + "\n")
    assert excerpt[1].strip() == "...  # docstring"
    assert textwrap.dedent("\n".join(excerpt[2:])) == body(custom_fit.CustomModel.train_step)


def test_minimize_excerpt_is_the_real_body():
    assert BLOCKS["minimize-body"].strip() == body(custom_fit.CustomModel.minimize)


def small_functional(base):
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    return base(inputs, keras.layers.Dense(1)(hidden))


@pytest.mark.parametrize(
    "name", ["CenteredLoss", "TwoOptimizers", "UnconnectedAsZero", "NoisyGradients", "CountUpdates", "MyModel"]
)
def test_readme_examples_train(name):
    namespace: dict = {}
    exec(compile(BLOCKS["override-examples"], "README override examples", "exec"), namespace)
    keras2_step = "import tensorflow as tf\nimport custom_fit\n" + BLOCKS["keras2-step"]
    exec(compile(keras2_step, "README Keras-2 step", "exec"), namespace)
    model = small_functional(namespace[name])
    model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
    x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    before = model.get_weights()
    history = model.fit(x, x[:, :1], batch_size=16, epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(before, model.get_weights(), strict=True)) > 0
    if name == "CountUpdates":
        assert int(model.updates_seen.numpy()) == 8
    if name == "TwoOptimizers":
        assert history.history["loss"][0] > 0 and "mae" in history.history
        assert int(model.head_optimizer.iterations) == int(model.optimizer.iterations) == 8


def test_gan_example_trains():
    namespace: dict = {}
    gan_step = "import tensorflow as tf\nimport custom_fit\n" + BLOCKS["gan-step"]
    exec(compile(gan_step, "README GAN", "exec"), namespace)
    two_tower_gan: type = namespace["TwoTowerGAN"]

    class Model(two_tower_gan):
        def __init__(self):
            super().__init__()
            self.generator = keras.Sequential([keras.Input((16,)), keras.layers.Dense(4)])
            self.discriminator = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
            self.built = True

    model = Model()
    model.compile(optimizer={"generator": "adam", "discriminator": "adam"})
    history = model.fit(
        np.random.default_rng(0).normal(size=(64, 4)).astype("float32"), batch_size=16, epochs=2, verbose=0
    )
    assert sorted(history.history) == ["d_loss", "g_loss"]
    assert int(model.optimizer["generator"].iterations) == int(model.optimizer["discriminator"].iterations) == 8


def test_gan_ema_example_ends_on_the_generator_averages():
    namespace: dict = {}
    exec(compile(BLOCKS["gan-ema"], "docs/gans.md generator EMA", "exec"), namespace)
    gan = namespace["gan"]
    averages = gan.optimizer["generator"]._model_variables_moving_average  # Keras' attribute, read to check
    assert parity.max_delta(gan.generator.trainable_weights, averages) == 0.0
    assert namespace["samples"].shape == (16, 2)


def test_the_docs_quick_start_is_the_readmes():
    assert "```python\n" + BLOCKS["quickstart"] + "```" in (ROOT / "docs" / "index.md").read_text()


def test_every_public_name_is_in_the_api_reference():
    api = (ROOT / "docs" / "api.md").read_text()
    constants = {"KERAS_2", "KERAS_VERSION", "__version__", "keras"}  # described in prose
    for name in set(custom_fit.__all__) - constants:
        assert f"::: custom_fit.{name}\n" in api, name
    for name in constants:
        assert f"`custom_fit.{name}`" in api, name
