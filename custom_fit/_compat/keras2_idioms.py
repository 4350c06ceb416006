"""Keras 2's optimizer API on the Keras 3 optimizers a ``CustomModel`` uses.

Steps and callbacks written for Keras 2 (tf.keras before 2.16, TensorFlow's
mixed-precision guide) call optimizer methods Keras 3 dropped:

* ``optimizer.lr``, read and assigned, and ``tf.keras.backend.set_value(optimizer.lr, v)``;
* ``optimizer.minimize(loss, var_list, tape=tape)``;
* on a ``LossScaleOptimizer``: ``get_scaled_loss(loss)`` and
  ``get_unscaled_gradients(grads)`` followed by ``apply_gradients``.

:func:`with_keras2_api` gives one optimizer instance these names by moving
it to a *twin* class: a subclass of its class with the Keras 2 methods, made
once per class, that serializes exactly as its class does. Keras' classes are
not changed: an optimizer no ``CustomModel`` compiled has none of them.

Why hand-written: Keras 3 has no compatibility layer for these names, and the
meaning of ``apply_gradients`` differs (Keras 2's ``LossScaleOptimizer`` takes
unscaled gradients, Keras 3's divides by the loss scale), so the twin must
know which form it is given.

Nothing in this module is public API.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import keras
import tensorflow as tf
from keras.src import api_export as _api_export
from keras.src.optimizers.loss_scale_optimizer import LossScaleOptimizer
from keras.src.saving import object_registration as _registration

from custom_fit._compat.common import recording
from custom_fit._per_replica import PerReplica

__all__ = ["Keras2LossScaleAPI", "Keras2OptimizerAPI", "with_keras2_api"]


class Keras2OptimizerAPI:
    """``lr`` and ``minimize(loss, var_list, tape)`` as tf.keras 2.11+ optimizers have them."""

    @property
    def lr(self) -> Any:
        """The learning rate (Keras 2's name): its variable, so ``set_value(optimizer.lr, v)`` sets it."""
        rate = self.learning_rate
        return rate.value if isinstance(rate, keras.Variable) else rate

    @lr.setter
    def lr(self, value: Any) -> None:
        self.learning_rate = value

    def minimize(self, loss: Any, var_list: Any, tape: tf.GradientTape | None = None) -> None:
        """Keras 2's ``Optimizer.minimize``: gradients of ``loss`` on ``tape``, then ``apply_gradients``.

        Args:
            loss: A scalar tensor computed inside ``tape``, or a callable
                returning one (then ``tape`` may be left out).
            var_list: The variables to update, or a callable returning them.
            tape: The ``tf.GradientTape`` that recorded ``loss``.

        Raises:
            ValueError: ``loss`` is a tensor and no ``tape`` was given.
        """
        if tape is None:
            if not callable(loss):
                raise ValueError(
                    f"{type(self).__name__}.minimize() received a loss tensor and no tape. Expected the "
                    "tf.GradientTape that recorded the loss. Fix: minimize(loss, var_list, tape=tape)."
                )
            tape = tf.GradientTape()
        with recording(tape):
            if callable(loss):
                if not callable(var_list):
                    tape.watch(var_list)
                loss = loss()
            loss = self.scale_loss(loss)  # type: ignore[attr-defined]  # the loss scale, under mixed precision
        variables = list(var_list() if callable(var_list) else var_list)
        gradients = tape.gradient(loss, variables)
        self.apply_gradients(zip(gradients, variables, strict=True))  # type: ignore[attr-defined]


# The ids of the optimizers whose get_unscaled_gradients() ran and whose apply_gradients() has
# not yet, per replica (MirroredStrategy's replicas trace a step at the same time).
_unscaled: PerReplica[set[int]] = PerReplica(set)


class Keras2LossScaleAPI:
    """``get_scaled_loss`` and ``get_unscaled_gradients`` as Keras 2's ``LossScaleOptimizer`` has them.

    Keras 2's ``apply_gradients`` takes unscaled gradients; Keras 3's divides
    by the loss scale. Gradients from :meth:`get_unscaled_gradients` are
    multiplied by the scale again (exact: a power of two) when they are
    applied, so the update equals Keras 3's own, skipped steps included.
    """

    def _scale(self) -> Any:
        """What ``scale_loss`` multiplies by: the scale variable once built, the initial scale before."""
        return self.dynamic_scale if self.built else self.initial_scale  # type: ignore[attr-defined]

    def get_scaled_loss(self, loss: Any) -> Any:
        """The loss multiplied by the loss scale (a callable ``loss`` is called first)."""
        return self.scale_loss(loss() if callable(loss) else loss)  # type: ignore[attr-defined]

    def get_unscaled_gradients(self, grads: Iterable[Any]) -> list[Any]:
        """The gradients divided by the loss scale; ``apply_gradients`` then takes them as Keras 2's does."""
        _unscaled.get().add(id(self))
        scale = self._scale()
        return [None if g is None else keras.ops.divide(g, scale) for g in grads]

    def apply_gradients(self, grads_and_vars: Iterable[Any], *args: Any, **kwargs: Any) -> Any:
        """Keras 3's ``apply_gradients``; gradients from :meth:`get_unscaled_gradients` are scaled back first."""
        pending = _unscaled.get()
        unscaled = id(self) in pending
        pending.discard(id(self))
        if not pending:
            _unscaled.pop()
        if unscaled:
            scale = self._scale()
            grads_and_vars = [(None if g is None else keras.ops.multiply(g, scale), v) for g, v in grads_and_vars]
        return super().apply_gradients(grads_and_vars, *args, **kwargs)  # type: ignore[misc]


_twins: dict[type, type] = {}


def _twin(cls: type) -> type:
    twin = _twins.get(cls)
    if twin is None:
        mixins: tuple[type, ...] = (Keras2OptimizerAPI,)
        if issubclass(cls, LossScaleOptimizer):
            mixins = (Keras2LossScaleAPI, *mixins)
        attributes = {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "__doc__": cls.__doc__}
        twin = type(cls.__name__, (*mixins, cls), attributes)
        # Serialized as `cls` is: under its public keras.* name, or its registered name.
        public = _api_export.get_name_from_symbol(cls)
        if public is not None:
            _api_export.REGISTERED_OBJS_TO_NAMES[twin] = public
        else:
            _registration.GLOBAL_CUSTOM_NAMES[twin] = _registration.get_registered_name(cls)
        _twins[cls] = twin
    return twin


def with_keras2_api(optimizer: Any) -> Any:
    """``optimizer`` (and a ``LossScaleOptimizer``'s inner one) with Keras 2's names; returns it.

    Anything but a Keras 3 ``Optimizer`` without them is returned as it is.
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer) or isinstance(optimizer, Keras2OptimizerAPI):
        return optimizer
    optimizer.__class__ = _twin(type(optimizer))
    if isinstance(optimizer, LossScaleOptimizer):
        with_keras2_api(optimizer.inner_optimizer)
    return optimizer
