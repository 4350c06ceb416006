"""A ``fit`` on ``CustomModel`` prints nothing to stderr: no TensorFlow, absl or AutoGraph warning.

custom_fit's step calls Python helpers while ``tf.function`` traces it, and
AutoGraph converts each one it reaches. A helper AutoGraph cannot convert makes
it log ``WARNING:tensorflow:AutoGraph could not transform <function ...>`` on
the first ``fit`` of a process (as ``variable_names`` in ``_compat/keras2.py``
did, with an annotated name a nested function assigned: "annotated name 'paths'
can't be nonlocal"). The suite's warning filters do not see it (it is a log line,
not a Python warning), so the fit runs in a subprocess and its stderr is read.

Which lines are TensorFlow's own: TensorFlow prints C++ start-up lines (no CUDA
driver, absl's notice) while it loads, before ``TF_CPP_MIN_LOG_LEVEL=3`` takes
effect, whatever model is used. The script loads TensorFlow, Keras and the
devices first, then writes a marker; everything after the marker comes from the
fit, evaluate and predict of ``CustomModel``, and must be empty but for a
warning the script logs itself through TensorFlow's logger last, which shows
that such a warning would reach this stderr. The subprocess runs the Keras of
this test run: Keras 3, or tf_keras under ``TF_USE_LEGACY_KERAS=1`` (``make test``
runs both).
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest

MARKER = "--- fit starts ---"
OWN_WARNING = "the test's own warning, after the fit"

SCRIPT = f"""
import sys

import numpy as np
import tensorflow as tf

tf.config.list_physical_devices()  # TensorFlow's start-up lines come before the marker
from custom_fit import keras
from custom_fit._model import CustomModel

print({MARKER!r}, file=sys.stderr, flush=True)
inputs = keras.Input((3,))
outputs = keras.layers.Dense(2, activation="softmax")(keras.layers.Dense(4, activation="relu")(inputs))
model = CustomModel(inputs, outputs)
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
x = np.random.default_rng(0).normal(size=(12, 3)).astype("float32")
y = (x[:, 0] > 0).astype("int32")
model.fit(x, y, epochs=2, batch_size=4, validation_split=0.25, verbose=0)
model.evaluate(x, y, verbose=0)
model.predict(x, verbose=0)
tf.get_logger().warning({OWN_WARNING!r})
"""


@pytest.mark.slow
def test_fit_logs_no_warning():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    completed = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    assert completed.returncode == 0, completed.stderr
    assert "AutoGraph could not transform" not in completed.stderr, completed.stderr
    _, marker, after = completed.stderr.partition(MARKER)
    assert marker, completed.stderr
    assert [line for line in after.splitlines() if line.strip()] == [f"WARNING:tensorflow:{OWN_WARNING}"]


def _sum_of_range_in_a_tf_function(n: int) -> int:
    """A ``tf.function`` that loops over a tensor, which only AutoGraph's conversion makes graph code."""
    import tensorflow as tf

    @tf.function
    def total(n):
        result = tf.constant(0)
        for i in tf.range(n):
            result += i
        return result

    return int(total(tf.constant(n)))


# What setup.cfg ignores for the tests (docs/testing.md): Python 3.13's deprecation of AutoGraph's annotation field.
PYCT_ANNO = r"\w+\.__init__ got an unexpected keyword argument '___pyct_anno'"


def test_warnings_as_errors_stop_autograph_on_python_3_13():
    """docs/testing.md: on Python 3.13 warnings as errors make AutoGraph give up, and a loop over a tensor fails;
    ignoring that one deprecation by its message (as setup.cfg does) lets it convert. Earlier Pythons convert."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        if sys.version_info >= (3, 13):
            with pytest.raises(TypeError, match=r"Iterating over a symbolic `tf\.Tensor` is not allowed"):
                _sum_of_range_in_a_tf_function(4)
        else:
            assert _sum_of_range_in_a_tf_function(4) == 6
        warnings.filterwarnings("ignore", message=PYCT_ANNO, category=DeprecationWarning)
        assert _sum_of_range_in_a_tf_function(4) == 6
