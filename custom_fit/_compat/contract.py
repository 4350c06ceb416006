"""The contract between custom_fit and the Keras in use: what ``keras3`` and ``keras2`` each implement.

:class:`KerasVersion` declares every name the two version modules
(:mod:`custom_fit._compat.keras3` and :mod:`custom_fit._compat.keras2`) must
define, with its signature. Type checkers check both modules against it (a
module can implement a ``Protocol``; see the ``TYPE_CHECKING`` block below),
and :mod:`custom_fit._compat` hands the rest of the package the one in use
typed as the contract, so callers see these signatures, not one Keras' own.
``tests/test_compat.py`` compares the signatures at run time too (names,
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

__all__ = ["KerasObject", "KerasVersion"]

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
    #: Whether ``custom_fit.BackupAndRestore`` can resume in the middle of an epoch (Keras 3).
    RESUMES_MID_EPOCH: bool
    #: Whether ``custom_fit.BackupAndRestore`` can resume only a custom_fit model (Keras 2: tf_keras'
    #: ``fit`` asks the model where to start; Keras 3 reads the callback's initial epoch).
    RESUMES_ONLY_CUSTOM_FIT_MODELS: bool
    #: Whether Keras gives models its own ``compiled_loss`` / ``compiled_metrics`` (Keras 2).
    HAS_COMPILED_LOSS_ATTRIBUTES: bool
    #: Whether ``CustomModel`` runs custom_fit's ``fit``/``evaluate``/``predict`` loop (Keras 3)
    #: rather than Keras' own (Keras 2: tf_keras' loop, steered through its data handler).
    RUNS_OWN_LOOP: bool

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
        self, model: KerasObject, step: Callable[[Any], Any], *, training: bool, tuner: Any = None
    ) -> Callable[[Any], Any]:
        """The function ``fit`` (``training=True``) or ``evaluate`` calls on an iterator.

        ``tuner`` (``steps_per_execution="auto"``): where the loop is tf_keras'
        (Keras 2), the function asks it before and tells it after each
        execution; custom_fit's own loop (Keras 3) does both itself.
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

    def gradients_already_summed(self, optimizer: KerasObject) -> contextlib.AbstractContextManager[None]:
        """While it lasts, ``optimizer.apply_gradients`` does not sum the gradients across replicas again."""

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


if TYPE_CHECKING:  # type checkers check that both version modules implement the contract
    from custom_fit._compat import keras2, keras3

    _keras3: KerasVersion = keras3
    _keras2: KerasVersion = keras2
