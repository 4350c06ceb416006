"""The only package that knows which Keras runs, and Keras' private names.

TensorFlow decides what ``tf.keras`` is: Keras 3 (the ``keras`` package) by
default, Keras 2 (``tf_keras``) when the environment sets
``TF_USE_LEGACY_KERAS=1`` before TensorFlow first loads Keras. custom_fit
follows TensorFlow, so code written against ``tf.keras`` gets a ``CustomModel``
of the same Keras. Everything that differs between the two lives in
:mod:`~custom_fit._compat.keras3` and :mod:`~custom_fit._compat.keras2`, which
both implement :class:`~custom_fit._compat.contract.KerasVersion` (bodies
they share live once in :mod:`~custom_fit._compat.common`); this package
re-exports the one in use, typed as the contract, together with the shared
helpers the rest of custom_fit calls. Keras-3-only features import :mod:`~custom_fit._compat.keras3_only`
themselves.

Where custom_fit copies, rewrites, replaces or wraps a Keras internal,
:mod:`~custom_fit._compat.internals` lists it with the upstream functions it
was made from, and ``tests/test_keras_internals.py`` fails when the installed
Keras changed one of them since the version it was reviewed against
(docs/keras_internals.md: every copy, what it changes and why).

Nothing in this package is public API.
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

import tensorflow as _tf

from custom_fit._compat import contract
from custom_fit._compat.common import (
    batch_size_of,
    cluster_key_get,
    cluster_key_insert,
    explain_xla_errors,
    is_scalar,
    marked_as,
    record_compile_option,
    recording,
    replica_context_with_peers,
    set_untracked,
    unbuilt_sub_layers,
    variable_names_without_model,
)
from custom_fit._compat.internals import UnreviewedKerasWarning, check_installed

#: Whether ``tf.keras`` is Keras 2 (``tf_keras``, ``TF_USE_LEGACY_KERAS=1``) rather than Keras 3.
KERAS_2: bool = _tf.keras.__name__.startswith("tf_keras")

# Before the version module reads Keras' private names: on a Keras release the recorded hashes do
# not list, say which copied internals changed (a warning) or are gone (an ImportError).
check_installed("tf_keras" if KERAS_2 else "keras")

# The version module in use. `TrainerHooks` (a base class of CustomModel) and `keras` (a module)
# are imported by name, so that type checkers see a class and a module; everything else comes
# from the module typed as the contract (custom_fit._compat.contract.KerasVersion).
if KERAS_2:
    from custom_fit._compat import keras2 as _module
    from custom_fit._compat.keras2 import TrainerHooks, keras
else:
    from custom_fit._compat import keras3 as _module
    from custom_fit._compat.keras3 import TrainerHooks, keras

_version: contract.KerasVersion = _module

if _TYPE_CHECKING:
    from custom_fit._compat import keras3_only  # on Keras 3, loaded by keras3; see __getattr__


def __getattr__(name: str) -> _Any:
    """``keras3_only`` on Keras 2: a Keras-3-only code path was reached, which is a bug in custom_fit."""
    if name == "keras3_only":
        raise AttributeError(
            f"custom_fit._compat.keras3_only is Keras 3's, but this process runs {KERAS_VERSION}: a Keras-3-only "
            "code path of custom_fit ran on Keras 2. Please report it with the traceback."
        )
    raise AttributeError(f"module 'custom_fit._compat' has no attribute {name!r}")


BACKUP_WEIGHTS_FILE = _version.BACKUP_WEIGHTS_FILE
GROUP_COMPILE_KWARGS = _version.GROUP_COMPILE_KWARGS
HAS_COMPILED_LOSS_ATTRIBUTES = _version.HAS_COMPILED_LOSS_ATTRIBUTES
RESUMES_MID_EPOCH = _version.RESUMES_MID_EPOCH
RUNS_OWN_LOOP = _version.RUNS_OWN_LOOP
RESUMES_ONLY_CUSTOM_FIT_MODELS = _version.RESUMES_ONLY_CUSTOM_FIT_MODELS
KERAS_VERSION = _version.KERAS_VERSION
OPTIMIZER_CLASSES = _version.OPTIMIZER_CLASSES
OPTIMIZER_GROUP_KWARGS = _version.OPTIMIZER_GROUP_KWARGS
SAVES_UNCONFIGURABLE_MODELS = _version.SAVES_UNCONFIGURABLE_MODELS
STEP_UPDATES_LOSS_TRACKER = _version.STEP_UPDATES_LOSS_TRACKER
Functional = _version.Functional
LossScaleOptimizer = _version.LossScaleOptimizer
SeedGenerator = _version.SeedGenerator
build_optimizer = _version.build_optimizer
call_accepts_training = _version.call_accepts_training
check_compile_arguments = _version.check_compile_arguments
compiled_metrics_container = _version.compiled_metrics_container
compute_loss_accepts_training = _version.compute_loss_accepts_training
counting_regularizer_calls = _version.counting_regularizer_calls
finish_metrics_result = _version.finish_metrics_result
gradients_already_summed = _version.gradients_already_summed
has_compiled_loss = _version.has_compiled_loss
is_compiled = _version.is_compiled
is_functional_call = _version.is_functional_call
logged_value_entries = _version.logged_value_entries
loss_scaled = _version.loss_scaled
loss_tracker = _version.loss_tracker
make_step_function = _version.make_step_function
mark_built = _version.mark_built
mark_built_if_complete = _version.mark_built_if_complete
call_symbolically = _version.call_symbolically
optimizer_built = _version.optimizer_built
random_normal = _version.random_normal
random_uniform = _version.random_uniform
restore_base_config = _version.restore_base_config
scale_loss = _version.scale_loss
scale_loss_for_distribution = _version.scale_loss_for_distribution
seed_generator_states = _version.seed_generator_states
set_initial_epoch = _version.set_initial_epoch
share_registered_name = _version.share_registered_name
sum_across_replicas = _version.sum_across_replicas
unscale_gradients = _version.unscale_gradients
rescale_gradients = _version.rescale_gradients
with_keras2_api = _version.with_keras2_api
unscale_loss_for_distribution = _version.unscale_loss_for_distribution
untracked_variables = _version.untracked_variables
variable_names = _version.variable_names
variables_built_on = _version.variables_built_on
wrap_for_loss_scaling = _version.wrap_for_loss_scaling

#: The names the rest of custom_fit uses: the contract's, and the shared helpers it calls directly.
__all__ = [
    "BACKUP_WEIGHTS_FILE",
    "GROUP_COMPILE_KWARGS",
    "HAS_COMPILED_LOSS_ATTRIBUTES",
    "KERAS_2",
    "KERAS_VERSION",
    "OPTIMIZER_CLASSES",
    "OPTIMIZER_GROUP_KWARGS",
    "RESUMES_MID_EPOCH",
    "RESUMES_ONLY_CUSTOM_FIT_MODELS",
    "RUNS_OWN_LOOP",
    "SAVES_UNCONFIGURABLE_MODELS",
    "STEP_UPDATES_LOSS_TRACKER",
    "Functional",
    "LossScaleOptimizer",
    "SeedGenerator",
    "TrainerHooks",
    "UnreviewedKerasWarning",
    "batch_size_of",
    "build_optimizer",
    "call_accepts_training",
    "call_symbolically",
    "check_compile_arguments",
    "check_installed",
    "cluster_key_get",
    "cluster_key_insert",
    "compiled_metrics_container",
    "compute_loss_accepts_training",
    "counting_regularizer_calls",
    "explain_xla_errors",
    "finish_metrics_result",
    "gradients_already_summed",
    "has_compiled_loss",
    "is_compiled",
    "is_functional_call",
    "is_scalar",
    "keras",
    "logged_value_entries",
    "loss_scaled",
    "loss_tracker",
    "make_step_function",
    "mark_built",
    "mark_built_if_complete",
    "marked_as",
    "optimizer_built",
    "random_normal",
    "random_uniform",
    "record_compile_option",
    "recording",
    "replica_context_with_peers",
    "rescale_gradients",
    "restore_base_config",
    "scale_loss",
    "scale_loss_for_distribution",
    "seed_generator_states",
    "set_initial_epoch",
    "set_untracked",
    "share_registered_name",
    "sum_across_replicas",
    "unbuilt_sub_layers",
    "unscale_gradients",
    "unscale_loss_for_distribution",
    "untracked_variables",
    "variable_names",
    "variable_names_without_model",
    "variables_built_on",
    "with_keras2_api",
    "wrap_for_loss_scaling",
]
