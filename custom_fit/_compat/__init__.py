"""The only package that knows which Keras runs, and Keras' private names.

TensorFlow decides what ``tf.keras`` is: Keras 3 (the ``keras`` package) by
default, Keras 2 (``tf_keras``) when the environment sets
``TF_USE_LEGACY_KERAS=1`` before TensorFlow first loads Keras. custom_fit
follows TensorFlow, so code written against ``tf.keras`` gets a ``CustomModel``
of the same Keras. Everything that differs between the two lives in
:mod:`~custom_fit._compat.keras3` and :mod:`~custom_fit._compat.keras2`, which
declare the same ``__all__``; this package re-exports the one in use, together
with the helpers of :mod:`~custom_fit._compat.common` that are the same for
both. Keras-3-only features import :mod:`~custom_fit._compat.keras3_only`
themselves.

Where custom_fit copies, rewrites, replaces or wraps a Keras internal,
:mod:`~custom_fit._compat.internals` lists it with the upstream functions it
was made from, and ``tests/test_keras_internals.py`` fails when the installed
Keras changed one of them since the version it was reviewed against
(docs/keras_internals.md: every copy, what it changes and why).

Nothing in this package is public API.
"""

import tensorflow as _tf

from custom_fit._compat import common
from custom_fit._compat.common import (
    CountingCall,
    UntrackedVariable,
    batch_size_of,
    dataset_without_autotuning,
    explain_xla_errors,
    find_untracked_variables,
    is_scalar,
    loss_scaling_twins,
    record_compile_option,
    recording,
    replica_context_with_peers,
    report_execution,
    set_untracked,
    shared_while_inside,
    skippable_aggregation,
    variable_names_without_model,
)

#: Whether ``tf.keras`` is Keras 2 (``tf_keras``, ``TF_USE_LEGACY_KERAS=1``) rather than Keras 3.
KERAS_2: bool = _tf.keras.__name__.startswith("tf_keras")

# Explicit names (no star import) so that readers and type checkers see them;
# tests/test_compat.py checks that both lists equal the modules' `__all__`.
if KERAS_2:
    from custom_fit._compat import keras2 as _selected
    from custom_fit._compat.keras2 import (
        BACKUP_WEIGHTS_FILE,
        CLIPS_AFTER_AGGREGATION,
        GROUP_COMPILE_KWARGS,
        KERAS_VERSION,
        OPTIMIZER_GROUP_KWARGS,
        STEP_UPDATES_LOSS_TRACKER,
        Functional,
        LossScaleOptimizer,
        SeedGenerator,
        TrainerHooks,
        call_accepts_training,
        check_compile_arguments,
        compiled_metrics_container,
        compute_loss_accepts_training,
        counting_regularizer_calls,
        finish_metrics_result,
        gradients_already_summed,
        has_compiled_loss,
        is_compiled,
        is_functional_call,
        keras,
        logged_value_entries,
        loss_scaled,
        loss_tracker,
        make_step_function,
        mark_built,
        mark_built_if_complete,
        optimizer_built,
        random_normal,
        random_uniform,
        scale_loss,
        scale_loss_for_distribution,
        set_initial_epoch,
        share_registered_name,
        sum_across_replicas,
        unscale_gradients,
        unscale_loss_for_distribution,
        untracked_variables,
        variable_names,
        variables_built_on,
        wrap_for_loss_scaling,
    )
else:
    from custom_fit._compat import keras3 as _selected
    from custom_fit._compat.keras3 import (
        BACKUP_WEIGHTS_FILE,
        CLIPS_AFTER_AGGREGATION,
        GROUP_COMPILE_KWARGS,
        KERAS_VERSION,
        OPTIMIZER_GROUP_KWARGS,
        STEP_UPDATES_LOSS_TRACKER,
        Functional,
        LossScaleOptimizer,
        SeedGenerator,
        TrainerHooks,
        call_accepts_training,
        check_compile_arguments,
        compiled_metrics_container,
        compute_loss_accepts_training,
        counting_regularizer_calls,
        finish_metrics_result,
        gradients_already_summed,
        has_compiled_loss,
        is_compiled,
        is_functional_call,
        keras,
        logged_value_entries,
        loss_scaled,
        loss_tracker,
        make_step_function,
        mark_built,
        mark_built_if_complete,
        optimizer_built,
        random_normal,
        random_uniform,
        scale_loss,
        scale_loss_for_distribution,
        set_initial_epoch,
        share_registered_name,
        sum_across_replicas,
        unscale_gradients,
        unscale_loss_for_distribution,
        untracked_variables,
        variable_names,
        variables_built_on,
        wrap_for_loss_scaling,
    )

__all__ = ["KERAS_2", *common.__all__, *_selected.__all__]
