"""Several optimizers compiled together under names: ``compile(optimizer={"generator": ...})``.

A GAN-style step updates different sub-models with different optimizers. Keras
compiles one optimizer, so the usual workaround keeps extra optimizers as
attributes, where ``load_model`` does not recompile them, loss scaling skips
them and a default optimizer is created besides them. :class:`NamedOptimizers`
is the compiled optimizer instead: ``model.optimizer["generator"]`` is the
generator's optimizer, each member is built on the variables it updates,
wrapped for loss scaling under ``mixed_float16``, saved by ``model.save``,
checkpoints and ``BackupAndRestore``, and rebuilt by ``load_model``.

Which variables a member updates:

1. after ``load_model`` (or from a config): the assignment saved with it;
2. otherwise, when the model has a sub-layer attribute with the member's name
   (``model.generator`` for ``"generator"``), that layer's trainable variables;
3. otherwise, the variables of the first ``minimize(..., optimizer=name)``.

:func:`resolve` turns what a step passes as ``optimizer=`` into the optimizer
that applies the update.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, ItemsView, Iterator, KeysView, Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from custom_fit._compat import keras, version
from custom_fit._compat.common import set_untracked, variable_names_without_model

__all__ = [
    "DEFAULT_OPTIMIZER",
    "UNSET",
    "NamedOptimizers",
    "attribute_optimizers",
    "ensure_state",
    "for_compile",
    "give_keras2_api",
    "group_attribute_optimizers",
    "load_assignment",
    "load_attribute_assignment",
    "resolve",
    "save_assignment",
    "save_attribute_assignment",
]

#: The optimizer ``keras.Model.compile`` uses when it is given none.
DEFAULT_OPTIMIZER = "rmsprop"


class _Unset:
    """The ``optimizer`` of a ``compile()`` call that passed none (``None`` means "no optimizer")."""

    def __repr__(self) -> str:
        return f"<keras default: {DEFAULT_OPTIMIZER!r}>"


#: Default of ``compile(optimizer=...)``: Keras' default optimizer, unless a
#: subclass' own ``compile`` calls ``super().compile()`` without one.
UNSET: Any = _Unset()


@dataclasses.dataclass(eq=False)
class _GroupState:
    """A :class:`NamedOptimizers` group's bookkeeping, kept out of checkpoints (one untracked attribute).

    Attributes:
        assignment: ``{name: [positions in the model's trainable variables]}`` (saved with the model).
        owners: ``{name: the model's sub-layer of that name}``, set by ``attach``.
        owner_of_variable: ``{id(variable): name}`` of every variable a member updates.
        model_variables: The model's trainable variables the group was built on.
        built_on: ``{name: the variables that member was built on}``.
        name_variables: Names variables for messages (by their path in the model once attached).
        from_attributes: Whether the members are optimizers the model keeps as attributes.
    """

    assignment: dict[str, list[int]]
    owners: dict[str, Any] = dataclasses.field(default_factory=dict)
    owner_of_variable: dict[int, str] = dataclasses.field(default_factory=dict)
    model_variables: list[Any] = dataclasses.field(default_factory=list)
    built_on: dict[str, Any] = dataclasses.field(default_factory=dict)
    name_variables: Callable[[Sequence[Any]], Any] = variable_names_without_model
    from_attributes: bool = False


@keras.saving.register_keras_serializable(package="custom_fit")
class NamedOptimizers(keras.optimizers.Optimizer):
    """A mapping of names to optimizers that ``compile()`` accepts as one optimizer.

    ``CustomModel.compile`` builds it from a dict; you rarely create it yourself.
    Keras' learning-rate callbacks (``LearningRateScheduler``,
    ``ReduceLROnPlateau``) and ``TensorBoard`` act on every member through
    :attr:`optimizers`. ``iterations`` counts training steps; each member's
    ``iterations`` counts its own updates.

    Args:
        optimizers: ``{name: optimizer}``; values may be instances or names
            such as ``"adam"``.
        assignment: ``{name: [positions in model.trainable_variables]}``, as
            saved by :meth:`get_config`.
        name: The group's name.

    Example:
        >>> import custom_fit
        >>> group = custom_fit.NamedOptimizers({"generator": "adam", "discriminator": "sgd"})
        >>> sorted(group), type(group["discriminator"]).__name__
        (['discriminator', 'generator'], 'SGD')
    """

    #: Marks the group for ``CustomModel``'s compile (Keras 2 must not wrap it for loss scaling).
    is_optimizer_group = True

    def __init__(
        self,
        optimizers: Mapping[str, Any],
        assignment: Mapping[str, list[int]] | None = None,
        name: str = "named_optimizers",
        **kwargs: Any,
    ):
        super().__init__(name=name, **version.OPTIMIZER_GROUP_KWARGS, **kwargs)
        if not isinstance(optimizers, Mapping) or not optimizers:
            raise ValueError(
                "NamedOptimizers expected a non-empty dict {name: optimizer}, "
                f"received {optimizers!r}. Fix: pass e.g. "
                "{'generator': 'adam', 'discriminator': 'adam'}."
            )
        members = {}
        for key, optimizer in optimizers.items():
            if not isinstance(key, str) or not key:
                raise ValueError(f"Optimizer names must be non-empty strings, received {key!r}.")
            members[key] = keras.optimizers.get(optimizer)
        self._members = members  # tracked: checkpoints and .keras files save the members
        # Bookkeeping that must not become checkpoint dependencies:
        set_untracked(self, "_bookkeeping", _GroupState({k: list(v) for k, v in (assignment or {}).items()}))

    @property
    def from_attributes(self) -> bool:
        """Whether the members are optimizers the model keeps as attributes (a step uses them directly)."""
        return self._bookkeeping.from_attributes

    # -- mapping ------------------------------------------------------------

    def __getitem__(self, name: str) -> Any:
        if name not in self._members:
            raise KeyError(
                f"No optimizer named {name!r}: expected one of {sorted(self._members)}, "
                "the names given to compile(optimizer={...})."
            )
        return self._members[name]

    def __contains__(self, name: object) -> bool:
        return name in self._members

    def __iter__(self) -> Iterator[str]:
        return iter(self._members)

    def __len__(self) -> int:
        return len(self._members)

    def keys(self) -> KeysView[str]:
        return self._members.keys()

    def items(self) -> ItemsView[str, Any]:
        return self._members.items()

    @property
    def optimizers(self) -> list[Any]:
        """The member optimizers, in name order of the dict (Keras callbacks use this)."""
        return list(self._members.values())

    @property
    def learning_rate(self) -> _GroupRate:
        """The first member's learning rate; setting it scales every member's rate by the same factor.

        Keras 3.15's ``LearningRateScheduler`` and ``ReduceLROnPlateau`` act
        on each member through :attr:`optimizers`. Keras 2 and earlier Keras 3
        releases read and set one ``learning_rate`` (``lr``); through this
        property they act on every member and keep the ratios between the
        members' rates (a multiplicative schedule gives each member exactly
        what 3.15 gives it).
        """
        return _GroupRate(_rate_of(self.optimizers[0]), self)

    @learning_rate.setter
    def learning_rate(self, value: Any) -> None:
        value = float(np.asarray(value))
        reference = _rate_of(self.optimizers[0])
        for i, optimizer in enumerate(self.optimizers):
            scaled = value if i == 0 or reference == 0.0 else _rate_of(optimizer) * (value / reference)
            optimizer.learning_rate = scaled

    lr = learning_rate  # Keras 2's callbacks use `optimizer.lr`

    def apply_gradients(self, grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
        """Refuses: each member applies its own gradients."""
        raise ValueError(
            f"model.optimizer is a group of named optimizers {sorted(self._members)} (compile(optimizer={{...}}) "
            "or optimizers kept as attributes), which applies no gradients itself. Expected each part of the "
            "model to be updated by its own optimizer. Fix: self.minimize(loss, tape, variables, "
            f"optimizer={sorted(self._members)[0]!r}), or self.optimizer[name].apply_gradients(...)."
        )

    apply = apply_gradients  # Keras 3's `optimizer.apply(gradients, variables)`

    # -- compiling ------------------------------------------------------------

    def attach(self, model: Any, *, loss_scaling: bool) -> None:
        """Prepares the group for ``model.compile``.

        Members named like one of ``model``'s sub-layer attributes update that
        layer's variables; messages name variables by their path in ``model``;
        with ``loss_scaling`` (``mixed_float16``) every member is wrapped in a
        ``LossScaleOptimizer`` (once).
        """
        owners = {name: getattr(model, name, None) for name in self._members}
        self._bookkeeping.owners = {k: v for k, v in owners.items() if v is not None}
        self._bookkeeping.name_variables = lambda variables: version.variable_names(model, variables)
        if loss_scaling:
            for name, optimizer in self._members.items():
                if not isinstance(optimizer, version.LossScaleOptimizer):
                    self._members[name] = version.wrap_for_loss_scaling(optimizer, f"{name}_loss_scale")

    def member_for_step(self, name: str, variables: Sequence[Any], model_variables: Sequence[Any]) -> Any:
        """Member ``name``, built (outside the traced step) and checked to own ``variables``.

        Called by ``CustomModel.minimize(..., optimizer=name)``.

        Raises:
            ValueError: ``name`` is not a member, or the member was built on
                other variables.
        """
        if name not in self._members:
            raise ValueError(
                f"minimize() received optimizer={name!r}; this model was compiled with named "
                f"optimizers {sorted(self._members)}. Expected one of those names (or an "
                f"optimizer instance). Fix: pass optimizer={sorted(self._members)[0]!r}, or add "
                f"{name!r} to the dict given to compile(optimizer={{...}})."
            )
        ensure_state(self, model_variables)
        known = self.member_variables(name)
        if not known:
            ensure_state(self, variables, member=name)
        known_ids = {id(v) for v in known}
        unknown = self._bookkeeping.name_variables([v for v in variables if id(v) not in known_ids]) if known else []
        if unknown:
            raise ValueError(
                f"minimize(..., optimizer={name!r}) received variables the {name!r} "
                f"optimizer does not update: {unknown}. Expected the variables it "
                f"was built with ({len(known)} variables, e.g. "
                f"{self._bookkeeping.name_variables(known[:3])}). Fix: pass the "
                f"same variables every step (e.g. self.{name}.trainable_weights), or "
                "compile another named optimizer for these variables."
            )
        return self._members[name]

    def members_built_on(self, candidates: Sequence[Any]) -> dict[str, list[Any]]:
        """``{name: the variables among candidates that member was built on}``, for built members."""
        return {
            name: version.variables_built_on(member, candidates)
            for name, member in self._members.items()
            if version.optimizer_built(member)
        }

    def finalize_variable_values(self, var_list: Sequence[Any]) -> None:
        """Lets each member finalize the variables it updates (``fit`` calls this when it ends).

        A member with ``use_ema=True`` then swaps its moving averages into its
        variables, as Keras does for a single compiled optimizer (Keras' own
        ``MultiOptimizer`` splits ``var_list`` the same way). Optimizers kept
        as attributes are left alone: ``keras.Model`` never finalizes them.
        """
        if self.from_attributes:
            return
        for name, variables in self.members_built_on(var_list).items():
            finalize = getattr(self._members[name], "finalize_variable_values", None)  # tf_keras' legacy: none
            if variables and finalize is not None:
                finalize(variables)

    def count_step(self) -> None:
        """Adds one training step to the group's ``iterations`` (each member counts its own updates)."""
        self.iterations.assign_add(1)

    # -- building -----------------------------------------------------------

    def build(self, variables: Sequence[Any]) -> None:
        """Builds every member whose variables are known; records the model's variables."""
        if version.optimizer_built(self):
            return
        self._bookkeeping.model_variables = list(variables)
        for name in self._members:
            own = self._known_variables(name)
            if own is not None:
                ensure_state(self, own, member=name)
        super().build(self._bookkeeping.model_variables)
        version.mark_built(self)

    def _assign_member(self, name: str, variables: Sequence[Any]) -> None:
        """Records that member ``name`` updates ``variables`` (:func:`ensure_state` then builds it).

        Raises:
            ValueError: Another member updates one of ``variables``.
        """
        variables = list(variables)
        shared: dict[str, list[Any]] = {}
        for v in variables:
            owner = self._bookkeeping.owner_of_variable.get(id(v))
            if owner is not None and owner != name:
                shared.setdefault(owner, []).append(v)
        if shared:
            other, overlap = next(iter(shared.items()))
            raise ValueError(
                f"Variables {self._bookkeeping.name_variables(overlap)} would be updated by two optimizers, "
                f"{other!r} and {name!r}. Expected each variable to belong to one named optimizer. "
                f"Fix: pass disjoint variable lists to minimize(), e.g. "
                f"self.{other}.trainable_weights and self.{name}.trainable_weights."
            )
        for v in variables:
            self._bookkeeping.owner_of_variable[id(v)] = name
        self._bookkeeping.built_on[name] = variables

    def _known_variables(self, name: str) -> list[Any] | None:
        if name in self._bookkeeping.assignment and self._bookkeeping.model_variables:
            return [self._bookkeeping.model_variables[i] for i in self._bookkeeping.assignment[name]]
        owner = self._bookkeeping.owners.get(name)
        if owner is not None and owner.built:
            return list(owner.trainable_variables)
        return None

    def member_variables(self, name: str) -> list[Any]:
        """The variables member ``name`` was built with (empty before it is built)."""
        return list(self._bookkeeping.built_on.get(name, []))

    # -- saving -------------------------------------------------------------

    def get_config(self) -> dict[str, Any]:
        assignment = dict(self._bookkeeping.assignment)
        positions = {id(v): i for i, v in enumerate(self._bookkeeping.model_variables)}
        for name in self._members:
            built_on = self.member_variables(name)
            if built_on and all(id(v) in positions for v in built_on):
                assignment[name] = [positions[id(v)] for v in built_on]
        return {
            "name": self.name,
            "optimizers": {k: keras.saving.serialize_keras_object(v) for k, v in self._members.items()},
            "assignment": assignment,
        }

    @classmethod
    def from_config(cls, config: dict[str, Any], custom_objects: Any = None) -> NamedOptimizers:
        config = dict(config)
        config["optimizers"] = {
            k: keras.saving.deserialize_keras_object(v, custom_objects=custom_objects)
            for k, v in config["optimizers"].items()
        }
        return cls(**config)


def ensure_state(optimizer: Any, variables: Sequence[Any], member: str | None = None) -> None:
    """Creates ``optimizer``'s state (its slots) for ``variables`` unless it has some: the one place that does.

    Idempotent: an optimizer that has its state keeps it. Always outside any
    traced function (``tf.init_scope``), as Keras' ``apply_gradients``
    builds: ``tf.function`` may create variables only in a first trace, and
    a restore must find them before the step runs.

    * A plain optimizer and a ``LossScaleOptimizer`` (its inner optimizer
      with it) are built on ``variables``, in their order.
    * A :class:`NamedOptimizers` group records ``variables`` as the model's
      and builds each member whose variables are known (its ``build`` comes
      back here for each, with ``member``).
    * ``member=name`` (``optimizer`` is the group): records that member
      ``name`` updates ``variables`` (an error if another member does), then
      builds that member on them if it has no state yet.

    Who calls it, when, and why then:

    * ``StepFunctions`` (training step, first trace): the compiled optimizer
      on every trainable variable, at the moment Keras builds it, so the step
      traces as often as on ``keras.Model`` (its docstring says why).
    * ``CustomModel.minimize``: the optimizer it uses, on all its
      ``variables`` when some have no gradient (Keras builds on those too; the
      update leaves them out); :meth:`NamedOptimizers.member_for_step`, at a
      member's first ``minimize``: the group, then the member.
    * Restoring, before state is read (it is read only into a built
      optimizer): ``BackupAndRestore`` before loading a backup (not a group:
      the saved assignment builds its members); ``compile_from_config``
      (``load_model``) before Keras loads the optimizer's variables;
      :func:`load_assignment` and :func:`load_attribute_assignment` on the
      saved positions, inside the strategy's scope.

    Args:
        optimizer: A Keras optimizer, ``LossScaleOptimizer`` or
            :class:`NamedOptimizers` group.
        variables: The variables it updates.
        member: A member of the group ``optimizer`` to build instead.

    Raises:
        TypeError: ``member`` is given and ``optimizer`` is not a group.
        ValueError: Another member of the group updates one of ``variables``.
    """
    with tf.init_scope():
        if member is not None:
            if not isinstance(optimizer, NamedOptimizers):
                raise TypeError(f"ensure_state(member={member!r}) expected a NamedOptimizers, received {optimizer!r}.")
            optimizer._assign_member(member, variables)
            optimizer = optimizer[member]
        if not version.optimizer_built(optimizer):
            version.build_optimizer(optimizer, list(variables))


def pop_accumulation_steps(kwargs: dict[str, Any]) -> int | None:
    """``compile(gradient_accumulation_steps=N)``'s ``N``, taken out of ``kwargs`` (``None`` if not given).

    Raises:
        ValueError: Not a whole number >= 2.
    """
    steps = kwargs.pop("gradient_accumulation_steps", None)
    if steps is None:
        return None
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 2:
        raise ValueError(
            "compile(gradient_accumulation_steps) expects a whole number >= 2: the steps whose gradients make one "
            f"update; received {steps!r}. Fix: pass e.g. gradient_accumulation_steps=4, or leave it out."
        )
    return steps


def accumulate_gradients(model: Any, steps: int) -> None:
    """Makes every optimizer of ``model`` (each member of a group) accumulate ``steps`` steps' gradients per update.

    ``compile(gradient_accumulation_steps=steps)``: Keras 3's option of each
    optimizer, custom_fit's own for tf_keras' (which have none).
    """
    compiled = model.optimizer
    for member in compiled.optimizers if isinstance(compiled, NamedOptimizers) else [compiled]:
        version.set_accumulation_steps(member, steps)


def for_compile(model: Any, optimizer: Any, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The optimizer and keyword arguments ``CustomModel.compile`` passes on to Keras.

    A dict of optimizers becomes a :class:`NamedOptimizers` attached to
    ``model``; under ``mixed_float16`` its members are wrapped for loss
    scaling, and Keras is told not to wrap the group itself.
    """
    if isinstance(optimizer, Mapping):
        optimizer = NamedOptimizers(optimizer)
    if isinstance(optimizer, NamedOptimizers):
        scaled = model.dtype_policy.name == "mixed_float16" and kwargs.get("auto_scale_loss", True)
        optimizer.attach(model, loss_scaling=scaled)
        kwargs = {**kwargs, **version.GROUP_COMPILE_KWARGS}
    return optimizer, kwargs


def resolve(model: Any, optimizer: Any, variables: Sequence[Any] = ()) -> Any:
    """The optimizer that applies ``model``'s update for ``minimize(..., optimizer=optimizer)``.

    Args:
        model: The model whose step calls ``minimize``.
        optimizer: ``None`` (the compiled optimizer), a name given to
            ``compile(optimizer={name: ...})``, or an optimizer instance
            (wrapped for loss scaling under ``mixed_float16``, like the
            compiled one).
        variables: The variables to update (checked against a named member).

    Raises:
        ValueError: ``optimizer`` names no optimizer of ``model``, or ``model``
            has none.
    """
    if isinstance(optimizer, version.OPTIMIZER_CLASSES):
        return version.loss_scaled(model, optimizer)
    compiled = getattr(model, "optimizer", None)
    if isinstance(compiled, NamedOptimizers):
        if isinstance(optimizer, str):
            return compiled.member_for_step(optimizer, variables, model.trainable_variables)
        names = sorted(compiled)
        if optimizer is None:
            raise ValueError(
                f"{type(model).__name__} '{model.name}' was compiled with named optimizers {names}, "
                "but minimize() received optimizer=None, which means the one compiled optimizer "
                "(CustomModel's own train_step updates all variables that way). Expected a train_step "
                "that updates each part with its own optimizer. Fix: write one that calls "
                f"self.minimize(loss, tape, variables, optimizer=name) for each of {names} "
                "(custom_fit.GAN is an example), or compile a single optimizer."
            )
        raise ValueError(
            f"{type(model).__name__}.minimize() received optimizer={optimizer!r}; this model was "
            f"compiled with named optimizers {names}. Expected one of those names "
            f"(or an optimizer instance). Fix: pass optimizer={names[0]!r}."
        )
    if optimizer is None and compiled is not None:
        return compiled
    if optimizer is None:
        raise ValueError(
            f"{type(model).__name__} '{model.name}' has no optimizer: expected "
            "`compile(optimizer=...)` to have been called, received a model "
            "without one. Fix: call `model.compile(optimizer='adam', ...)` "
            "or pass `optimizer=` an optimizer instance."
        )
    compiled_name = type(compiled).__name__ if compiled is not None else "none"
    if isinstance(optimizer, str):
        compiled_name += "; name optimizers with compile(optimizer={name: ...})"
    raise ValueError(
        f"{type(model).__name__}.minimize() received optimizer={optimizer!r}, "
        f"which names no optimizer of this model (compiled optimizer: "
        f"{compiled_name}). Expected `None` for the compiled optimizer or a "
        "`keras.optimizers.Optimizer` instance. Fix: omit `optimizer=` or "
        "pass the optimizer object itself."
    )


class _GroupRate(float):
    """A group's learning rate as Keras 2's callbacks handle ``optimizer.lr``: a number with ``assign``."""

    dtype = tf.float32  # Keras 3's legacy `set_value` reads `dtype.name`, tf_keras' `tf.as_dtype(dtype)`
    _group: NamedOptimizers

    def __new__(cls, value: float, group: NamedOptimizers) -> _GroupRate:
        rate = super().__new__(cls, value)
        rate._group = group
        return rate

    def assign(self, value: Any) -> None:
        self._group.learning_rate = value

    def numpy(self) -> float:
        return float(self)


def _rate_of(optimizer: Any) -> float:
    return float(np.asarray(optimizer.learning_rate))


def group_attribute_optimizers(model: Any) -> None:
    """Makes the optimizers a model keeps as attributes its ``model.optimizer``, named by attribute.

    The keras.io pattern ``compile(self, d_optimizer, g_optimizer, loss_fn)``
    stores optimizers as attributes and compiles none; as members of a
    :class:`NamedOptimizers` group they are scheduled by Keras' learning-rate
    callbacks, and built before their state is restored. The step keeps
    using them as attributes. Nothing changes when ``model.optimizer`` is set.
    """
    if model.optimizer is not None:
        return
    members = attribute_optimizers(model)
    if members:
        group = NamedOptimizers(members)
        group._bookkeeping.from_attributes = True
        model.optimizer = group


def give_keras2_api(model: Any) -> None:
    """Gives each optimizer of ``model`` Keras 2's ``lr``, ``minimize`` and loss-scale methods (Keras 3).

    Keras-2-era steps and callbacks (``self.optimizer.get_scaled_loss``,
    ``optimizer.minimize(loss, var_list, tape=tape)``,
    ``set_value(self.model.optimizer.lr, v)``) then run unchanged; the
    compiled optimizer, named members and optimizers kept as attributes get
    them. Optimizers no
    ``CustomModel`` compiled stay as Keras made them.
    """
    optimizer = model.optimizer
    for member in optimizer.optimizers if isinstance(optimizer, NamedOptimizers) else [optimizer]:
        version.with_keras2_api(member)


def save_assignment(model: Any) -> dict[str, Any]:
    """``{name: positions}``: which of ``model.trainable_variables`` each built named optimizer updates.

    An optimizer's state (slots) can only be read into a built optimizer; after
    ``load_model`` or in a fresh process before ``load_weights`` the named
    optimizers are not built yet. These positions, saved with the model's own
    variables (``custom_fit._extra_state``), build them first (:func:`load_assignment`).
    """
    group: Any = getattr(model, "optimizer", None)
    if not hasattr(group, "members_built_on"):
        return {}
    variables = model.trainable_variables
    positions = {id(v): i for i, v in enumerate(variables)}
    return {
        name: np.array([positions[id(v)] for v in built_on], "int64")
        for name, built_on in group.members_built_on(variables).items()
    }


def load_assignment(model: Any, saved: Mapping[str, Any]) -> None:
    """Builds each unbuilt named optimizer that :func:`save_assignment` saved built, on its saved variables."""
    group = getattr(model, "optimizer", None)
    if not saved or not isinstance(group, NamedOptimizers):
        return
    variables = model.trainable_variables
    # Under a tf.distribute strategy (BackupAndRestore restores before the first step, outside
    # the strategy's scope) the slots must be created by the strategy, like the model's variables.
    with tf.init_scope(), model.distribute_strategy.scope():
        for name, positions in saved.items():
            if name in group and not version.optimizer_built(group[name]):
                ensure_state(group, [variables[int(i)] for i in np.asarray(positions)], member=name)


def attribute_optimizers(model: Any) -> dict[str, Any]:
    """``{attribute: optimizer}``: the optimizers ``model`` keeps as public attributes."""
    return {
        name: value
        for name, value in vars(model).items()
        if isinstance(value, version.OPTIMIZER_CLASSES) and not name.startswith("_")
    }


def _outside_the_group(model: Any) -> dict[str, Any]:
    """:func:`attribute_optimizers` that are neither ``model.optimizer`` nor one of its named members."""
    compiled: Any = getattr(model, "optimizer", None)
    grouped = {id(compiled)} | {id(m) for m in getattr(compiled, "optimizers", [])}
    return {name: value for name, value in attribute_optimizers(model).items() if id(value) not in grouped}


def save_attribute_assignment(model: Any) -> dict[str, Any]:
    """``{attribute: positions}``: which of ``model.trainable_variables`` each built attribute optimizer updates.

    For an optimizer the model keeps as an attribute outside ``model.optimizer``
    (made in ``__init__`` and used by the step, the WGAN-GP shape). Keras saves
    its variables with the model's, but reads them only into a built optimizer:
    :func:`load_attribute_assignment` builds it first, on the same variables.
    """
    variables = model.trainable_variables
    positions = {id(v): i for i, v in enumerate(variables)}
    return {
        name: np.array([positions[id(v)] for v in version.variables_built_on(optimizer, variables)], "int64")
        for name, optimizer in _outside_the_group(model).items()
        if version.optimizer_built(optimizer)
    }


def load_attribute_assignment(model: Any, saved: Mapping[str, Any]) -> None:
    """Builds each unbuilt attribute optimizer that :func:`save_attribute_assignment` saved built."""
    present = _outside_the_group(model)
    if not saved or not present:
        return
    variables = model.trainable_variables
    with tf.init_scope(), model.distribute_strategy.scope():  # as load_assignment
        for name, positions in saved.items():
            optimizer = present.get(name)
            if optimizer is not None and not version.optimizer_built(optimizer):
                ensure_state(optimizer, [variables[int(i)] for i in np.asarray(positions)])
