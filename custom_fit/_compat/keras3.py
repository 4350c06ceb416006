"""Keras 3 (the ``keras`` package, TensorFlow backend): the private names custom_fit needs.

Everything here leans on Keras 3 internals that have no public equivalent.
Each helper is small, named for what it does, and says which private name it
touches, so that a Keras upgrade that moves one of them breaks exactly one
function here instead of the training step. :mod:`custom_fit._compat.keras2`
has the same names for Keras 2.

Nothing in this module is public API.
"""

from __future__ import annotations

from typing import Any, Callable

import keras
import tensorflow as tf
from keras.src.backend.tensorflow import trainer as _tf_trainer
from keras.src.losses import loss as _loss_module
from keras.src.optimizers.loss_scale_optimizer import LossScaleOptimizer
from keras.src.trainers import compile_utils as _compile_utils
from keras.src.models import functional as _functional
from keras.src.models import model as _model
from keras.src.saving import object_registration as _registration

from custom_fit._compat.common import (
    CountingCall,
    batch_size_of,
    explain_xla_errors,
    loss_scaling_twins,
    skippable_aggregation,
    variable_names_without_model,
)

KERAS_2 = False
KERAS_VERSION: str = f"keras {keras.version()}"

#: Keras 3 optimizers clip each replica's gradient, then sum across replicas.
CLIPS_AFTER_AGGREGATION = False

#: The class Keras uses for models built from ``(inputs, outputs)``.
Functional = _functional.Functional


# --------------------------------------------------------------------------
# Forward pass and data
# --------------------------------------------------------------------------


def is_compiled(model: keras.Model) -> bool:
    """Whether ``compile()`` was called (``Trainer.compiled``)."""
    return bool(model.compiled)


def call_accepts_training(model: keras.Model) -> bool:
    """Whether ``model.call`` takes a ``training`` argument (``Layer._call_has_training_arg``)."""
    return bool(model._call_has_training_arg)


def forward(model: keras.Model, x: Any, training: bool):
    """``model(x, training=...)``, passing ``training`` only if ``call`` accepts it.

    Keras' own steps do the same: a ``call`` without ``training`` is invoked
    as ``model(x)``, which leaves sublayers in their default mode.
    """
    if call_accepts_training(model):
        return model(x, training=training)
    return model(x)


def scale_loss_for_distribution(loss):
    """Multiplies by ``1 / num_replicas`` under ``tf.distribute``, as every Keras loss does."""
    return _loss_module.scale_loss_for_distribution(loss)


def has_compiled_loss(model: keras.Model) -> bool:
    """Whether ``compile()`` was given a ``loss`` (``Trainer._compile_loss``)."""
    return model._compile_loss is not None


# --------------------------------------------------------------------------
# Losses and metrics created by ``compile()``
# --------------------------------------------------------------------------


def compute_loss(model: keras.Model, x, y, y_pred, sample_weight, training: bool):
    """Calls ``model.compute_loss``, passing ``training`` only if the override accepts it.

    Mirrors ``Trainer._compute_loss``: user overrides written before Keras 3.3
    have no ``training`` argument.
    """
    if model._compute_loss_has_training_arg:
        return model.compute_loss(x, y, y_pred, sample_weight, training=training)
    return model.compute_loss(x, y, y_pred, sample_weight)


def compiled_loss_value(model: keras.Model, y, y_pred, sample_weight):
    """The loss given to ``compile()`` alone (no ``add_loss`` or regularizers).

    Returns ``None`` when no loss was compiled. Updates the per-output loss
    trackers of multi-output models, as ``Trainer.compute_loss`` does.
    """
    if model._compile_loss is None:
        return None
    return model._compile_loss(y, y_pred, sample_weight)


def sum_losses(losses: list):
    """The total of several scalar losses, reduced as ``Trainer.compute_loss`` does (bit-identical)."""
    return losses[0] if len(losses) == 1 else keras.ops.sum(losses)


def aggregate_additional_loss(model: keras.Model, loss):
    """Reduces one ``add_loss``/regularization tensor the way Keras' trainer does.

    (Cast to float, sum, then scale for distribution:
    ``TensorFlowTrainer._aggregate_additional_loss``.)
    """
    return model._aggregate_additional_loss(loss)


def compiled_metrics_container(model: keras.Model):
    """The ``CompileMetrics`` object made by ``compile()`` (or ``None``)."""
    return model._compile_metrics


def compiled_loss_trackers(model: keras.Model) -> list:
    """Per-output loss trackers of a multi-output compiled loss (may be empty)."""
    return list(model._compile_loss.metrics) if model._compile_loss is not None else []


def loss_tracker(model: keras.Model):
    """The ``Mean`` metric named ``"loss"`` that ``compile()`` creates."""
    return model._loss_tracker


class LoggedValues(_compile_utils.MetricsList):
    """One batch-size weighted ``Mean`` per logged value, held in Keras' ``MetricsList``.

    ``EarlyStopping``, ``ModelCheckpoint`` and ``ReduceLROnPlateau`` infer
    ``mode`` only for metrics inside a ``MetricsList`` (or the compiled
    metrics) that carry a ``_direction``; names ending in ``loss`` or
    ``penalty`` get ``"down"``, so ``monitor="g_loss"`` needs no ``mode``.
    """

    def __init__(self, names):
        trackers = [keras.metrics.Mean(name=name) for name in names]
        for tracker in trackers:
            if tracker.name.endswith(("loss", "penalty")):
                tracker._direction = "down"
        super().__init__(trackers, name="logged_values")

    def __getitem__(self, name: str):
        return next(m for m in self.metrics if m.name == name)

    def __contains__(self, name: object) -> bool:
        return any(m.name == name for m in self.metrics)

    def result(self) -> dict:
        return {m.name: m.result() for m in self.metrics}


def logged_value_metrics(trackers: LoggedValues) -> list:
    """The entries :class:`LoggedValues` adds to ``model.metrics``: the ``MetricsList`` itself."""
    return [trackers]


def record_compile_option(model: keras.Model, name: str, value: Any) -> None:
    """Adds ``name=value`` to the config ``load_model`` passes back to ``compile``."""
    model._compile_config.config[name] = value


def compile_kwargs_for_group(kwargs: dict) -> dict:
    """``compile()`` arguments for an optimizer group: Keras must not loss-scale the group itself."""
    return {**kwargs, "auto_scale_loss": False}


def check_compile_arguments(model: keras.Model, optimizer: Any, kwargs: dict) -> None:
    """Nothing to check: every ``compile()`` argument custom_fit accepts works on Keras 3."""


def unscale_loss_for_distribution(loss):
    """Undoes the ``1 / num_replicas`` factor Keras losses apply under ``tf.distribute``."""
    return _loss_module.unscale_loss_for_distribution(loss)


def track_loss(model: keras.Model, loss, x: Any) -> None:
    """Adds one batch's loss to the ``loss`` tracker, as Keras' steps do.

    The tracker sees the loss unscaled for distribution (the global mean, not
    ``1 / num_replicas`` of it) and weighted by batch size, so the epoch value
    is the per-sample mean also when the last batch is partial.
    """
    tracker = loss_tracker(model)
    if tracker is not None:
        tracker.update_state(unscale_loss_for_distribution(loss), sample_weight=batch_size_of(x))


# --------------------------------------------------------------------------
# Step functions
# --------------------------------------------------------------------------


def make_train_function(model: keras.Model, step: Callable) -> Callable:
    """The function ``fit`` calls on an iterator: :func:`make_step_function`."""
    return make_step_function(model, step)


def make_test_function(model: keras.Model, step: Callable) -> Callable:
    """The function ``evaluate`` calls on an iterator: :func:`make_step_function`."""
    return make_step_function(model, step)


def make_step_function(model: keras.Model, step: Callable) -> Callable:
    """Builds the function ``fit``/``evaluate`` call on an iterator, around ``step``.

    The same contract as ``TensorFlowTrainer._make_function``: run ``step``
    per replica with ``strategy.run``, reduce the per-replica logs, fuse
    ``model.steps_per_execution`` steps in one ``tf.function`` (XLA-compiled
    when ``model.jit_compile``), return the logs of the last step run or
    raise ``StopIteration`` when the iterator is exhausted.

    It differs in how the fused loop is built. Keras 3.15 runs each step
    inside a ``tf.cond`` within the ``tf.while_loop``. Under ``tf.distribute``
    the optimizer aggregates gradients with a cross-replica ``merge_call``;
    a ``merge_call`` made inside a ``tf.cond`` branch leaves some tensors the
    branch captures unfed, and ``MirroredStrategy`` + ``steps_per_execution > 1``
    fails with "You must feed a value for placeholder tensor
    'while/cond/Placeholder…'" (keras-team/keras#19246; ``evaluate``, which
    makes no ``merge_call``, works). Here the loop's *condition* checks that
    another batch exists and the *body* runs the step unconditionally; only
    fetching the next batch sits in a ``tf.cond``. The arithmetic is the same,
    so results equal Keras' loop bit for bit where Keras' loop works.
    (``model.unrolled_steps_per_execution`` is not used: one step per
    iteration.)
    """
    strategy = model.distribute_strategy

    @tf.autograph.experimental.do_not_convert
    def one_step_on_data(data):
        return reduce_logs(strategy, strategy.run(step, args=(data,)))

    if not model.run_eagerly:
        one_step_on_data = tf.function(one_step_on_data, reduce_retracing=True, jit_compile=model.jit_compile)
    one_step_on_data = model._autoconvert_optionals(one_step_on_data)
    steps = model.steps_per_execution

    @tf.autograph.experimental.do_not_convert
    def multi_step_on_iterator(iterator):
        if steps == 1:
            return tf.experimental.Optional.from_value(one_step_on_data(iterator.get_next()))
        # The outputs' structure is known only once the body is traced; like
        # Keras, start from an empty Optional whose spec the body fills in.
        no_outputs = tf.experimental.Optional.empty(None)

        def has_batch(i, outputs, batch):
            return tf.logical_and(i < steps, batch.has_value())

        def run_step(i, outputs, batch):
            outputs = tf.experimental.Optional.from_value(one_step_on_data(batch.get_value()))
            no_outputs._element_spec = outputs.element_spec
            batch = tf.cond(i + 1 < steps, iterator.get_next_as_optional, lambda: batch)
            return i + 1, outputs, batch

        _, outputs, _ = tf.while_loop(
            has_batch, run_step, [tf.constant(0), no_outputs, iterator.get_next_as_optional()]
        )
        outputs._element_spec = no_outputs.element_spec
        return outputs

    if not model.run_eagerly:
        multi_step_on_iterator = tf.function(multi_step_on_iterator, reduce_retracing=True)

    def function(iterator):
        if isinstance(iterator, (tf.data.Iterator, tf.distribute.DistributedIterator)):
            outputs = multi_step_on_iterator(iterator)
            if not outputs.has_value():
                raise StopIteration
            return outputs.get_value()
        # `train_on_batch` & co. pass a Python generator of batches.
        for _, data in zip(range(steps), iterator):
            logs = one_step_on_data(data)
        return logs

    return explain_xla_errors(model, function)


def reduce_logs(strategy, logs):
    """One value per log entry: the mean over replicas (``reduce_per_replica(..., "auto")``).

    Keras 3.15 reduces each log under ``MultiWorkerMirroredStrategy`` with
    ``strategy.reduce("MEAN", v, axis=0)``, which fails for the scalar values
    every step returns ("Invalid reduction dimension 0 for input with 0
    dimensions"). Scalars are averaged across all workers' replicas here.
    """
    if _tf_trainer._collective_all_reduce_multi_worker(strategy):
        return keras.tree.map_structure(lambda v: strategy.reduce("MEAN", v, axis=None), logs)
    return _tf_trainer.reduce_per_replica(logs, strategy, reduction="auto")


# --------------------------------------------------------------------------
# Distribution and mixed precision
# --------------------------------------------------------------------------


def optimizer_built(optimizer) -> bool:
    """Whether ``optimizer`` has created its slots."""
    return bool(optimizer.built)


def scale_loss(optimizer, loss):
    """``optimizer.scale_loss(loss)``: multiplied by the loss scale under ``mixed_float16``."""
    return optimizer.scale_loss(loss)


def unscale_gradients(optimizer, gradients: list) -> list:
    """Gradients as they are: Keras 3's ``LossScaleOptimizer`` unscales in ``apply_gradients``."""
    return gradients


def sum_across_replicas(context, optimizer, grads_and_vars: list) -> list:
    """All-reduces (sums) the gradients of every replica; each replica gets the global sum."""
    summed = context.all_reduce(tf.distribute.ReduceOp.SUM, [g for g, _ in grads_and_vars])
    return [(g, v) for g, (_, v) in zip(summed, grads_and_vars)]


#: ``with gradients_already_summed(optimizer):`` -- ``apply_gradients`` does not sum again
#: (Keras 3 sums in ``_all_reduce_sum_gradients``, after clipping).
gradients_already_summed = skippable_aggregation("_all_reduce_sum_gradients")


def wrap_for_loss_scaling(optimizer, name: str) -> LossScaleOptimizer:
    """``optimizer`` in a dynamic ``LossScaleOptimizer`` named ``name``."""
    return LossScaleOptimizer(optimizer, name=name)


_loss_scaled_twin = loss_scaling_twins(
    lambda optimizer: wrap_for_loss_scaling(optimizer, f"{optimizer.name}_loss_scale")
)


def loss_scaled(model: keras.Model, optimizer):
    """``optimizer`` wrapped in a ``LossScaleOptimizer`` when ``model`` runs in ``mixed_float16``.

    ``compile()`` wraps the compiled optimizer (``auto_scale_loss=True``); an
    extra optimizer handed to ``minimize`` gets the same treatment, once.
    """
    if model.dtype_policy.name != "mixed_float16" or isinstance(optimizer, LossScaleOptimizer):
        return optimizer
    return _loss_scaled_twin(optimizer)


def group_learning_rate_error(fix: str) -> AttributeError:
    """Reading an optimizer group's single learning rate (Keras 3's callbacks use ``.optimizers``)."""
    return AttributeError(f"NamedOptimizers has one learning rate per member: {fix}.")


def optimizer_group_kwargs() -> dict:
    """Arguments for the base ``Optimizer.__init__`` of an optimizer group (its own rate is unused)."""
    return {"learning_rate": 0.0}


def mark_built(optimizer) -> None:
    """Nothing to do: Keras 3's ``Optimizer.build`` sets ``built``."""


def count_regularizer_calls(model: keras.Model) -> dict:
    """``{id(variable): counter}`` for every regularized trainable variable of ``model``.

    Keras 3 computes a weight penalty by calling ``variable.regularizer`` when
    ``layer.losses`` is read; counting those calls while the step is traced
    tells whether the step computed it at all.
    """
    counters = {}
    for variable in model.trainable_variables:
        if variable.regularizer is None:
            continue
        if not isinstance(variable.regularizer, CountingCall):
            variable.regularizer = CountingCall(variable.regularizer)
        counters[id(variable)] = variable.regularizer
    return counters


def variable_names(model: keras.Model, variables) -> list[str]:
    """The variables' paths, for messages (Keras 3 variables know their layer)."""
    return variable_names_without_model(variables)


# --------------------------------------------------------------------------
# Random numbers
# --------------------------------------------------------------------------


def SeedGenerator(seed: int | None = None, name: str | None = None) -> keras.random.SeedGenerator:  # noqa: N802
    """``keras.random.SeedGenerator``: a seed state that advances with every draw."""
    return keras.random.SeedGenerator(seed, name=name)


def random_normal(shape, seed):
    """Standard normal numbers; ``seed`` is an ``int`` or a :func:`SeedGenerator`."""
    return keras.random.normal(shape, seed=seed)


def random_uniform(shape, seed):
    """Uniform numbers in ``[0, 1)``; ``seed`` is an ``int`` or a :func:`SeedGenerator`."""
    return keras.random.uniform(shape, seed=seed)


def seed_generator_states(model: keras.Model) -> list:
    """The state variable of every ``SeedGenerator`` in ``model`` and its layers.

    Keras does not save these (``Layer._seed_generators``) with the weights,
    so a ``Dropout`` restored from a file draws different masks.
    """
    states, seen = [], set()
    for layer in model._flatten_layers(include_self=True):
        for generator in layer._seed_generators:
            if id(generator.state) not in seen:
                seen.add(id(generator.state))
                states.append(generator.state)
    return states


# --------------------------------------------------------------------------
# Functional construction without rewriting class bases
# --------------------------------------------------------------------------


def is_functional_call(args: tuple, kwargs: dict) -> bool:
    """Whether constructor arguments mean ``Model(inputs, outputs)``.

    Keras' own test (``functional_init_arguments``) only counts arguments; the
    inputs must also be symbolic ``KerasTensor``s, so that a subclass taking
    two ordinary arguments is not mistaken for a functional model.
    """
    if not _model.functional_init_arguments(args, kwargs):
        return False
    inputs = kwargs["inputs"] if "inputs" in kwargs else args[0]
    flat = tf.nest.flatten(inputs)
    return bool(flat) and all(isinstance(t, keras.KerasTensor) for t in flat)


def share_registered_name(twin: type, cls: type) -> None:
    """Serializes ``twin`` under ``cls``' registered name, so ``load_model`` finds ``cls``."""
    _registration.GLOBAL_CUSTOM_NAMES[twin] = keras.saving.get_registered_name(cls)


# --------------------------------------------------------------------------
# Overrides of private Trainer hooks
# --------------------------------------------------------------------------


class TrainerHooks:
    """Overrides of private ``Trainer`` methods, kept here with the other private names.

    ``CustomModel`` inherits from this mixin before ``keras.Model``.
    """

    # Keras 3 keeps `compiled_loss` / `compiled_metrics` only as deprecated
    # shims with the wrong meaning; Keras 2 code expects these (Keras 2 has
    # its own, so the Keras 2 mixin defines neither).

    @property
    def compiled_loss(self):
        """Keras-2 ``compiled_loss``: see :class:`custom_fit.compiled.CompiledLoss`."""
        from custom_fit.compiled import CompiledLoss  # imports this module

        return CompiledLoss(self)

    @property
    def compiled_metrics(self):
        """Keras-2 ``compiled_metrics``: see :class:`custom_fit.compiled.CompiledMetrics`."""
        from custom_fit.compiled import CompiledMetrics  # imports this module

        return CompiledMetrics(self)

    def _assert_compile_called(self, method_name: str | None = None) -> None:
        # Keras' own message does not name the method or the fix (and its
        # ``method_name`` branch is dead code in Keras 3.15).
        if not self.compiled:
            method = f"{method_name}()" if method_name else "this method"
            raise ValueError(
                f"{type(self).__name__}.{method} needs a compiled model: expected "
                f"`model.compile(optimizer=..., loss=...)` to have been called "
                f"first, but model '{self.name}' was never compiled. Fix: call "
                f"`model.compile(...)` before `model.{method}`."
            )

    def _maybe_symbolic_build(self, iterator=None, data_batch=None) -> None:
        # Keras builds the model, metrics and optimizer from a first batch when
        # a strategy is set, reducing that batch with `strategy.reduce("MEAN",
        # batch)`. Under MultiWorkerMirroredStrategy that call fails on a
        # nested (x, y) batch ("Attempt to convert a value (PerReplica...) to
        # a Tensor"), so plain Keras 3.15 cannot `fit` there at all. Only the
        # batch's structure, shapes and dtypes matter for the symbolic build:
        # take one local replica's value of each leaf instead (no collective).
        strategy = self._distribute_strategy
        if strategy is None:
            return
        if iterator is not None:
            for _, _, batches in iterator:
                data_batch = keras.tree.map_structure(
                    lambda v: (
                        strategy.experimental_local_results(v)[0]
                        if isinstance(v, tf.distribute.DistributedValues)
                        else v
                    ),
                    next(batches),
                )
                break
        with strategy.scope():
            self._symbolic_build(data_batch=data_batch)
