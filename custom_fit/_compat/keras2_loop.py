"""Keras 2's pieces of custom_fit's ``fit``/``evaluate``/``predict`` loop: tf_keras' data handler and checks.

:class:`custom_fit._trainer.loop.Loop` runs the same loop on both Kerases;
what differs is read here (Keras 2) and in :mod:`custom_fit._compat.keras3_only`
(Keras 3), both implementing :class:`custom_fit._compat.contract.LoopParts`.
The loop is tf_keras 2.21's ``Model.fit``, ``evaluate`` and ``predict``
(the same calls in the same order, so histories, callbacks and weights
equal ``tf_keras.Model``'s), but for the pieces custom_fit owns:

* :class:`EpochIterator` steps through tf_keras' ``DataHandler``
  (``enumerate_epochs`` and ``steps``, rewritten) with the number of steps
  per execution the loop's plan chooses before each execution, and may
  start a resumed run at the step where an interrupted one stopped: it
  makes and drops the data iterators the interrupted run had made (a seeded
  ``tf.data`` shuffle draws a new order for each) and skips the batches
  already trained. tf_keras' own loop starts every epoch at its first batch
  and makes the array pipeline for the epochs left only, so a run it
  resumed read other batches than an uninterrupted one.
* Array pipelines run without tf.data autotuning (same batches; why:
  :func:`custom_fit._compat.common.dataset_without_autotuning`), set on the
  data handler the loop builds, not by replacing tf_keras'
  ``data_adapter.get_data_handler`` while ``fit`` runs.

Not supported (as before): ``ParameterServerStrategy``'s coordinator and its
exact evaluation (``pss_evaluation_shards``). Nothing in this module is public API.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import tensorflow as tf
import tf_keras as keras
from tensorflow.python.distribute import values as _distribute_values
from tf_keras.src.engine import data_adapter as _data_adapter
from tf_keras.src.engine import training as _training
from tf_keras.src.engine import training_utils as _training_utils
from tf_keras.src.utils import tf_utils as _tf_utils
from tf_keras.src.utils import version_utils as _version_utils

from custom_fit._compat.common import (
    FIT_VALIDATION_KWARGS,
    dataset_without_autotuning,
    not_compiled_error,
    pop_fit_validation,
    validates_after,
)
from custom_fit._compat.keras2 import Execution, has_compiled_loss, running
from custom_fit._trainer.data_position import DataCursor

__all__ = [
    "FIT_VALIDATION_KWARGS",
    "EpochIterator",
    "Execution",
    "batch_end_step",
    "begin_call",
    "build_before_loop",
    "build_compiled_state",
    "call_scope",
    "callback_list",
    "capped_epochs",
    "concat_predictions",
    "data_options",
    "epoch_iterator",
    "epoch_logs",
    "evaluation_logs",
    "first_epoch",
    "fixed_steps_per_execution",
    "flat_logs",
    "has_validation_data",
    "in_legacy_graph",
    "pop_fit_validation",
    "reset_counter",
    "run_prediction",
    "set_steps_per_execution",
    "steps_per_execution",
    "train_validation_split",
    "validates_after",
]

#: tf_keras' data-loading arguments of ``fit``, ``evaluate`` and ``predict`` (Keras 3 has none), with their defaults.
_DATA_OPTIONS = {"max_queue_size": 10, "workers": 1, "use_multiprocessing": False}


class EpochIterator:
    """tf_keras' ``DataHandler``, stepped with the number of steps per execution and the start chosen per call.

    Iterating it runs one epoch: each item is ``(first step, steps,
    Execution)``, as :class:`custom_fit._compat.keras3_only.EpochIterator`
    gives them. It makes data iterators where tf_keras' ``enumerate_epochs``
    does (one before the first epoch; a new one per epoch where the adapter
    asks for it, e.g. a ``tf.data.Dataset``; arrays read one iterator over
    all epochs) and numbers the steps as tf_keras' ``steps`` does (the last
    execution of an epoch is shortened to the steps left; on data of unknown
    length the first epoch that runs dry gives the epoch's length). The
    replay and skip of a resumed run, the plan's argument and the epoch's
    executions are :attr:`cursor`'s (a
    :class:`~custom_fit._trainer.data_position.DataCursor`, as on Keras 3).

    Args:
        model: The model whose ``fit``, ``evaluate`` or ``predict`` reads the data.
        plan: The number of steps of the next execution, given the steps left
            in the epoch (``None``: unknown).
        position: Where ``fit`` reads its data
            (:class:`custom_fit._trainer.data_position.EpochPosition`); ``None`` for
            ``evaluate`` and ``predict``.
        **data: tf_keras' ``DataHandler`` arguments (``x``, ``y``,
            ``batch_size``, ``steps_per_epoch``, ``initial_epoch``, ``epochs``, ...).
    """

    def __init__(self, model: Any, *, plan: Callable[[int | None], int], position: Any = None, **data: Any):
        variable = model._steps_per_execution  # None before compile (predict): the handler makes its own
        self._handler = _data_adapter.get_data_handler(model=model, steps_per_execution=variable, **data)
        handler = self._handler
        self._variable = handler._steps_per_execution
        self._fixed = int(self._variable.numpy())  # compile's: executions set it only while they run
        adapter = handler._adapter
        if isinstance(adapter, _data_adapter.TensorLikeDataAdapter):
            handler._dataset = dataset_without_autotuning(handler._dataset)
        self.plan = plan
        self.position = position
        self._steps_per_epoch = data.get("steps_per_epoch")
        self.cursor = DataCursor(
            lambda: iter(handler._dataset),
            position,
            # Iterators of a generator or a Sequence read a Python object: a resumed run skips batches
            # of the first iterator it makes instead of making the interrupted run's again.
            replays_iterators=not isinstance(adapter, _data_adapter.GeneratorDataAdapter),
            may_run_dry=_may_run_dry(handler),
        )
        self._epoch_open = False  # an epoch ran whose data adapter's on_epoch_end is due
        #: Where the first epoch starts when nothing resumes (tf_keras' own BackupAndRestore sets it).
        self.initial_step = 0
        if position is not None:
            # The batches' spec before a strategy splits them (build_compiled_state reads it).
            position.element_spec = getattr(handler._dataset, "_original_dataset", handler._dataset).element_spec
            position.adapter = adapter

    @property
    def num_batches(self) -> int | None:
        """The steps of an epoch (``None`` until an epoch of data of unknown length ran dry)."""
        return self._handler.inferred_steps

    @property
    def steps_per_epoch(self) -> int | None:
        """``fit``'s ``steps_per_epoch`` argument, else the steps of an epoch as far as known."""
        return self._steps_per_epoch or self.num_batches

    @property
    def exhausted(self) -> bool:
        """Whether the data ran out before the epochs' steps did (tf_keras then ends ``fit``)."""
        return bool(self._handler._insufficient_data)

    def reset(self) -> None:
        """Starts reading the data anew, as each call of tf_keras' ``enumerate_epochs`` does.

        ``fit`` resets once; ``evaluate`` at each call, also when ``fit``'s
        validation reuses the validation data's iterator.
        """
        self.cursor.drop_iterator()
        self._epoch_open = False

    def catch_stop_iteration(self) -> contextlib.AbstractContextManager[None]:
        """tf_keras' ``DataHandler.catch_stop_iteration``: running out of data ends the epoch (or ``fit``)."""
        return self._handler.catch_stop_iteration()

    def epochs_done(self) -> None:
        """All epochs ran (no stop): the data's ``on_epoch_end`` of the last one runs, as in tf_keras."""
        self._end_open_epoch()

    def close(self) -> None:
        """Drops the data iterator."""
        self.cursor.drop_iterator()

    def __enter__(self) -> EpochIterator:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[tuple[int, int, Execution]]:
        handler, cursor = self._handler, self.cursor
        self._end_open_epoch()
        if handler._insufficient_data:
            return
        resume = cursor.take_resume()
        if self.position is not None:
            self.position.epoch_begins(None)
        if cursor.iterator is None:  # tf_keras makes one before its first epoch
            cursor.new_iterator()
        recreates = handler._adapter.should_recreate_iterator()
        if recreates:
            cursor.new_iterator()
            if not isinstance(handler._dataset, _data_adapter.DistributedDataset):
                steps = handler._infer_steps(self._steps_per_epoch, handler._dataset)
                if steps is not None:
                    handler._inferred_steps = steps
        first = cursor.start_epoch(resume, first_step=self.initial_step)
        self.initial_step = 0
        sync = handler.should_sync
        executions = cursor.executions(
            first,
            lambda: handler._inferred_steps,  # set by catch_stop_iteration when data of unknown length runs dry
            self.plan,
            ran_dry=lambda: bool(handler._insufficient_data),  # set by catch_stop_iteration
            shortens_last=True,
        )
        for step, steps in executions:
            handler._current_step = step  # catch_stop_iteration reads it when the data runs out
            yield step, steps, Execution(cursor.iterator, steps, sync, self._variable, self._fixed)
            handler._current_step = step + steps
        self._epoch_open = True
        cursor.end_epoch(next_reads_on=not handler._adapter.should_recreate_iterator())

    def _end_open_epoch(self) -> None:
        if self._epoch_open:
            self._epoch_open = False
            self._handler._adapter.on_epoch_end()


def _may_run_dry(handler: Any) -> bool:
    """Whether the data of tf_keras' ``handler`` has a length nobody knows in advance (it may end any time).

    With one step per execution, tf_keras' execution that finds such data
    exhausted still counts an optimizer iteration; a fused one raises in its
    loop body, and tf_keras then takes the steps counted before it for the
    epoch's length. ``steps_per_execution="auto"`` runs one step per execution
    on it, so that it trains as ``steps_per_execution=1`` does.
    """
    if handler._adapter.get_size() is not None:
        return False
    dataset = handler._dataset
    return not (isinstance(dataset, tf.data.Dataset) and dataset.cardinality() == tf.data.INFINITE_CARDINALITY)


# --------------------------------------------------------------------------
# The rest of fit, evaluate and predict (custom_fit._trainer.loop)
# --------------------------------------------------------------------------


def in_legacy_graph() -> bool:
    """Whether a TF1 graph is being built (``tf.Graph().as_default()``): tf_keras' v1 engine runs ``fit`` there.

    tf_keras gives a model built in such a graph its v1 training engine
    (``training_v1.Model``) as a base class; custom_fit's loop is TF2's, so
    ``fit``, ``evaluate`` and ``predict`` hand such calls to it, as before.
    """
    return not tf.compat.v1.executing_eagerly_outside_functions()


def begin_call(model: Any, method: str, verbose: Any, x: Any = None, sample_weight: Any = None) -> Any:
    """tf_keras' checks at the start of ``fit``, ``evaluate`` and ``predict``; returns the verbosity to use.

    ``compile()`` is checked first, with a message naming the method and the fix.
    """
    _version_utils.disallow_legacy_graph("Model", method)
    if method != "predict" and not model._is_compiled:
        raise not_compiled_error(model, method)
    model._check_call_args(method)
    if method == "evaluate":
        model._check_sample_weight_warning(x, sample_weight)
    _training._disallow_inside_tf_function(method)
    if model.distribute_strategy._should_use_with_coordinator:
        raise NotImplementedError(
            f"custom_fit models do not support ParameterServerStrategy's coordinator in {method}(); received "
            f"{type(model.distribute_strategy).__name__}. Use MirroredStrategy or MultiWorkerMirroredStrategy."
        )
    return _training._get_verbosity(verbose, model.distribute_strategy)


def data_options(kwargs: dict[str, Any], method: str) -> dict[str, Any]:
    """Takes tf_keras' ``max_queue_size``, ``workers`` and ``use_multiprocessing`` out of ``kwargs``.

    Raises:
        TypeError: Any other keyword is left, as tf_keras' ``fit``, ``evaluate`` and ``predict`` raise.
    """
    options = {name: kwargs.pop(name, default) for name, default in _DATA_OPTIONS.items()}
    if kwargs:
        if method == "evaluate":
            raise TypeError(f"Invalid keyword arguments: {list(kwargs.keys())}")
        raise TypeError(f"{method}() got an unexpected keyword argument {next(iter(kwargs))!r}")
    return options


def call_scope(model: Any, method: str) -> contextlib.AbstractContextManager[Any]:
    """The scope tf_keras' ``fit``, ``evaluate`` and ``predict`` run in (``fit`` also keeps compiled ``trainable``)."""
    stack = contextlib.ExitStack()
    stack.enter_context(model.distribute_strategy.scope())
    if method == "fit":
        stack.enter_context(_training_utils.RespectCompiledTrainableState(model))
    return stack


def epoch_iterator(model: Any, **kwargs: Any) -> EpochIterator:
    """The :class:`EpochIterator` of a ``fit``, ``evaluate`` or ``predict`` call (``predicting``: ``predict``'s)."""
    predicting = kwargs.pop("predicting", False)
    kwargs.pop("steps_per_execution", None)  # the model's variable
    x = kwargs.get("x")
    if predicting and model._in_multi_worker_mode() and isinstance(x, tf.data.Dataset):
        # tf_keras' predict: shard by data, so that the outputs keep their order.
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
        kwargs["x"] = x.with_options(options)
    return EpochIterator(model, **kwargs)


def callback_list(lazy: Any, callbacks: Any, **kwargs: Any) -> Any:
    """tf_keras' ``CallbackList`` (it skips batch hooks no callback implements), with a ``History`` as tf_keras adds.

    ``lazy`` (Keras 3's list without a host wait per step) is not needed here.
    """
    kwargs["add_history"] = True  # tf_keras' evaluate and predict add one too
    return keras.callbacks.CallbackList(callbacks, **kwargs)


def fixed_steps_per_execution(model: Any, recorded: int) -> int:
    """``compile(steps_per_execution=N)``'s ``N`` (tf_keras keeps it in a variable; 1 before ``compile``)."""
    variable = model._steps_per_execution
    return int(variable.numpy()) if variable is not None else 1


def steps_per_execution(model: Any, steps: int) -> Any:
    """What ``model.steps_per_execution`` reads: tf_keras' variable (``None`` before ``compile``), as in tf_keras."""
    return model._steps_per_execution


def set_steps_per_execution(model: Any, value: int) -> None:
    """``model.steps_per_execution = value`` as tf_keras does it: creates the variable, or assigns it."""
    if model._steps_per_execution is None:
        model._configure_steps_per_execution(value)
    else:
        model._steps_per_execution.assign(value)


def reset_counter(model: Any, kind: str) -> None:
    """Sets the train, test or predict counter to 0, as tf_keras does when each call begins."""
    {"fit": model._train_counter, "evaluate": model._test_counter, "predict": model._predict_counter}[kind].assign(0)


def run_prediction(function: Callable[[Any], Any], execution: Execution) -> Any:
    """Runs the predict function (it takes the data iterator) on one execution of ``execution.steps`` steps."""
    with running(execution) as iterator:
        return function(iterator)


def batch_end_step(first: int, steps: int) -> int:
    """The step tf_keras passes to ``on_*_batch_end`` for an execution of ``steps`` steps from ``first``: its last."""
    return first + steps - 1


def capped_epochs(epochs: int) -> int:
    """``epochs`` (tf_keras has no cap on the number of epochs)."""
    return epochs


def train_validation_split(arrays: tuple[Any, ...], validation_split: float) -> tuple[tuple[Any, ...], Any]:
    """``fit(validation_split=...)``: the last fraction of the arrays, not shuffled, becomes validation data."""
    return _data_adapter.train_validation_split(arrays, validation_split=validation_split)


def has_validation_data(validation_data: Any) -> bool:
    """Whether ``fit`` validates: tf_keras tests ``validation_data``'s truth (an empty tuple: no validation)."""
    return bool(validation_data)


def build_before_loop(model: Any, epoch_iterator: Any) -> None:
    """Nothing: tf_keras builds a model at its first batch."""


def build_compiled_state(model: Any, element_spec: Any) -> None:
    """Creates the compiled loss' and metrics' variables before a resumed run restores their values.

    tf_keras creates them in the first training step (``compiled_loss`` and
    ``compiled_metrics`` build on the first batch's targets and predictions,
    which choose, e.g., which accuracy ``"accuracy"`` means); a resumed run
    restores them before that step. The predictions' structure, shapes and
    dtypes come from a trace of the model on the data's spec (nothing runs);
    the containers are then built on one-row batches of zeros.
    """
    # Only what compile() was given: a step that uses neither (a GAN's) never builds them, and a
    # built container would list metrics the interrupted run did not have.
    metrics = model.compiled_metrics
    build_loss = has_compiled_loss(model) and not model.compiled_loss._built
    build_metrics = (
        metrics is not None
        and not metrics._built
        and bool(tf.nest.flatten(metrics._user_metrics) or tf.nest.flatten(metrics._user_weighted_metrics))
    )
    if not (build_loss or build_metrics):
        return
    # A strategy's dataset (distribute_datasets_from_function) has per-replica specs: one replica's.
    element_spec = tf.nest.map_structure(
        lambda spec: spec._value_specs[0] if isinstance(spec, _distribute_values.PerReplicaSpec) else spec,
        element_spec,
    )
    x_spec, y_spec, _ = _data_adapter.unpack_x_y_sample_weight(element_spec)
    if y_spec is None:
        return  # no targets in the data: the step does not use the compiled loss and metrics

    def one_row(spec: Any) -> Any:
        return tf.zeros([1, *[1 if d is None else d for d in spec.shape[1:]]], spec.dtype)

    traced = tf.function(lambda x: model(x, training=False)).get_concrete_function(x_spec)
    y_pred = tf.nest.map_structure(one_row, traced.structured_outputs)
    y_true = tf.nest.map_structure(one_row, y_spec)
    if build_loss:
        model.compiled_loss.build(y_pred)
    if build_metrics:
        metrics.build(y_pred, y_true)


def first_epoch(model: Any, initial_epoch: int, epoch_iterator: EpochIterator) -> int:
    """Where ``fit`` starts when nothing of custom_fit resumes it: ``initial_epoch``, or tf_keras' own backup.

    tf_keras' ``BackupAndRestore`` answers through the model's multi-worker
    training state (``_maybe_load_initial_counters_from_ckpt``): an epoch and
    a step, where tf_keras' loop counts on from (reading its data afresh).
    """
    epoch, step = model._maybe_load_initial_counters_from_ckpt(epoch_iterator.steps_per_epoch, initial_epoch)
    epoch_iterator.initial_step = step
    return int(epoch)


def epoch_logs(model: Any, logs: Any, *, returned: bool) -> Any:
    """The metrics' results over the last execution's ``logs``, as tf_keras' ``fit`` and ``evaluate`` make them.

    Raises:
        ValueError: ``fit`` ran no step at all (tf_keras' message).
    """
    logs = _tf_utils.sync_to_numpy_or_python_type(logs)
    if logs is None:
        raise ValueError(
            "Unexpected result of `train_function` (Empty logs). This could be due to issues in input pipeline "
            "that resulted in an empty dataset. Otherwise, please use `Model.compile(..., run_eagerly=True)`, "
            "or `tf.config.run_functions_eagerly(True)` for more information of where went wrong."
        )
    return model._validate_and_get_metrics_result(logs)


def evaluation_logs(logs: dict[str, Any]) -> dict[str, Any]:
    """What ``evaluate`` returns for the metrics' results (already NumPy values on Keras 2)."""
    return logs


def flat_logs(model: Any, logs: Any) -> Any:
    """``evaluate``'s logs as it returns them without ``return_dict`` (tf_keras' ``flatten_metrics_in_order``)."""
    return _training.flatten_metrics_in_order(logs, model.metrics_names)


def concat_predictions(outputs: list[Any]) -> Any:
    """The executions' outputs of ``predict`` joined along the batch axis (ragged too), as NumPy, as in tf_keras."""
    first = outputs[0]
    joined = tf.nest.map_structure(lambda *batches: list(batches), *outputs)
    concatenated = tf.__internal__.nest.map_structure_up_to(first, _training.potentially_ragged_concat, joined)
    return _tf_utils.sync_to_numpy_or_python_type(concatenated)
