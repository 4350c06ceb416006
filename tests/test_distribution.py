"""custom_fit._distribution without a strategy: the merge_call error explained, other errors untouched.

The strategy cases themselves (variables created outside the replica context, keras.io-style code
under MirroredStrategy and MultiWorkerMirroredStrategy) run in subprocesses: tests/end_to_end/test_distribute.py.
"""

from __future__ import annotations

import functools
import types

import pytest
import tensorflow as tf

from custom_fit import _distribution as distribution
from custom_fit._compat.common import with_errors_explained

# What TensorFlow 2.21 raises for apply_gradients inside tf.cond under MirroredStrategy (abridged).
TF_MERGE_CALL_ERROR = (
    "`merge_call` called while defining a new graph or a tf.function. This can often happen if the "
    "function `fn` passed to `strategy.run()` contains a nested `@tf.function`, and the nested "
    "`@tf.function` contains a synchronization point, such as aggregating gradients (e.g, "
    "optimizer.apply_gradients), or if the function `fn` uses a control flow statement which contains "
    "a synchronization point in the body. Such behaviors are not yet supported."
)


def fake_model():
    return types.SimpleNamespace(name="accumulating", distribute_strategy=tf.distribute.MirroredStrategy(["/cpu:0"]))


def train_function(model, function):
    """``function`` as the train function runs it: its errors explained by ``explained_merge_call_error``."""
    return with_errors_explained(model, function, functools.partial(distribution.explained_merge_call_error, model))


def raising(error):
    def function(iterator):
        raise error

    return function


def test_apply_gradients_in_a_cond_is_explained_with_the_fix():
    original = RuntimeError(TF_MERGE_CALL_ERROR)
    function = train_function(fake_model(), raising(original))
    with pytest.raises(RuntimeError) as raised:
        function(None)
    message = str(raised.value)
    assert "'accumulating' updates variables across replicas (optimizer.apply_gradients) inside a tf.cond" in message
    assert "Expected every optimizer update to run unconditionally in the step under MirroredStrategy" in message
    assert "Fix: call apply_gradients on every step, outside tf.cond" in message
    assert "pass compile(gradient_accumulation_steps=N) (Keras 3 and Keras 2; CustomModel applies it" in message
    assert raised.value.__cause__ is original


class DecoratedStep:
    """A model whose ``train_step`` is a ``tf.function`` (GRU4Rec's ragged ``input_signature``, TF Privacy's XLA)."""

    name = "decorated"
    distribute_strategy = tf.distribute.MirroredStrategy(["/cpu:0"])

    @tf.function(input_signature=[tf.RaggedTensorSpec([None, None], tf.int32)])
    def train_step(self, data):
        return {}


def test_a_train_step_that_is_a_tf_function_is_named_with_how_to_keep_what_it_was_for():
    original = RuntimeError(TF_MERGE_CALL_ERROR)
    function = train_function(DecoratedStep(), raising(original))
    with pytest.raises(RuntimeError) as raised:
        function(None)
    message = str(raised.value)
    assert message.startswith(
        "The train_step of DecoratedStep 'decorated' is a tf.function (decorated with @tf.function)"
    )
    assert "Expected train_step to be a plain method: fit compiles it into its own tf.function" in message
    assert "Fix: remove @tf.function from train_step." in message
    assert "compile(..., jit_compile=True) compiles fit's step with XLA" in message
    assert (
        "Its input_signature (RaggedTensorSpec(TensorShape([None, None]), tf.int32, 1, tf.int64),) is not needed"
        in message
    )
    assert "tf.cond" not in message and "gradient_accumulation_steps" not in message  # not the fix for this
    assert raised.value.__cause__ is original


def test_a_train_step_compiled_with_xla_is_named_so():
    class WithXla(DecoratedStep):
        @tf.function(jit_compile=True)
        def train_step(self, data):
            return {}

    function = train_function(WithXla(), raising(RuntimeError(TF_MERGE_CALL_ERROR)))
    with pytest.raises(
        RuntimeError, match=r"is a tf.function \(compiled with XLA: @tf.function\(jit_compile=True\)\)"
    ) as raised:
        function(None)
    assert "this one would lose XLA there" in str(raised.value)
    assert "If it was for an input_signature" in str(raised.value)


def test_other_errors_pass_unchanged():
    original = RuntimeError("something else")
    function = train_function(fake_model(), raising(original))
    with pytest.raises(RuntimeError) as raised:
        function(None)
    assert raised.value is original


def test_the_function_result_passes_through():
    function = train_function(fake_model(), lambda iterator: {"loss": 1.0})
    assert function(None) == {"loss": 1.0}


def test_outside_a_replica_context_variables_are_created_as_usual():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope(), distribution.variables_created_outside_replicas():  # the cross-replica context
        mirrored = tf.Variable(2.0)
    assert isinstance(mirrored, tf.distribute.DistributedValues)
    with distribution.variables_created_outside_replicas():  # no strategy
        plain = tf.Variable(2.0)
    assert not isinstance(plain, tf.distribute.DistributedValues)


def test_a_variable_created_in_a_replica_context_is_mirrored_and_initialised():
    """One replica here (no logical devices in this process); two: tests/end_to_end/test_distribute.py."""
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    created: list[tf.Variable] = []

    def step():
        if not created:
            with distribution.variables_created_outside_replicas():
                created.append(tf.Variable(lambda: tf.fill([2], 3.0)))
        return created[0].assign_add(tf.ones([2]))

    @tf.function
    def train():
        return strategy.run(step)

    train()
    assert isinstance(created[0], tf.distribute.DistributedValues)
    assert created[0].numpy().tolist() == [4.0, 4.0]
    train()
    assert created[0].numpy().tolist() == [5.0, 5.0]
