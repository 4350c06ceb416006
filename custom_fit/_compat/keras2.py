"""Keras 2 (``tf_keras``, selected by ``TF_USE_LEGACY_KERAS=1``): the private names custom_fit needs.

The same ``__all__`` as :mod:`custom_fit._compat.keras3`, written against
``tf_keras``. Where Keras 2 does a thing natively, a flag or the helper says so:

* ``compiled_loss`` / ``compiled_metrics`` are Keras 2's own containers; the
  compiled loss updates its ``loss`` tracker itself
  (``STEP_UPDATES_LOSS_TRACKER = False``).
* ``training`` is always passed to ``call`` (Keras 2's ``Layer.__call__``
  accepts it for every layer).
* Loss scaling is ``get_scaled_loss`` / ``get_unscaled_gradients`` on the
  ``LossScaleOptimizer``; gradients are unscaled before they are aggregated.
* The optimizer sums gradients across replicas *before* clipping
  (``aggregate_gradients``), so clipping always sees the global gradient.

Nothing in this module is public API.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import random
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

import tensorflow as tf
import tf_keras as keras
from tensorflow.python.eager import context as _context
from tf_keras.src.engine import functional as _functional
from tf_keras.src.engine import training as _training
from tf_keras.src.mixed_precision import loss_scale_optimizer as _lso
from tf_keras.src.optimizers import optimizer_v1 as _optimizer_v1
from tf_keras.src.optimizers.legacy import optimizer_v2 as _optimizer_v2
from tf_keras.src.saving import object_registration as _registration
from tf_keras.src.utils import losses_utils as _losses_utils

from custom_fit._compat.common import (
    CountingCall,
    ErrorExplainer,
    UntrackedVariable,
    errors_explained,
    find_untracked_variables,
    loss_scaling,
    marks_built_if_complete,
    not_compiled_error,
    shared_while_inside,
    sharing_registered_names,
    variable_names_without_model,
)
from custom_fit._compat.keras2_accumulation import (
    accumulation_steps,
    apply_gradients,
    build_accumulators,
    set_accumulation_steps,
)
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

KERAS_VERSION: str = f"tf_keras {keras.__version__}"

#: Keras 2's compiled loss updates the ``loss`` tracker when called, so the step does not.
STEP_UPDATES_LOSS_TRACKER = False

#: A plain tf_keras model runs tf_keras' loop, which custom_fit's progress cannot start mid-way.
RESUMES_ONLY_CUSTOM_FIT_MODELS = True

#: tf_keras models have Keras' own ``compiled_loss`` / ``compiled_metrics``.
HAS_COMPILED_LOSS_ATTRIBUTES = True

#: tf_keras saves a subclassed model it cannot configure, with an empty config (``load_model`` then fails).
SAVES_UNCONFIGURABLE_MODELS = True

#: Base ``Optimizer.__init__`` arguments of an optimizer group (Keras 2's needs none).
OPTIMIZER_GROUP_KWARGS: dict[str, Any] = {}

#: ``compile()`` arguments for an optimizer group: none (``TrainerHooks._get_optimizer`` skips it).
GROUP_COMPILE_KWARGS: dict[str, Any] = {}

#: The class Keras uses for models built from ``(inputs, outputs)``.
Functional = _functional.Functional

#: ``LossScaleOptimizer`` classes of this Keras (V3 wraps the current optimizers).
LossScaleOptimizer = _lso.BaseLossScaleOptimizer

#: What ``compile`` and ``minimize`` take as an optimizer: tf_keras' optimizers, its legacy ones
#: (``tf_keras.optimizers.legacy.*``, ``OptimizerV2``) and ``tf.compat.v1`` optimizers as
#: ``compile`` wraps them (``TFOptimizer``).
OPTIMIZER_CLASSES: tuple[type, ...] = (keras.optimizers.Optimizer, _optimizer_v2.OptimizerV2, _optimizer_v1.TFOptimizer)


def _needs_keras_3(feature: str, fix: str) -> ValueError:
    """The error for a feature that exists only on Keras 3."""
    return ValueError(
        f"{feature} needs Keras 3 (keras>=3.0); this process runs Keras 2 "
        f"({KERAS_VERSION}) because TF_USE_LEGACY_KERAS=1 makes tf.keras tf_keras. "
        f"Fix: {fix}, or run without TF_USE_LEGACY_KERAS=1 to use Keras 3."
    )


# --------------------------------------------------------------------------
# Trainer state
# --------------------------------------------------------------------------


def is_compiled(model: Any) -> bool:
    """Whether ``compile()`` was called (``Model._is_compiled``)."""
    return bool(getattr(model, "_is_compiled", False))


def call_accepts_training(model: Any) -> bool:
    """``True``: Keras 2's ``Layer.__call__`` accepts ``training`` for every ``call``."""
    return True


def compute_loss_accepts_training(model: Any) -> bool:
    """``False``: Keras 2's ``compute_loss(x, y, y_pred, sample_weight)`` has no ``training``."""
    return False


def has_compiled_loss(model: Any) -> bool:
    """Whether ``compile()`` was given a ``loss`` (``LossesContainer._user_losses``)."""
    container = getattr(model, "compiled_loss", None)
    return container is not None and container._user_losses is not None


def loss_tracker(model: Any) -> Any:
    """The ``Mean`` named ``"loss"`` (``LossesContainer._total_loss_mean``), if a loss was compiled."""
    return model.compiled_loss._total_loss_mean if has_compiled_loss(model) else None


def compiled_metrics_container(model: Any) -> None:
    """``None``: Keras 2's ``model.metrics`` lists the compiled metrics one by one."""
    return


def logged_value_entries(trackers: list[Any]) -> list[Any]:
    """What one ``Mean`` per logged value adds to ``model.metrics``: each ``Mean``.

    Keras 2's callbacks infer "lower is better" from the monitored name
    (anything not ending in ``acc``/``accuracy``), so no direction is stored.
    """
    return list(trackers)


def finish_metrics_result(results: dict[str, Any]) -> dict[str, Any]:
    """``results`` as they are: Keras 2's ``get_metrics_result`` returns the metrics' values."""
    return results


def _from_keras_3(obj: Any) -> bool:
    return type(obj).__module__.split(".")[0] == "keras"


def check_compile_arguments(model: Any, optimizer: Any, kwargs: dict[str, Any]) -> None:
    """Rejects, with the Keras version they need, ``compile()`` arguments only Keras 3 understands.

    Under ``TF_USE_LEGACY_KERAS=1`` ``import keras`` is still Keras 3, so a
    Keras 3 optimizer (e.g. one with ``gradient_accumulation_steps``), loss or
    metric can reach a Keras 2 model; tf_keras would reject it with "Could
    not interpret optimizer identifier".
    """
    members = optimizer.values() if isinstance(optimizer, dict) else [optimizer]
    for member in members:
        if _from_keras_3(member):
            accumulation = getattr(member, "gradient_accumulation_steps", None)
            feature = (
                f"An optimizer with gradient_accumulation_steps={accumulation}"
                if accumulation
                else f"The Keras 3 optimizer {type(member).__name__}"
            )
            raise _needs_keras_3(
                f"{feature} (received for {type(model).__name__} '{model.name}', a tf_keras model)",
                f"pass a tf.keras optimizer, e.g. tf.keras.optimizers.{type(member).__name__}()"
                + (f", and compile(gradient_accumulation_steps={accumulation})" if accumulation else ""),
            )
    for name in ("loss", "metrics", "weighted_metrics"):
        for value in tf.nest.flatten(kwargs.get(name)):
            if value is not None and _from_keras_3(value):
                raise _needs_keras_3(
                    f"The Keras 3 object {type(value).__name__} passed as compile({name}=...)",
                    f"use tf.keras.{'losses' if name == 'loss' else 'metrics'}.{type(value).__name__}",
                )
    if "auto_scale_loss" in kwargs:
        raise _needs_keras_3(
            "compile(auto_scale_loss=...)",
            "leave it out (Keras 2 always scales the loss under mixed_float16)",
        )


# --------------------------------------------------------------------------
# Losses
# --------------------------------------------------------------------------


def scale_loss_for_distribution(loss: Any) -> Any:
    """Multiplies by ``1 / num_replicas`` under ``tf.distribute``, as every Keras loss does."""
    return _losses_utils.scale_loss_for_distribution(loss)


def unscale_loss_for_distribution(loss: Any) -> Any:
    """Undoes :func:`scale_loss_for_distribution` (Keras 2 has no helper for it)."""
    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    return loss if replicas == 1 else loss * tf.cast(replicas, loss.dtype)


# --------------------------------------------------------------------------
# Step functions
# --------------------------------------------------------------------------


class Execution(NamedTuple):
    """What the train, test or predict function runs next: ``steps`` steps on ``iterator``.

    tf_keras' step functions read the number of steps from the model's
    ``_steps_per_execution`` variable (``steps_variable``) when they run:
    :func:`running` sets it to ``steps`` for the call and back to
    ``fixed`` (``compile``'s number) after it, so that what runs between two
    executions (callbacks, a validation run inside the epoch, which builds
    and runs the test function) sees ``compile``'s number. ``sync``: the data's
    length is unknown, so the loop waits for the execution before the next
    (tf_keras' ``DataHandler.should_sync``), where running out of data raises.
    """

    iterator: Any
    steps: int
    sync: bool
    steps_variable: Any = None
    fixed: int = 1


@contextlib.contextmanager
def running(execution: Execution) -> Iterator[Any]:
    """Runs the block on ``execution``'s data iterator (given), with ``execution.steps`` as the model's steps.

    The steps variable is set for the block and put back after it; where the
    data's length is unknown (``sync``), the block's execution is waited for,
    so that running out of data raises here, before its logs are used.
    """
    variable, steps = execution.steps_variable, execution.steps
    changes = variable is not None and steps != execution.fixed
    if changes:
        variable.assign(steps)  # read by the step function when it runs
    try:
        yield execution.iterator
        if execution.sync:
            _context.async_wait()
    finally:
        if changes:
            variable.assign(execution.fixed)


def make_step_function(
    model: Any,
    step: Callable[[Any], Any],
    *,
    training: bool,
    tuner: Any = None,
    explain: ErrorExplainer | None = None,
) -> Callable[[Any], Any]:
    """``Model.make_train_function``'s (or ``make_test_function``'s) function in tf_keras 2.21.

    The same structure and arithmetic (so results are identical): run ``step``
    per replica with ``strategy.run``, count the step, reduce the logs with
    ``model.distribute_reduction_method``, loop ``steps_per_execution`` times
    inside one ``tf.function``. The training function is also kept as
    ``model.train_tf_function`` (TensorBoard's graph). ``ParameterServerStrategy``'s
    coordinator is not supported.

    The loop reads ``model._steps_per_execution`` (a variable) when it runs;
    custom_fit's epoch iterator (:class:`custom_fit._compat.keras2_loop.EpochIterator`)
    sets it before an execution whose number of steps differs from the last
    one's. With the model's ``tuner`` (``steps_per_execution="auto"``) the
    function is built for a number that changes (the multi-step loop, also
    while the number is 1).
    """
    counter = model._train_counter if training else model._test_counter

    def run_step(data: Any) -> Any:
        outputs = step(data)
        with tf.control_dependencies(_training._minimum_control_deps(outputs)):
            counter.assign_add(1)
        return outputs

    if model.jit_compile:
        run_step = tf.function(run_step, jit_compile=True, reduce_retracing=True)

    def one_step(iterator: Any) -> Any:
        outputs = model.distribute_strategy.run(run_step, args=(next(iterator),))
        return _training.reduce_per_replica(
            outputs, model.distribute_strategy, reduction=model.distribute_reduction_method
        )

    def multi_step(iterator: Any) -> Any:
        for _ in tf.range(model._steps_per_execution):
            outputs = one_step(iterator)
        return outputs

    steps = model._steps_per_execution
    single = tuner is None and (steps is None or (steps.numpy().item() == 1 and not model.autotune_steps_per_execution))
    function: Callable[[Any], Any] = one_step if single else multi_step

    if not model.run_eagerly:
        function = tf.function(function, reduce_retracing=True)
        if training:
            model.train_tf_function = function

    def function_on_execution(iterator: Any) -> Any:
        # fit's and evaluate's loop pass an Execution, train_on_batch & co. a data iterator. Errors are
        # explained here, not by a wrapper: one frame fewer above the step.
        with errors_explained(model, explain):
            if isinstance(iterator, Execution):
                with running(iterator) as data:
                    return function(data)
            return function(iterator)

    return function_on_execution


#: ``mark_built_if_complete(model)``: sets ``model.built`` when all its variables exist although it
#: was never called (see :func:`custom_fit._compat.common.marks_built_if_complete`).
mark_built_if_complete = marks_built_if_complete(keras.layers.Layer, keras.Model)


def call_symbolically(layer: Any, input_shape: Any) -> None:
    """Calls ``layer`` on a ``keras.Input`` of ``input_shape``: sub-layers its ``call`` builds lazily get built.

    As the functional API calls a layer; the node that call records is removed
    again (the input is connected to nothing).
    """
    nodes = list(layer._inbound_nodes_value)
    layer(keras.Input(batch_shape=tuple(input_shape)))
    layer._inbound_nodes_value[:] = nodes


# --------------------------------------------------------------------------
# Optimizers, distribution and mixed precision
# --------------------------------------------------------------------------


def _legacy(optimizer: Any) -> bool:
    """Whether ``optimizer`` (or a ``LossScaleOptimizer``'s inner one) is a legacy ``OptimizerV2``."""
    return isinstance(getattr(optimizer, "inner_optimizer", optimizer), _optimizer_v2.OptimizerV2)


def optimizer_built(optimizer: Any) -> bool:
    """Whether ``optimizer`` has created its state (``Optimizer._built``; a legacy one its ``iterations``).

    A ``tf.compat.v1`` optimizer (``TFOptimizer``) creates its slots when it
    first applies gradients, as in tf_keras: there is nothing to build.
    """
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    if isinstance(inner, _optimizer_v1.TFOptimizer):
        return True
    if isinstance(inner, _optimizer_v2.OptimizerV2):
        return inner._iterations is not None
    return bool(getattr(inner, "_built", False))


def build_optimizer(optimizer: Any, variables: list[Any]) -> None:
    """Creates ``optimizer``'s state for ``variables`` (a legacy one: ``_create_all_weights``)."""
    if isinstance(optimizer, _optimizer_v1.TFOptimizer):
        return
    if _legacy(optimizer):
        optimizer._create_all_weights(variables)
    else:
        optimizer.build(variables)
    build_accumulators(optimizer, variables)  # compile(gradient_accumulation_steps=N): with the state


def mark_built(optimizer: Any) -> None:
    """Marks an optimizer group as built (Keras 2 subclasses set ``_built`` themselves)."""
    optimizer._built = True


def scale_loss(optimizer: Any, loss: Any) -> Any:
    """The loss multiplied by the loss scale, when ``optimizer`` is a ``LossScaleOptimizer``."""
    if isinstance(optimizer, LossScaleOptimizer):
        return optimizer.get_scaled_loss(loss)
    return loss


def unscale_gradients(optimizer: Any, gradients: list[Any]) -> list[Any]:
    """Divides gradients by the loss scale, as ``LossScaleOptimizer.compute_gradients`` does."""
    if isinstance(optimizer, LossScaleOptimizer):
        return optimizer.get_unscaled_gradients(gradients)
    return gradients


def with_keras2_api(optimizer: Any) -> Any:
    """``optimizer`` as it is: Keras 2's optimizers have Keras 2's API."""
    return optimizer


def rescale_gradients(optimizer: Any, gradients: list[Any]) -> list[Any]:
    """Gradients as they are: Keras 2's ``LossScaleOptimizer.apply_gradients`` takes unscaled ones."""
    return gradients


def sum_across_replicas(context: Any, optimizer: Any, grads_and_vars: list[Any]) -> list[Any]:
    """Sums gradients across replicas with the optimizer's own ``aggregate_gradients``."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    if isinstance(inner, _optimizer_v2.OptimizerV2):
        return inner._aggregate_gradients(grads_and_vars)
    return inner.aggregate_gradients(grads_and_vars)


def wrap_for_loss_scaling(optimizer: Any, name: str) -> Any:
    """``optimizer`` in a dynamic ``LossScaleOptimizer`` (Keras 2 names it after the inner one)."""
    return LossScaleOptimizer(optimizer)


#: ``loss_scaled(model, optimizer)``: ``optimizer`` in a ``LossScaleOptimizer`` (made once) when
#: ``model`` runs in ``mixed_float16``, as Keras 2's ``compile`` wraps the compiled one.
loss_scaled = loss_scaling(LossScaleOptimizer, LossScaleOptimizer)


def restore_base_config(layer: Any, config: dict[str, Any]) -> None:
    """Sets ``layer``'s name (``Layer._name``), ``trainable`` and dtype policy from ``config`` where they differ.

    For a model made without them (its constructor does not pass them on to
    ``tf.keras.Model``); before it is built, as the constructor would have set them.
    """
    if "name" in config and layer.name != config["name"]:
        layer._name = config["name"]
    if "trainable" in config and layer.trainable != config["trainable"]:
        layer.trainable = config["trainable"]
    if config.get("dtype") is not None:
        before = layer.dtype_policy
        layer._set_dtype_policy(config["dtype"])  # a name or a policy's config, as the constructor takes it
        if layer.dtype_policy.name == before.name:
            layer._set_dtype_policy(before)


def variables_built_on(optimizer: Any, candidates: Any) -> list[Any]:
    """The candidates ``optimizer`` keeps state for, in the order it was built on them.

    (``Optimizer._index_dict`` maps each variable's key to its position; a
    ``LossScaleOptimizer``'s inner optimizer.)
    """
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    if isinstance(inner, _optimizer_v2.OptimizerV2):  # slots by variable key, none for plain SGD
        slots = getattr(inner, "_slots", {})
        return [v for v in candidates if _optimizer_v2._var_key(v) in slots]
    index = getattr(inner, "_index_dict", {})
    found = [(index[inner._var_key(v)], v) for v in candidates if inner._var_key(v) in index]
    return [v for _, v in sorted(found, key=lambda pair: pair[0])]


# --------------------------------------------------------------------------
# Diagnostics
# --------------------------------------------------------------------------


def _regularized_variable(loss: Any) -> Any:
    """The variable of a weight penalty in ``Layer._callable_losses``, else ``None``.

    ``Layer._handle_weight_regularization`` adds
    ``partial(_tag_callable, partial(_loss_for_variable, variable))``.
    """
    inner = loss.args[0] if isinstance(loss, functools.partial) and loss.args else None
    if isinstance(inner, functools.partial) and inner.args and isinstance(inner.args[0], tf.Variable):
        return inner.args[0]
    return None


class _CountingPenalty(CountingCall):
    """A counted weight penalty of ``_callable_losses``, and the variable it penalizes."""

    def __init__(self, function: Callable[..., Any], variable: Any):
        super().__init__(function)
        self.variable = variable


def _count_regularizer_calls(model: Any) -> dict[int, CountingCall]:
    """Wraps each weight penalty in the layers' ``_callable_losses`` in a counter, keyed by its variable.

    Runs before the step is traced, when sub-models without an input shape
    are not built yet: their ``trainable_variables`` would raise, so each
    layer's own are read.
    """
    layers = list(model._flatten_layers(include_self=True))
    trainable = {id(v) for layer in layers if layer.trainable for v in layer._trainable_weights}
    counters: dict[int, CountingCall] = {}
    for layer in layers:
        for i, loss in enumerate(layer._callable_losses):
            variable = _regularized_variable(loss)
            if variable is not None and id(variable) in trainable:
                layer._callable_losses[i] = counters[id(variable)] = _CountingPenalty(loss, variable)
    return counters


def _restore_penalties(model: Any, counters: dict[int, CountingCall]) -> None:
    wrappers = {id(counter) for counter in counters.values()}
    for layer in model._flatten_layers(include_self=True):
        layer._callable_losses[:] = [loss.function if id(loss) in wrappers else loss for loss in layer._callable_losses]


#: ``with counting_regularizer_calls(model) as counters:`` -- ``{id(variable): counter}`` for
#: every regularized trainable variable. Keras 2 computes a weight penalty by calling a closure
#: in the layer's ``_callable_losses`` when ``layer.losses`` is read; counting those calls while
#: the step is traced tells whether the step computed it at all. The layers' penalties are
#: Keras' own again when the context ends.
#: A swap kept on purpose (tests/end_to_end/test_layout.py lists it): Keras records nothing when
#: it computes a penalty. tf_keras names a penalty's ops in a traced graph (``kernel/Regularizer/...``,
#: 4 of 4 for an L2 penalty, measured by ``benchmarks/trace_time_swaps.py``), but a step run eagerly
#: (``run_eagerly=True``) makes no graph, and the check must warn there too (as it does on Keras 3,
#: whose penalty ops carry no such name); without the count, a step that drops the penalties trains
#: unregularized silently.
counting_regularizer_calls = shared_while_inside(_count_regularizer_calls, _restore_penalties)


def seed_generator_states(model: Any) -> list[Any]:
    """None: tf_keras layers draw from TensorFlow's global generator (no format saves it), and
    custom_fit's Keras 2 :class:`SeedGenerator` is a layer whose state weight Keras saves."""
    return []


def untracked_variables(model: Any) -> list[UntrackedVariable]:
    """The states of ``tf.random.Generator``s in layer attributes, which tf_keras leaves out of ``weights``.

    (tf_keras tracks a raw ``tf.Variable`` a layer's attribute holds: it is
    in ``weights``. See :func:`custom_fit._compat.common.find_untracked_variables`.)
    """
    return find_untracked_variables(model._flatten_layers(include_self=True), raw_variables=False)


@tf.autograph.experimental.do_not_convert  # plain Python, called while the step is traced
def variable_names(model: Any, variables: Any) -> list[str]:
    """``layer/.../weight`` paths of ``variables`` inside ``model``, for messages.

    A Keras 2 ``tf.Variable``'s name depends on the name scope it was created
    in (often just ``kernel:0``); the path through ``model``'s layers says
    which layer it belongs to, like Keras 3's ``variable.path``.
    """
    if not variables:
        return []
    paths: dict[int, str] = {}
    pending = [(model, "")]
    while pending:
        layer, prefix = pending.pop()
        for v in layer._trainable_weights + layer._non_trainable_weights:
            paths.setdefault(id(v), prefix + v.name.split(":")[0].split("/")[-1])
        children = layer._flatten_layers(include_self=False, recursive=False)
        pending.extend((child, f"{prefix}{child.name}/") for child in reversed(list(children)))
    fallback = variable_names_without_model(variables)
    return [paths.get(id(v), name) for v, name in zip(variables, fallback, strict=True)]


# --------------------------------------------------------------------------
# Random numbers
# --------------------------------------------------------------------------


class SeedGenerator(keras.layers.Layer):
    """Keras 3's ``keras.random.SeedGenerator`` for Keras 2 (which has none).

    Written here because ``tf.random.Generator`` draws different numbers on
    each replica; this state is one non-trainable weight (saved with the
    model's weights) that every replica reads and advances identically.
    """

    def __init__(self, seed: int | None = None, name: str | None = None):
        super().__init__(name=name)
        seed = random.SystemRandom().randrange(2**31) if seed is None else int(seed)
        self.state = self.add_weight(
            name="seed_generator_state",
            shape=(2,),
            dtype="int64",
            initializer=keras.initializers.Constant([seed, 0]),
            trainable=False,
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
        )

    def next(self) -> tf.Tensor:
        """The current seed; the state advances by one."""
        seed = tf.identity(self.state)
        with tf.control_dependencies([seed]):
            self.state.assign_add(tf.constant([0, 1], "int64"))
        return seed


def _seed(seed: Any) -> Any:
    return seed.next() if isinstance(seed, SeedGenerator) else tf.constant([int(seed), 0], "int64")


def random_normal(shape: Any, seed: Any) -> Any:
    """Standard normal numbers; ``seed`` is an ``int`` or a :class:`SeedGenerator`."""
    return tf.random.stateless_normal(shape, seed=_seed(seed))


def random_uniform(shape: Any, seed: Any) -> Any:
    """Uniform numbers in ``[0, 1)``; ``seed`` is an ``int`` or a :class:`SeedGenerator`."""
    return tf.random.stateless_uniform(shape, seed=_seed(seed))


# --------------------------------------------------------------------------
# Functional construction without rewriting class bases
# --------------------------------------------------------------------------


def is_functional_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether ``Model.__init__`` takes these arguments for ``Model(inputs, outputs)``.

    Keras' own test (``is_functional_model_init_params``) counts arguments;
    when it holds, Keras splices ``Functional`` into the class' bases before it
    checks the arguments themselves.
    """
    if not _training.is_functional_model_init_params(args, kwargs):
        return False
    inputs = kwargs["inputs"] if "inputs" in kwargs else args[0]
    flat = tf.nest.flatten(inputs)
    if any(_from_keras_3(t) for t in flat):
        # Keras 2 would take these for functional arguments it cannot use and
        # splice `Functional` into the class' bases for good.
        raise ValueError(
            "custom_fit models are tf_keras (Keras 2) models in this process because "
            "TF_USE_LEGACY_KERAS=1, but the inputs received are Keras 3 tensors "
            f"({type(flat[0]).__module__}.{type(flat[0]).__name__}, from `import keras`). "
            "Expected tensors from tf.keras.Input(...). Fix: build the model with "
            "`from tensorflow import keras` (or `import tf_keras as keras`), or unset "
            "TF_USE_LEGACY_KERAS to use Keras 3."
        )
    return True


#: The weights of a ``custom_fit.BackupAndRestore`` backup: a TensorFlow checkpoint
#: prefix, because tf_keras' ``.h5`` weights leave the optimizer's state out.
BACKUP_WEIGHTS_FILE = "weights"


def snapshot_weights(model: keras.Model, path: str, reuse: Callable[[], None] | None = None) -> Callable[[], None]:
    """Copies what ``model.save_weights(path)`` writes to host memory; the function returned waits for the file.

    TensorFlow's asynchronous checkpoint does it: ``save_weights`` returns
    once the variables are copied (to CPU copies it keeps), and TensorFlow's
    own thread writes the files; the function returned waits for them (the
    model's checkpoint's ``sync``), and may run in another thread while
    training goes on. (On Keras 3 the same option fails: TensorFlow copies a
    Keras 3 variable by creating one inside a ``tf.function``.) ``reuse`` is
    not needed: the checkpoint keeps its CPU copies from one save to the next.
    """
    model.save_weights(path, options=tf.train.CheckpointOptions(experimental_enable_async_checkpoint=True))
    return model._checkpoint.sync


def set_initial_epoch(model: Any, epoch: int | None) -> None:
    """Keras 3's means for a ``fit`` custom_fit does not run; on Keras 2 every resumed ``fit`` is custom_fit's."""
    raise NotImplementedError(
        "custom_fit resumes a Keras 2 fit through its progress (custom_fit._trainer.progress.Progress); a model "
        f"{type(model).__name__} whose fit custom_fit does not run cannot be resumed by custom_fit on Keras 2."
    )


#: ``share_registered_name(twin, cls)``: ``twin`` serializes under ``cls``' registered name.
share_registered_name = sharing_registered_names(_registration._GLOBAL_CUSTOM_NAMES, keras.saving.get_registered_name)


# --------------------------------------------------------------------------
# Overrides of private Model hooks
# --------------------------------------------------------------------------


if TYPE_CHECKING:

    class _TrainerHost(Host):
        """The model with the private tf_keras ``Model`` names :class:`TrainerHooks` reads or overrides."""

        _is_compiled: bool

        def _updated_config(self) -> dict[str, Any]: ...

        def _get_optimizer(self, optimizer: Any) -> Any: ...

else:
    _TrainerHost = Host


class TrainerHooks(_TrainerHost):
    """Overrides of private ``tf_keras`` ``Model`` methods; ``CustomModel`` inherits it first."""

    def _updated_config(self) -> dict[str, Any]:
        # `to_json`, `to_yaml` and the H5 format name the class by `__name__`, which tf_keras'
        # `model_from_json` does not find for a registered class ("custom_fit>CustomModel"): it
        # returned the string "CustomModel". The registered name finds the class with no
        # custom_objects; an unregistered subclass keeps its own name, as in tf_keras.
        config: dict[str, Any] = super()._updated_config()
        config["class_name"] = keras.saving.get_registered_name(type(self))
        return config

    @functools.wraps(keras.Model.train_on_batch)
    def train_on_batch(self, *args: Any, **kwargs: Any) -> Any:
        self._require_compiled("train_on_batch")
        return super().train_on_batch(*args, **kwargs)

    @functools.wraps(keras.Model.test_on_batch)
    def test_on_batch(self, *args: Any, **kwargs: Any) -> Any:
        self._require_compiled("test_on_batch")
        return super().test_on_batch(*args, **kwargs)

    def _require_compiled(self, method: str) -> None:
        # Keras 2's message names neither the method, the model nor the fix; each method that
        # needs compile() asks first, with its name (tf_keras' own check does not know it).
        if not self._is_compiled:
            raise not_compiled_error(self, method)

    def _assert_compile_was_called(self) -> None:
        if not self._is_compiled:  # any other tf_keras method that needs compile()
            raise not_compiled_error(self, None)

    def get_config(self) -> dict[str, Any]:
        # Keras 2 writes a functional config only when `__init__`'s arguments
        # are literally (inputs, outputs, name, trainable); CustomModel's are
        # (*args, **kwargs) and still rebuild a functional model from it.
        cls_init = inspect.getfullargspec(type(self).__init__)
        functional = isinstance(self, Functional) and not isinstance(self, keras.Sequential)
        if functional and (cls_init.varargs, cls_init.varkw) == ("args", "kwargs"):
            base = {"name": self.name, "trainable": self.trainable}
            return copy.deepcopy(_functional.get_network_config(self, config=base))
        return super().get_config()

    def _get_optimizer(self, optimizer: Any) -> Any:
        # Keras 2 wraps every compiled optimizer in a LossScaleOptimizer under
        # mixed_float16; a group of named optimizers wraps its members instead.
        if optimizer is None or getattr(optimizer, "is_optimizer_group", False):
            return optimizer  # None: a subclass compile() that manages its own optimizers
        return super()._get_optimizer(optimizer)
