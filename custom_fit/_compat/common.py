"""Helpers that are the same on Keras 3 and on Keras 2 (``tf_keras``).

Most touch only TensorFlow; the few that touch a Keras private name touch one
that both Kerases spell the same way, and say which.
"""

from __future__ import annotations

import contextlib
import re
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple, TypeVar

import numpy as np
import tensorflow as tf

T = TypeVar("T")

__all__ = [
    "FIT_VALIDATION_KWARGS",
    "CountingCall",
    "ErrorExplainer",
    "UntrackedVariable",
    "batch_size_of",
    "cluster_key_get",
    "cluster_key_insert",
    "dataset_without_autotuning",
    "errors_explained",
    "explained_step_error",
    "explained_xla_error",
    "find_untracked_variables",
    "in_one_merge_call",
    "is_scalar",
    "loss_scaling",
    "marked_as",
    "marks_built_if_complete",
    "not_compiled_error",
    "pop_fit_validation",
    "record_compile_option",
    "recording",
    "replica_context_with_peers",
    "report_execution",
    "set_untracked",
    "shared_while_inside",
    "sharing_registered_names",
    "unbuilt_sub_layers",
    "validates_after",
    "variable_names_without_model",
    "with_errors_explained",
]

# --------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------


def is_scalar(value: Any) -> bool:
    """Whether ``value`` is a Python number or a rank-0 tensor."""
    return isinstance(value, (int, float)) or (hasattr(value, "shape") and len(value.shape) == 0)


def batch_size_of(x: Any) -> tf.Tensor:
    """The batch size of the first non-``None`` input, as Keras' trainers compute it."""
    first = next(t for t in tf.nest.flatten(x) if t is not None)
    return tf.shape(first)[0]


def dataset_without_autotuning(dataset: Any) -> Any:
    """``dataset`` with tf.data autotuning off; anything else (a distributed dataset) as it is.

    Used for the pipeline ``fit``, ``evaluate`` (and on Keras 2 ``predict``)
    build from arrays. With TensorFlow 2.21, deleting an autotuned ``tf.data``
    iterator sometimes blocks until the autotuning thread wakes from a sleep
    that grows with the iterator's age, and ``fit`` deletes one at the end of
    every epoch (measurements: docs/performance.md, "Measurements behind
    design choices").

    Autotuning only sizes a pipeline's parallelism and prefetch buffers.
    Without it, a parallel ``map`` keeps the parallelism it starts with and
    still returns elements in order, and ``prefetch`` sizes its buffer with
    its own tuner, so every batch and its order are unchanged. These
    pipelines gather rows of arrays already in memory, which needs no tuning.
    A ``tf.data.Dataset`` the user passes keeps its own options.
    """
    if not isinstance(dataset, tf.data.Dataset) or dataset.options().autotune.enabled is False:
        return dataset  # a distributed dataset's options can no longer be set; or already off
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


def set_untracked(obj: Any, name: str, value: Any) -> None:
    """Sets an attribute that neither Keras' tracker nor TF checkpointing follows.

    Keras layers and optimizers (and TensorFlow's ``AutoTrackable``) turn
    attributes into tracked state; bookkeeping such as references to layers
    or lists of variables must not become part of what is saved.
    """
    object.__setattr__(obj, name, value)


class UntrackedVariable(NamedTuple):
    """A ``tf.Variable`` held by a layer's attribute that Keras does not track (Keras 3)."""

    layer_index: int  # the layer's position in the model's layers, the model itself first
    layer_name: str
    attribute: str  # the attribute's name; ``name.0`` for an item of a list, ``name.key`` of a dict
    variable: tf.Variable

    @property
    def name(self) -> str:
        """``layer.attribute``, for messages."""
        return f"{self.layer_name}.{self.attribute}"


def find_untracked_variables(layers: Iterable[Any], *, raw_variables: bool) -> list[UntrackedVariable]:
    """The variables that attributes of ``layers`` hold outside what Keras tracks.

    These are the state of each ``tf.random.Generator`` (neither Keras counts
    it among a layer's weights) and, with ``raw_variables``, each raw
    ``tf.Variable`` (Keras 3 tracks only its own variables; tf_keras tracks
    these). An attribute holding a list, tuple or dict of them counts too.
    ``layers`` is the model itself, then its layers, nested ones included
    (``Layer._flatten_layers``), whose order numbers them; attributes go by
    name. TensorFlow's own bookkeeping (``_self_*`` attributes, which list the
    same objects as checkpoint dependencies) is skipped.
    """

    def variable_of(value: Any) -> tuple[str, Any] | None:
        if isinstance(value, tf.random.Generator):
            return ".state", value.state
        if raw_variables and isinstance(value, tf.Variable):
            return "", value
        return None

    found: dict[int, UntrackedVariable] = {}
    for index, layer in enumerate(layers):
        for attribute, value in sorted(vars(layer).items()):
            if attribute.startswith("_self_"):
                continue
            if isinstance(value, dict):
                candidates = [(f"{attribute}.{key}", item) for key, item in value.items()]
            elif isinstance(value, (list, tuple)):
                candidates = [(f"{attribute}.{i}", item) for i, item in enumerate(value)]
            else:
                candidates = [(attribute, value)]
            for name, candidate in candidates:
                state = variable_of(candidate)
                if state is not None and id(state[1]) not in found:
                    found[id(state[1])] = UntrackedVariable(index, layer.name, name + state[0], state[1])
    return list(found.values())


def variable_names_without_model(variables: Any) -> list[str]:
    """Variables' paths (Keras 3) or names (``tf.Variable``), for messages."""
    return [getattr(v, "path", None) or v.name for v in variables]


def record_compile_option(model: Any, name: str, value: Any) -> None:
    """Adds ``name=value`` to the config ``load_model`` passes back to ``compile``.

    Both Kerases keep that config in ``model._compile_config.config``.
    """
    model._compile_config.config[name] = value


def marks_built_if_complete(layer_class: Any, model_class: Any) -> Callable[[Any], None]:
    """``mark_built_if_complete(model)`` for the Keras whose ``Layer`` and ``Model`` are given."""

    def mark_built_if_complete(model: Any) -> None:
        """Sets ``model.built`` when it was never called but every variable it can have exists.

        A GAN, a distiller or a VAE is trained through sub-models its step
        calls; the model itself is never called, stays unbuilt, and Keras'
        ``BackupAndRestore`` refuses it and ``save`` warns. When every direct
        sub-layer is built or has no ``build`` of its own (so creates no
        variables), and the model has no ``build`` of its own either, Keras'
        default ``build`` would do nothing but set ``built``.
        """
        if model.built or type(model).build is not model_class.build:
            return
        layers = model.layers
        if layers and all(layer.built or type(layer).build is layer_class.build for layer in layers):
            model.built = True

    return mark_built_if_complete


def unbuilt_sub_layers(layer: Any) -> list[str]:
    """The names of the layers inside ``layer`` (at any depth) that are not built."""
    return [sub.name for sub in layer._flatten_layers(include_self=False) if not sub.built]


def not_compiled_error(model: Any, method: str | None) -> ValueError:
    """The error for ``fit``, ``evaluate`` & co. on a model that was never compiled (``method``: its name)."""
    called = f"{method}()" if method else "this method"
    return ValueError(
        f"{type(model).__name__}.{called} needs a compiled model: expected "
        "`model.compile(optimizer=..., loss=...)` to have been called first, but model "
        f"'{model.name}' was never compiled. Fix: call `model.compile(...)` before `model.{called}`."
    )


def sharing_registered_names(
    registry: dict[Any, str], get_registered_name: Callable[[type], str]
) -> Callable[[type, type], None]:
    """``share_registered_name(twin, cls)`` for the Keras whose custom-name registry is ``registry``."""

    def share_registered_name(twin: type, cls: type) -> None:
        """Serializes ``twin`` under ``cls``' registered name, so ``load_model`` finds ``cls``."""
        registry[twin] = get_registered_name(cls)

    return share_registered_name


def marked_as(keras_method: Callable[..., Any]) -> Callable[[T], T]:
    """A decorator: the method carries ``keras_method``'s "default" mark (``_is_default``), if it has one.

    Keras calls a layer's ``build`` (tf_keras' ``Sequential.build`` is marked
    default, Keras 3's is not) or generates a ``get_config`` only where the
    method is its own default; an override that delegates to Keras' must keep
    that mark for Keras to treat it alike.
    """

    def mark(method: T) -> T:
        if getattr(keras_method, "_is_default", False):
            method._is_default = True  # type: ignore[attr-defined]
        return method

    return mark


class CountingCall:
    """Wraps a penalty function and counts how often it is computed."""

    def __init__(self, function: Callable[..., Any]):
        self.function = function
        self.calls = 0

    def __call__(self, *args: Any) -> Any:
        self.calls += 1
        return self.function(*args)


# --------------------------------------------------------------------------
# Step functions
# --------------------------------------------------------------------------

_XLA_UNSUPPORTED = re.compile(
    r"Detected unsupported operations when trying to compile graph \S+ on (\S+): (.*?) \(No registered"
)


def report_execution(tuner: Any, steps: int, logs: Any, source: Any) -> None:
    """Tells a ``StepsPerExecutionTuner`` that an execution of ``steps`` steps read ``source`` and returned ``logs``.

    The tuner waits for the logs (a host read of their first value) only when
    it ends a measurement window.
    """
    tuner.executed(steps, sync=lambda: [np.asarray(v) for v in tf.nest.flatten(logs)[:1]], source=source)


#: What a step function asks of an error it raised: the error to raise instead, or ``None``.
ErrorExplainer = Callable[[Exception], "Exception | None"]


def explained_xla_error(model: Any, error: Exception) -> XlaCompileError | None:
    """TensorFlow's "unsupported operations ... XLA" error as one that names the fix; ``None`` for another error."""
    if not isinstance(error, tf.errors.InvalidArgumentError):
        return None
    found = _XLA_UNSUPPORTED.search(str(error))
    if found is None or not model.jit_compile:
        return None
    device, ops = found.groups()
    return XlaCompileError(
        f"XLA cannot compile the step of model '{model.name}': op {ops} has no "
        f"XLA kernel on {device}. Expected every op in train/test/predict_step "
        "to be XLA-compilable because the model was compiled with "
        f"jit_compile=True; received a step that uses {ops}. Fix: "
        "`model.compile(..., jit_compile=False)`, or replace that op with an "
        f"XLA-compatible one. (TensorFlow: {str(error.message).strip().splitlines()[0]})",
        error,
    )


def explained_step_error(model: Any, error: Exception, explain: ErrorExplainer | None = None) -> Exception | None:
    """The error to raise instead of ``error``: XLA's explained, else ``explain``'s; ``None``: ``error`` itself."""
    return explained_xla_error(model, error) or (explain(error) if explain is not None else None)


@contextlib.contextmanager
def errors_explained(model: Any, explain: ErrorExplainer | None = None) -> Iterator[None]:
    """Raises :func:`explained_step_error`'s error, from the original, in place of an error the block raises.

    The step functions run their body in it instead of being wrapped in a
    function per explanation: each wrapper was one more frame between ``fit``
    and ``train_step`` in a debugger or a traceback (issue 50). A block that
    raises nothing costs its entry and exit only.
    """
    try:
        yield
    except (RuntimeError, tf.errors.InvalidArgumentError) as error:  # what the explanations explain
        explained = explained_step_error(model, error, explain)
        if explained is None:
            raise
        raise explained from error


def with_errors_explained(
    model: Any, function: Callable[[Any], Any], explain: ErrorExplainer | None = None
) -> Callable[[Any], Any]:
    """``function``, run in :func:`errors_explained` (Keras' predict function, which custom_fit does not build)."""

    def function_with_errors_explained(iterator: Any) -> Any:
        with errors_explained(model, explain):
            return function(iterator)

    return function_with_errors_explained


class XlaCompileError(ValueError, tf.errors.InvalidArgumentError):
    """An op of the step has no XLA kernel (``jit_compile=True``); the message names the op and the fix.

    Both a ``ValueError`` and the ``tf.errors.InvalidArgumentError`` Keras raises
    there, so code written against either still catches it.
    """

    def __init__(self, message: str, error: tf.errors.InvalidArgumentError):
        tf.errors.InvalidArgumentError.__init__(self, error.node_def, error.op, message)


# --------------------------------------------------------------------------
# Gradient tapes and distribution
# --------------------------------------------------------------------------


@contextlib.contextmanager
def recording(tape: tf.GradientTape) -> Iterator[None]:
    """Records on ``tape``: re-enters it, unless it is recording already.

    ``GradientTape._recording`` is private; re-entering a tape that is still
    recording raises in TensorFlow, so it is checked first.
    """
    if tape._recording:
        yield
    else:
        with tape:
            yield


def cluster_key_insert(key: str, value: str) -> bool:
    """Stores ``key`` in the key-value store every worker of a multi-worker strategy reaches; ``False`` if taken.

    TensorFlow's coordination service (which ``MultiWorkerMirroredStrategy``
    starts) keeps the store; its Python API is ``tensorflow.python.eager``'s
    private ``context``. A key, once inserted, keeps its first value for the
    cluster's lifetime.
    """
    from tensorflow.python.eager import context

    try:
        context.context().set_config_key_value(key, value)
    except tf.errors.AlreadyExistsError:
        return False
    return True


def cluster_key_get(key: str, timeout_s: float) -> str | None:
    """The value of ``key`` in the cluster's key-value store, waiting up to ``timeout_s``; ``None`` if still unset."""
    from tensorflow.python.eager import context

    try:
        value: str = context.context().get_config_key_value(key, timeout_in_ms=max(1, int(timeout_s * 1000)))
    except tf.errors.DeadlineExceededError:
        return None
    return value


def is_xla_function(step: Any) -> bool:
    """Whether ``step`` is a ``tf.function`` compiled with XLA (``jit_compile=True``: TensorFlow's ``_jit_compile``)."""
    return isinstance(step, tf.types.experimental.PolymorphicFunction) and bool(getattr(step, "_jit_compile", False))


def in_replica(step: Any) -> Any:
    """``step`` as a replica of a ``tf.distribute`` strategy runs it: a ``tf.function``'s Python function.

    ``MirroredStrategy`` runs a ``tf.function`` handed to ``strategy.run`` as
    its Python function in each replica, inside one ``tf.function`` (Keras 3
    hands it ``train_step`` itself, so a ``train_step`` decorated with
    ``@tf.function`` trains there). custom_fit's step function runs the
    model's ``train_step`` inside its own, where the decorated function would
    be a nested ``tf.function`` whose optimizer update cannot make its
    cross-replica ``merge_call``. One compiled with XLA is left as it is: it
    would run without XLA, and Keras 3 fails with it too (``_distribution``
    explains the error). With no strategy the decorated step runs as it is,
    as for ``keras.Model``.
    """
    if (
        isinstance(step, tf.types.experimental.PolymorphicFunction)
        and tf.distribute.has_strategy()
        and not is_xla_function(step)
    ):
        return step.python_function
    return step


def replica_context_with_peers() -> tf.distribute.ReplicaContext | None:
    """The current replica context under a ``tf.distribute`` strategy (also of one replica), else ``None``.

    A strategy of one replica (``MirroredStrategy()`` on a machine with one
    GPU) still makes an optimizer's update a cross-replica ``merge_call``:
    the update goes the strategy's way, as with several replicas.
    """
    context = tf.distribute.get_replica_context()
    if context is None or not tf.distribute.has_strategy():
        return None
    return context


def in_one_merge_call(
    update: Callable[[list[Any]], None], gradients: list[Any], *, direct_updates: bool = True
) -> None:
    """Runs ``update(gradients)`` once, in cross-replica context, from a replica: one unconditional ``merge_call``.

    For an optimizer update that is conditional (gradient accumulation
    updates inside ``tf.cond`` every N-th step) under a multi-replica
    strategy. A Keras optimizer called in a replica reaches the other
    replicas through a ``merge_call`` in each branch, and ``tf.distribute``
    cannot wait for the other replicas inside a branch (the error
    ``custom_fit._distribution.explained_merge_call_error`` rewrites). Here the step makes one
    ``merge_call``, unconditionally, and ``update`` runs in its cross-replica
    context: the optimizer's branches update each device's copy of the
    variables (``strategy.extended.update``), which needs no replica to wait.
    Without a strategy it runs as it is.

    ``gradients`` must be equal on every replica (the gradient contract sums
    them over replicas first), so the first local replica's stand for all:
    each device computes the update one device computes, as Keras' own update
    does with its local gradient. Keras' optimizer code asks ``tf.distribute``
    for a ``merge_call`` itself (``maybe_merge_call``), which cross-replica
    context cannot make; the strategy's ``_use_merge_call`` answers "no" while
    ``update`` is traced (TensorFlow's own mode for XLA on GPUs, where the
    same functions run without one), so those calls run their update
    functions directly. With ``direct_updates=False`` it does not: ``update``
    goes back into the replicas itself (``call_for_each_replica``, as Keras'
    ``LossScaleOptimizer`` does in its branch).

    The swap of ``_use_merge_call`` is kept on purpose
    (``tests/end_to_end/test_layout.py`` lists it): TensorFlow has no public
    switch for it, and the ways without it were measured
    (``benchmarks/trace_time_swaps.py``, Keras 3's
    ``gradient_accumulation_steps`` on 2 replicas): Keras' update in
    cross-replica context without it ends in an ``AttributeError`` (no
    replica context to ``merge_call`` from), and back in the replicas its
    ``merge_call`` is inside Keras' accumulation branch again (the error
    ``explained_merge_call_error`` rewrites).
    """

    def cross_replica(strategy: tf.distribute.Strategy, values: list[Any]) -> None:
        local = [strategy.experimental_local_results(g)[0] for g in values]
        if not direct_updates:
            update(local)
            return
        extended = strategy.extended
        extended._use_merge_call = lambda: False  # an instance attribute over the method, for this trace
        try:
            update(local)
        finally:
            del extended._use_merge_call  # the strategy's own method again

    tf.distribute.get_replica_context().merge_call(cross_replica, args=(gradients,))


def shared_while_inside(
    install: Callable[[Any], T], uninstall: Callable[[Any, T], None]
) -> Callable[[Any], contextlib.AbstractContextManager[T]]:
    """A context manager factory: ``install(obj)`` when the first caller enters, ``uninstall`` when the last leaves.

    For changes custom_fit makes to a user's object (an optimizer, a
    model's regularizers) while it traces a step: they last no longer than
    the trace. Callers inside at the same time share one installation (what
    ``install`` returned is what each gets): the replica threads of
    ``MirroredStrategy`` trace the step one after another, each inside.
    """
    inside: dict[int, tuple[int, T]] = {}  # id(obj) -> (callers inside, what install returned)
    lock = threading.Lock()

    @contextlib.contextmanager
    def while_inside(obj: Any) -> Iterator[T]:
        with lock:
            count, installed = inside.get(id(obj)) or (0, install(obj))
            inside[id(obj)] = (count + 1, installed)
        try:
            yield installed
        finally:
            with lock:
                count, installed = inside.pop(id(obj))
                if count > 1:
                    inside[id(obj)] = (count - 1, installed)
                else:
                    uninstall(obj, installed)

    return while_inside


def loss_scaling(loss_scale_optimizer: type, wrap: Callable[[Any], Any]) -> Callable[[Any, Any], Any]:
    """``loss_scaled(model, optimizer)`` for the Keras whose ``LossScaleOptimizer`` class is given.

    ``wrap(optimizer)`` makes the ``LossScaleOptimizer``, once per optimizer
    (weakly cached).
    """
    twins: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()

    def loss_scaled(model: Any, optimizer: Any) -> Any:
        """``optimizer`` wrapped in a ``LossScaleOptimizer`` when ``model`` runs in ``mixed_float16``.

        ``compile()`` wraps the compiled optimizer; an extra optimizer handed to
        ``minimize`` gets the same treatment, once.
        """
        if model.dtype_policy.name != "mixed_float16" or isinstance(optimizer, loss_scale_optimizer):
            return optimizer
        if optimizer not in twins:
            twins[optimizer] = wrap(optimizer)
        return twins[optimizer]

    return loss_scaled


# --------------------------------------------------------------------------
# Fit's validation: the same on both Kerases' trainers
# --------------------------------------------------------------------------

#: The keyword ``fit`` passes to ``evaluate`` for its validation: reuse the validation epoch iterator
#: (Keras 3's and tf_keras' ``fit`` pass the same private keyword).
FIT_VALIDATION_KWARGS: dict[str, Any] = {"_use_cached_eval_dataset": True}


def pop_fit_validation(kwargs: dict[str, Any]) -> bool:
    """Removes :data:`FIT_VALIDATION_KWARGS`' keyword from ``evaluate``'s ``kwargs``: whether ``fit`` validates."""
    return bool(kwargs.pop("_use_cached_eval_dataset", False))


def validates_after(model: Any, epoch: int, validation_freq: Any) -> bool:
    """Whether ``fit`` validates after ``epoch`` (``_should_eval``, which both Kerases' trainers define alike)."""
    return bool(model._should_eval(epoch, validation_freq))
