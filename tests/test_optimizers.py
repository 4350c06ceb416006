"""Named optimizers in compile(), and the errors and warnings of multi-optimizer steps."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import tensorflow as tf

import custom_fit
from custom_fit import _compat, keras
from custom_fit._optimizers import ensure_state
from tests import parity

X = parity.classification_data()["x"]


class TwoHeads(custom_fit.CustomModel):
    """``self.encoder`` and ``self.head``: a stand-in for any two-sub-model step."""

    uses = ("encoder", "head")

    def __init__(self, regularize=False):
        super().__init__()
        reg = keras.regularizers.L2(0.1) if regularize else None
        self.encoder = keras.Sequential(
            [keras.Input((parity.N_FEATURES,)), keras.layers.Dense(4, kernel_regularizer=reg)], name="encoder"
        )
        self.head = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)], name="head")
        self.built = True

    def call(self, x):
        return self.head(self.encoder(x))

    def train_step(self, data):
        x, y = data
        with tf.GradientTape(persistent=True) as tape:
            loss = custom_fit.batch_mean(tf.square(tf.cast(self(x, training=True), "float32") - y))
        for name, part in zip(self.uses, (self.encoder, self.head), strict=True):
            self.minimize(loss, tape, part.trainable_weights, optimizer=name)
        return {"loss": loss}


def fit(model, epochs=1):
    return model.fit(X, X[:, :1], batch_size=33, epochs=epochs, verbose=0)


def test_dict_of_optimizers_compiles_into_named_group():
    model = TwoHeads()
    model.compile(optimizer={"encoder": "adam", "head": keras.optimizers.SGD(0.1)})
    assert isinstance(model.optimizer, custom_fit.NamedOptimizers)
    assert type(model.optimizer["encoder"]).__name__ == "Adam" and type(model.optimizer["head"]).__name__ == "SGD"
    fit(model, epochs=2)
    assert int(model.optimizer["encoder"].iterations) == int(model.optimizer["head"].iterations) == 6
    assert [id(v) for v in model.optimizer.member_variables("head")] == [id(v) for v in model.head.trainable_weights]
    # No stray default optimizer anywhere in the model's state.
    assert model.optimizer.optimizers == [model.optimizer["encoder"], model.optimizer["head"]]
    if not custom_fit.KERAS_2:  # Keras 3 variables name their optimizer in their path
        assert {v.path.split("/")[0] for v in model.optimizer.variables} == {"named_optimizers"}


def test_loss_scaling_wraps_every_member(mixed_float16):
    model = TwoHeads()
    model.compile(optimizer={"encoder": "adam", "head": "adam"})
    assert all(isinstance(model.optimizer[n], keras.mixed_precision.LossScaleOptimizer) for n in ("encoder", "head"))
    before = [np.array(w) for w in model.get_weights()]
    fit(model, epochs=3)
    for name in ("encoder", "head"):
        optimizer = model.optimizer[name]
        scale = float(optimizer.loss_scale if custom_fit.KERAS_2 else optimizer.dynamic_scale)
        # Dynamic loss scaling ran for both: it starts at 2**15 and halves on overflow.
        assert 1.0 < scale <= 2.0**15
        assert int(optimizer.inner_optimizer.iterations) >= 1
    assert parity.max_delta(before, model.get_weights()) > 0


def test_optimizer_name_not_compiled():
    class Typo(TwoHeads):
        uses = ("encoder", "haed")

    model = Typo()
    model.compile(optimizer={"encoder": "adam", "head": "adam"})
    with pytest.raises(
        ValueError,
        match=(
            r"received optimizer='haed'; this model was compiled with named optimizers \['encoder', "
            r"'head'\]\. Expected one of those names.*Fix: pass optimizer='encoder', or add 'haed'"
        ),
    ):
        fit(model)


def test_unused_named_optimizer_warns_once():
    class OnlyHead(TwoHeads):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = custom_fit.batch_mean(tf.square(self(x) - y))
            self.minimize(loss, tape, self.head.trainable_weights, optimizer="head")
            return {"loss": loss}

    model = OnlyHead()
    model.compile(optimizer={"encoder": "adam", "head": "adam"})
    with pytest.warns(
        custom_fit.UnusedOptimizerWarning,
        match=(
            r"compiled with optimizers \['encoder', 'head'\], but its train_step never used "
            r"\['encoder'\].*Fix: call self.minimize\(..., optimizer='encoder'\)"
        ),
    ) as caught:
        fit(model, epochs=2)
    assert len([w for w in caught if issubclass(w.category, custom_fit.UnusedOptimizerWarning)]) == 1


def test_variables_updated_by_two_optimizers():
    class Overlap(TwoHeads):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape(persistent=True) as tape:
                loss = custom_fit.batch_mean(tf.square(self(x) - y))
            self.minimize(loss, tape, self.trainable_weights, optimizer="first")
            self.minimize(loss, tape, self.head.trainable_weights, optimizer="second")
            return {"loss": loss}

    model = Overlap()
    model.compile(optimizer={"first": "adam", "second": "adam"})
    with pytest.raises(
        ValueError,
        match=(
            r"Variables \[.*head.*\] would be updated by two optimizers, 'first' and 'second'\. "
            r"Expected each variable to belong to one named optimizer\. Fix:"
        ),
    ):
        fit(model)


def test_named_optimizer_given_other_variables():
    class Swapped(TwoHeads):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape(persistent=True) as tape:
                loss = custom_fit.batch_mean(tf.square(self(x) - y))
            self.minimize(loss, tape, self.head.trainable_weights, optimizer="encoder")
            return {"loss": loss}

    model = Swapped()
    model.compile(optimizer={"encoder": "adam"})
    with pytest.raises(
        ValueError,
        match=(
            r"optimizer='encoder'\) received variables the 'encoder' optimizer does not update.*Fix: "
            r"pass the same variables every step"
        ),
    ):
        fit(model)


@pytest.mark.parametrize("run_eagerly", [False, True], ids=["traced", "eager"])
def test_regularization_never_added_warns(run_eagerly):
    """Eagerly too, where the step makes no graph that a check could read the penalty from."""
    model = TwoHeads(regularize=True)
    model.compile(optimizer={"encoder": "adam", "head": "adam"}, run_eagerly=run_eagerly)
    with pytest.warns(
        custom_fit.UnusedRegularizationWarning,
        match=(
            r"updated regularized variables of \['encoder'\] without computing their regularization "
            r"losses.*Fix: .*custom_fit.regularization_loss"
        ),
    ):
        fit(model)


@pytest.mark.parametrize("run_eagerly", [False, True], ids=["traced", "eager"])
def test_regularization_added_does_not_warn(run_eagerly):
    class Regularized(TwoHeads):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape(persistent=True) as tape:
                loss = custom_fit.batch_mean(tf.square(self(x) - y))
                encoder_loss = loss + custom_fit.regularization_loss(self.encoder)
            self.minimize(encoder_loss, tape, self.encoder.trainable_weights, optimizer="encoder")
            self.minimize(loss, tape, self.head.trainable_weights, optimizer="head")
            return {"loss": loss}

    model = Regularized(regularize=True)
    model.compile(optimizer={"encoder": "adam", "head": "adam"}, run_eagerly=run_eagerly)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit(model)


def test_group_learning_rate_scales_every_member():
    """What Keras 2's and older Keras 3's LR callbacks read and set: one rate, applied as a factor."""
    group = custom_fit.NamedOptimizers({"a": keras.optimizers.SGD(0.1), "b": keras.optimizers.Adam(0.4)})
    assert float(group.learning_rate) == pytest.approx(0.1)
    group.learning_rate = 0.05  # halves every member
    assert [float(np.array(o.learning_rate)) for o in group.optimizers] == pytest.approx([0.05, 0.2])
    group.lr.assign(0.025)  # Keras 2's backend.set_value(optimizer.lr, value)
    assert [float(np.array(o.learning_rate)) for o in group.optimizers] == pytest.approx([0.025, 0.1])
    assert float(group.lr) == pytest.approx(0.025)


def test_group_errors_say_how_to_fix():
    with pytest.raises(KeyError, match=r"No optimizer named 'b': expected one of \['a'\]"):
        custom_fit.NamedOptimizers({"a": "adam"})["b"]
    with pytest.raises(ValueError, match=r"expected a non-empty dict \{name: optimizer\}, received \{\}"):
        custom_fit.NamedOptimizers({})
    with pytest.raises(ValueError, match=r"Optimizer names must be non-empty strings, received 3"):
        custom_fit.NamedOptimizers({3: "adam"})  # type: ignore[dict-item]


def test_applying_gradients_with_the_group_names_the_fix():
    """`self.optimizer.apply_gradients(...)` in a step compiled with named optimizers."""

    class GroupApplies(TwoHeads):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = custom_fit.batch_mean(tf.square(self(x) - y))
            gradients = tape.gradient(loss, self.trainable_weights)
            self.optimizer.apply_gradients(zip(gradients, self.trainable_weights, strict=True))
            return {"loss": loss}

    model = GroupApplies()
    model.compile(optimizer={"encoder": "adam", "head": "adam"})
    with pytest.raises(
        ValueError,
        match=r"model.optimizer is a group of named optimizers \['encoder', 'head'\].*which applies no gradients "
        r"itself.*Fix: self.minimize\(loss, tape, variables, optimizer='encoder'\), or "
        r"self.optimizer\[name\].apply_gradients",
    ):
        fit(model)


def test_minimize_without_name_on_named_group():
    class NoName(TwoHeads):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = custom_fit.batch_mean(tf.square(self(x) - y))
            self.minimize(loss, tape, self.trainable_weights)
            return {"loss": loss}

    model = NoName()
    model.compile(optimizer={"encoder": "adam", "head": "adam"})
    with pytest.raises(
        ValueError,
        match=r"compiled with named optimizers \['encoder', 'head'\], but minimize\(\) received optimizer=None.*"
        r"Fix: write one that calls self.minimize\(loss, tape, variables, optimizer=name\)",
    ):
        fit(model)


def test_default_train_step_with_named_optimizers_names_the_fix():
    class DefaultStep(TwoHeads):
        train_step = custom_fit.CustomModel.train_step

    model = DefaultStep()
    model.compile(optimizer={"encoder": "adam", "head": "adam"}, loss="mse")
    with pytest.raises(
        ValueError, match=r"CustomModel's own train_step updates all variables.*compile a single optimizer"
    ):
        model.fit(X, X[:, :1], batch_size=33, epochs=1, verbose=0)


def moving_averages(optimizer):
    """The moving averages an optimizer with ``use_ema=True`` keeps (Keras 3 and tf_keras: same attribute)."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)  # a LossScaleOptimizer's
    return [np.array(v) for v in inner._model_variables_moving_average]


@pytest.mark.parametrize("policy", ["float32", "mixed_float16"])
def test_ema_member_swaps_in_its_moving_averages_when_fit_ends(policy):
    """The member with ``use_ema=True`` ends on its averages, as Keras' compiled optimizer does; the other does not."""
    keras.mixed_precision.set_global_policy(policy)
    try:
        runs = {}
        for ema in (False, True):
            keras.utils.set_random_seed(0)
            model = TwoHeads()
            model.compile(
                optimizer={"encoder": keras.optimizers.Adam(0.05, use_ema=ema), "head": keras.optimizers.Adam(0.05)}
            )
            fit(model, epochs=2)
            runs[ema] = model
    finally:
        keras.mixed_precision.set_global_policy("float32")
    ema_run, plain = runs[True], runs[False]
    assert parity.max_delta(ema_run.encoder.get_weights(), moving_averages(ema_run.optimizer["encoder"])) == 0.0
    assert parity.max_delta(ema_run.encoder.get_weights(), plain.encoder.get_weights()) > 1e-3
    # EMA does not change the training itself: the other member's variables are those of a run without it.
    assert parity.max_delta(ema_run.head.get_weights(), plain.head.get_weights()) == 0.0


def _ids(variables):
    return [id(v) for v in variables]


def test_ensure_state_builds_an_optimizer_once():
    variables = TwoHeads().trainable_weights
    optimizer = keras.optimizers.Adam()
    ensure_state(optimizer, variables)
    state = _ids(optimizer.variables)
    assert _compat.version.optimizer_built(optimizer) and len(state) > len(variables)  # two slots per variable
    assert _ids(_compat.version.variables_built_on(optimizer, variables)) == _ids(variables)
    ensure_state(optimizer, variables)
    ensure_state(optimizer, variables[:1])
    assert _ids(optimizer.variables) == state


def test_ensure_state_builds_a_loss_scale_optimizer_with_its_inner_one():
    variables = TwoHeads().trainable_weights
    optimizer = keras.mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(momentum=0.9))
    ensure_state(optimizer, variables)
    state = _ids(optimizer.variables)
    assert _compat.version.optimizer_built(optimizer) and _compat.version.optimizer_built(optimizer.inner_optimizer)
    assert _ids(_compat.version.variables_built_on(optimizer, variables)) == _ids(variables)
    ensure_state(optimizer, variables)
    assert _ids(optimizer.variables) == state


def test_ensure_state_builds_a_group_and_its_members():
    model = TwoHeads()
    model.compile(optimizer={"encoder": "adam", "other": keras.optimizers.SGD(momentum=0.9)})
    group = model.optimizer
    ensure_state(group, model.trainable_variables)
    # The member named like a sub-model is built on its variables; the other waits for its first use.
    assert _compat.version.optimizer_built(group) and _compat.version.optimizer_built(group["encoder"])
    assert _ids(group.member_variables("encoder")) == _ids(model.encoder.trainable_weights)
    assert not _compat.version.optimizer_built(group["other"]) and group.member_variables("other") == []
    ensure_state(group, model.head.trainable_weights, member="other")
    assert _ids(group.member_variables("other")) == _ids(model.head.trainable_weights)
    state = {name: _ids(group[name].variables) for name in group}
    ensure_state(group, model.trainable_variables)
    ensure_state(group, model.head.trainable_weights, member="other")
    assert {name: _ids(group[name].variables) for name in group} == state


def test_ensure_state_refuses_a_member_on_another_members_variables():
    model = TwoHeads()
    model.compile(optimizer={"encoder": "adam", "other": "adam"})
    ensure_state(model.optimizer, model.trainable_variables)
    with pytest.raises(ValueError, match=r"would be updated by two optimizers, 'encoder' and 'other'"):
        ensure_state(model.optimizer, model.encoder.trainable_weights, member="other")
    with pytest.raises(TypeError, match=r"ensure_state\(member='other'\) expected a NamedOptimizers"):
        ensure_state(keras.optimizers.Adam(), model.encoder.trainable_weights, member="other")


def test_learning_rate_callbacks_act_on_every_named_optimizer():
    """docs/gans.md: Keras' learning-rate callbacks set every member of a named group, on both Kerases.

    Keras 3.15 sets each member; Keras 2 (and earlier Keras 3) set one ``optimizer.lr``, the group's,
    which scales every member's rate by the same factor.
    """
    model = TwoHeads()
    model.compile(optimizer={"encoder": keras.optimizers.SGD(0.1), "head": keras.optimizers.Adam(0.4)})

    def rates():
        return [float(np.array(o.learning_rate)) for o in model.optimizer.optimizers]

    halve = keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr * 0.5)
    model.fit(X, X[:, :1], batch_size=33, epochs=2, verbose=0, callbacks=[halve])
    assert rates() == pytest.approx([0.025, 0.1])
    plateau = keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=0, min_delta=1e9, min_lr=0)
    model.fit(X, X[:, :1], batch_size=33, epochs=2, verbose=0, callbacks=[plateau])  # the second epoch reduces
    assert rates() == pytest.approx([0.0125, 0.05])
