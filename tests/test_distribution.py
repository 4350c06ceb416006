"""custom_fit.distribution in this process: variables created outside a replica context.

The strategy cases themselves (variables created outside the replica context, keras.io-style code
under MirroredStrategy and MultiWorkerMirroredStrategy) run in subprocesses: tests/test_distribute.py.
"""

from __future__ import annotations

import tensorflow as tf

from custom_fit import distribution


def test_outside_a_replica_context_variables_are_created_as_usual():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope(), distribution.variables_created_outside_replicas():  # the cross-replica context
        mirrored = tf.Variable(2.0)
    assert isinstance(mirrored, tf.distribute.DistributedValues)
    with distribution.variables_created_outside_replicas():  # no strategy
        plain = tf.Variable(2.0)
    assert not isinstance(plain, tf.distribute.DistributedValues)


def test_a_variable_created_in_a_replica_context_is_mirrored_and_initialised():
    """One replica here (no logical devices in this process); two: tests/test_distribute.py."""
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
