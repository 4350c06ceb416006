"""Keras 3 (the ``keras`` package, TensorFlow backend): the private names custom_fit needs.

Everything here leans on Keras 3 internals that have no public equivalent.
Each helper is small, named for what it does, and says which private name it
touches, so that a Keras upgrade that moves one of them breaks exactly one
function here instead of the training step. :mod:`custom_fit._compat.keras2`
defines the same ``__all__`` for Keras 2; what only Keras-3-only features need
is in :mod:`custom_fit._compat.keras3_only`.

Nothing in this module is public API.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import keras
import numpy as np
import tensorflow as tf
from keras.src.backend.common import global_state as _global_state
from keras.src.backend.tensorflow import trainer as _tf_trainer
from keras.src.losses import loss as _loss_module
from keras.src.models import functional as _functional
from keras.src.models import model as _model
from keras.src.optimizers.loss_scale_optimizer import LossScaleOptimizer
from keras.src.saving import object_registration as _registration
from keras.src.saving import saving_lib as _saving_lib
from keras.src.trainers import compile_utils as _compile_utils
from keras.src.utils import python_utils as _python_utils

from custom_fit._compat import keras3_only
from custom_fit._compat.common import (
    CountingCall,
    ErrorExplainer,
    UntrackedVariable,
    errors_explained,
    find_untracked_variables,
    in_one_merge_call,
    loss_scaling,
    marks_built_if_complete,
    not_compiled_error,
    shared_while_inside,
    sharing_registered_names,
    variable_names_without_model,
)
from custom_fit._compat.keras2_idioms import with_keras2_api
from custom_fit._host import Host

__all__ = [
    "BACKUP_WEIGHTS_FILE",
    "GROUP_COMPILE_KWARGS",
    "HAS_COMPILED_LOSS_ATTRIBUTES",
    "KERAS_VERSION",
    "OPTIMIZER_CLASSES",
    "OPTIMIZER_GROUP_KWARGS",
    "RESUMES_ONLY_CUSTOM_FIT_MODELS",
    "SAVES_UNCONFIGURABLE_MODELS",
    "STEP_UPDATES_LOSS_TRACKER",
    "Functional",
    "LossScaleOptimizer",
    "SeedGenerator",
    "TrainerHooks",
    "accumulation_steps",
    "apply_gradients",
    "build_optimizer",
    "call_accepts_training",
    "call_symbolically",
    "check_compile_arguments",
    "compiled_metrics_container",
    "compute_loss_accepts_training",
    "counting_regularizer_calls",
    "finish_metrics_result",
    "has_compiled_loss",
    "is_compiled",
    "is_functional_call",
    "keras",
    "logged_value_entries",
    "loss_scaled",
    "loss_tracker",
    "make_step_function",
    "mark_built",
    "mark_built_if_complete",
    "optimizer_built",
    "random_normal",
    "random_uniform",
    "rescale_gradients",
    "restore_base_config",
    "scale_loss",
    "scale_loss_for_distribution",
    "seed_generator_states",
    "set_accumulation_steps",
    "set_initial_epoch",
    "share_registered_name",
    "snapshot_weights",
    "sum_across_replicas",
    "unscale_gradients",
    "unscale_loss_for_distribution",
    "untracked_variables",
    "variable_names",
    "variables_built_on",
    "with_keras2_api",
    "wrap_for_loss_scaling",
]

KERAS_VERSION: str = f"keras {keras.version()}"

#: Whether Keras runs one step per execution on a batch it fetched before the compiled step
#: (3.16, keras-team/keras#23179) rather than fetching it inside (3.8-3.15); see ``make_step_function``.
_STEPS_ON_A_FETCHED_BATCH = keras3_only.VERSION >= (3, 16)

#: Keras 3's steps add the loss to the ``loss`` tracker themselves (``compute_loss`` does not).
STEP_UPDATES_LOSS_TRACKER = True

#: Keras 3's ``fit`` starts at the initial epoch ``BackupAndRestore`` sets, whatever the model.
RESUMES_ONLY_CUSTOM_FIT_MODELS = False

#: Keras 3 has no ``compiled_loss`` / ``compiled_metrics``; ``custom_fit.CompiledLoss`` adds them.
HAS_COMPILED_LOSS_ATTRIBUTES = False

#: What ``compile`` and ``minimize`` take as an optimizer.
OPTIMIZER_CLASSES: tuple[type, ...] = (keras.optimizers.Optimizer,)

#: Keras 3.12+ raises ``NotImplementedError`` when it cannot configure a subclassed model it saves;
#: 3.8-3.11 save a config without the arguments (which ``load_model`` cannot use).
SAVES_UNCONFIGURABLE_MODELS = keras3_only.VERSION < (3, 12)

#: Base ``Optimizer.__init__`` arguments of an optimizer group (its own rate is never used).
OPTIMIZER_GROUP_KWARGS: dict[str, Any] = {"learning_rate": 0.0}

#: ``compile()`` arguments for an optimizer group: Keras must not loss-scale the group itself.
GROUP_COMPILE_KWARGS: dict[str, Any] = {"auto_scale_loss": False}

#: The class Keras uses for models built from ``(inputs, outputs)``.
Functional = _functional.Functional


# --------------------------------------------------------------------------
# Trainer state
# --------------------------------------------------------------------------


def is_compiled(model: keras.Model) -> bool:
    """Whether ``compile()`` was called (``Trainer.compiled``)."""
    return bool(model.compiled)


def call_accepts_training(model: keras.Model) -> bool:
    """Whether ``model.call`` takes a ``training`` argument (``Layer._call_has_training_arg``).

    Keras' steps call ``model(x)`` when it does not, which leaves sublayers
    such as ``Dropout`` in their default mode.
    """
    return bool(model._call_has_training_arg)


def compute_loss_accepts_training(model: keras.Model) -> bool:
    """Whether ``model.compute_loss`` takes ``training`` (overrides from before Keras 3.3 do not)."""
    return bool(model._compute_loss_has_training_arg)


def has_compiled_loss(model: keras.Model) -> bool:
    """Whether ``compile()`` was given a ``loss`` (``Trainer._compile_loss``)."""
    return model._compile_loss is not None


def loss_tracker(model: keras.Model) -> Any:
    """The ``Mean`` metric named ``"loss"`` that ``compile()`` creates."""
    return model._loss_tracker


def compiled_metrics_container(model: keras.Model) -> Any:
    """The ``CompileMetrics`` object made by ``compile()`` (or ``None``)."""
    return model._compile_metrics


def finish_metrics_result(results: dict[str, Any]) -> dict[str, Any]:
    """What ``Trainer.get_metrics_result`` returns for ``results``: Keras < 3.14 pythonifies them.

    (Floats where they can be, nested dicts flattened, keys sorted; inside a
    traced step the tensors stay. From 3.14 ``evaluate`` & co. convert.)
    """
    return _python_utils.pythonify_logs(results) if keras3_only.VERSION < (3, 14) else results


def check_compile_arguments(model: keras.Model, optimizer: Any, kwargs: dict[str, Any]) -> None:
    """Accepts every ``compile()`` argument: all of custom_fit's work on Keras 3."""


def logged_value_entries(trackers: list[Any]) -> list[Any]:
    """What one ``Mean`` per logged value adds to ``model.metrics``: one ``MetricsList``.

    ``EarlyStopping``, ``ModelCheckpoint`` and ``ReduceLROnPlateau`` infer
    ``mode`` only for metrics inside a ``MetricsList`` (or the compiled
    metrics) that carry a ``_direction``; names ending in ``loss`` or
    ``penalty`` get ``"down"``, so ``monitor="g_loss"`` needs no ``mode``.
    """
    for tracker in trackers:
        if tracker.name.endswith(("loss", "penalty")):
            tracker._direction = "down"
    return [_LoggedValuesList(trackers, name="logged_values")]


class _LoggedValuesList(_compile_utils.MetricsList):
    def result(self) -> dict[str, Any]:
        return {m.name: m.result() for m in self.metrics}


# --------------------------------------------------------------------------
# Losses
# --------------------------------------------------------------------------


def scale_loss_for_distribution(loss: Any) -> Any:
    """Multiplies by ``1 / num_replicas`` under ``tf.distribute``, as every Keras loss does."""
    return _loss_module.scale_loss_for_distribution(loss)


def unscale_loss_for_distribution(loss: Any) -> Any:
    """Undoes the ``1 / num_replicas`` factor Keras losses apply under ``tf.distribute``."""
    return _loss_module.unscale_loss_for_distribution(loss)


# --------------------------------------------------------------------------
# Step functions
# --------------------------------------------------------------------------


def make_step_function(
    model: keras.Model,
    step: Callable[[Any], Any],
    *,
    training: bool,
    tuner: Any = None,
    explain: ErrorExplainer | None = None,
) -> Callable[[Any], Any]:
    """Builds the function ``fit`` (``training=True``) or ``evaluate`` calls on an iterator.

    The same contract as ``TensorFlowTrainer._make_function``: run ``step``
    per replica with ``strategy.run``, reduce the per-replica logs, fuse
    ``model.steps_per_execution`` steps in one ``tf.function`` (XLA-compiled
    when ``model.jit_compile``), return the logs of the last step run or
    raise ``StopIteration`` when the iterator is exhausted. Training and
    evaluation build the same function on Keras 3.

    With one step per execution, Keras 3.16 (keras-team/keras#23179) fetches
    the batch in Python (``get_next_as_optional``) and calls the compiled
    step on it; 3.8-3.15 fetch it inside a compiled function. The step is
    then traced with the batch's static shape (the first batch's, until a
    batch of another size makes ``reduce_retracing`` relax it to ``None``),
    and what reads a static shape sees it: Keras' per-output loss trackers
    weigh each batch by ``y_pred.shape[0]``, so a batch of the first size
    weighs its size and one of another size 1 (3.8-3.15: always ``None``,
    every batch weighs 1). This function does what the Keras in use does,
    so those trackers equal ``keras.Model``'s on every version.

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
    iteration.) The number of steps is an argument of the traced loop, read
    at each call: the loop's epoch iterator
    (:class:`custom_fit._compat.keras3_only.EpochIterator`) hands each
    execution with the number its plan chose (a
    :class:`~custom_fit._compat.keras3_only.Execution`), and the loop tells
    the plan what ran, so ``tuner`` is not used here (Keras 2's function uses
    it to choose its multi-step loop). ``train_on_batch`` & co. pass a
    generator of batches.
    """
    strategy = model.distribute_strategy

    @tf.autograph.experimental.do_not_convert
    def one_step_on_data(data: Any) -> Any:
        return _reduce_logs(strategy, strategy.run(step, args=(data,)))

    if not model.run_eagerly:
        one_step_on_data = tf.function(one_step_on_data, reduce_retracing=True, jit_compile=model.jit_compile)
    autoconvert = getattr(model, "_autoconvert_optionals", None)  # optional inputs, Keras >= 3.12
    if autoconvert is not None:
        one_step_on_data = autoconvert(one_step_on_data)

    @tf.autograph.experimental.do_not_convert
    def one_step_on_iterator(iterator: Any) -> Any:
        return tf.experimental.Optional.from_value(one_step_on_data(iterator.get_next()))

    @tf.autograph.experimental.do_not_convert
    def multi_step_on_iterator(iterator: Any, steps: Any) -> Any:
        # The outputs' structure is known only once the body is traced; like
        # Keras, start from an empty Optional whose spec the body fills in.
        no_outputs = tf.experimental.Optional.empty(None)

        def has_batch(i: Any, outputs: Any, batch: Any) -> Any:
            return tf.logical_and(i < steps, batch.has_value())

        def run_step(i: Any, outputs: Any, batch: Any) -> Any:
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
        one_step_on_iterator = tf.function(one_step_on_iterator, reduce_retracing=True)
        multi_step_on_iterator = tf.function(multi_step_on_iterator, reduce_retracing=True)

    def function(iterator: Any) -> Any:
        # Errors are explained here rather than by a wrapper: one frame fewer above the step.
        with errors_explained(model, explain):
            steps = model.steps_per_execution
            if isinstance(iterator, keras3_only.Execution):  # fit's steered epoch iterator: its planned steps
                iterator, steps = iterator.iterator, iterator.steps
            if isinstance(iterator, (tf.data.Iterator, tf.distribute.DistributedIterator)):
                if steps == 1 and _STEPS_ON_A_FETCHED_BATCH:
                    batch = iterator.get_next_as_optional()
                    if not batch.has_value():
                        raise StopIteration
                    logs = one_step_on_data(batch.get_value())
                else:
                    if steps == 1:
                        outputs = one_step_on_iterator(iterator)
                    else:
                        outputs = multi_step_on_iterator(iterator, tf.constant(steps, "int32"))
                    if not outputs.has_value():
                        raise StopIteration
                    logs = outputs.get_value()
                return logs
            # `train_on_batch` & co. pass a Python generator of batches.
            for _, data in zip(range(model.steps_per_execution), iterator, strict=False):
                logs = one_step_on_data(data)
            return logs

    return function


def _reduce_logs(strategy: tf.distribute.Strategy, logs: Any) -> Any:
    """One value per log entry: the mean over replicas (``reduce_per_replica(..., "auto")``).

    Keras 3.15 reduces each log under ``MultiWorkerMirroredStrategy`` with
    ``strategy.reduce("MEAN", v, axis=0)``, which fails for the scalar values
    every step returns ("Invalid reduction dimension 0 for input with 0
    dimensions"). Scalars are averaged across all workers' replicas here.
    """
    if _tf_trainer._collective_all_reduce_multi_worker(strategy):
        return keras.tree.map_structure(lambda v: strategy.reduce("MEAN", v, axis=None), logs)
    return _tf_trainer.reduce_per_replica(logs, strategy, reduction="auto")


#: ``mark_built_if_complete(model)``: sets ``model.built`` when all its variables exist although it
#: was never called (see :func:`custom_fit._compat.common.marks_built_if_complete`).
mark_built_if_complete = marks_built_if_complete(keras.layers.Layer, keras.Model)


def call_symbolically(layer: keras.layers.Layer, input_shape: Any) -> None:
    """Calls ``layer`` on a ``KerasTensor`` of ``input_shape``: sub-layers its ``call`` builds lazily get built.

    As the functional API calls a layer; the node that call records is removed
    again (the input is connected to nothing).
    """
    nodes = list(layer._inbound_nodes)
    layer(keras.KerasTensor(tuple(input_shape)))
    layer._inbound_nodes[:] = nodes


# --------------------------------------------------------------------------
# Optimizers, distribution and mixed precision
# --------------------------------------------------------------------------


def build_optimizer(optimizer: Any, variables: list[Any]) -> None:
    """``optimizer.build(variables)``: creates its state for ``variables``."""
    optimizer.build(variables)


def optimizer_built(optimizer: Any) -> bool:
    """Whether ``optimizer`` has created its slots."""
    return bool(optimizer.built)


def mark_built(optimizer: Any) -> None:
    """Nothing to mark: Keras 3's ``Optimizer.build`` sets ``built`` itself (Keras 2's does not)."""


def scale_loss(optimizer: Any, loss: Any) -> Any:
    """``optimizer.scale_loss(loss)``: multiplied by the loss scale under ``mixed_float16``."""
    return optimizer.scale_loss(loss)


def _loss_scale(optimizer: LossScaleOptimizer) -> Any:
    """The scale ``optimizer.scale_loss`` multiplies by now (its variable once built)."""
    return optimizer.dynamic_scale if optimizer.built else optimizer.initial_scale


def unscale_gradients(optimizer: Any, gradients: list[Any]) -> list[Any]:
    """Gradients divided by the loss scale, as ``LossScaleOptimizer.apply`` divides them."""
    if not isinstance(optimizer, LossScaleOptimizer):
        return gradients
    scale = _loss_scale(optimizer)
    return [keras.ops.divide(g, scale) if g is not None else None for g in gradients]


def rescale_gradients(optimizer: Any, gradients: list[Any]) -> list[Any]:
    """Unscaled gradients multiplied by the loss scale again: Keras 3's ``LossScaleOptimizer`` divides them.

    Exact: the scale is a power of two.
    """
    if not isinstance(optimizer, LossScaleOptimizer):
        return gradients
    scale = _loss_scale(optimizer)
    return [keras.ops.multiply(g, scale) if g is not None else None for g in gradients]


def sum_across_replicas(context: Any, optimizer: Any, grads_and_vars: list[Any]) -> list[Any]:
    """All-reduces (sums) the gradients of every replica; each replica gets the global sum."""
    summed = context.all_reduce(tf.distribute.ReduceOp.SUM, [g for g, _ in grads_and_vars])
    return [(g, v) for g, (_, v) in zip(summed, grads_and_vars, strict=True)]


def _pass_through(grads_and_vars: Any) -> list[Any]:
    return list(grads_and_vars)


#: ``with _gradients_already_summed(inner_optimizer):`` ``apply_gradients`` does not sum again.
#:
#: A swap kept on purpose (tests/end_to_end/test_layout.py lists it; docs/keras_internals.md,
#: ``k3-all-reduce-sum``): Keras 3 sums in ``TFOptimizer._all_reduce_sum_gradients``, called by ``_backend_update_step``
#: whenever a replica context exists, with no argument to skip it (3.8 to 3.16-dev, the
#: hashes in internals.json); tf_keras has one and gets it (``keras2_accumulation``). To update
#: in cross-replica context, where it does not sum, needs a swap of its own (``in_one_merge_call``'s
#: ``_use_merge_call``). The one way without a swap, handing the optimizer the sum divided by the
#: replica count for it to sum again, was measured (benchmarks/summed_gradients.py,
#: benchmarks/results/results_summed_gradients.md): it all-reduces twice the values per step
#: (153,620 instead of 76,810 for an MLP; on two logical CPUs, where an all-reduce is a copy in
#: memory, its throughput was not told apart: 0.973 [0.817, 1.085] of the swap's), and is not
#: exact where the count is no power of two (3 replicas: 16,205 of 76,810 weights differ after 20
#: steps). So the method is replaced on the optimizer instance while
#: the update is traced, and Keras' own is back after it (:func:`shared_while_inside`: the replica
#: threads meet in the update's ``merge_call`` before any of them leaves).
_gradients_already_summed = shared_while_inside(
    lambda inner: object.__setattr__(inner, "_all_reduce_sum_gradients", _pass_through),  # untracked: not state
    lambda inner, _: object.__delattr__(inner, "_all_reduce_sum_gradients"),  # Keras' own method again
)


def accumulation_steps(optimizer: Any) -> int:
    """``gradient_accumulation_steps`` of ``optimizer`` (a ``LossScaleOptimizer``: its inner one's), else 1."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    return int(getattr(inner, "gradient_accumulation_steps", None) or 1)


def set_accumulation_steps(optimizer: Any, steps: int) -> None:
    """``compile(gradient_accumulation_steps=steps)``: Keras' own option on ``optimizer`` (its inner one's).

    Raises:
        ValueError: ``optimizer`` was built already, or accumulates over another number of steps.
    """
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    own = inner.gradient_accumulation_steps
    if own not in (None, steps) or (own is None and inner.built):
        raise ValueError(
            f"compile(gradient_accumulation_steps={steps}) sets the option on each optimizer, but "
            f"{type(inner).__name__} '{inner.name}' "
            + (f"has gradient_accumulation_steps={own}" if own else "was built already (it has state)")
            + ". Fix: pass gradient_accumulation_steps to one of them only, or compile a new optimizer."
        )
    inner.gradient_accumulation_steps = steps


def apply_gradients(optimizer: Any, grads_and_vars: list[Any], *, summed: bool) -> None:
    """``optimizer.apply_gradients(grads_and_vars)``: in one cross-replica ``merge_call`` where it accumulates.

    An optimizer with ``gradient_accumulation_steps`` updates inside
    ``tf.cond`` every N-th step. Under several replicas (``summed``: the
    gradients are the replicas' sum, equal on each) its whole
    ``apply_gradients`` runs in cross-replica context
    (:func:`~custom_fit._compat.common.in_one_merge_call` says why and how); a
    ``LossScaleOptimizer`` refuses that context in ``apply``, so its own path
    for strategies that make no ``merge_call`` (``_common_apply``: the finite
    check and its ``tf.cond``) runs there. The optimizer does not sum
    ``summed`` gradients again (:data:`_gradients_already_summed`).
    """
    if not summed:
        optimizer.apply_gradients(grads_and_vars)
        return
    with _gradients_already_summed(getattr(optimizer, "inner_optimizer", optimizer)):
        _apply_summed(optimizer, grads_and_vars)


def _apply_summed(optimizer: Any, grads_and_vars: list[Any]) -> None:
    if accumulation_steps(optimizer) == 1:
        optimizer.apply_gradients(grads_and_vars)
        return
    pairs = [(g, v) for g, v in grads_and_vars if g is not None]  # as apply_gradients filters them
    variables = [v for _, v in pairs]

    def update(gradients: list[Any]) -> None:
        if isinstance(optimizer, LossScaleOptimizer):
            optimizer._common_apply(gradients, variables)
        else:
            optimizer.apply_gradients(list(zip(gradients, variables, strict=True)))

    in_one_merge_call(update, [g for g, _ in pairs])


def wrap_for_loss_scaling(optimizer: Any, name: str) -> LossScaleOptimizer:
    """``optimizer`` in a dynamic ``LossScaleOptimizer`` named ``name``."""
    return LossScaleOptimizer(optimizer, name=name)


#: ``loss_scaled(model, optimizer)``: ``optimizer`` in a ``LossScaleOptimizer`` (made once) when
#: ``model`` runs in ``mixed_float16``, as ``compile(auto_scale_loss=True)`` wraps the compiled one.
loss_scaled = loss_scaling(
    LossScaleOptimizer, lambda optimizer: wrap_for_loss_scaling(optimizer, f"{optimizer.name}_loss_scale")
)


def variables_built_on(optimizer: Any, candidates: Any) -> list[Any]:
    """The candidates ``optimizer`` keeps state for, in the order it was built on them.

    (``BaseOptimizer._trainable_variables``; a ``LossScaleOptimizer``'s inner one.)
    """
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    wanted = {id(v) for v in candidates}
    return [v for v in inner._trainable_variables if id(v) in wanted]


def restore_base_config(layer: Any, config: dict[str, Any]) -> None:
    """Sets ``layer``'s ``name``, ``trainable`` and dtype policy from ``config`` (Keras' base keys) where they differ.

    For a model made without them (its constructor does not pass them on to
    ``keras.Model``); before it is built, as the constructor would have set them.
    """
    if "name" in config and layer.name != config["name"]:
        layer.name = config["name"]
    if "trainable" in config and layer.trainable != config["trainable"]:
        layer.trainable = config["trainable"]
    if config.get("dtype") is not None:
        policy = keras.dtype_policies.get(config["dtype"])
        if policy.name != layer.dtype_policy.name:
            layer.dtype_policy = policy


# --------------------------------------------------------------------------
# Diagnostics
# --------------------------------------------------------------------------


class _CountingRegularizer(CountingCall, keras.regularizers.Regularizer):
    """A ``CountingCall`` that Keras < 3.15 accepts as ``variable.regularizer`` (a ``Regularizer``)."""


def _count_regularizer_calls(model: keras.Model) -> dict[int, CountingCall]:
    """Wraps the regularizer of every regularized trainable variable of ``model`` in a counter."""
    counters: dict[int, CountingCall] = {}
    for variable in model.trainable_variables:
        if variable.regularizer is not None:
            variable.regularizer = counters[id(variable)] = _CountingRegularizer(variable.regularizer)
    return counters


def _restore_regularizers(model: keras.Model, counters: dict[int, CountingCall]) -> None:
    for variable in model.trainable_variables:
        if id(variable) in counters:
            variable.regularizer = counters[id(variable)].function


#: ``with counting_regularizer_calls(model) as counters:`` -- ``{id(variable): counter}`` for
#: every regularized trainable variable. Keras 3 computes a weight penalty by calling
#: ``variable.regularizer`` when ``layer.losses`` is read; counting those calls while the step
#: is traced tells whether the step computed it at all. The regularizers are Keras' own again
#: when the context ends.
#: A swap kept on purpose (tests/end_to_end/test_layout.py lists it): Keras records nothing when
#: it computes a penalty, and a check without a counter would have to find the penalty in the traced
#: graph. Measured (``benchmarks/trace_time_swaps.py``, Keras 3.15): none of one L2 penalty's 6 ops
#: is named for a regularizer (``Square``, ``Sum``, ``mul``, as any step's), and a step run eagerly
#: makes no graph; without the count, a step that drops the penalties trains unregularized silently.
counting_regularizer_calls = shared_while_inside(_count_regularizer_calls, _restore_regularizers)


def variable_names(model: keras.Model, variables: Any) -> list[str]:
    """The variables' paths, for messages (Keras 3 variables know their layer: ``variable.path``)."""
    return variable_names_without_model(variables)


def seed_generator_states(model: keras.Model) -> list[Any]:
    """Every ``SeedGenerator`` state in ``model`` and its layers: Keras 3 does not save them."""
    return keras3_only.seed_generator_states(model)


def untracked_variables(model: keras.Model) -> list[UntrackedVariable]:
    """Variables in layer attributes that Keras 3 does not track: raw ``tf.Variable``s and ``tf.random.Generator``s.

    Keras 3 tracks only its own variables (``add_weight``, ``keras.Variable``):
    a raw ``tf.Variable`` (the keras.io masked autoencoder's
    ``self.mask_token = tf.Variable(...)``) is missing from ``weights`` and
    ``trainable_variables``, so no optimizer updates it and ``save_weights``
    leaves it out; so is a ``tf.random.Generator``'s state. See
    :func:`custom_fit._compat.common.find_untracked_variables`.
    """
    return find_untracked_variables(model._flatten_layers(include_self=True), raw_variables=True)


# --------------------------------------------------------------------------
# Random numbers
# --------------------------------------------------------------------------


def SeedGenerator(seed: int | None = None, name: str | None = None) -> keras.random.SeedGenerator:  # noqa: N802
    """``keras.random.SeedGenerator``: a seed state that advances with every draw."""
    return keras.random.SeedGenerator(seed, name=name)


def random_normal(shape: Any, seed: Any) -> Any:
    """Standard normal numbers; ``seed`` is an ``int`` or a :func:`SeedGenerator`."""
    return keras.random.normal(shape, seed=seed)


def random_uniform(shape: Any, seed: Any) -> Any:
    """Uniform numbers in ``[0, 1)``; ``seed`` is an ``int`` or a :func:`SeedGenerator`."""
    return keras.random.uniform(shape, seed=seed)


# --------------------------------------------------------------------------
# Functional construction without rewriting class bases
# --------------------------------------------------------------------------


def is_functional_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether ``keras.Model.__init__`` takes these arguments for ``Model(inputs, outputs)``.

    Keras' own test (``functional_init_arguments``) counts arguments; when it
    holds, Keras splices ``Functional`` into the class' bases before it checks
    the arguments themselves.
    """
    return bool(_model.functional_init_arguments(args, kwargs))


#: The weights file of a ``custom_fit.BackupAndRestore`` backup (model, optimizer and seed states).
BACKUP_WEIGHTS_FILE = "model.weights.h5"


class _CopiedWeights(_saving_lib.H5IOStore):
    """What ``save_weights`` writes, copied to host memory by Keras' own walk of the model, to write later.

    Keras' ``save_weights`` walks the model (``_save_state``: layers,
    optimizers, metrics, each one's ``save_own_variables``) and writes each
    value into an HDF5 file as it goes, so the file can only be written while
    training waits. This store takes the walk's values instead (copies: the
    variables train on) and :meth:`write` replays them into Keras' own
    ``H5IOStore`` in the same order, which makes the same file, byte for byte
    (``tests/test_saving.py``). It derives from ``H5IOStore`` only
    because ``_save_state`` accepts no other store (Keras >= 3.12); it opens
    no file.

    Args:
        reuse: An earlier snapshot of the same model whose file is written:
            each value is copied into the array that took the value at its
            place in the walk, where shape and dtype match. Memory written
            before costs no page faults: measured on a 2.4M-parameter model
            with Adam while it trains, 8 ms per snapshot instead of 14.5 ms.
    """

    def __init__(self, reuse: _CopiedWeights | None = None) -> None:  # no super().__init__(): that opens a file
        self.entries: list[tuple[str, dict[str, Any] | None, _Copying]] = []
        self.arrays: list[np.ndarray] = []  # every value copied, in the walk's order
        self.written: bool = False
        self._spare: list[np.ndarray] = reuse.arrays if reuse is not None and reuse.written else []

    def __bool__(self) -> bool:  # H5IOStore asks its file
        return True

    def make(self, path: str, metadata: dict[str, Any] | None = None) -> _Copying:
        values = _Copying(self._copy)
        self.entries.append((path, metadata, values))
        return values

    def _copy(self, value: Any) -> np.ndarray:
        """A host copy of ``value``, made once.

        A variable is read as a tensor (no copy) and copied from it:
        ``keras.ops.convert_to_numpy`` of a variable copies twice.
        """
        if isinstance(value, keras.Variable):
            value = tf.convert_to_tensor(value)
        source = np.asarray(value)  # a tensor's buffer or the array itself: no copy yet
        place = len(self.arrays)
        spare = self._spare[place] if place < len(self._spare) else None
        if spare is not None and spare.shape == source.shape and spare.dtype == source.dtype:
            np.copyto(spare, source)
            copied = spare
        else:
            copied = np.array(source)
        self.arrays.append(copied)
        return copied

    def write(self, path: str) -> None:
        """Writes the file ``save_weights(path)`` would have written when the values were copied."""
        store = _saving_lib.H5IOStore(path, mode="w")
        try:
            for inner_path, metadata, values in self.entries:
                entry = store.make(inner_path, metadata=metadata)
                for key, value in values.items():
                    entry[key] = value
        finally:
            store.close()
        self.written = True


class _Copying(dict[str, np.ndarray]):
    """One entry of :class:`_CopiedWeights`: each value set is copied at once by ``copy``."""

    def __init__(self, copy: Callable[[Any], np.ndarray]) -> None:
        super().__init__()
        self._copy = copy

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, self._copy(value))


@dataclasses.dataclass
class _WeightsFile:
    """The function :func:`snapshot_weights` returns: writes ``copied`` to ``path``."""

    copied: _CopiedWeights
    path: str

    def __call__(self) -> None:
        self.copied.write(self.path)


def snapshot_weights(model: keras.Model, path: str, reuse: Callable[[], None] | None = None) -> Callable[[], None]:
    """Copies what ``model.save_weights(path)`` writes to host memory; the function returned writes the file.

    The copy is the only part that needs the training thread; the function
    returned may run in another thread while training goes on. ``reuse``:
    what an earlier call for ``model`` returned; once it has written its
    file, this copy goes into the same host memory (see :class:`_CopiedWeights`).
    """
    copied = _CopiedWeights(reuse.copied if isinstance(reuse, _WeightsFile) else None)
    _saving_lib._save_state(model, weights_store=copied, assets_store=None, inner_path="", visited_saveables=set())
    _remember_saving_skipsets()
    return _WeightsFile(copied, path)


#: The kinds of object Keras' ``get_attr_skipset`` computes a skip set for (Keras 3.8-3.16).
_SKIPSET_KINDS = ("Operation", "Layer", "Functional", "Sequential", "Metric", "Optimizer", "Loss", "Cross", "Feature")


def _remember_saving_skipsets() -> None:
    """Makes Keras' walk of a model reuse the attribute skip sets it computed, as it means to.

    Keras' ``get_attr_skipset`` caches each skip set under
    ``saving_attr_skipset_<kind>`` but looks it up under
    ``saving_attr_skiplist_<kind>`` (every Keras 3 release to 3.16), so every
    ``save_weights`` builds a throwaway ``Layer``, ``Optimizer``, ``Metric``
    and ``CompileMetrics`` again: about 5 ms of the 15 ms a backup of a
    2.4M-parameter model takes on the training thread
    (``benchmarks/results/results_backup.md``). The sets Keras computed are
    stored under the name it reads; where Keras reads its own cache (the
    bug fixed), there is nothing to do.
    """
    for kind in _SKIPSET_KINDS:
        computed = _global_state.get_global_attribute(f"saving_attr_skipset_{kind}")
        if computed is not None and _global_state.get_global_attribute(f"saving_attr_skiplist_{kind}") is None:
            _global_state.set_global_attribute(f"saving_attr_skiplist_{kind}", computed)


def set_initial_epoch(model: keras.Model, epoch: int | None) -> None:
    """Makes ``fit`` start at ``epoch`` (``None``: at its ``initial_epoch``), as Keras' ``BackupAndRestore`` does."""
    model._initial_epoch = epoch


#: ``share_registered_name(twin, cls)``: ``twin`` serializes under ``cls``' registered name.
share_registered_name = sharing_registered_names(_registration.GLOBAL_CUSTOM_NAMES, keras.saving.get_registered_name)


# --------------------------------------------------------------------------
# Overrides of private Trainer hooks
# --------------------------------------------------------------------------


def _names_of_untouched_metrics(model: Any) -> set[str]:
    """The result names of ``model``'s metrics that hold their reset state: no step updated them since."""
    names: set[str] = set()
    for metric in model.metrics:
        variables = metric.variables
        if not variables or any(np.any(variable.numpy()) for variable in variables):
            continue
        result = metric.result()
        names.update(result if isinstance(result, dict) else [metric.name])
    return names


if TYPE_CHECKING:

    class _TrainerHost(Host):
        """The model with the private Keras 3 ``Trainer`` names :class:`TrainerHooks` reads or overrides."""

        _distribute_strategy: Any

        def _assert_compile_called(self, method_name: str | None = None) -> None: ...

        def _get_metrics_result_or_logs(self, logs: Any, returned: bool = True) -> Any: ...

        def _maybe_symbolic_build(self, iterator: Any = None, data_batch: Any = None) -> None: ...

        def _symbolic_build(self, data_batch: Any = None) -> None: ...

else:
    _TrainerHost = Host


class TrainerHooks(_TrainerHost):
    """Overrides of private ``Trainer`` methods; ``CustomModel`` inherits it before ``keras.Model``."""

    def _assert_compile_called(self, method_name: str | None = None) -> None:
        # Keras' own message does not name the method or the fix (and its
        # ``method_name`` branch is dead code in Keras 3.15).
        if not self.compiled:
            raise not_compiled_error(self, method_name)

    def _get_metrics_result_or_logs(self, logs: Any, returned: bool = True) -> Any:
        # At the end of an epoch (and of `evaluate`) Keras replaces the last step's logs with the
        # metrics' results when their names match, even where no step updated that metric: a step
        # that computes and returns its own `loss` (keras.io's DDPM) logs the reset tracker, 0.0.
        # Such names keep the value the step returned, as on Keras 2. `returned=False` (custom_fit's
        # loop: the epoch ran no step, `logs` are the epoch before's): Keras' rule alone, as Keras logs.
        results = super()._get_metrics_result_or_logs(logs)
        if results is logs or not isinstance(logs, dict) or not returned:
            return results
        untouched = _names_of_untouched_metrics(self)
        return finish_metrics_result(
            {name: logs[name] if name in untouched else value for name, value in results.items()}
        )

    def _maybe_symbolic_build(self, iterator: Any = None, data_batch: Any = None) -> None:
        # Called by fit/evaluate/*_on_batch before anything is built; a model
        # that is never called itself must not be built symbolically below.
        mark_built_if_complete(self)
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
            for *_, execution in iterator:  # custom_fit._trainer.loop's epoch iterator: (first, steps, execution)
                data_batch = keras.tree.map_structure(
                    lambda v: (
                        strategy.experimental_local_results(v)[0]
                        if isinstance(v, tf.distribute.DistributedValues)
                        else v
                    ),
                    next(execution.iterator),
                )
                break
        if type(self).call in (keras.Model.call, keras.layers.Layer.call):
            # A model never called itself (a GAN, a distiller, a VAE): Keras' symbolic
            # build of its forward pass fails ("Unable to automatically build the
            # model"). Its step builds what is unbuilt, as on one device;
            # custom_fit._distribution creates those variables under the strategy.
            return
        with strategy.scope():
            self._symbolic_build(data_batch=data_batch)
