"""Keras 3 private names used only by code paths that exist only on Keras 3.

Some features of custom_fit have no Keras 2 counterpart, because Keras 2 does
them itself or has nothing to do: the Keras-2 meaning of ``compiled_loss`` /
``compiled_metrics`` (:mod:`custom_fit._compiled`) and saving random seed
generator states (:mod:`custom_fit._extra_state`). Others reach Keras 3's
``fit`` loop through its epoch iterator (:mod:`custom_fit._loop`):
steering it (tuned step fusion, exact resume) and turning tf.data
autotuning off for its array pipeline, which on Keras 2 happens in
:mod:`custom_fit._compat.keras2`. Importing this module loads Keras 3, so
only Keras-3-only code paths import it.

Nothing in this module is public API.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import keras
from keras.src.trainers.data_adapters.array_data_adapter import ArrayDataAdapter as _ArrayDataAdapter
from keras.src.trainers.data_adapters.generator_data_adapter import GeneratorDataAdapter as _GeneratorDataAdapter
from keras.src.trainers.data_adapters.py_dataset_adapter import PyDatasetAdapter as _PyDatasetAdapter

from custom_fit._compat import common

__all__ = [
    "VERSION",
    "Execution",
    "aggregate_additional_loss",
    "build_compiled_state",
    "compiled_loss_trackers",
    "compiled_loss_value",
    "data_epoch",
    "seed_generator_states",
    "set_steps_per_execution",
    "steer_epoch_iterator",
    "sum_losses",
    "without_autotuning",
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


class Execution:
    """A data iterator and the number of steps the next execution runs on it.

    :func:`steer_epoch_iterator` hands ``fit`` one per execution, where Keras'
    epoch iterator hands the data iterator itself; Keras passes it to the
    train function, which runs ``steps`` steps on ``iterator`` (and reports
    them to the tuner that planned them). Anything else that reads it (Keras'
    symbolic build takes one batch with ``next``) reads ``iterator``.
    """

    def __init__(self, iterator: Any, steps: int):
        self.iterator = iterator
        self.steps = steps

    def __iter__(self) -> Execution:
        return self

    def __next__(self) -> Any:
        return next(self.iterator)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.iterator, name)  # get_next, get_next_as_optional, element_spec, ...


def steer_epoch_iterator(epoch_iterator: Any, plan: Callable[[int | None], int], position: Any) -> None:
    """Makes ``fit``'s epoch iterator fuse ``plan(remaining)`` steps per execution and start where asked.

    Keras' epoch iterator (``EpochIterator._enumerate_iterator``) steps
    through each epoch in strides of ``steps_per_execution`` fixed when
    ``fit`` starts, and passes the first and last step of each execution to
    the callbacks. This generator is the same loop with two additions:

    * the stride is ``plan(remaining steps)`` (``None``: unknown length),
      asked before each execution (``steps_per_execution="auto"``), and the
      number travels with the data iterator to the train function as an
      :class:`Execution`;
    * ``position`` (a :class:`custom_fit._loop.EpochPosition`)
      learns which data iterator each batch comes from, and may start the
      first epoch where an interrupted run stopped: it makes and drops the
      iterators the run had made before (a seeded ``tf.data`` shuffle draws a
      new order for each) and skips the batches already trained.

    From Keras 3.16 the data adapter also counts the epochs it ended and
    seeds its shuffle with the count (:func:`data_epoch`); a resumed run sets
    its new adapter's count to the interrupted run's.

    The rest (data adapter hooks, one iterator per epoch or one kept across
    epochs with ``steps_per_epoch``, the warning when data runs out) is Keras'
    own, as of 3.8-3.15 (the items grew from ``(step, iterator)`` to
    ``(first, last, iterator)`` in 3.11), but for one iterator no epoch reads.
    At the end of each epoch Keras makes the next epoch's iterator; without
    ``steps_per_epoch`` the next epoch makes its own and drops that one
    unread. For arrays (``ArrayDataAdapter``), whose pipeline ``fit`` builds
    for itself, it is not made: making it would only cost time (see
    docs/performance.md) and the batches it prefetches, since every
    iterator of that pipeline draws its shuffle afresh from the same seed.
    A ``tf.data.Dataset`` the user passed gets it as in Keras: each iterator
    of a seeded, reshuffling dataset draws the next order, so the epochs of a
    later ``fit`` depend on it.
    """
    # The generator reaches the epoch iterator through a weak reference: one
    # it held would make a cycle (iterator -> generator -> iterator) that keeps
    # the data, its pipeline and a prefetching tf.data iterator alive after
    # fit until the garbage collector runs, where Keras frees them on return.
    epoch_iterator_ref: Callable[[], Any] = weakref.ref(epoch_iterator)
    adapter = epoch_iterator.data_adapter
    # Iterators of a PyDataset or a generator read a Python object (its
    # shuffle draws from Python's random module in a tf.data thread), so
    # making and dropping them would only race with the restored state.
    replays_iterators = not isinstance(adapter, (_PyDatasetAdapter, _GeneratorDataAdapter))
    position.element_spec = epoch_iterator._get_iterator().element_spec
    position.adapter = adapter
    position.records_hooks = isinstance(adapter, _PyDatasetAdapter) and _has_own_epoch_hooks(adapter.py_dataset)
    drops_unread_iterators = isinstance(adapter, _ArrayDataAdapter)

    def item(first: int, steps: int, iterator: Any) -> tuple[Any, ...]:
        execution = Execution(iterator, steps)
        return (first, first + steps - 1, execution) if VERSION >= (3, 11) else (first, execution)

    def new_iterator(it: Any) -> Any:
        position.iterator_made()
        return iter(it._get_iterator())

    def enumerate_iterator() -> Any:
        it = epoch_iterator_ref()
        resume = position.take_resume()
        if resume is not None:
            while replays_iterators and position.iterators_made < resume.iterator:
                new_iterator(it)
            if resume.data_epoch is not None and data_epoch(adapter) is not None:
                adapter._epoch = resume.data_epoch  # the count the interrupted run's adapter had reached
        position.epoch_begins(data_epoch(adapter))
        adapter.on_epoch_begin()
        steps_per_epoch = it.steps_per_epoch or it._num_batches or -1
        if steps_per_epoch > 0:
            step = 0
            if resume is not None:
                it._current_iterator = new_iterator(it)
                for _ in range(resume.skip):  # batches the interrupted run had read
                    next(it._current_iterator)
                it._steps_seen, step = resume.skip, resume.step
            elif it._current_iterator is None or it.steps_per_epoch is None:
                it._current_iterator = new_iterator(it)
                it._steps_seen = 0
            position.reading(batches_before_step_0=it._steps_seen - step)
            while step < steps_per_epoch:
                if it._num_batches and it._steps_seen >= it._num_batches:
                    if it.steps_per_epoch:
                        it._interrupted_warning()
                    break
                steps = plan(steps_per_epoch - step)
                it._steps_seen += steps
                yield item(step, steps, it._current_iterator)
                step += steps
            kept = it.steps_per_epoch is not None  # the next epoch reads on from this iterator
            if it._num_batches and it._steps_seen >= it._num_batches:
                it._current_iterator = None if drops_unread_iterators and not kept else new_iterator(it)
                it._steps_seen = 0
            position.epoch_ends(next_skip=it._steps_seen if kept else None)
        else:  # unknown length
            iterator = new_iterator(it)
            step = 0
            if resume is not None:
                for _ in range(resume.skip):
                    next(iterator)
                step = resume.step
            position.reading(batches_before_step_0=0)
            while True:
                steps = plan(None)
                it._steps_seen = step + steps
                yield item(step, steps, iterator)
                step += steps
        adapter.on_epoch_end()

    object.__setattr__(epoch_iterator, "_enumerate_iterator", enumerate_iterator)


def set_steps_per_execution(epoch_iterator: Any, steps: int) -> None:
    """Makes an evaluation's epoch iterator count ``steps`` steps per execution from its next epoch on.

    ``EpochIterator`` reads its ``steps_per_execution`` attribute each time
    an epoch starts, to step through it and number the batches passed to
    the callbacks; the test function runs the same number of steps.
    """
    epoch_iterator.steps_per_execution = steps


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


def without_autotuning(epoch_iterator: Any) -> None:
    """Turns tf.data autotuning off for the pipeline ``fit``/``evaluate`` build from arrays.

    Why, and why batches are unchanged: :func:`custom_fit._compat.common.dataset_without_autotuning`.
    Only Keras' ``ArrayDataAdapter`` pipeline: a ``tf.data.Dataset`` the user
    passed keeps its options, generators and ``PyDataset`` are not tf.data
    pipelines of Keras' making, and one a ``tf.distribute`` strategy has
    already split can no longer take options.
    """
    if isinstance(epoch_iterator.data_adapter, _ArrayDataAdapter):
        epoch_iterator._distributed_dataset = common.dataset_without_autotuning(epoch_iterator._distributed_dataset)


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
