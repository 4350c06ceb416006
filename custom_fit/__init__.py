"""custom_fit: write your own Keras training step and keep everything ``fit()`` gives you.

Replace ``keras.Model`` with :class:`CustomModel` (or ``keras.Sequential`` with
:class:`CustomSequential`) and call ``compile``/``fit`` as before. The training,
test and predict steps are written out with ``tf.GradientTape`` so they can be
read and overridden, and they match ``keras.Model`` bit for bit on CPU.

custom_fit runs on the Keras TensorFlow is configured with: Keras 3 by
default, Keras 2 (``tf_keras``) when ``TF_USE_LEGACY_KERAS=1`` is set before
TensorFlow loads Keras. :data:`keras` is that module, :data:`KERAS_2` says
whether it is Keras 2 and :data:`KERAS_VERSION` names it, so code can run on
both with ``from custom_fit import keras``.

Example:
    >>> import numpy as np, keras, custom_fit
    >>> model = custom_fit.CustomSequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> model.compile(optimizer="sgd", loss="mse")
    >>> _ = model.fit(np.zeros((4, 2)), np.zeros((4, 1)), verbose=0)
"""

__version__ = "0.2.0"

__all__ = [
    "GAN",
    "KERAS_2",
    "KERAS_VERSION",
    "BackupAndRestore",
    "BackupDirectoryInUseError",
    "BackupStore",
    "CompiledLoss",
    "CompiledMetrics",
    "CustomModel",
    "CustomSequential",
    "DamagedBackupError",
    "DamagedBackupWarning",
    "MissingGradientWarning",
    "NamedOptimizers",
    "Steps",
    "StepsPerExecutionTuner",
    "UnappliedWrapperWarning",
    "UnreviewedKerasWarning",
    "UntrackedVariableWarning",
    "UnusedOptimizerWarning",
    "UnusedRegularizationWarning",
    "__version__",
    "batch_mean",
    "gan",
    "keras",
    "random",
    "regularization_loss",
]

import sys
from typing import Any

# Eager imports: `import custom_fit` loads TensorFlow and Keras and registers custom_fit's classes
# with Keras, so that `keras.models.load_model` finds them after a bare `import custom_fit`.
from custom_fit import _compat, _deprecated, gan, random
from custom_fit._backup_and_restore import BackupAndRestore
from custom_fit._backup_store import (
    BackupDirectoryInUseError,
    BackupStore,
    DamagedBackupError,
    DamagedBackupWarning,
    IncompleteBackupWarning,  # noqa: F401  # DamagedBackupWarning's name before backups carried checksums
)
from custom_fit._compat import KERAS_2, keras
from custom_fit._compat.internals import UnreviewedKerasWarning
from custom_fit._compiled import CompiledLoss, CompiledMetrics
from custom_fit._diagnostics import (
    MissingGradientWarning,
    UntrackedVariableWarning,
    UnusedOptimizerWarning,
    UnusedRegularizationWarning,
)
from custom_fit._losses import batch_mean, regularization_loss
from custom_fit._model import CustomModel, CustomSequential
from custom_fit._optimizers import NamedOptimizers
from custom_fit._tool_wrappers import UnappliedWrapperWarning
from custom_fit._trainer.step_fusion import StepsPerExecutionTuner
from custom_fit._trainer.validation import Steps
from custom_fit.gan import GAN

#: The Keras in use as text: ``"keras 3.15.1"`` or ``"tf_keras 2.21.0"``.
KERAS_VERSION: str = _compat.version.KERAS_VERSION

_deprecated.register_aliases()


def __getattr__(name: str) -> Any:
    """``custom_fit.model`` and the other implementation modules of 0.2, deprecated (``_deprecated``)."""
    if name in _deprecated.RENAMED:
        return sys.modules[f"custom_fit.{name}"]
    raise AttributeError(f"module 'custom_fit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
