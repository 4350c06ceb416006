"""custom_fit._compat.keras2 (tf_keras only): legacy optimizers, Keras 3 objects refused by name, tf_keras' graph.

Keras 2's legacy optimizers in CustomModel, as tf_keras.Model takes them:

``tf_keras.optimizers.legacy.*`` (``OptimizerV2``) and ``tf.compat.v1.train.*Optimizer``
(wrapped by ``compile`` as ``TFOptimizer``): on 7a9ee83 ``fit`` raised "'RMSprop' object has no
attribute 'build'" and ``minimize(..., optimizer=<legacy optimizer>)`` "names no optimizer of this
model". About 105 of tf_keras' own engine tests failed that way with the classes swapped.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import keras as keras3
import numpy as np
import pytest
import tensorflow as tf

import custom_fit
from custom_fit import _compat, keras
from tests import parity

pytestmark = pytest.mark.keras2

DATA = parity.classification_data()
X, Y = DATA["x"], DATA["y"]


def small_model():
    inputs = keras.Input((4,))
    return custom_fit.CustomModel(inputs, keras.layers.Dense(1)(inputs))


LEGACY: dict[str, Callable[[], Any]] = {
    "legacy.SGD(momentum)": lambda: keras.optimizers.legacy.SGD(0.1, momentum=0.9),
    "legacy.RMSprop": lambda: keras.optimizers.legacy.RMSprop(0.01),
    "legacy.Adam": lambda: keras.optimizers.legacy.Adam(0.01),
    "tf.compat.v1.train.GradientDescentOptimizer": lambda: tf.compat.v1.train.GradientDescentOptimizer(0.1),
    "tf.compat.v1.train.AdamOptimizer": lambda: tf.compat.v1.train.AdamOptimizer(0.01),
}


def classifier(base: type) -> Any:
    inputs = keras.Input((parity.N_FEATURES,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    return base(inputs, keras.layers.Dense(parity.N_CLASSES, activation="softmax", dtype="float32")(hidden))


def trained(base: type, make_optimizer: Callable[[], Any], epochs: int = 2, **fit_kwargs: Any) -> tuple[Any, dict]:
    keras.utils.set_random_seed(0)
    model = classifier(base)
    model.compile(optimizer=make_optimizer(), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    history = model.fit(X, Y, batch_size=16, epochs=epochs, shuffle=False, verbose=0, **fit_kwargs)
    return model, history.history


@pytest.mark.parametrize("name", list(LEGACY))
def test_legacy_optimizers_train_exactly_as_tf_keras_model(name):
    keras_model, keras_history = trained(keras.Model, LEGACY[name])
    custom_model, custom_history = trained(custom_fit.CustomModel, LEGACY[name])
    assert custom_history == keras_history
    assert parity.max_delta(custom_model.get_weights(), keras_model.get_weights()) == 0.0
    assert parity.max_delta(custom_model.predict(X, verbose=0), keras_model.predict(X, verbose=0)) == 0.0


@pytest.mark.parametrize("name", ["legacy.SGD(momentum)", "legacy.Adam"])
def test_legacy_optimizers_are_loss_scaled_exactly_as_tf_keras_model(name, mixed_float16):
    keras_model, keras_history = trained(keras.Model, LEGACY[name])
    custom_model, custom_history = trained(custom_fit.CustomModel, LEGACY[name])
    assert isinstance(custom_model.optimizer, keras.mixed_precision.LossScaleOptimizer)
    assert custom_history == keras_history
    assert parity.max_delta(custom_model.get_weights(), keras_model.get_weights()) == 0.0


@pytest.mark.filterwarnings("ignore:You are saving your model as an HDF5 file")  # saving H5 is the point
def test_legacy_optimizer_state_is_saved_and_restored(tmp_path):
    """A model saved mid-training (H5) and trained on equals one trained straight through."""
    straight, _ = trained(custom_fit.CustomModel, LEGACY["legacy.Adam"], epochs=4)
    first, _ = trained(custom_fit.CustomModel, LEGACY["legacy.Adam"], epochs=2)
    first.save(tmp_path / "half.h5")
    resumed = keras.models.load_model(tmp_path / "half.h5", custom_objects={"CustomModel": custom_fit.CustomModel})
    assert int(resumed.optimizer.iterations) == int(first.optimizer.iterations)
    resumed.fit(X, Y, batch_size=16, epochs=4, initial_epoch=2, shuffle=False, verbose=0)
    assert parity.max_delta(resumed.get_weights(), straight.get_weights()) == 0.0


def test_the_keras_format_keeps_a_legacy_optimizer_as_tf_keras_does(tmp_path):
    """tf_keras' .keras format holds no legacy optimizer state (iterations load as 0): the same here."""
    loaded = {}
    for base in (keras.Model, custom_fit.CustomModel):
        model, _ = trained(base, LEGACY["legacy.Adam"], epochs=1)
        model.save(tmp_path / f"{base.__name__}.keras")
        loaded[base] = keras.models.load_model(tmp_path / f"{base.__name__}.keras")
        np.testing.assert_array_equal(loaded[base].predict(X, verbose=0), model.predict(X, verbose=0))
    assert type(loaded[custom_fit.CustomModel].optimizer) is type(loaded[keras.Model].optimizer)
    assert int(loaded[custom_fit.CustomModel].optimizer.iterations) == int(loaded[keras.Model].optimizer.iterations)


def test_backup_and_restore_resumes_a_legacy_optimizer_exactly(tmp_path):
    straight, _ = trained(custom_fit.CustomModel, LEGACY["legacy.Adam"], epochs=4)

    class StopAfterEpoch(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                raise KeyboardInterrupt  # an interruption after two epochs

    backup = custom_fit.BackupAndRestore(tmp_path / "backup")
    with pytest.raises(KeyboardInterrupt):
        trained(custom_fit.CustomModel, LEGACY["legacy.Adam"], epochs=4, callbacks=[backup, StopAfterEpoch()])
    resumed, _ = trained(custom_fit.CustomModel, LEGACY["legacy.Adam"], epochs=4, callbacks=[backup])
    assert parity.max_delta(resumed.get_weights(), straight.get_weights()) == 0.0


def gan(base: type, named: bool) -> Any:
    """A two-optimizer GAN with legacy optimizers, as attributes (keras.io) or named in compile."""

    class GAN(base):
        def __init__(self):
            super().__init__()
            self.discriminator = keras.Sequential([keras.Input((parity.N_FEATURES,)), keras.layers.Dense(1)])
            self.generator = keras.Sequential([keras.Input((4,)), keras.layers.Dense(parity.N_FEATURES)])

        def compile(self, d_optimizer, g_optimizer):  # keras.io's signature
            if named:
                super().compile(optimizer={"discriminator": d_optimizer, "generator": g_optimizer})
            else:
                super().compile()
                self.d_optimizer, self.g_optimizer = d_optimizer, g_optimizer

        def train_step(self, real):
            noise = tf.sin(real[:, :4])
            with tf.GradientTape() as tape:
                fake = self.generator(noise)
                d_loss = tf.reduce_mean(tf.nn.softplus(-self.discriminator(real))) + tf.reduce_mean(
                    tf.nn.softplus(self.discriminator(fake))
                )
            self.update(d_loss, tape, self.discriminator, "discriminator")
            with tf.GradientTape() as tape:
                g_loss = tf.reduce_mean(tf.nn.softplus(-self.discriminator(self.generator(noise))))
            self.update(g_loss, tape, self.generator, "generator")
            return {"d_loss": d_loss, "g_loss": g_loss}

        def update(self, loss, tape, part, name):
            variables = part.trainable_weights
            if named:
                self.minimize(loss, tape, variables, optimizer=name)
            else:
                optimizer = self.d_optimizer if name == "discriminator" else self.g_optimizer
                optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables, strict=True))

    keras.utils.set_random_seed(0)
    model = GAN()
    model.compile(keras.optimizers.legacy.Adam(1e-3), keras.optimizers.legacy.RMSprop(1e-3))
    return model


def test_a_gan_with_two_legacy_optimizers_trains_as_attributes_and_named(tmp_path):
    """Attribute optimizers equal tf_keras.Model's step; named ones (minimize) equal both."""
    weights = {}
    for base, named in ((keras.Model, False), (custom_fit.CustomModel, False), (custom_fit.CustomModel, True)):
        model = gan(base, named)
        model.fit(X, batch_size=16, epochs=2, shuffle=False, verbose=0)
        weights[(base, named)] = model.get_weights()
    reference = weights[(keras.Model, False)]
    assert parity.max_delta(weights[(custom_fit.CustomModel, False)], reference) == 0.0
    assert parity.max_delta(weights[(custom_fit.CustomModel, True)], reference) == 0.0


def test_minimize_takes_a_legacy_optimizer_instance():
    class OwnOptimizer(custom_fit.CustomModel):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = self.compute_loss(x, y, self(x, training=True))
            self.minimize(loss, tape, self.trainable_variables, optimizer=self.extra)
            return {"loss": loss}

    keras.utils.set_random_seed(0)
    model = classifier(OwnOptimizer)
    model.extra = keras.optimizers.legacy.SGD(0.1)
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    before = model.get_weights()
    model.fit(X, Y, batch_size=16, epochs=1, verbose=0)
    assert int(model.extra.iterations) > 0
    assert parity.max_delta(before, model.get_weights()) > 0
    assert np.all(np.isfinite(model.predict(X, verbose=0)))


KERAS_3_NEEDED = (
    r"needs Keras 3 \(keras>=3.0\); this process runs Keras 2 \(tf_keras [\d.]+\) because TF_USE_LEGACY_KERAS=1"
)


@pytest.mark.keras2
def test_keras3_optimizer_with_gradient_accumulation_names_the_keras_version():
    model = small_model()
    with pytest.raises(
        ValueError,
        match=r"An optimizer with gradient_accumulation_steps=4 \(received for CustomModel '.*', a tf_keras model\) "
        + KERAS_3_NEEDED
        + r".*Fix: pass a tf.keras optimizer, e.g. tf.keras.optimizers.Adam\(\), "
        + r"and compile\(gradient_accumulation_steps=4\)",
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
def test_keras3_tensors_are_rejected_before_keras2_rewrites_the_class():
    inputs = keras3.Input((4,))
    with pytest.raises(
        ValueError,
        match=(
            r"received are Keras 3 tensors \(keras.*KerasTensor, from `import keras`\)\. Expected "
            r"tensors from tf.keras.Input\(...\)\. Fix:"
        ),
    ):
        custom_fit.CustomModel(inputs, keras3.layers.Dense(1)(inputs))
    # The class is intact: a subclass with its own __init__ still works.
    model = small_model()
    model.compile(optimizer="sgd", loss="mse")
    model.fit(np.ones((4, 4)), np.ones((4, 1)), verbose=0)
    assert _compat.version.Functional not in custom_fit.CustomModel.__bases__


@pytest.mark.keras2
def test_keras3_only_names_say_so_on_keras2():
    model = small_model()
    model.compile(optimizer="sgd", loss="mse")
    for cls, attribute in (
        (custom_fit.CompiledLoss, "compiled_loss"),
        (custom_fit.CompiledMetrics, "compiled_metrics"),
    ):
        with pytest.raises(
            ValueError,
            match=(
                rf"custom_fit.{cls.__name__} gives Keras 3 models Keras 2's `model.{attribute}`; this "
                rf"process runs Keras 2 \(tf_keras .*Fix: use `model.{attribute}` itself"
            ),
        ):
            cls(model)


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
