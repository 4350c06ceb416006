"""custom_fit follows the Keras TensorFlow is configured with; Keras-3-only features say so.

``make test`` runs the suite twice: on Keras 3, and with ``TF_USE_LEGACY_KERAS=1``
(``tf.keras`` is then ``tf_keras``, Keras 2, while ``import keras`` stays Keras 3).
"""

from __future__ import annotations

import ast
import collections
import json
import os
import pathlib
import re
import subprocess
import sys

import keras as keras3
import numpy as np
import pytest
import tensorflow as tf
from tensorflow import keras

import custom_fit
from custom_fit import _compat

KERAS_3_NEEDED = (
    r"needs Keras 3 \(keras>=3.0\); this process runs Keras 2 \(tf_keras [\d.]+\) because TF_USE_LEGACY_KERAS=1"
)


def test_custom_model_subclasses_the_keras_tensorflow_uses():
    assert issubclass(custom_fit.CustomModel, tf.keras.Model)
    assert issubclass(custom_fit.CustomSequential, tf.keras.Sequential)
    assert tf.keras.__name__.startswith("tf_keras") == custom_fit.KERAS_2
    assert custom_fit.KERAS_VERSION.startswith("tf_keras 2." if custom_fit.KERAS_2 else "keras 3.")


def small_model():
    inputs = keras.Input((4,))
    return custom_fit.CustomModel(inputs, keras.layers.Dense(1)(inputs))


@pytest.mark.keras2
def test_keras3_optimizer_with_gradient_accumulation_names_the_keras_version():
    model = small_model()
    with pytest.raises(
        ValueError,
        match=r"An optimizer with gradient_accumulation_steps=4 \(received for CustomModel '.*', a tf_keras model\) "
        + KERAS_3_NEEDED
        + r".*Fix: pass a tf.keras optimizer, e.g. tf.keras.optimizers.Adam\(\) and accumulate gradients in train_step",
    ):
        model.compile(optimizer=keras3.optimizers.Adam(gradient_accumulation_steps=4), loss="mse")


@pytest.mark.keras2
def test_keras3_objects_in_compile_name_the_keras_version():
    model = small_model()
    with pytest.raises(
        ValueError, match=r"The Keras 3 optimizer SGD .*" + KERAS_3_NEEDED + r".*tf.keras.optimizers.SGD\(\)"
    ):
        model.compile(optimizer={"generator": keras3.optimizers.SGD()}, loss="mse")
    with pytest.raises(
        ValueError,
        match=r"The Keras 3 object MeanSquaredError passed as compile\(loss=...\) "
        + KERAS_3_NEEDED
        + r".*Fix: use tf.keras.losses.MeanSquaredError",
    ):
        model.compile(optimizer="sgd", loss=keras3.losses.MeanSquaredError())
    with pytest.raises(ValueError, match=r"compile\(auto_scale_loss=...\) " + KERAS_3_NEEDED + r".*Fix: leave it out"):
        model.compile(optimizer="sgd", loss="mse", auto_scale_loss=False)


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


@pytest.mark.keras2
def test_keras3_tensors_are_rejected_before_keras2_rewrites_the_class():
    inputs = keras3.Input((4,))
    with pytest.raises(
        ValueError,
        match=(
            r"received are Keras 3 tensors \(keras.*KerasTensor, from `import keras`\)\. Expected "
            r"tensors from tf.keras.Input\(...\)\. Fix:"
        ),
    ):
        custom_fit.CustomModel(inputs, keras3.layers.Dense(1)(inputs))
    # The class is intact: a subclass with its own __init__ still works.
    model = small_model()
    model.compile(optimizer="sgd", loss="mse")
    model.fit(np.ones((4, 4)), np.ones((4, 1)), verbose=0)
    assert _compat.version.Functional not in custom_fit.CustomModel.__bases__


PACKAGE = pathlib.Path(custom_fit.__file__).parent


def module_all(name: str) -> list[str]:
    """A ``_compat`` module's ``__all__``, read from its source (importing keras2 or keras3 loads that Keras)."""
    tree = ast.parse((PACKAGE / "_compat" / f"{name}.py").read_text())
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.List)):
            continue
        if [t.id for t in node.targets if isinstance(t, ast.Name)] == ["__all__"]:
            return [ast.literal_eval(element) for element in node.value.elts]
    raise AssertionError(f"custom_fit._compat.{name} has no __all__")


def module_level_names(name: str) -> set[str]:
    tree = ast.parse((PACKAGE / "_compat" / f"{name}.py").read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    return names


def contract_names() -> set[str]:
    """The members of ``custom_fit._compat.contract.KerasVersion``."""
    from custom_fit._compat.contract import KerasVersion

    names = {*vars(KerasVersion), *KerasVersion.__annotations__}  # functions and properties; constants
    return {name for name in names if not name.startswith("_")}


def test_keras_modules_declare_the_contract_names():
    assert set(module_all("keras2")) == set(module_all("keras3")) == contract_names()
    for version in ("keras2", "keras3", "common", "keras3_only"):
        missing = set(module_all(version)) - module_level_names(version)
        assert not missing, f"custom_fit._compat.{version} declares but does not define {sorted(missing)}"


# Run in a process of its own: importing the other Keras' module loads that Keras.
SIGNATURES = """
import inspect, json
from custom_fit._compat import contract, keras2, keras3

def shape(function, drop_self):
    parameters = list(inspect.signature(function).parameters.values())[1 if drop_self else 0 :]
    return [(p.name, p.kind.name, p.default is not inspect.Parameter.empty) for p in parameters]

members = {name: member for name, member in vars(contract.KerasVersion).items() if callable(member)}
found = {}
for module in (keras2, keras3):
    for name, member in members.items():
        if not name.startswith("_"):
            found[f"{module.__name__}.{name}"] = [shape(member, True), shape(getattr(module, name), False)]
print(json.dumps(found))
"""


@pytest.mark.slow
def test_keras_modules_implement_the_contract_signatures():
    """Each function of keras2 and keras3 takes the parameters the contract declares (names, kinds, defaults)."""
    completed = subprocess.run(
        [sys.executable, "-c", SIGNATURES],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(PACKAGE.parent)},
    )
    found = json.loads(completed.stdout.splitlines()[-1])
    assert len(found) == 2 * len([n for n in contract_names() if not n.isupper() and n not in PROPERTIES])
    differing = {name: shapes for name, shapes in found.items() if shapes[0] != shapes[1]}
    assert not differing, f"signatures differ from custom_fit._compat.contract.KerasVersion: {differing}"


#: The contract's read-only members (a class or the module), not functions.
PROPERTIES = {"keras", "Functional", "LossScaleOptimizer", "TrainerHooks"}


def test_compat_defines_no_star_imports():
    """The facade's size is tests/end_to_end/test_layout.py's; here: no module of ``_compat`` star-imports."""
    for path in (PACKAGE / "_compat").glob("*.py"):
        assert "import *" not in path.read_text(), f"{path.name} star-imports"


def test_package_reads_only_contract_names_from_version():
    """``version.X`` outside ``_compat`` names a member of the contract (mypy checks it too)."""
    used = set()
    for path in PACKAGE.glob("*.py"):
        used |= set(re.findall(r"(?<![\w.])version\.(\w+)", path.read_text()))
    assert used and used - contract_names() == set()


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


@pytest.mark.keras2
def test_keras3_only_names_say_so_on_keras2():
    model = small_model()
    model.compile(optimizer="sgd", loss="mse")
    for cls, attribute in (
        (custom_fit.CompiledLoss, "compiled_loss"),
        (custom_fit.CompiledMetrics, "compiled_metrics"),
    ):
        with pytest.raises(
            ValueError,
            match=(
                rf"custom_fit.{cls.__name__} gives Keras 3 models Keras 2's `model.{attribute}`; this "
                rf"process runs Keras 2 \(tf_keras .*Fix: use `model.{attribute}` itself"
            ),
        ):
            cls(model)


def _op_types(graph) -> collections.Counter:
    """Op types in ``graph`` and in every function it calls."""
    counts = collections.Counter(op.type for op in graph.get_operations())
    for function in graph._functions.values():
        if hasattr(function, "graph"):
            counts.update(_op_types(function.graph))
    return counts


@pytest.mark.keras2
@pytest.mark.parametrize("steps_per_execution", [1, 4])
def test_keras2_training_graph_has_the_same_ops_as_tf_keras(steps_per_execution):
    """Speed parity without timing: the traced train function is tf_keras' own, op for op."""
    x, y = np.random.default_rng(0).normal(size=(64, 4)).astype("float32"), np.zeros((64, 1), "float32")
    graphs = {}
    for base in (keras.Model, custom_fit.CustomModel):
        inputs = keras.Input((4,))
        model = base(inputs, keras.layers.Dense(1)(keras.layers.Dense(8, activation="relu")(inputs)))
        model.compile(optimizer="adam", loss="mse", metrics=["mae"], steps_per_execution=steps_per_execution)
        model.fit(x, y, batch_size=16, epochs=1, verbose=0)
        functions = model.train_tf_function._list_all_concrete_functions()
        graphs[base] = (len(functions), sum((_op_types(f.graph) for f in functions), collections.Counter()))
    assert graphs[custom_fit.CustomModel] == graphs[keras.Model]


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
