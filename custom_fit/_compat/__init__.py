"""The only place that knows which Keras runs, and Keras' private names.

TensorFlow decides what ``tf.keras`` is: Keras 3 (the ``keras`` package) by
default, Keras 2 (``tf_keras``) when the environment sets
``TF_USE_LEGACY_KERAS=1`` before TensorFlow first loads Keras. custom_fit
follows TensorFlow, so code written against ``tf.keras`` gets a ``CustomModel``
of the same Keras. Everything that differs between the two lives in
:mod:`~custom_fit._compat.keras3` and :mod:`~custom_fit._compat.keras2`, which
define the same names; this package re-exports the one in use, together with
``keras`` itself (the module custom_fit subclasses) and the TensorFlow-only
helpers of :mod:`~custom_fit._compat.common`.

Nothing in this package is public API.
"""

import tensorflow as tf

from custom_fit._compat.common import *  # noqa: F401,F403

if tf.keras.__name__.startswith("tf_keras"):
    from custom_fit._compat.keras2 import *  # noqa: F401,F403
else:
    from custom_fit._compat.keras3 import *  # noqa: F401,F403
