"""Keras 3 private names used only by code paths that exist only on Keras 3.

Some features of custom_fit have no Keras 2 counterpart, because Keras 2 does
them itself or has nothing to do: the Keras-2 meaning of ``compiled_loss`` /
``compiled_metrics`` (:mod:`custom_fit._compiled`) and saving random seed
generator states (:mod:`custom_fit._extra_state`). Others are the parts of
Keras 3's ``fit`` loop that the loop custom_fit owns (:mod:`custom_fit._trainer.loop`)
builds on: the epoch iterator (tuned step fusion, exact resume, array
pipelines without tf.data autotuning), the validation split, joining
``predict``'s batches (:class:`custom_fit._compat.contract.LoopParts`; Keras 2's
are :mod:`custom_fit._compat.keras2_loop`). Importing this module loads
Keras 3, so only Keras-3-only code paths import it.

Nothing in this module is public API.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import keras
import tensorflow as tf
from keras.src.backend import config as _config
from keras.src.backend.tensorflow.trainer import TFEpochIterator as _TFEpochIterator
from keras.src.backend.tensorflow.trainer import convert_to_np_if_not_ragged as _convert_to_np_if_not_ragged
from keras.src.backend.tensorflow.trainer import potentially_ragged_concat as _potentially_ragged_concat
from keras.src.callbacks.tensorboard import keras_model_summary as _keras_model_summary
from keras.src.models.functional import Functional as _Functional
from keras.src.trainers.data_adapters import array_slicing as _array_slicing
from keras.src.trainers.data_adapters.array_data_adapter import ArrayDataAdapter as _ArrayDataAdapter
from keras.src.trainers.data_adapters.generator_data_adapter import GeneratorDataAdapter as _GeneratorDataAdapter
from keras.src.trainers.data_adapters.py_dataset_adapter import PyDatasetAdapter as _PyDatasetAdapter
from keras.src.utils import python_utils as _python_utils

from custom_fit._compat import common
from custom_fit._compat.common import FIT_VALIDATION_KWARGS, pop_fit_validation, validates_after  # both Kerases'
from custom_fit._trainer.data_position import DataCursor

__all__ = [
    "FIT_VALIDATION_KWARGS",
    "VERSION",
    "EpochIterator",
    "Execution",
    "aggregate_additional_loss",
    "batch_end_step",
    "begin_call",
    "build_before_loop",
    "build_compiled_state",
    "call_scope",
    "callback_list",
    "capped_epochs",
    "compiled_loss_trackers",
    "compiled_loss_value",
    "concat_predictions",
    "data_epoch",
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
    "seed_generator_states",
    "set_steps_per_execution",
    "steps_per_execution",
    "sum_losses",
    "train_validation_split",
    "validates_after",
]


def compiled_loss_value(model: keras.Model, y: Any, y_pred: Any, sample_weight: Any) -> Any:
    """The loss given to ``compile()`` alone (no ``add_loss`` or regularizers).

    Returns ``None`` when no loss was compiled. Updates the per-output loss
    trackers of multi-output models, as ``Trainer.compute_loss`` does.
    """
    if model._compile_loss is None:
        return None
    return model._compile_loss(y, y_pred, sample_weight)


def compiled_loss_trackers(model: keras.Model) -> list[Any]:
    """Per-output loss trackers of a multi-output compiled loss (may be empty)."""
    return list(model._compile_loss.metrics) if model._compile_loss is not None else []


def aggregate_additional_loss(model: keras.Model, loss: Any) -> Any:
    """Reduces one ``add_loss``/regularization tensor the way Keras' trainer does.

    (Cast to float, sum, then scale for distribution:
    ``TensorFlowTrainer._aggregate_additional_loss``.)
    """
    return model._aggregate_additional_loss(loss)


def sum_losses(losses: list[Any]) -> Any:
    """The total of several scalar losses, reduced as ``Trainer.compute_loss`` does (bit-identical)."""
    return losses[0] if len(losses) == 1 else keras.ops.sum(losses)


def seed_generator_states(model: keras.Model) -> list[Any]:
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


#: The Keras 3 release's (major, minor).
VERSION: tuple[int, ...] = tuple(int(part) for part in keras.version().split(".")[:2])


class Execution(NamedTuple):
    """What the train or test function runs next: ``steps`` steps on ``iterator``.

    :class:`EpochIterator` yields one per execution; the step function
    (:func:`custom_fit._compat.keras3.make_step_function`) runs ``steps``
    steps on ``iterator`` (and reports them to the tuner that planned them).
    """

    iterator: Any
    steps: int


class EpochIterator(_TFEpochIterator):
    """Keras' epoch iterator, with the number of steps per execution and the start chosen per call.

    Keras' ``EpochIterator._enumerate_iterator`` steps through each epoch in
    strides of ``steps_per_execution`` fixed when ``fit`` starts, and always
    starts an epoch at its first batch. :meth:`_enumerate_iterator` here is
    the same loop with two collaborators:

    * ``plan(remaining steps)`` (``None``: unknown length) is asked before each
      execution for its number of steps (``steps_per_execution="auto"``: the
      tuner's plan; otherwise a constant); each item is
      ``(first step, steps, Execution(iterator, steps))``;
    * ``position`` (a :class:`custom_fit._trainer.data_position.EpochPosition`) learns which
      data iterator each batch comes from, and may start the first epoch
      where an interrupted run stopped: the iterators the run had made
      before are made and dropped (a seeded ``tf.data`` shuffle draws a new
      order for each) and the batches already trained skipped.

    Both go through :attr:`cursor` (a
    :class:`~custom_fit._trainer.data_position.DataCursor`, which tf_keras'
    epoch iterator reads through too): it holds the current data iterator
    and the batches read from it (Keras' ``_current_iterator`` and
    ``_steps_seen``, which Keras' ``__init__``, ``reset`` and
    ``catch_stop_iteration`` set, are properties over it), replays and skips,
    and yields the epoch's executions. What is Keras 3's is here: where its
    iterators are made, when known-length data ran out, and its data hooks.

    From Keras 3.16 the data adapter also counts the epochs it ended and
    seeds its shuffle with the count (:func:`data_epoch`); a resumed run sets
    its new adapter's count to the interrupted run's.

    The rest (data adapter hooks, one iterator per epoch or one kept across
    epochs with ``steps_per_epoch``, the warning when data runs out, running
    out of data in ``catch_stop_iteration``) is Keras' own, but for one
    iterator no epoch reads. At the end of each epoch Keras makes the next
    epoch's iterator; without ``steps_per_epoch`` the next epoch makes its own
    and drops that one unread. For arrays (``ArrayDataAdapter``), whose
    pipeline ``fit`` builds for itself, it is not made: making it would only
    cost time (see docs/performance.md) and the batches it prefetches, since
    every iterator of that pipeline draws its shuffle afresh from the same
    seed. A ``tf.data.Dataset`` the user passed gets it as in Keras: each
    iterator of a seeded, reshuffling dataset draws the next order, so the
    epochs of a later ``fit`` depend on it.

    Array pipelines run with tf.data autotuning off (same batches; why:
    :func:`custom_fit._compat.common.dataset_without_autotuning`). A
    ``tf.data.Dataset`` the user passed keeps its options, generators and
    ``PyDataset`` are not tf.data pipelines of Keras' making, and one a
    ``tf.distribute`` strategy has already split can no longer take options.

    Args:
        plan: The number of steps of the next execution, given the steps left
            in the epoch (``None``: unknown).
        position: Where ``fit`` reads its data; ``None`` for ``evaluate`` and
            ``predict``.
        **kwargs: Keras' ``TFEpochIterator`` arguments (``x``, ``y``,
            ``batch_size``, ``steps_per_epoch``, ``distribute_strategy``, ...).
    """

    _epoch_iterator: Any  # Keras' attribute: the running _enumerate_iterator

    def __init__(self, *, plan: Callable[[int | None], int], position: Any = None, **kwargs: Any):
        super().__init__(**kwargs)
        adapter = self.data_adapter
        if isinstance(adapter, _ArrayDataAdapter):
            self._distributed_dataset: Any = common.dataset_without_autotuning(self._distributed_dataset)
        self.plan = plan
        self.position = position
        self.cursor = DataCursor(
            functools.partial(iter, self._get_iterator()),  # not a closure over self: no cycle keeps the data
            position,
            # Iterators of a PyDataset or a generator read a Python object (its
            # shuffle draws from Python's random module in a tf.data thread), so
            # making and dropping them would only race with the restored state.
            replays_iterators=not isinstance(adapter, (_PyDatasetAdapter, _GeneratorDataAdapter)),
            # Data whose length is not known in advance may end before the epoch's steps do (also
            # where `steps_per_epoch` or an epoch that ran dry gave Keras a number): with one step
            # per execution, the execution that finds the data exhausted still counts an optimizer
            # iteration and draws seeds (the step's state updates do not wait for the batch); a
            # fused execution stops before its loop body.
            may_run_dry=adapter.num_batches is None and not _infinite(self._distributed_dataset),
        )
        self._drops_unread_iterators = isinstance(adapter, _ArrayDataAdapter)
        if position is not None:
            position.element_spec = self._get_iterator().element_spec
            position.adapter = adapter
            position.read_data_epoch = lambda: data_epoch(adapter)
            position.records_hooks = isinstance(adapter, _PyDatasetAdapter) and _has_own_epoch_hooks(adapter.py_dataset)

    @property
    def exhausted(self) -> bool:
        """``False``: Keras 3 goes on with the epochs after the data ran out (they run no step)."""
        return False

    def epochs_done(self) -> None:
        """Nothing: each epoch of the data ends in :meth:`_enumerate_iterator`."""

    def close(self) -> None:
        """Stops reading the data: closes the epoch's loop and drops the data iterators it holds.

        Dropping the last reference to a ``tf.data`` iterator stops its
        prefetch thread before this returns. That matters when ``fit`` stops
        with an exception (an interrupted run resumed in the same process): a
        ``PyDataset`` or generator that draws from NumPy's or Python's global
        random state in its ``__getitem__`` would otherwise go on drawing in
        that thread, at a moment that depends on the machine's load, while the
        resumed run restores the state a backup saved.
        """
        if self._epoch_iterator is not None:
            self._epoch_iterator.close()
        self._epoch_iterator = None
        self.cursor.drop_iterator()

    def __enter__(self) -> EpochIterator:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # Keras' own attributes for the current data iterator and the batches read from it, which its
    # __init__, reset and catch_stop_iteration set or read, are the cursor's.

    @property
    def _current_iterator(self) -> Any:
        cursor = self.__dict__.get("cursor")
        return cursor.iterator if cursor is not None else None

    @_current_iterator.setter
    def _current_iterator(self, value: Any) -> None:
        if value is not None:
            raise AssertionError("custom_fit's epoch iterator makes its data iterators through its cursor")
        cursor = self.__dict__.get("cursor")
        if cursor is not None:
            cursor.drop_iterator()

    @property
    def _steps_seen(self) -> int:
        cursor = self.__dict__.get("cursor")
        return cursor.read if cursor is not None else 0

    @_steps_seen.setter
    def _steps_seen(self, value: int) -> None:  # Keras sets 0 with the iterator it drops
        pass

    def _enumerate_iterator(self) -> Iterator[tuple[int, int, Execution]]:
        cursor, adapter = self.cursor, self.data_adapter
        resume = cursor.take_resume()
        if resume is not None:
            cursor.replay_before(resume)
            if resume.data_epoch is not None and data_epoch(adapter) is not None:
                adapter._epoch = resume.data_epoch  # the count the interrupted run's adapter had reached
        if self.position is not None:
            self.position.epoch_begins(data_epoch(adapter))
        adapter.on_epoch_begin()
        steps_per_epoch = self.steps_per_epoch or self._num_batches or -1
        known = steps_per_epoch > 0
        if resume is None and (not known or cursor.iterator is None or self.steps_per_epoch is None):
            cursor.new_iterator()  # unless the epoch reads on from the last one (steps_per_epoch)

        def ran_dry() -> bool:  # known-length data read to its end before the epoch's steps
            dry = bool(self._num_batches) and cursor.read >= self._num_batches
            if dry and self.steps_per_epoch:
                self._interrupted_warning()
            return dry

        first = cursor.start_epoch(resume)
        epoch_steps = steps_per_epoch if known else None
        executions = cursor.executions(first, lambda: epoch_steps, self.plan, ran_dry=ran_dry, shortens_last=False)
        for step, steps in executions:
            yield step, steps, Execution(cursor.iterator, steps)
        kept = self.steps_per_epoch is not None  # the next epoch reads on from this iterator
        if self._num_batches and cursor.read >= self._num_batches:
            if self._drops_unread_iterators and not kept:
                cursor.drop_iterator()
            else:
                cursor.new_iterator()
        cursor.end_epoch(next_reads_on=kept)
        adapter.on_epoch_end()


def data_epoch(adapter: Any) -> int | None:
    """How many epochs Keras' data adapter has ended, where its shuffle depends on it; else ``None``.

    From Keras 3.16 a ``PyDataset``'s batch order is ``random.Random(count)``
    (``PyDatasetAdapter._epoch``), no longer Python's global random state, and
    the array pipeline seeds its shuffle with the count too. A new ``fit`` (a
    resumed run) starts counting at 0, so :class:`custom_fit.BackupAndRestore`
    saves the count and the resumed run continues it. Keras < 3.16: ``None``.
    """
    count = getattr(adapter, "_epoch", None)
    return count if isinstance(count, int) else None


def _infinite(dataset: Any) -> bool:
    """Whether a (distributed) ``tf.data`` dataset never ends (``.repeat()``): its cardinality says so."""
    cardinality = getattr(dataset, "cardinality", None)  # a method; a number on a DistributedDataset
    if cardinality is None:
        return False
    return int(cardinality() if callable(cardinality) else cardinality) == tf.data.INFINITE_CARDINALITY


def _has_own_epoch_hooks(py_dataset: Any) -> bool:
    """Whether a ``PyDataset`` overrides ``on_epoch_begin`` or ``on_epoch_end``."""
    base = keras.utils.PyDataset
    return any(
        getattr(type(py_dataset), hook) is not getattr(base, hook) for hook in ("on_epoch_begin", "on_epoch_end")
    )


def build_compiled_state(model: keras.Model, element_spec: Any) -> None:
    """Creates the variables of the compiled metrics and loss from the data's spec (no batch is read).

    Keras creates them in the first training step (from a first batch under a
    strategy); a resumed run restores their values before that step.
    """
    unbuilt = [part for part in (model._compile_metrics, model._compile_loss) if part is not None and not part.built]
    if unbuilt:
        model._symbolic_build(data_batch=element_spec)


# --------------------------------------------------------------------------
# The rest of fit, evaluate and predict (custom_fit._trainer.loop)
# --------------------------------------------------------------------------


def batch_end_step(first: int, steps: int) -> int:
    """The step Keras passes to ``on_*_batch_end`` for an execution of ``steps`` steps from ``first``.

    The execution's last step from Keras 3.11; its first one before (3.8-3.10 passed one number to both hooks).
    """
    return first + steps - 1 if VERSION >= (3, 11) else first


def capped_epochs(epochs: int) -> int:
    """``epochs``, or fewer where ``keras.config.set_max_epochs`` caps them (Keras >= 3.10), with Keras' warning."""
    max_epochs = _config.max_epochs() if hasattr(_config, "max_epochs") else None
    if max_epochs and max_epochs < epochs:
        warnings.warn(f"Limiting epochs to {max_epochs}", stacklevel=3)
        return int(max_epochs)
    return epochs


# -- the trainer's private methods the loop calls (custom_fit._trainer.loop reads no Keras private name) --


def in_legacy_graph() -> bool:
    """``False``: Keras 3 has no TF1 graph engine."""
    return False


def begin_call(model: keras.Model, method: str, verbose: Any, x: Any = None, sample_weight: Any = None) -> Any:
    """Raises where ``fit``/``evaluate`` run before ``compile()`` (``Trainer._assert_compile_called``); ``verbose``."""
    if method != "predict":
        model._assert_compile_called(method)
    return verbose


def data_options(kwargs: dict[str, Any], method: str) -> dict[str, Any]:
    """Keras 3 has no data-loading keywords (tf_keras' ``workers`` & co.): any keyword left is an error, as in Keras.

    Raises:
        TypeError: ``fit`` or ``predict`` received an unknown keyword.
        ValueError: ``evaluate`` did (Keras' message).
    """
    if kwargs:
        if method == "evaluate":
            raise ValueError(f"Arguments not recognized: {kwargs}")
        raise TypeError(f"{method}() got an unexpected keyword argument {next(iter(kwargs))!r}")
    return {}


def call_scope(model: keras.Model, method: str) -> Any:
    """Nothing to enter: Keras 3 enters the strategy's scope where it builds."""
    return contextlib.nullcontext()


def epoch_iterator(model: keras.Model, **kwargs: Any) -> EpochIterator:
    """The :class:`EpochIterator` of a ``fit``, ``evaluate`` or ``predict`` call on ``model``'s strategy."""
    kwargs.pop("predicting", None)
    kwargs.pop("initial_epoch", None)  # Keras 3 builds the same pipeline for every epoch
    kwargs.pop("epochs", None)
    return EpochIterator(distribute_strategy=model.distribute_strategy, **kwargs)


def callback_list(lazy: Any, callbacks: Any, **kwargs: Any) -> Any:
    """``lazy`` (custom_fit's list without a host wait per step) where given, else Keras' ``CallbackList``.

    A ``TensorBoard`` callback in it gets the model summary it writes for the
    classes custom_fit's stand in for (see :func:`write_tensorboard_model_summaries`).
    """
    made = (lazy or keras.callbacks.CallbackList)(callbacks, **kwargs)
    write_tensorboard_model_summaries(made.callbacks, kwargs.get("model"))
    return made


#: custom_fit's classes and the Keras classes they stand in for where Keras decides by class name.
STAND_INS = {"CustomModel": "Functional", "CustomSequential": "Sequential"}


def write_tensorboard_model_summaries(callbacks: list[Any], model: Any) -> None:
    """Writes the model summary (TensorBoard's conceptual graph) that ``TensorBoard(write_graph=True)`` writes
    for ``keras.Model(inputs, outputs)`` and ``keras.Sequential``, for their stand-ins.

    Keras' callback writes it in ``set_model`` only for a model whose class is
    *named* ``Functional`` or ``Sequential`` (tf_keras: any graph network), so
    ``CustomModel(inputs, outputs)`` and ``CustomSequential`` would get none
    where the models they replace get one. A subclass of the user's gets none,
    as a subclass of ``keras.Model`` gets none.
    """
    cls = type(model)
    if (
        not cls.__module__.startswith("custom_fit.")
        or cls.__name__ not in STAND_INS
        or not isinstance(model, (_Functional, keras.Sequential))
    ):
        return
    for callback in callbacks:
        if isinstance(callback, keras.callbacks.TensorBoard) and callback.write_graph:
            with callback._train_writer.as_default():  # what the callback's _write_keras_model_summary does
                _keras_model_summary("keras", model, step=0)


def fixed_steps_per_execution(model: keras.Model, recorded: int) -> int:
    """``compile(steps_per_execution=N)``'s ``N``: ``recorded`` (Keras sets ``model.steps_per_execution``)."""
    return recorded


def steps_per_execution(model: keras.Model, steps: int) -> int:
    """What ``model.steps_per_execution`` reads: ``steps`` (the fixed number, or the tuner's in ``fit``)."""
    return steps


def set_steps_per_execution(model: keras.Model, value: int) -> None:
    """Nothing more than the loop records: Keras 3 keeps the number in the attribute."""


def reset_counter(model: keras.Model, kind: str) -> None:
    """Nothing: Keras 3 keeps no step counters."""


def run_prediction(function: Callable[[Any], Any], execution: Execution) -> Any:
    """Runs the predict function on the batches of one execution: up to ``execution.steps``, fewer where the data ends.

    Raises ``StopIteration`` (which the epoch iterator catches) when no batch is left.
    """
    batches: list[Any] = []
    for _ in range(execution.steps):
        try:
            batches.append(next(execution.iterator))
        except (StopIteration, tf.errors.OutOfRangeError):
            if batches:
                break
            raise
    return function(batches)


def has_validation_data(validation_data: Any) -> bool:
    """Whether ``fit`` validates: ``validation_data`` is given."""
    return validation_data is not None


def build_before_loop(model: keras.Model, epoch_iterator: Any) -> None:
    """Builds what a first batch builds before ``fit``/``evaluate`` run (``Trainer._maybe_symbolic_build``)."""
    model._maybe_symbolic_build(iterator=epoch_iterator)


def first_epoch(model: keras.Model, initial_epoch: int, epoch_iterator: Any) -> int:
    """Where ``fit`` starts: the epoch a ``BackupAndRestore`` set (``model._initial_epoch``), else ``initial_epoch``."""
    return model._initial_epoch or initial_epoch


def epoch_logs(model: keras.Model, logs: Any, *, returned: bool) -> Any:
    """The metrics' results merged over the last step's ``logs`` (``Trainer._get_metrics_result_or_logs``).

    ``logs`` is ``None`` before ``fit``'s first step (Keras starts from ``{}``).
    """
    return model._get_metrics_result_or_logs({} if logs is None else logs, returned=returned)


def flat_logs(model: keras.Model, logs: Any) -> Any:
    """``evaluate``'s logs as it returns them without ``return_dict`` (``Trainer._flatten_metrics_in_order``)."""
    return model._flatten_metrics_in_order(logs)


def train_validation_split(arrays: tuple[Any, ...], validation_split: float) -> tuple[tuple[Any, ...], Any]:
    """``fit(validation_split=...)``: the last fraction of the arrays, not shuffled, becomes validation data."""
    return _array_slicing.train_validation_split(arrays, validation_split=validation_split)


def evaluation_logs(logs: dict[str, Any]) -> dict[str, Any]:
    """What ``evaluate`` returns for the metrics' results: Keras >= 3.14 converts them to Python numbers."""
    return _python_utils.pythonify_logs(logs) if VERSION >= (3, 14) else logs


def concat_predictions(outputs: list[Any]) -> Any:
    """The executions' outputs of ``predict`` joined along the batch axis (ragged ones too), as NumPy, as in Keras."""
    joined = keras.tree.map_structure(lambda *batches: list(batches), *outputs)
    joined = keras.tree.map_structure_up_to(outputs[0], _potentially_ragged_concat, joined)
    return keras.tree.map_structure(_convert_to_np_if_not_ragged, joined)
