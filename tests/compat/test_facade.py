"""custom_fit._compat: custom_fit follows the Keras TensorFlow is configured with, and only _compat knows which.

``make test`` runs the suite twice: on Keras 3, and with ``TF_USE_LEGACY_KERAS=1``
(``tf.keras`` is then ``tf_keras``, Keras 2, while ``import keras`` stays Keras 3).
"""

from __future__ import annotations

import ast
import pathlib
import re

import numpy as np
import pytest
import tensorflow as tf
from tensorflow import keras

import custom_fit


def test_custom_model_subclasses_the_keras_tensorflow_uses():
    assert issubclass(custom_fit.CustomModel, tf.keras.Model)
    assert issubclass(custom_fit.CustomSequential, tf.keras.Sequential)
    assert tf.keras.__name__.startswith("tf_keras") == custom_fit.KERAS_2
    assert custom_fit.KERAS_VERSION.startswith("tf_keras 2." if custom_fit.KERAS_2 else "keras 3.")


def small_model():
    inputs = keras.Input((4,))
    return custom_fit.CustomModel(inputs, keras.layers.Dense(1)(inputs))


def test_per_replica_clipping_is_refused_and_says_why():
    with pytest.raises(
        ValueError,
        match=r"compile\(clip_after_aggregation=False\) asks to clip each replica's gradient.*global gradient"
        r".*received False.*Fix: leave clip_after_aggregation out",
    ):
        small_model().compile(optimizer="sgd", loss="mse", clip_after_aggregation=False)


def test_clip_after_aggregation_true_is_no_longer_needed():
    model = small_model()
    with pytest.warns(DeprecationWarning, match=r"clip_after_aggregation=True\) is no longer needed"):
        model.compile(optimizer="sgd", loss="mse", clip_after_aggregation=True)
    assert "clip_after_aggregation" not in model.get_compile_config()


PACKAGE = pathlib.Path(custom_fit.__file__).parent


def test_compat_defines_no_star_imports():
    """The facade's size is tests/end_to_end/test_layout.py's; here: no module of ``_compat`` star-imports."""
    for path in (PACKAGE / "_compat").glob("*.py"):
        assert "import *" not in path.read_text(), f"{path.name} star-imports"


def test_keras_private_names_appear_only_in_compat():
    """``keras.src``/``tf_keras.src`` imports live in ``custom_fit/_compat`` and nowhere else."""
    for path in PACKAGE.glob("*.py"):
        assert not re.search(r"\b(keras|tf_keras)\.src\b", path.read_text()), path.name


def test_no_import_cycle_between_modules():
    """Module-level imports between custom_fit's modules form no cycle (a DAG)."""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        module = "custom_fit." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        module = module.removesuffix(".__init__")
        imports = set()
        for node in ast.parse(path.read_text()).body:  # module level only, including `if` blocks
            if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
                continue  # annotations only: never imported at run time
            for child in ast.walk(node) if isinstance(node, ast.If) else [node]:
                if isinstance(child, ast.ImportFrom) and child.module and child.module.startswith("custom_fit"):
                    imports.add(child.module)
                    imports |= {f"{child.module}.{a.name}" for a in child.names}
                elif isinstance(child, ast.Import):
                    imports |= {a.name for a in child.names if a.name.startswith("custom_fit")}
        graph[module] = imports
    graph = {m: {i for i in imports if i in graph and i != m} for m, imports in graph.items()}
    # A package imports its own submodules; that is not a cycle.
    graph = {m: {i for i in imports if not m.startswith(i + ".")} for m, imports in graph.items()}
    visiting, done = set(), set()

    def visit(module: str, path: list[str]) -> None:
        if module in done:
            return
        assert module not in visiting, "import cycle: " + " -> ".join([*path, module])
        visiting.add(module)
        for imported in sorted(graph[module]):
            visit(imported, [*path, module])
        visiting.discard(module)
        done.add(module)

    for module in sorted(graph):
        visit(module, [])


def test_public_names_are_declared():
    for name in custom_fit.__all__:
        assert hasattr(custom_fit, name), name
    assert isinstance(custom_fit.KERAS_2, bool)
    assert custom_fit.keras.Model is tf.keras.Model  # the module custom_fit subclasses


def _regularizer_objects(model) -> list:
    """The objects Keras calls to compute weight penalties (Keras 3: ``variable.regularizer``; Keras 2: closures)."""
    if custom_fit.KERAS_2:
        return [loss for layer in model._flatten_layers(include_self=True) for loss in layer._callable_losses]
    return [v.regularizer for v in model.trainable_variables]


def test_custom_fit_changes_keras_and_user_objects_only_while_its_calls_run():
    """The regularizers custom_fit counts while it traces a step are the user's own again after ``fit``."""
    inputs = keras.Input((4,))
    dense = keras.layers.Dense(2, kernel_regularizer=keras.regularizers.L2(0.1), bias_regularizer="l1")
    model = custom_fit.CustomModel(inputs, dense(inputs))
    model.compile(optimizer="sgd", loss="mse")
    before = _regularizer_objects(model)
    model.fit(np.ones((8, 4)), np.zeros((8, 2)), epochs=2, verbose=0)
    assert all(a is b for a, b in zip(_regularizer_objects(model), before, strict=True))
