"""Tripwires on the Keras internals custom_fit copies, rewrites, replaces or wraps.

custom_fit reaches into Keras where the public API cannot do what it needs
(docs/keras_internals.md says what each copy changes and why). When Keras
changes one of those functions, nothing fails loudly: a copy keeps the old
logic and parity with ``keras.Model`` drifts. :data:`COPIES` names each copy
and the upstream functions it was made from or depends on; for every
supported Keras and tf_keras version, ``internals_hashes.RECORDED`` holds a
hash of those functions' source as it was reviewed. ``tests/test_keras_internals.py``
hashes the installed source and compares; ``compat/keras_internals.py``
prints the hashes of an installed (or unpacked) Keras and records them.

The hash is of the function's syntax tree, not its text (see
:func:`normalized_source`): reformatting, comments and docstrings do not
change it; any change to the code does.

This module reads source files only (it imports neither Keras nor
TensorFlow), so the maintainer script can hash a wheel unpacked anywhere.

Nothing in this module is public API.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import importlib.util
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

__all__ = [
    "ABSENT",
    "COPIES",
    "Copy",
    "Verdict",
    "check",
    "copies_of",
    "installed_root",
    "normalized_source",
    "source_hash",
    "upstream_hash",
    "version_of",
]

#: The recorded "hash" of functions none of whose names exist in a version.
ABSENT = "absent"

#: Files that hold each package's version string (``__version__ = "..."``).
_VERSION_FILES = {"keras": "keras/src/version.py", "tf_keras": "tf_keras/__init__.py"}


@dataclasses.dataclass(frozen=True)
class Copy:
    """custom_fit code that copies, rewrites, replaces or wraps Keras internals, and what it was made from.

    Attributes:
        id: A short stable name, e.g. ``"k3-make-function"``; the key of the recorded hashes.
        copies: The custom_fit functions, methods or classes (dotted names) made from the upstream code.
        package: ``"keras"`` (Keras 3) or ``"tf_keras"`` (Keras 2).
        upstream: The upstream functions, hashed together in this order. Each
            is ``"module:Qualified.name"``; ``|`` separates names it had in
            other versions (``"module:Old.name|New.name"``, or
            ``"|other.module:Name"``), the first one found is used.
    """

    id: str
    copies: tuple[str, ...]
    package: str
    upstream: tuple[str, ...]

    def upstream_names(self) -> list[str]:
        """Each upstream function as ``module:qualname`` (its first spelling), for messages."""
        return [spec.split("|")[0] for spec in self.upstream]


def _k3(id: str, copies: str | tuple[str, ...], *upstream: str) -> Copy:
    return Copy(id, (copies,) if isinstance(copies, str) else copies, "keras", upstream)


def _k2(id: str, copies: str | tuple[str, ...], *upstream: str) -> Copy:
    return Copy(id, (copies,) if isinstance(copies, str) else copies, "tf_keras", upstream)


# Keras 3.16 renamed the TensorFlow trainer's classes (TensorFlowTrainer -> Trainer,
# the backend-independent Trainer -> BaseTrainer).
_TF_TRAINER = "keras.src.backend.tensorflow.trainer"
_TRAINER = "keras.src.trainers.trainer"


def _tf_trainer(method: str) -> str:
    return f"{_TF_TRAINER}:TensorFlowTrainer.{method}|Trainer.{method}"


def _trainer(method: str) -> str:
    return f"{_TRAINER}:Trainer.{method}|BaseTrainer.{method}"


_MODEL = "custom_fit.model.CustomModel"
_STEPS = "custom_fit.step_functions.StepFunctions"
_K3 = "custom_fit._compat.keras3"
_K3_ONLY = "custom_fit._compat.keras3_only"
_K2 = "custom_fit._compat.keras2"
_CONFIGS = "custom_fit.configs"
_EXTRA_STATE = "custom_fit.extra_state"
_LOGGED = "custom_fit.logged_values.LoggedValuesMixin"
_BATCH_HOOKS = (
    "on_batch_begin",
    "on_batch_end",
    "on_train_batch_begin",
    "on_train_batch_end",
    "on_test_batch_begin",
    "on_test_batch_end",
    "on_predict_batch_begin",
    "on_predict_batch_end",
)
_PROGBAR = "keras.src.callbacks.progbar_logger:ProgbarLogger"
_EPOCH_ITERATOR = "keras.src.trainers.epoch_iterator:EpochIterator"
_PY_DATASET = "keras.src.trainers.data_adapters.py_dataset_adapter:PyDatasetAdapter"
_ARRAYS = "keras.src.trainers.data_adapters.array_data_adapter:ArrayDataAdapter"
_LAYER = "keras.src.layers.layer:Layer"
_MODELS = "keras.src.models.model"
_OPTIMIZER = "keras.src.optimizers.base_optimizer:BaseOptimizer"
_TF_OPTIMIZER = "keras.src.backend.tensorflow.optimizer:TFOptimizer"
_LOSS_SCALE = "keras.src.optimizers.loss_scale_optimizer:LossScaleOptimizer"
_TF_KERAS_MODEL = "tf_keras.src.engine.training:Model"
_TF_KERAS_LAYER = "tf_keras.src.engine.base_layer:Layer"
_TF_KERAS_OPTIMIZER = "tf_keras.src.optimizers.optimizer"

#: Every copy of Keras internals in custom_fit (docs/keras_internals.md says what each one
#: changes and why Keras' own cannot be used; tests/test_keras_internals.py checks the list).
COPIES: tuple[Copy, ...] = (
    # -- Keras 3: the steps and the functions that run them ------------------------------
    _k3("k3-train-step", f"{_MODEL}.train_step", _tf_trainer("train_step")),
    _k3("k3-test-step", f"{_MODEL}.test_step", _tf_trainer("test_step")),
    _k3("k3-predict-step", f"{_MODEL}.predict_step", _tf_trainer("predict_step")),
    _k3("k3-make-function", f"{_K3}.make_step_function", _tf_trainer("_make_function")),
    _k3(
        "k3-make-step-functions",
        (f"{_STEPS}.make_train_function", f"{_STEPS}.make_test_function", f"{_STEPS}.make_predict_function"),
        _tf_trainer("make_train_function"),
        _tf_trainer("make_test_function"),
        _tf_trainer("make_predict_function"),
    ),
    _k3("k3-reduce-per-replica", f"{_K3}._reduce_logs", f"{_TF_TRAINER}:reduce_per_replica"),
    _k3("k3-maybe-symbolic-build", f"{_K3}.TrainerHooks._maybe_symbolic_build", _tf_trainer("_maybe_symbolic_build")),
    _k3("k3-symbolic-build", f"{_K3_ONLY}.build_compiled_state", _trainer("_symbolic_build")),
    _k3("k3-assert-compile-called", f"{_K3}.TrainerHooks._assert_compile_called", _trainer("_assert_compile_called")),
    _k3(
        "k3-metrics-result-or-logs",
        f"{_K3}.TrainerHooks._get_metrics_result_or_logs",
        _trainer("_get_metrics_result_or_logs"),
    ),
    # -- Keras 3: the fit loop and callbacks ----------------------------------------------
    _k3(
        "k3-enumerate-iterator",
        (f"{_K3_ONLY}.steer_epoch_iterator", f"{_K3_ONLY}.set_steps_per_execution"),
        f"{_EPOCH_ITERATOR}._enumerate_iterator",
        f"{_EPOCH_ITERATOR}.catch_stop_iteration",
        f"{_TF_TRAINER}:TFEpochIterator.__next__",
        f"{_TF_TRAINER}:TFEpochIterator.catch_stop_iteration",
    ),
    _k3("k3-tf-epoch-iterator", f"{_K3_ONLY}.without_autotuning", f"{_TF_TRAINER}:TFEpochIterator.__init__"),
    _k3(
        "k3-data-shuffle",
        (f"{_K3_ONLY}.data_epoch", f"{_K3_ONLY}.steer_epoch_iterator", "custom_fit.backup_and_restore.Backup"),
        f"{_PY_DATASET}._finite_generator",
        f"{_PY_DATASET}.on_epoch_begin",
        f"{_PY_DATASET}.on_epoch_end",
        f"{_ARRAYS}.get_tf_dataset",
        f"{_ARRAYS}.on_epoch_end",
    ),
    _k3(
        "k3-fit-evaluate",
        (
            "custom_fit.fit_loop.FitLoopHooks.fit",
            "custom_fit.fit_loop.FitLoopHooks.evaluate",
            "custom_fit.fit_loop.FitLoopHooks.predict",
            "custom_fit.fit_loop.FitLoopHooks.steps_per_execution",
        ),
        _tf_trainer("fit"),
        _tf_trainer("evaluate"),
        _tf_trainer("predict"),
    ),
    _k3(
        "k3-callback-list-batch-hooks",
        "custom_fit.callbacks.LazyCallbackList",
        *(f"keras.src.callbacks.callback_list:CallbackList.{hook}" for hook in _BATCH_HOOKS),
    ),
    _k3(
        "k3-callback-batch-forwarding",
        ("custom_fit.callbacks._implements", "custom_fit.callbacks._BATCH_HOOKS"),
        *(f"keras.src.callbacks.callback:Callback.{hook}" for hook in _BATCH_HOOKS[2:]),
    ),
    _k3(
        "k3-pythonify-logs",
        ("custom_fit.callbacks.LazyLogs", "custom_fit.callbacks._python_value", "custom_fit.callbacks._flat"),
        "keras.src.utils.python_utils:pythonify_logs",
    ),
    _k3(
        "k3-progbar",
        "custom_fit.callbacks.LazyCallbackList._batch_hook",
        f"{_PROGBAR}.on_train_batch_end",
        f"{_PROGBAR}.on_test_batch_end",
        f"{_PROGBAR}._update_progbar",
        "keras.src.utils.progbar:Progbar.update",
    ),
    _k3(
        "k3-initial-epoch",
        f"{_K3}.set_initial_epoch",
        "keras.src.callbacks.backup_and_restore:BackupAndRestore.on_train_begin",
    ),
    _k3(
        "k3-backup-and-restore",
        "custom_fit.backup_and_restore.BackupAndRestore.__init__",
        "keras.src.callbacks.backup_and_restore:BackupAndRestore.__init__",
    ),
    # -- Keras 3: metrics and logs ----------------------------------------------------------
    _k3(
        "k3-get-metrics-result",
        (f"{_LOGGED}.get_metrics_result", f"{_K3}.finish_metrics_result"),
        _trainer("get_metrics_result"),
    ),
    _k3("k3-metrics", f"{_LOGGED}.metrics", _trainer("metrics")),
    _k3(
        "k3-monitor-direction",
        (f"{_K3}.logged_value_entries", f"{_K3}._LoggedValuesList"),
        "keras.src.callbacks.monitor_callback:MonitorCallback._set_monitor_op"
        "|keras.src.callbacks.early_stopping:EarlyStopping._set_monitor_op",
    ),
    # -- Keras 3: losses and compile --------------------------------------------------------
    _k3(
        "k3-compiled-attributes",
        "custom_fit.compiled.CompiledAttributes",
        _tf_trainer("compiled_loss"),
        _tf_trainer("compiled_metrics"),
    ),
    _k3(
        "k3-compute-loss",
        ("custom_fit.compiled.CompiledLoss.__call__", f"{_K3_ONLY}.sum_losses"),
        _trainer("compute_loss"),
    ),
    _k3(
        "k3-aggregate-additional-loss",
        "custom_fit.losses.regularization_loss",
        _tf_trainer("_aggregate_additional_loss"),
    ),
    _k3("k3-compile", f"{_MODEL}.compile", _trainer("compile")),
    _k3(
        "k3-compile-config",
        f"{_CONFIGS}.RecompilesOnLoad",
        _trainer("get_compile_config"),
        _trainer("compile_from_config"),
    ),
    # -- Keras 3: models, layers and saving -------------------------------------------------
    _k3(
        "k3-functional-splice",
        (f"{_MODEL}.__init__", f"{_CONFIGS}.ConfigFromConstructor.__new__", f"{_K3}.is_functional_call"),
        f"{_MODELS}:Model.__new__",
        f"{_MODELS}:functional_init_arguments",
    ),
    _k3(
        "k3-model-config",
        (f"{_CONFIGS}.ConfigFromConstructor.get_config", f"{_CONFIGS}.ConfigFromConstructor.from_config"),
        "keras.src.ops.operation:Operation.get_config",
        f"{_LAYER}.get_config",
        f"{_MODELS}:Model.from_config",
    ),
    _k3(
        "k3-build-config",
        (
            f"{_CONFIGS}.ConfigFromConstructor.get_build_config",
            f"{_CONFIGS}.ConfigFromConstructor.build_from_config",
        ),
        f"{_LAYER}.get_build_config",
        f"{_MODELS}:Model.build_from_config",
    ),
    _k3(
        "k3-own-variables",
        (
            "custom_fit.optimizers.SavesOptimizerAssignment",
            f"{_EXTRA_STATE}.SavesSeedGeneratorStates",
            f"{_EXTRA_STATE}.SavesUntrackedVariables",
        ),
        f"{_LAYER}.save_own_variables",
        f"{_LAYER}.load_own_variables",
    ),
    _k3("k3-default-build", f"{_K3}.mark_built_if_complete", f"{_LAYER}.build"),
    _k3(
        "k3-regularizer-calls",
        (f"{_K3}._count_regularizer_calls", f"{_K3}._restore_regularizers"),
        f"{_LAYER}._get_regularization_losses",
    ),
    _k3(
        "k3-untracked-variables",
        (f"{_K3}.untracked_variables", "custom_fit._compat.common.find_untracked_variables"),
        f"{_LAYER}._initialize_tracker",
    ),
    # -- Keras 3: optimizers ----------------------------------------------------------------
    _k3(
        "k3-all-reduce-sum",
        ("custom_fit._compat.common.skippable_aggregation", f"{_K3}.sum_across_replicas"),
        f"{_TF_OPTIMIZER}._all_reduce_sum_gradients",
        f"{_TF_OPTIMIZER}._backend_update_step",
    ),
    _k3("k3-optimizer-apply", "custom_fit.diagnostics.StepDiagnostics.pair_with_gradients", f"{_OPTIMIZER}.apply"),
    _k3(
        "k3-loss-scale-apply",
        (
            f"{_K3}.unscale_gradients",
            f"{_K3}.rescale_gradients",
            "custom_fit._compat.keras2_idioms.Keras2LossScaleAPI.get_unscaled_gradients",
            "custom_fit._compat.keras2_idioms.Keras2LossScaleAPI.apply_gradients",
        ),
        f"{_LOSS_SCALE}.apply",
        f"{_LOSS_SCALE}._stateful_handle_finite_grads",
    ),
    _k3(
        "k3-named-optimizers",
        ("custom_fit.optimizers.NamedOptimizers.build", "custom_fit.optimizers.NamedOptimizers.learning_rate"),
        f"{_OPTIMIZER}.build",
        f"{_OPTIMIZER}.learning_rate",
    ),
    # -- Keras 2 (tf_keras): the steps and the functions that run them -------------------
    _k2("k2-train-step", f"{_MODEL}.train_step", f"{_TF_KERAS_MODEL}.train_step"),
    _k2("k2-test-step", f"{_MODEL}.test_step", f"{_TF_KERAS_MODEL}.test_step"),
    _k2("k2-predict-step", f"{_MODEL}.predict_step", f"{_TF_KERAS_MODEL}.predict_step"),
    _k2(
        "k2-minimize",
        (f"{_MODEL}.minimize", f"{_K2}.scale_loss", f"{_K2}.unscale_gradients"),
        f"{_TF_KERAS_OPTIMIZER}:_BaseOptimizer.minimize",
        f"{_TF_KERAS_OPTIMIZER}:_BaseOptimizer.compute_gradients",
        "tf_keras.src.mixed_precision.loss_scale_optimizer:LossScaleOptimizerV3.compute_gradients",
    ),
    _k2(
        "k2-make-train-function",
        (f"{_K2}.make_step_function", f"{_STEPS}.make_train_function"),
        f"{_TF_KERAS_MODEL}.make_train_function",
    ),
    _k2(
        "k2-make-test-function",
        (f"{_K2}.make_step_function", f"{_STEPS}.make_test_function"),
        f"{_TF_KERAS_MODEL}.make_test_function",
    ),
    _k2("k2-make-predict-function", f"{_STEPS}.make_predict_function", f"{_TF_KERAS_MODEL}.make_predict_function"),
    _k2("k2-steps-per-execution", f"{_K2}._tuned", "tf_keras.src.engine.data_adapter:DataHandler.steps"),
    _k2(
        "k2-get-data-handler",
        (
            f"{_K2}._install_data_handler",
            f"{_K2}.TrainerHooks.fit",
            f"{_K2}.TrainerHooks.evaluate",
            f"{_K2}.TrainerHooks.predict",
        ),
        "tf_keras.src.engine.data_adapter:get_data_handler",
        f"{_TF_KERAS_MODEL}.fit",
        f"{_TF_KERAS_MODEL}.evaluate",
        f"{_TF_KERAS_MODEL}.predict",
    ),
    _k2("k2-updated-config", f"{_K2}.TrainerHooks._updated_config", f"{_TF_KERAS_MODEL}._updated_config"),
    _k2(
        "k2-assert-compile-called",
        f"{_K2}.TrainerHooks._assert_compile_was_called",
        f"{_TF_KERAS_MODEL}._assert_compile_was_called",
    ),
    _k2(
        "k2-initial-counters",
        (f"{_K2}.TrainerHooks._maybe_load_initial_counters_from_ckpt", f"{_K2}.set_initial_epoch"),
        f"{_TF_KERAS_MODEL}._maybe_load_initial_counters_from_ckpt",
    ),
    _k2("k2-get-optimizer", f"{_K2}.TrainerHooks._get_optimizer", f"{_TF_KERAS_MODEL}._get_optimizer"),
    _k2(
        "k2-backup-and-restore",
        "custom_fit.backup_and_restore.BackupAndRestore.__init__",
        "tf_keras.src.callbacks:BackupAndRestore.__init__",
    ),
    # -- Keras 2: metrics, losses and compile ----------------------------------------------
    _k2("k2-get-metrics-result", f"{_LOGGED}.get_metrics_result", f"{_TF_KERAS_MODEL}.get_metrics_result"),
    _k2("k2-metrics", f"{_LOGGED}.metrics", f"{_TF_KERAS_MODEL}.metrics"),
    _k2(
        "k2-losses-container",
        ("custom_fit.compiled.CompiledLoss", "custom_fit.compiled.CompiledMetrics"),
        "tf_keras.src.engine.compile_utils:LossesContainer.__call__",
        "tf_keras.src.engine.compile_utils:MetricsContainer.update_state",
    ),
    _k2(
        "k2-scale-loss-for-distribution",
        f"{_K2}.unscale_loss_for_distribution",
        "tf_keras.src.utils.losses_utils:scale_loss_for_distribution",
    ),
    _k2("k2-compile", f"{_MODEL}.compile", f"{_TF_KERAS_MODEL}.compile"),
    _k2(
        "k2-compile-config",
        f"{_CONFIGS}.RecompilesOnLoad",
        f"{_TF_KERAS_MODEL}.get_compile_config",
        f"{_TF_KERAS_MODEL}.compile_from_config",
    ),
    # -- Keras 2: models, layers and saving -------------------------------------------------
    _k2(
        "k2-functional-splice",
        (f"{_MODEL}.__init__", f"{_CONFIGS}.ConfigFromConstructor.__new__", f"{_K2}.is_functional_call"),
        f"{_TF_KERAS_MODEL}.__new__",
        "tf_keras.src.engine.training:is_functional_model_init_params",
    ),
    _k2(
        "k2-model-config",
        (
            f"{_K2}.TrainerHooks.get_config",
            f"{_CONFIGS}.ConfigFromConstructor.get_config",
            f"{_CONFIGS}.ConfigFromConstructor.from_config",
        ),
        f"{_TF_KERAS_MODEL}.get_config",
        f"{_TF_KERAS_MODEL}.from_config",
        "tf_keras.src.engine.functional:Functional.get_config",
    ),
    _k2(
        "k2-build-config",
        (
            f"{_CONFIGS}.ConfigFromConstructor.get_build_config",
            f"{_CONFIGS}.ConfigFromConstructor.build_from_config",
        ),
        f"{_TF_KERAS_LAYER}.get_build_config",
        f"{_TF_KERAS_LAYER}.build_from_config",
    ),
    _k2(
        "k2-own-variables",
        ("custom_fit.optimizers.SavesOptimizerAssignment", f"{_EXTRA_STATE}.SavesUntrackedVariables"),
        f"{_TF_KERAS_LAYER}.save_own_variables",
        f"{_TF_KERAS_LAYER}.load_own_variables",
    ),
    _k2("k2-default-build", f"{_K2}.mark_built_if_complete", f"{_TF_KERAS_MODEL}.build"),
    _k2(
        "k2-regularizer-calls",
        (f"{_K2}._count_regularizer_calls", f"{_K2}._restore_penalties"),
        f"{_TF_KERAS_LAYER}._handle_weight_regularization",
    ),
    # -- Keras 2: optimizers ----------------------------------------------------------------
    _k2(
        "k2-aggregate-gradients",
        ("custom_fit._compat.common.skippable_aggregation", f"{_K2}.sum_across_replicas"),
        f"{_TF_KERAS_OPTIMIZER}:Optimizer.aggregate_gradients",
        f"{_TF_KERAS_OPTIMIZER}:Optimizer.apply_gradients",
    ),
    _k2(
        "k2-named-optimizers",
        (
            "custom_fit.optimizers.NamedOptimizers.build",
            "custom_fit.optimizers.NamedOptimizers.learning_rate",
            "custom_fit.optimizers.NamedOptimizers.lr",
        ),
        f"{_TF_KERAS_OPTIMIZER}:_BaseOptimizer.build",
        f"{_TF_KERAS_OPTIMIZER}:_BaseOptimizer.learning_rate",
        f"{_TF_KERAS_OPTIMIZER}:_BaseOptimizer.lr",
    ),
)


def copies_of(package: str) -> list[Copy]:
    """The copies made from ``package`` (``"keras"`` or ``"tf_keras"``)."""
    return [copy for copy in COPIES if copy.package == package]


# --------------------------------------------------------------------------
# Hashing
# --------------------------------------------------------------------------


def _without_docstring(body: list[ast.stmt]) -> list[ast.stmt]:
    first = body[0] if body else None
    is_docstring = (
        isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)
    )
    return body[1:] if is_docstring else body


def _dump(node: object) -> str:
    """A syntax tree as text, the same on Python 3.11 to 3.13 (empty fields and positions left out)."""
    if isinstance(node, ast.AST):
        fields = []
        for name, value in ast.iter_fields(node):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and name == "body":
                value = _without_docstring(value)
            if value is None or value == [] or name == "type_comment":
                continue  # fields newer Pythons add empty (type_params), or that hold no code
            fields.append(f"{name}={_dump(value)}")
        return f"{type(node).__name__}({', '.join(fields)})"
    if isinstance(node, list):
        return "[" + ", ".join(_dump(item) for item in node) + "]"
    return repr(node)


def _find(tree: ast.Module, qualname: str) -> list[ast.AST]:
    """The definitions named ``qualname`` (a property's getter and setter are two), in source order."""
    scope: list[ast.stmt] = tree.body
    *owners, name = qualname.split(".")
    for owner in owners:
        classes = [n for n in scope if isinstance(n, ast.ClassDef) and n.name == owner]
        if not classes:
            return []
        scope = classes[-1].body
    definitions = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return [n for n in scope if isinstance(n, definitions) and n.name == name]


def normalized_source(source: str, qualname: str) -> str | None:
    """The normalized syntax tree of ``qualname``'s definitions in ``source``, or ``None`` if absent.

    Normalized: the tree without positions (line numbers, columns),
    docstrings, comments or formatting, and without the empty fields newer
    Pythons add, so that it is the same text on every supported Python.
    A change to the code (a statement, a name, a default, a decorator)
    changes it; a reformatting, a comment or a docstring does not.

    Example:
        >>> a = normalized_source("def f(x):\\n    '''Doc.'''\\n    return x + 1  # one\\n", "f")
        >>> b = normalized_source("def f(x):   return (x +\\n  1)\\n", "f")
        >>> a == b, a == normalized_source("def f(x):\\n    return x + 2\\n", "f")
        (True, False)
    """
    nodes = _find(ast.parse(source), qualname)
    return "\n".join(_dump(node) for node in nodes) if nodes else None


def source_hash(normalized: Iterable[str | None]) -> str:
    """A short hash of normalized sources (``None``: absent); :data:`ABSENT` when all are absent."""
    parts = list(normalized)
    if all(part is None for part in parts):
        return ABSENT
    text = "\n\n".join(ABSENT if part is None else part for part in parts)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _resolve(spec: str, root: Path) -> str | None:
    """The normalized source of the first spelling of ``spec`` found under ``root``."""
    module = spec.split(":", 1)[0]
    for alternative in spec.split("|"):
        if ":" in alternative:
            module, qualname = alternative.split(":", 1)
        else:
            qualname = alternative
        path = root / Path(*module.split("."))
        file = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        if not file.is_file():
            continue
        found = normalized_source(file.read_text(encoding="utf-8"), qualname)
        if found is not None:
            return found
    return None


def upstream_hash(copy: Copy, root: Path) -> str:
    """The hash of ``copy``'s upstream functions in the sources under ``root``.

    ``root`` is the directory that contains the ``keras`` or ``tf_keras``
    package (site-packages, an unpacked wheel, a git checkout).
    """
    return source_hash(_resolve(spec, root) for spec in copy.upstream)


def installed_root(package: str) -> Path | None:
    """The directory that contains the installed ``package`` (without importing it), or ``None``."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).parent


def version_of(package: str, root: Path) -> str:
    """``package``'s version string as written in its sources under ``root``."""
    text = (root / _VERSION_FILES[package]).read_text(encoding="utf-8")
    found = re.search(r"""^__version__\s*=\s*["']([^"']+)["']""", text, re.MULTILINE)
    if found is None:
        raise ValueError(f"no __version__ in {root / _VERSION_FILES[package]}")
    return found.group(1)


# --------------------------------------------------------------------------
# Verdicts
# --------------------------------------------------------------------------


def _release_key(version: str) -> tuple[tuple[int, ...], int, int]:
    """Orders versions as pip does for the ones Keras publishes (``3.16.0.dev2026102704`` < ``3.16.0``)."""
    found = re.match(r"(\d+(?:\.\d+)*)(?:\.?(dev|rc)(\d+))?", version)
    if found is None:
        raise ValueError(f"cannot order the version {version!r}")
    release = tuple(int(part) for part in found.group(1).split("."))
    stage = {"dev": 0, "rc": 1, None: 2}[found.group(2)]
    return release, stage, int(found.group(3) or 0)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What the tripwire of one copy says about one installed version.

    Attributes:
        ok: Whether the installed upstream source is one the copy was reviewed against.
        message: Why not (names the copy, the upstream functions and how to
            record the hash after re-checking); empty when ``ok``.
        reviewed_as: The recorded version whose hash it was compared with (``None``: none).
    """

    ok: bool
    message: str = ""
    reviewed_as: str | None = None


def check(copy: Copy, version: str, found: str, recorded: Mapping[str, Iterable[str]]) -> Verdict:
    """Compares the hash ``found`` in ``version`` with ``recorded`` (``{hash: versions}``) for ``copy``.

    A recorded version must have its recorded hash. A version not recorded
    (a new release or nightly) passes only if its hash equals the one
    recorded for the nearest older recorded version: the functions did not
    change since a version the copy was reviewed against. A function that
    changed fails until someone re-checks the copy and records the hash.
    """
    by_version = {v: h for h, versions in recorded.items() for v in versions}
    expected: str | None
    reviewed_as: str | None
    if version in by_version:
        expected, reviewed_as = by_version[version], version
    else:
        older = [v for v in by_version if _release_key(v) < _release_key(version)]
        reviewed_as = max(older, key=_release_key) if older else None
        expected = by_version[reviewed_as] if reviewed_as else None
    if found == expected:
        return Verdict(True, reviewed_as=reviewed_as)
    upstream = ", ".join(copy.upstream_names())
    if expected is None:
        seen = f"no hash is recorded for {copy.package} {version} or any older version"
    elif reviewed_as == version:
        seen = f"the recorded hash for {copy.package} {version} is {expected}"
    else:
        seen = (
            f"{copy.package} {version} has no recorded hash, and the nearest older "
            f"reviewed version, {reviewed_as}, had {expected}"
        )
    return Verdict(
        False,
        f"Keras internal changed: {', '.join(copy.copies)} [{copy.id}] was made from {upstream}. "
        f"Its source in the installed {copy.package} {version} hashes to {found}, but {seen}. "
        f"Fix: re-check the copy against the new upstream source (docs/keras_internals.md "
        f"says what it changes and why), then record the reviewed hashes of this version "
        f"with `python compat/keras_internals.py --record`.",
        reviewed_as,
    )
