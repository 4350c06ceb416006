"""What a training step needs to run under a ``tf.distribute`` strategy as it runs on one device.

On one device a step may create variables the first time it is traced: an
optimizer kept as an attribute creates its slots in its first
``apply_gradients``, a sub-model without an input shape creates its weights in
its first call, the compiled metrics theirs in their first ``update_state``.
``tf.function`` lifts such variables out of the traced step. Under a strategy
the step runs in a *replica context* (``strategy.run``), where that lifting
does not work: ``MirroredStrategy`` initialises the second replica's copy
from the first one's inside the traced ``tf.cond`` that guards the
initialisation, and ``fit`` fails with "You must feed a value for placeholder
tensor 'cond/Placeholder…'".

:func:`variables_created_outside_replicas` creates those variables where the
strategy expects them: outside the traced step (``tf.init_scope``), through
the strategy's creators, so that every replica gets its copy, initialised once,
before the step runs. The first replica to reach the creation creates the
variable; the others find it built (an optimizer's ``built``, a layer's
``built``), as they would on one device, or receive the first replica's
variable from ``MirroredStrategy``.

:func:`explain_merge_call_errors` turns TensorFlow's error for a cross-replica
update inside control flow (``apply_gradients`` in a ``tf.cond``) into one
that names the fix.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import tensorflow as tf

__all__ = ["explain_merge_call_errors", "variables_created_outside_replicas"]


@contextlib.contextmanager
def variables_created_outside_replicas() -> Iterator[None]:
    """Creates the variables made inside a replica context under the strategy's scope, outside the step.

    Does nothing outside a replica context of a strategy (one device, or the
    cross-replica context). A variable whose initial value is a tensor of the
    traced step cannot be created outside it and is left to TensorFlow.

    Example:
        >>> import tensorflow as tf
        >>> from custom_fit._distribution import variables_created_outside_replicas
        >>> with variables_created_outside_replicas():  # no strategy: nothing changes
        ...     v = tf.Variable(1.0)
        >>> float(v.numpy())
        1.0
    """
    if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
        yield
        return

    def create_outside_the_step(next_creator: Callable[..., Any], **kwargs: Any) -> Any:
        initial_value = kwargs.get("initial_value")
        if isinstance(initial_value, tf.Tensor) and not hasattr(initial_value, "numpy"):
            return next_creator(**kwargs)  # computed by the step: only TensorFlow's lifting can create it
        # The strategy's own creators make the copies (the other replicas
        # receive the first replica's variable); init_scope makes them
        # eagerly, initialised before the step runs.
        with tf.init_scope():
            return next_creator(**kwargs)

    with tf.variable_creator_scope(create_outside_the_step):
        yield


_MERGE_CALL_IN_CONTROL_FLOW = "`merge_call` called while defining a new graph or a tf.function"


def explain_merge_call_errors(model: Any, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function``, re-raising TensorFlow's error for a cross-replica update inside control flow with the fix.

    Under ``MirroredStrategy`` an optimizer sums the gradients of all replicas
    and updates the mirrored variables in a cross-replica ``merge_call``,
    which cannot run inside a ``tf.cond``, a ``tf.while_loop`` or a nested
    ``tf.function`` of the step (``tf.distribute`` does not support it: a
    branch cannot wait for the other replicas). The gradient-accumulation
    step that calls ``apply_gradients`` inside ``tf.cond`` every N batches is
    the usual case; ``compile(gradient_accumulation_steps=N)`` works
    (:func:`custom_fit._compat.common.in_one_merge_call`).
    """

    def function_with_clear_merge_call_errors(*args: Any) -> Any:
        try:
            return function(*args)
        except RuntimeError as error:
            if _MERGE_CALL_IN_CONTROL_FLOW not in str(error):
                raise
            strategy = model.distribute_strategy
            raise RuntimeError(
                f"The train_step of {type(model).__name__} '{model.name}' updates variables across replicas "
                "(optimizer.apply_gradients) inside a tf.cond, a loop or a nested tf.function, for example to "
                "apply accumulated gradients every N batches. Expected every optimizer update to run "
                f"unconditionally in the step under {type(strategy).__name__}: the optimizer sums the "
                f"{strategy.num_replicas_in_sync} replicas' gradients in a cross-replica merge_call, which "
                "tf.distribute cannot run inside a branch. Fix: call apply_gradients on every step, outside "
                "tf.cond. To accumulate gradients over N steps, pass compile(gradient_accumulation_steps=N) "
                "(Keras 3 and Keras 2; CustomModel applies it across replicas: docs/scaling.md), or raise the "
                "global batch size: the replicas' gradients are summed every step already."
            ) from error

    return function_with_clear_merge_call_errors
