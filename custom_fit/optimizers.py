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
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from custom_fit import _compat
from custom_fit._compat import keras


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

    def __init__(
        self,
        optimizers: Mapping[str, Any],
        assignment: Mapping[str, list[int]] | None = None,
        name: str = "named_optimizers",
        **kwargs: Any,
    ):
        super().__init__(name=name, **_compat.optimizer_group_kwargs(), **kwargs)
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
        _compat.set_untracked(self, "_assignment", {k: list(v) for k, v in (assignment or {}).items()})
        _compat.set_untracked(self, "_owners", {})
        _compat.set_untracked(self, "_owner_of_variable", {})
        _compat.set_untracked(self, "_model_variables", [])
        _compat.set_untracked(self, "_built_on", {})
        _compat.set_untracked(self, "name_variables", _compat.variable_names_without_model)

    #: Marks the group for ``CustomModel``'s compile (Keras 2 must not wrap it for loss scaling).
    is_optimizer_group = True

    # -- mapping ------------------------------------------------------------

    def __getitem__(self, name: str) -> keras.optimizers.Optimizer:
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

    def keys(self):
        return self._members.keys()

    def items(self):
        return self._members.items()

    @property
    def optimizers(self) -> list:
        """The member optimizers, in name order of the dict (Keras callbacks use this)."""
        return list(self._members.values())

    @property
    def learning_rate(self):  # type: ignore[override]
        raise _compat.group_learning_rate_error("read or set `model.optimizer[name].learning_rate` instead")

    @learning_rate.setter
    def learning_rate(self, value):
        raise _compat.group_learning_rate_error("set `model.optimizer[name].learning_rate` instead")

    # -- building -----------------------------------------------------------

    def wrap_for_loss_scaling(self) -> None:
        """Wraps every member in a ``LossScaleOptimizer`` (``mixed_float16``), once."""
        for name, optimizer in self._members.items():
            if not isinstance(optimizer, _compat.LossScaleOptimizer):
                self._members[name] = _compat.wrap_for_loss_scaling(optimizer, f"{name}_loss_scale")

    def set_owners(self, owners: Mapping[str, Any]) -> None:
        """Layers whose trainable variables a member updates (``{name: layer}``)."""
        _compat.set_untracked(self, "_owners", {k: v for k, v in owners.items() if k in self._members})

    def build(self, variables) -> None:
        """Builds every member whose variables are known; records the model's variables."""
        if _compat.optimizer_built(self):
            return
        _compat.set_untracked(self, "_model_variables", list(variables))
        for name in self._members:
            own = self._known_variables(name)
            if own is not None:
                self.build_member(name, own)
        super().build(self._model_variables)
        _compat.mark_built(self)

    def build_member(self, name: str, variables) -> None:
        """Builds member ``name`` on ``variables``; errors if another member owns one of them."""
        variables = list(variables)
        shared = {}
        for v in variables:
            owner = self._owner_of_variable.get(id(v))
            if owner is not None and owner != name:
                shared.setdefault(owner, []).append(v)
        if shared:
            other, names = next(iter(shared.items()))
            names = self.name_variables(names)
            raise ValueError(
                f"Variables {names} would be updated by two optimizers, {other!r} and "
                f"{name!r}. Expected each variable to belong to one named optimizer. "
                f"Fix: pass disjoint variable lists to minimize(), e.g. "
                f"self.{other}.trainable_weights and self.{name}.trainable_weights."
            )
        for v in variables:
            self._owner_of_variable[id(v)] = name
        self._built_on[name] = variables
        member = self._members[name]
        if not _compat.optimizer_built(member):
            member.build(variables)

    def _known_variables(self, name: str):
        if name in self._assignment and self._model_variables:
            return [self._model_variables[i] for i in self._assignment[name]]
        owner = self._owners.get(name)
        if owner is not None and owner.built:
            return owner.trainable_variables
        return None

    def member_variables(self, name: str) -> list:
        """The variables member ``name`` was built with (empty before it is built)."""
        return list(self._built_on.get(name, []))

    # -- saving -------------------------------------------------------------

    def get_config(self) -> dict:
        assignment = dict(self._assignment)
        positions = {id(v): i for i, v in enumerate(self._model_variables)}
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
    def from_config(cls, config: dict, custom_objects=None) -> "NamedOptimizers":
        config = dict(config)
        config["optimizers"] = {
            k: keras.saving.deserialize_keras_object(v, custom_objects=custom_objects)
            for k, v in config["optimizers"].items()
        }
        return cls(**config)
