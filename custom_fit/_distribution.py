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

:func:`explained_merge_call_error` turns TensorFlow's error for a cross-replica
update inside control flow (``apply_gradients`` in a ``tf.cond``) into one
that names the fix.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import tensorflow as tf

from custom_fit._compat.common import is_xla_function

__all__ = ["explained_merge_call_error", "variables_created_outside_replicas"]


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


def explained_merge_call_error(model: Any, error: Exception) -> RuntimeError | None:
    """TensorFlow's error for a cross-replica update inside control flow, with the fix; ``None`` for another error.

    Under ``MirroredStrategy`` an optimizer sums the gradients of all replicas
    and updates the mirrored variables in a cross-replica ``merge_call``,
    which cannot run inside a ``tf.cond``, a ``tf.while_loop`` or a nested
    ``tf.function`` of the step (``tf.distribute`` does not support it: a
    branch cannot wait for the other replicas). The gradient-accumulation
    step that calls ``apply_gradients`` inside ``tf.cond`` every N batches is
    the usual case; ``compile(gradient_accumulation_steps=N)`` works
    (:func:`custom_fit._compat.common.in_one_merge_call`). The train function
    raises the returned error from ``error``
    (:func:`custom_fit._compat.common.explained_step_error`).

    Example:
        >>> import types
        >>> from custom_fit._distribution import explained_merge_call_error
        >>> explained_merge_call_error(types.SimpleNamespace(), RuntimeError("another error")) is None
        True
    """
    if not isinstance(error, RuntimeError) or _MERGE_CALL_IN_CONTROL_FLOW not in str(error):
        return None
    strategy = model.distribute_strategy
    step = getattr(type(model), "train_step", None)
    if isinstance(step, tf.types.experimental.PolymorphicFunction):
        return RuntimeError(_step_is_a_tf_function(model, step, strategy))
    return RuntimeError(
        f"The train_step of {type(model).__name__} '{model.name}' updates variables across replicas "
        "(optimizer.apply_gradients) inside a tf.cond, a loop or a nested tf.function, for example to "
        "apply accumulated gradients every N batches. Expected every optimizer update to run "
        f"unconditionally in the step under {type(strategy).__name__}: the optimizer sums the "
        f"{strategy.num_replicas_in_sync} replicas' gradients in a cross-replica merge_call, which "
        "tf.distribute cannot run inside a branch. Fix: call apply_gradients on every step, outside "
        "tf.cond. To accumulate gradients over N steps, pass compile(gradient_accumulation_steps=N) "
        "(Keras 3 and Keras 2; CustomModel applies it across replicas: docs/scaling.md), or raise the "
        "global batch size: the replicas' gradients are summed every step already."
    )


def _step_is_a_tf_function(model: Any, step: Any, strategy: Any) -> str:
    """The error for a ``train_step`` decorated with ``@tf.function``, and how to keep what the decorator did.

    ``fit`` runs the step inside its own ``tf.function``; under a strategy a
    plain decorated step runs as its Python function in each replica
    (:func:`custom_fit._compat.common.in_replica`, as Keras 3 runs it), one
    compiled with XLA stays a nested ``tf.function``, where the optimizer's
    cross-replica ``merge_call`` cannot run. tf_keras says to stop decorating;
    the decorator's purposes have their place in ``fit``.
    """
    signature = step.input_signature
    kept = (
        f"Its input_signature {signature!r} is not needed: fit's step function relaxes shapes itself "
        "(reduce_retracing: after a batch of another shape it traces once for any shape, ragged batches "
        "too); to fix the element spec, give fit a tf.data.Dataset that has it."
        if signature is not None
        else "If it was for an input_signature: fit's step function relaxes shapes itself (reduce_retracing)."
    )
    xla = is_xla_function(step)
    return (
        f"The train_step of {type(model).__name__} '{model.name}' is a tf.function "
        f"({'compiled with XLA: @tf.function(jit_compile=True)' if xla else 'decorated with @tf.function'}), and "
        f"under {type(strategy).__name__} its optimizer update runs inside that nested tf.function, where the "
        f"cross-replica merge_call that sums the {strategy.num_replicas_in_sync} replicas' gradients cannot run"
        + (
            " (custom_fit runs a @tf.function step without XLA as its Python function in each replica, as Keras 3 "
            "does; this one would lose XLA there)"
            if xla
            else ""
        )
        + ". Expected train_step to be a plain method: fit compiles it into its own tf.function. Fix: remove "
        "@tf.function from train_step. If the decorator was for XLA (jit_compile=True, experimental_compile=True): "
        f"compile(..., jit_compile=True) compiles fit's step with XLA. {kept}"
    )
