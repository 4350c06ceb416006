"""The contract between custom_fit and the Keras in use: what ``keras3`` and ``keras2`` each implement.

:class:`KerasVersion` declares every name the two version modules
(:mod:`custom_fit._compat.keras3` and :mod:`custom_fit._compat.keras2`) must
define, with its signature. Type checkers check both modules against it (a
module can implement a ``Protocol``; see the ``TYPE_CHECKING`` block below),
and :mod:`custom_fit._compat` hands the rest of the package the one in use
typed as the contract, so callers see these signatures, not one Keras' own.
``tests/compat/test_contract.py`` compares the signatures at run time too (names,
kinds and defaults of the parameters), on whichever Keras a row installs.

Keras and tf_keras ship no type information, so a Keras object is
:data:`KerasObject` (``Any``) here: the contract fixes the shape of each call,
not the Keras classes.

Nothing in this module is public API.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from custom_fit._compat.common import CountingCall, UntrackedVariable

__all__ = ["KerasObject", "KerasVersion", "LoopParts"]

#: A Keras model, layer, optimizer or tensor (Keras ships no types).
KerasObject: TypeAlias = Any


class KerasVersion(Protocol):
    """What each Keras version module defines (constants, classes and functions), by name and signature."""

    # -- constants ------------------------------------------------------------------

    #: The Keras in use as text: ``"keras 3.15.1"`` or ``"tf_keras 2.21.0"``.
    KERAS_VERSION: str
    #: Whether the step adds the loss to the ``loss`` tracker (Keras 3) or the compiled loss does (Keras 2).
    STEP_UPDATES_LOSS_TRACKER: bool
    #: Whether ``model.save`` writes a subclassed model whose constructor arguments Keras cannot
    #: serialize (tf_keras: with a config ``load_model`` cannot use) rather than raising (Keras 3).
    SAVES_UNCONFIGURABLE_MODELS: bool
    #: The classes ``compile`` and ``minimize`` take as optimizers.
    OPTIMIZER_CLASSES: tuple[type, ...]
    #: Base ``Optimizer.__init__`` arguments of an optimizer group.
    OPTIMIZER_GROUP_KWARGS: dict[str, Any]
    #: ``compile()`` arguments for an optimizer group.
    GROUP_COMPILE_KWARGS: dict[str, Any]
    #: The weights file of a ``custom_fit.BackupAndRestore`` backup.
    BACKUP_WEIGHTS_FILE: str
    #: Whether ``custom_fit.BackupAndRestore`` can resume only a custom_fit model (Keras 2: tf_keras'
    #: ``fit`` asks the model where to start; Keras 3 reads the callback's initial epoch).
    RESUMES_ONLY_CUSTOM_FIT_MODELS: bool
    #: Whether Keras gives models its own ``compiled_loss`` / ``compiled_metrics`` (Keras 2).
    HAS_COMPILED_LOSS_ATTRIBUTES: bool

    # -- classes and the module (read-only: a module's classes are not assignable) --

    @property
    def keras(self) -> ModuleType:
        """The Keras module: ``keras`` or ``tf_keras``."""

    @property
    def Functional(self) -> type:  # noqa: N802
        """The class Keras uses for models built from ``(inputs, outputs)``."""

    @property
    def LossScaleOptimizer(self) -> type:  # noqa: N802
        """The ``LossScaleOptimizer`` class(es) to test against."""

    @property
    def TrainerHooks(self) -> type:  # noqa: N802
        """Overrides of Keras' private trainer methods; ``CustomModel`` derives from it."""

    def SeedGenerator(self, seed: int | None = None, name: str | None = None) -> KerasObject:  # noqa: N802
        """A seed state that advances with every draw (saved with the model's weights)."""

    # -- trainer state ---------------------------------------------------------------

    def is_compiled(self, model: KerasObject) -> bool:
        """Whether ``compile()`` was called."""

    def call_accepts_training(self, model: KerasObject) -> bool:
        """Whether Keras passes ``training`` to ``model.call``."""

    def compute_loss_accepts_training(self, model: KerasObject) -> bool:
        """Whether ``model.compute_loss`` takes ``training``."""

    def has_compiled_loss(self, model: KerasObject) -> bool:
        """Whether ``compile()`` was given a ``loss``."""

    def loss_tracker(self, model: KerasObject) -> KerasObject:
        """The ``Mean`` metric named ``"loss"`` (``None`` where Keras 2 has none)."""

    def compiled_metrics_container(self, model: KerasObject) -> KerasObject:
        """The object holding the compiled metrics (Keras 3), else ``None``."""

    def finish_metrics_result(self, results: dict[str, Any]) -> dict[str, Any]:
        """What Keras' ``get_metrics_result`` returns for ``results``."""

    def check_compile_arguments(self, model: KerasObject, optimizer: Any, kwargs: dict[str, Any]) -> None:
        """Rejects ``compile()`` arguments this Keras cannot take, naming the Keras they need."""

    def logged_value_entries(self, trackers: list[Any]) -> list[Any]:
        """What one ``Mean`` per logged value adds to ``model.metrics``."""

    def set_initial_epoch(self, model: KerasObject, epoch: int | None) -> None:
        """Makes ``fit`` start at ``epoch`` (``None``: at its ``initial_epoch``)."""

    def snapshot_weights(
        self, model: KerasObject, path: str, reuse: Callable[[], None] | None = None
    ) -> Callable[[], None]:
        """Copies what ``model.save_weights(path)`` writes off the device; the function returned writes the file.

        ``reuse``: what an earlier call for ``model`` returned, which may lend
        its host memory to this copy once it has written its file.
        """

    def call_symbolically(self, layer: KerasObject, input_shape: Any) -> None:
        """Runs ``layer`` on a symbolic input of ``input_shape``, building what its ``call`` builds; no trace left."""
        ...

    def mark_built_if_complete(self, model: KerasObject) -> None:
        """Sets ``model.built`` when all its variables exist although it was never called."""

    def is_functional_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Whether ``Model.__init__`` takes these arguments for ``Model(inputs, outputs)``."""

    def share_registered_name(self, twin: type, cls: type) -> None:
        """Serializes ``twin`` under ``cls``' registered name."""

    # -- losses and steps ----------------------------------------------------------

    def scale_loss_for_distribution(self, loss: Any) -> Any:
        """Multiplies by ``1 / num_replicas`` under ``tf.distribute``, as every Keras loss does."""

    def unscale_loss_for_distribution(self, loss: Any) -> Any:
        """Undoes :meth:`scale_loss_for_distribution`."""

    def make_step_function(
        self,
        model: KerasObject,
        step: Callable[[Any], Any],
        *,
        training: bool,
        tuner: Any = None,
        explain: Callable[[Exception], Exception | None] | None = None,
    ) -> Callable[[Any], Any]:
        """The function ``fit`` (``training=True``) or ``evaluate`` calls on an iterator.

        ``tuner`` (``steps_per_execution="auto"``): the number of steps may
        change between executions, so Keras 2's function reads it at each
        call (Keras 3's takes it with each execution). The loop asks and
        tells the tuner itself, on both Kerases. The function takes an
        execution of the loop's epoch iterator (``fit``, ``evaluate``) or a
        data iterator (``train_on_batch`` & co.). An error the function raises
        is replaced by the one
        :func:`~custom_fit._compat.common.explained_step_error` returns for it
        (XLA's, then ``explain``'s), raised from it.
        """

    # -- optimizers, distribution, mixed precision ------------------------------------

    def optimizer_built(self, optimizer: KerasObject) -> bool:
        """Whether ``optimizer`` has created its slots."""

    def build_optimizer(self, optimizer: KerasObject, variables: list[Any]) -> None:
        """Creates ``optimizer``'s state (slots) for ``variables``."""

    def mark_built(self, optimizer: KerasObject) -> None:
        """Marks an optimizer group as built."""

    def scale_loss(self, optimizer: KerasObject, loss: Any) -> Any:
        """The loss multiplied by the loss scale (mixed precision)."""

    def unscale_gradients(self, optimizer: KerasObject, gradients: list[Any]) -> list[Any]:
        """Gradients of the scaled loss divided by the loss scale (the true gradients)."""

    def with_keras2_api(self, optimizer: KerasObject) -> KerasObject:
        """``optimizer`` with Keras 2's ``lr``, ``minimize`` and loss-scale methods (returned; Keras 2: as is)."""

    def rescale_gradients(self, optimizer: KerasObject, gradients: list[Any]) -> list[Any]:
        """True gradients in the form ``optimizer.apply_gradients`` takes (scaled again on Keras 3)."""

    def sum_across_replicas(self, context: Any, optimizer: KerasObject, grads_and_vars: list[Any]) -> list[Any]:
        """The gradients summed across replicas."""

    def accumulation_steps(self, optimizer: KerasObject) -> int:
        """How many steps' gradients ``optimizer`` accumulates per update (1: it updates every step)."""

    def set_accumulation_steps(self, optimizer: KerasObject, steps: int) -> None:
        """``compile(gradient_accumulation_steps=steps)`` for ``optimizer`` (before it is built)."""

    def apply_gradients(self, optimizer: KerasObject, grads_and_vars: list[Any], *, summed: bool) -> None:
        """``optimizer.apply_gradients``, accumulating where asked; ``summed``: the replicas' sum, equal on each,
        which the optimizer must not sum again."""

    def wrap_for_loss_scaling(self, optimizer: KerasObject, name: str) -> KerasObject:
        """``optimizer`` in a dynamic ``LossScaleOptimizer``."""

    def loss_scaled(self, model: KerasObject, optimizer: KerasObject) -> KerasObject:
        """``optimizer`` wrapped for loss scaling when ``model`` runs in ``mixed_float16`` (once)."""

    def variables_built_on(self, optimizer: KerasObject, candidates: Any) -> list[Any]:
        """The candidates ``optimizer`` keeps state for, in the order it was built on them."""

    def restore_base_config(self, layer: KerasObject, config: dict[str, Any]) -> None:
        """Sets ``layer``'s ``name``, ``trainable`` and ``dtype`` from ``config`` where they differ."""

    # -- diagnostics and saving ----------------------------------------------------------

    def counting_regularizer_calls(
        self, obj: KerasObject
    ) -> contextlib.AbstractContextManager[dict[int, CountingCall]]:
        """While it lasts, ``{id(variable): counter}`` of each weight penalty's computations."""

    def variable_names(self, model: KerasObject, variables: Any) -> list[str]:
        """The variables' paths in ``model``, for messages."""

    def seed_generator_states(self, model: KerasObject) -> list[Any]:
        """The state variables of the seed generators in ``model`` that Keras does not save."""

    def untracked_variables(self, model: KerasObject) -> list[UntrackedVariable]:
        """The variables layer attributes hold that this Keras does not track."""

    # -- random numbers ---------------------------------------------------------------------

    def random_normal(self, shape: Any, seed: Any) -> Any:
        """Standard normal numbers; ``seed`` is an ``int`` or a :meth:`SeedGenerator`."""

    def random_uniform(self, shape: Any, seed: Any) -> Any:
        """Uniform numbers in ``[0, 1)``; ``seed`` is an ``int`` or a :meth:`SeedGenerator`."""


class LoopParts(Protocol):
    """What custom_fit's ``fit``/``evaluate``/``predict`` loop reads from the Keras in use.

    :class:`custom_fit._trainer.loop.Loop` is one loop for both Kerases; these
    are the pieces where Keras 3 (:mod:`custom_fit._compat.keras3_only`) and
    Keras 2 (:mod:`custom_fit._compat.keras2_loop`) differ: the epoch iterator
    over each Keras' data adapters, the checks each Keras makes when a call
    begins, how an execution is run, and how logs and predictions are made.
    ``method`` is ``"fit"``, ``"evaluate"`` or ``"predict"``.
    """

    #: The keyword ``fit`` passes to ``evaluate`` for its validation (reuse the validation epoch iterator).
    FIT_VALIDATION_KWARGS: dict[str, Any]

    def epoch_iterator(self, model: KerasObject, **kwargs: Any) -> Any:
        """The epoch iterator of a call: ``plan``, ``position``, the data arguments, ``predicting``.

        Iterating it runs one epoch, ``(first step, steps, execution)`` per
        execution; it has ``num_batches``, ``exhausted``, ``reset()``,
        ``catch_stop_iteration()``, ``epochs_done()`` and ``close()``.
        """

    def in_legacy_graph(self) -> bool:
        """Whether a TF1 graph is being built, where Keras 2's own v1 engine runs ``fit`` & co."""

    def begin_call(
        self, model: KerasObject, method: str, verbose: Any, x: Any = None, sample_weight: Any = None
    ) -> Any:
        """Keras' checks when a call begins (``compile()`` called, ...); returns the verbosity to use."""

    def data_options(self, kwargs: dict[str, Any], method: str) -> dict[str, Any]:
        """Takes this Keras' data-loading keywords out of ``kwargs``; raises, as Keras does, on any other."""

    def call_scope(self, model: KerasObject, method: str) -> contextlib.AbstractContextManager[Any]:
        """What the whole call runs in (Keras 2: the strategy's scope)."""

    def callback_list(self, lazy: Any, callbacks: Any, **kwargs: Any) -> Any:
        """The ``CallbackList`` a call makes when it is not given one (``lazy``: custom_fit's, where it applies)."""

    def fixed_steps_per_execution(self, model: KerasObject, recorded: int) -> int:
        """``compile(steps_per_execution=N)``'s ``N`` (``recorded``: what custom_fit's setter recorded)."""

    def steps_per_execution(self, model: KerasObject, steps: int) -> Any:
        """What ``model.steps_per_execution`` reads, given the number of steps the loop fuses now."""

    def set_steps_per_execution(self, model: KerasObject, value: int) -> None:
        """What ``model.steps_per_execution = value`` does beyond the loop's record of it."""

    def reset_counter(self, model: KerasObject, kind: str) -> None:
        """Sets the call's step counter to 0 where Keras keeps one."""

    def run_prediction(self, function: Callable[[Any], Any], execution: Any) -> Any:
        """Runs the predict function on one execution; returns its outputs."""

    def capped_epochs(self, epochs: int) -> int:
        """``epochs``, or fewer where Keras caps them."""

    def train_validation_split(self, arrays: tuple[Any, ...], validation_split: float) -> tuple[tuple[Any, ...], Any]:
        """``fit(validation_split=...)``'s split of the arrays."""

    def has_validation_data(self, validation_data: Any) -> bool:
        """Whether ``fit`` validates on ``validation_data``."""

    def build_before_loop(self, model: KerasObject, epoch_iterator: Any) -> None:
        """Builds what a first batch builds, before the loop runs (Keras 3)."""

    def build_compiled_state(self, model: KerasObject, element_spec: Any) -> None:
        """Creates the compiled loss' and metrics' variables from the data's spec (no batch is read)."""

    def first_epoch(self, model: KerasObject, initial_epoch: int, epoch_iterator: Any) -> int:
        """Where ``fit`` starts when custom_fit's progress does not say: Keras' own backup, else ``initial_epoch``."""

    def epoch_logs(self, model: KerasObject, logs: Any, *, returned: bool) -> Any:
        """The epoch's (or evaluation's) logs from the last execution's ``logs`` and the metrics."""

    def validates_after(self, model: KerasObject, epoch: int, validation_freq: Any) -> bool:
        """Whether ``fit`` validates after ``epoch``."""

    def pop_fit_validation(self, kwargs: dict[str, Any]) -> bool:
        """Removes :attr:`FIT_VALIDATION_KWARGS`' keyword from ``evaluate``'s ``kwargs``: whether ``fit`` validates."""

    def evaluation_logs(self, logs: dict[str, Any]) -> dict[str, Any]:
        """What ``evaluate`` returns for the metrics' results."""

    def flat_logs(self, model: KerasObject, logs: Any) -> Any:
        """``evaluate``'s result without ``return_dict``."""

    def batch_end_step(self, first: int, steps: int) -> int:
        """The step passed to ``on_*_batch_end`` for an execution of ``steps`` steps from ``first``."""

    def concat_predictions(self, outputs: list[Any]) -> Any:
        """The executions' outputs of ``predict`` joined along the batch axis, as NumPy."""


if TYPE_CHECKING:  # type checkers check that both version modules implement the contract
    from custom_fit._compat import keras2, keras3

    _keras3: KerasVersion = keras3
    _keras2: KerasVersion = keras2

    from custom_fit._compat import keras2_loop, keras3_only

    _keras3_loop: LoopParts = keras3_only
    _keras2_loop: LoopParts = keras2_loop
