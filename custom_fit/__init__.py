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

import importlib as _importlib
import sys as _sys
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "GAN",
    "KERAS_2",
    "KERAS_VERSION",
    "BackupAndRestore",
    "BackupDirectoryInUseError",
    "CompiledLoss",
    "CompiledMetrics",
    "CustomModel",
    "CustomSequential",
    "IncompleteBackupWarning",
    "MissingGradientWarning",
    "NamedOptimizers",
    "UntrackedVariableWarning",
    "UnusedOptimizerWarning",
    "UnusedRegularizationWarning",
    "__version__",
    "batch_mean",
    "gan",
    "keras",
    "regularization_loss",
]

# The module that defines each public name but `gan` (a submodule).
_DEFINED_IN = {
    "GAN": "custom_fit.gan",
    "KERAS_2": "custom_fit._compat",
    "KERAS_VERSION": "custom_fit._compat",
    "BackupAndRestore": "custom_fit.backup_and_restore",
    "BackupDirectoryInUseError": "custom_fit.backup_store",
    "IncompleteBackupWarning": "custom_fit.backup_store",
    "CompiledLoss": "custom_fit.compiled",
    "CompiledMetrics": "custom_fit.compiled",
    "CustomModel": "custom_fit.model",
    "CustomSequential": "custom_fit.model",
    "MissingGradientWarning": "custom_fit.diagnostics",
    "NamedOptimizers": "custom_fit.optimizers",
    "UntrackedVariableWarning": "custom_fit.diagnostics",
    "UnusedOptimizerWarning": "custom_fit.diagnostics",
    "UnusedRegularizationWarning": "custom_fit.diagnostics",
    "batch_mean": "custom_fit.losses",
    "keras": "custom_fit._compat",
    "regularization_loss": "custom_fit.losses",
}


def _run_as_demo() -> bool:
    """Whether Python imports this package to run ``python -m custom_fit.demo``."""
    # While runpy imports the package of `python -m <module>`, sys.argv[0] is "-m".
    return _sys.argv[:1] == ["-m"] and bool({"custom_fit.demo", "-mcustom_fit.demo"} & set(_sys.orig_argv))


# Why the public names are imported eagerly, but for one case:
# `import custom_fit` loads TensorFlow and Keras and registers custom_fit's classes with Keras, so
# `keras.models.load_model` finds them after a bare `import custom_fit` (Keras imports no other
# package to find a saved class). `python -m custom_fit.demo` is the exception: Python imports
# this package before the demo's first line, and the demo must set up TensorFlow's logging before
# TensorFlow loads (its C++ start-up lines are printed before TF_CPP_MIN_LOG_LEVEL is read). There
# the names stay lazy: `__getattr__` (PEP 562) imports each on first use, and the demo imports
# TensorFlow itself, quietly. Type checkers see the imports and no `__getattr__`, so a misspelt
# name is still an error.
if TYPE_CHECKING or not _run_as_demo():
    from custom_fit import gan
    from custom_fit._compat import KERAS_2, KERAS_VERSION, keras
    from custom_fit.backup_and_restore import BackupAndRestore
    from custom_fit.backup_store import BackupDirectoryInUseError, IncompleteBackupWarning
    from custom_fit.compiled import CompiledLoss, CompiledMetrics
    from custom_fit.diagnostics import (
        MissingGradientWarning,
        UntrackedVariableWarning,
        UnusedOptimizerWarning,
        UnusedRegularizationWarning,
    )
    from custom_fit.gan import GAN
    from custom_fit.losses import batch_mean, regularization_loss
    from custom_fit.model import CustomModel, CustomSequential
    from custom_fit.optimizers import NamedOptimizers

if not TYPE_CHECKING:

    def __getattr__(name: str) -> Any:
        """A public name not imported yet (only under ``python -m custom_fit.demo``): imports it now."""
        if name == "gan":
            return _importlib.import_module("custom_fit.gan")
        if name not in _DEFINED_IN:
            raise AttributeError(f"module 'custom_fit' has no attribute {name!r}")
        value = getattr(_importlib.import_module(_DEFINED_IN[name]), name)
        globals()[name] = value
        return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
