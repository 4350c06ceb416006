"""Loss reductions that follow Keras' convention under ``tf.distribute``.

Every Keras loss returns the mean over its batch multiplied by
``1 / num_replicas_in_sync``: each replica's share of the global mean, so that
summing the replicas' gradients gives the gradient of the global mean. A
hand-written ``tf.reduce_mean`` misses that factor, and under
``MirroredStrategy`` its gradients come out ``num_replicas`` times too large.
:meth:`CustomModel.minimize` and :meth:`CustomModel.log_values` expect losses in
Keras' convention; these helpers produce them.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from custom_fit._compat import keras, version


def batch_mean(values: Any, sample_weight: Any = None) -> tf.Tensor:
    """Mean of per-sample ``values`` as this replica's share of the global mean.

    Without a strategy (one replica) this is ``mean(values * sample_weight)``.

    Args:
        values: Per-sample (or per-element) losses, any shape.
        sample_weight: Optional weights broadcastable to ``values``.

    Returns:
        A float32 scalar: the mean, divided by the number of replicas in sync.

    Example:
        >>> import numpy as np, custom_fit
        >>> float(custom_fit.batch_mean(np.array([1.0, 2.0, 3.0])))
        2.0
    """
    values = tf.cast(tf.convert_to_tensor(values), "float32")
    if sample_weight is not None:
        values = values * tf.cast(sample_weight, "float32")
    return version.scale_loss_for_distribution(tf.reduce_mean(values))


def regularization_loss(layer: keras.layers.Layer) -> tf.Tensor:
    """The sum of ``layer.losses`` (weight and activity penalties), scaled like Keras does.

    Keras adds ``model.losses`` to the loss only in ``compute_loss``; a
    multi-loss step adds each sub-model's penalties to the loss that updates
    that sub-model. Returns 0.0 when the layer has none.

    Example:
        >>> import keras, custom_fit
        >>> dense = keras.layers.Dense(2, kernel_regularizer=keras.regularizers.L2(0.5),
        ...                            kernel_initializer="ones")
        >>> dense.build((None, 1))
        >>> float(custom_fit.regularization_loss(dense))
        1.0
    """
    losses = [tf.reduce_sum(tf.cast(loss, "float32")) for loss in layer.losses]
    if not losses:
        return tf.zeros((), "float32")
    return version.scale_loss_for_distribution(tf.reduce_sum(tf.stack(losses)))
