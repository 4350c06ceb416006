"""Training runs under ``tf.distribute`` strategies, each group in a process of its own.

A strategy (and the logical devices it needs) can be set up only once per
process, so the tests start this module as a subprocess, one per group of
cases (so that pytest-xdist can run the groups side by side)::

    python -m tests.strategy_cases mirrored_parity OUT.json   # also mirrored_fusion,
    python -m tests.strategy_cases worker INDEX PORT0,PORT1 OUT.json   # _clipping, _gan
                                                    # mirrored_existing_code; worker_existing_code

and read the measured results (max |delta| between runs, errors raised) from
``OUT.json``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import traceback
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import tensorflow as tf

GLOBAL_BATCH = 16
N_SAMPLES = 96  # six global batches: every batch splits evenly over two replicas
SEED = 2024


def data():
    rng = np.random.default_rng(SEED)
    x = rng.normal(size=(N_SAMPLES + 32, 8)).astype("float32")
    y = (x[:, 0] + x[:, 1] > 0).astype("int32") + (x[:, 2] > 0.5).astype("int32")
    return {
        "x": x[:N_SAMPLES],
        "y": y[:N_SAMPLES],
        "x_val": x[N_SAMPLES:],
        "y_val": y[N_SAMPLES:],
        "sw": rng.uniform(0.2, 2.0, size=N_SAMPLES).astype("float32"),
        "sw_val": rng.uniform(0.2, 2.0, size=32).astype("float32"),
    }


def build(base, kind: str):
    from custom_fit import keras

    inputs = keras.Input((8,))
    reg = (
        dict(kernel_regularizer=keras.regularizers.L2(1e-2), activity_regularizer=keras.regularizers.L1(1e-3))
        if kind == "regularizers"
        else {}
    )
    h = keras.layers.Dense(16, activation="relu", **reg)(inputs)
    if kind == "two_outputs":
        return base(
            inputs,
            {
                "cls": keras.layers.Dense(3, activation="softmax", name="cls")(h),
                "reg": keras.layers.Dense(1, name="reg")(h),
            },
        )
    return base(inputs, keras.layers.Dense(3, activation="softmax")(h))


def compile_kwargs(kind: str, **extra):
    from custom_fit import keras

    if kind == "two_outputs":
        kwargs = dict(
            loss={"cls": "sparse_categorical_crossentropy", "reg": "mse"},
            loss_weights={"cls": 1.0, "reg": 0.5},
            metrics={"cls": ["accuracy"], "reg": ["mae"]},
        )
    else:
        kwargs = dict(
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
            weighted_metrics=["accuracy"] if kind == "sample_weight" else None,
        )
    return dict(optimizer=keras.optimizers.Adam(1e-2), **kwargs, **extra)


def targets(d, kind, split=""):
    y, x = d["y" + split], d["x" + split]
    return {"cls": y, "reg": x[:, :1]} if kind == "two_outputs" else y


def run(base, kind, strategy=None, epochs=3, fit_kwargs=None, **extra_compile):
    """Trains one model; returns weights, history, evaluate and predict as plain lists."""
    from custom_fit import keras

    d = data()
    keras.utils.set_random_seed(SEED)
    with scope_of(strategy):
        model = build(base, kind)
        model.compile(**compile_kwargs(kind, **extra_compile))
    sw = {"sample_weight": d["sw"]} if kind == "sample_weight" else {}
    history = model.fit(
        d["x"],
        targets(d, kind),
        batch_size=GLOBAL_BATCH,
        epochs=epochs,
        shuffle=False,
        verbose=0,
        **sw,
        **{"validation_data": (d["x_val"], targets(d, kind, "_val")), **(fit_kwargs or {})},
    )
    evaluation = model.evaluate(
        d["x_val"], targets(d, kind, "_val"), batch_size=GLOBAL_BATCH, verbose=0, return_dict=True
    )
    prediction = model.predict(d["x_val"], batch_size=GLOBAL_BATCH, verbose=0)
    return {
        "weights": [w.tolist() for w in model.get_weights()],
        "history": history.history,
        "evaluate": {k: float(v) for k, v in evaluation.items()},
        "predict": tf.nest.map_structure(lambda a: np.asarray(a).tolist(), prediction),
    }


def validation_halves(d):
    """The validation data as two named sets of 16 samples each."""
    return {"first": (d["x_val"][:16], d["y_val"][:16]), "second": (d["x_val"][16:], d["y_val"][16:])}


def deltas(a, b):
    """Max |delta| per quantity between two ``run`` results."""
    from tests.parity import max_delta

    return {k: max_delta(a[k], b[k]) for k in ("weights", "history", "evaluate", "predict")}


def attempt(fn):
    """``{"ok": result}`` or ``{"error": "Type: message"}``."""
    try:
        return {"ok": fn()}
    except Exception as error:  # recorded for the test to assert on
        return {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()[-3000:]}


def mirrored_strategy() -> tf.distribute.MirroredStrategy:
    """``MirroredStrategy`` over two logical CPUs (call once per process, before anything runs)."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def mirrored_parity():
    """CustomModel vs keras.Model under the strategy, and vs one device."""
    strategy = mirrored_strategy()
    import custom_fit
    from custom_fit import keras

    results = {"replicas": strategy.num_replicas_in_sync}
    for kind in ("base", "sample_weight", "regularizers", "two_outputs"):
        plain = run(keras.Model, kind, strategy)
        custom = run(custom_fit.CustomModel, kind, strategy)
        single = run(custom_fit.CustomModel, kind)
        results[f"custom_vs_keras/{kind}"] = deltas(plain, custom)
        results[f"mirrored_vs_single/{kind}"] = deltas(single, custom)
        results[f"loss/{kind}"] = {"mirrored": custom["history"]["loss"], "single": single["history"]["loss"]}
    return results


def mirrored_fusion():
    """steps_per_execution under the strategy: plain Keras 3 fails, CustomModel equals one step."""
    strategy = mirrored_strategy()
    import custom_fit
    from custom_fit import keras

    results = {}
    one = run(custom_fit.CustomModel, "base", strategy)
    for spe in (2, 4):
        fused = attempt(lambda spe=spe: run(custom_fit.CustomModel, "base", strategy, steps_per_execution=spe))
        results[f"spe/custom/{spe}"] = deltas(one, fused["ok"]) if "ok" in fused else fused
    plain = attempt(lambda: run(keras.Model, "base", strategy, steps_per_execution=4))
    results["spe/keras/4"] = {"error": plain.get("error", "")} if "error" in plain else {"ok": True}
    # validation_freq=Steps(4): 18 steps, runs after 4, 8, 12, 16; fused executions end at runs.
    every = {"validation_freq": custom_fit.Steps(4)}
    single = run(custom_fit.CustomModel, "base", fit_kwargs=every)
    mirrored = run(custom_fit.CustomModel, "base", strategy, fit_kwargs=every)
    fused = run(custom_fit.CustomModel, "base", strategy, fit_kwargs=every, steps_per_execution=3)
    results["steps/val_step"] = mirrored["history"]["val_step"]
    results["steps/mirrored_vs_single"] = deltas(single, mirrored)
    results["steps/fused_vs_one_step"] = deltas(mirrored, fused)
    # Two named validation sets (the validation data's halves), Steps(4): each as one device, training unchanged.
    named = {**every, "validation_data": validation_halves(data())}
    named_single = run(custom_fit.CustomModel, "base", fit_kwargs=named)
    named_mirrored = run(custom_fit.CustomModel, "base", strategy, fit_kwargs=named)
    named_fused = run(custom_fit.CustomModel, "base", strategy, fit_kwargs=named, steps_per_execution=3)
    results["named/val_keys"] = sorted(name for name in named_mirrored["history"] if name.startswith("val_"))
    results["named/mirrored_vs_single"] = deltas(named_single, named_mirrored)
    results["named/fused_vs_one_step"] = deltas(named_mirrored, named_fused)
    results["named/weights_vs_one_set"] = deltas(mirrored, named_mirrored)["weights"]
    return results


def mirrored_clipping():
    """Optimizer clipping under the strategy: CustomModel clips the global gradient, Keras 3 each replica's."""
    strategy = mirrored_strategy()
    import custom_fit
    from custom_fit import keras
    from tests.parity import max_delta

    def with_opt(base, strategy_, options):
        kwargs = compile_kwargs("base")
        kwargs["optimizer"] = keras.optimizers.SGD(0.5, **options)
        d = data()
        keras.utils.set_random_seed(SEED)
        with strategy_.scope() if strategy_ else tf.distribute.get_strategy().scope():
            model = build(base, "base")
            model.compile(**kwargs)
        model.fit(d["x"], d["y"], batch_size=GLOBAL_BATCH, epochs=2, shuffle=False, verbose=0)
        # custom_fit replaces the optimizer's gradient sum only while it traces a step.
        leftovers.extend(set(vars(model.optimizer)) & {"_all_reduce_sum_gradients", "aggregate_gradients"})
        return [w.tolist() for w in model.get_weights()]

    results: dict = {}
    leftovers: list[str] = []
    clips = {
        "global_clipnorm": dict(global_clipnorm=0.05),
        "clipnorm": dict(clipnorm=0.05),
        "clipvalue": dict(clipvalue=0.01),
    }
    for name, options in clips.items():
        single = with_opt(custom_fit.CustomModel, None, options)
        mirrored = with_opt(custom_fit.CustomModel, strategy, options)
        keras_mirrored = with_opt(keras.Model, strategy, options)
        results[f"clip/{name}"] = {
            "custom_vs_single": max_delta(single, mirrored),
            "keras_vs_single": max_delta(single, keras_mirrored),
        }
    results["optimizer_methods_left_after_fit"] = sorted(leftovers)
    results["overrides"] = apply_gradients_overrides(strategy)
    return results


def apply_gradients_overrides(strategy):
    """Optimizer subclasses that override ``apply_gradients``, under the strategy: max |Δ| to one device, or the error.

    custom_fit tells tf_keras' optimizers not to sum the (summed) gradients again with their own
    argument, which an override must take (or ``**kwargs``) and pass on; Keras 3's have none (its
    sum passes the gradients through while the update is traced), so any override trains.
    """
    import custom_fit
    from custom_fit import keras
    from tests.parity import max_delta

    class PassesKwargsOn(keras.optimizers.SGD):
        def apply_gradients(self, grads_and_vars, **kwargs):
            return super().apply_gradients(grads_and_vars, **kwargs)

    class TakesNoKwargs(keras.optimizers.SGD):
        def apply_gradients(self, grads_and_vars):
            return super().apply_gradients(grads_and_vars)

    def fit_with(optimizer_class, strategy_):
        kwargs = dict(compile_kwargs("base"), optimizer=optimizer_class(0.5))
        d = data()
        keras.utils.set_random_seed(SEED)
        with strategy_.scope() if strategy_ else tf.distribute.get_strategy().scope():
            model = build(custom_fit.CustomModel, "base")
            model.compile(**kwargs)
        model.fit(d["x"], d["y"], batch_size=GLOBAL_BATCH, epochs=2, shuffle=False, verbose=0)
        return [w.tolist() for w in model.get_weights()]

    single = fit_with(keras.optimizers.SGD, None)
    results = {}
    for name, optimizer_class in (("passes_kwargs_on", PassesKwargsOn), ("takes_no_kwargs", TakesNoKwargs)):
        result = attempt(functools.partial(fit_with, optimizer_class, strategy))
        results[name] = max_delta(single, result["ok"]) if "ok" in result else short_error(result)
    return results


@contextlib.contextmanager
def global_policy(policy):
    """Keras' global dtype policy ``policy`` while the block runs, ``float32`` after it."""
    from custom_fit import keras

    keras.mixed_precision.set_global_policy(policy)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy("float32")


def scope_of(strategy):
    """``strategy``'s scope, or the default strategy's (one device) for ``None``."""
    return strategy.scope() if strategy is not None else tf.distribute.get_strategy().scope()


def contract_run(strategy=None, policy="float32", base="custom", learning_rate=0.1, clip=None, epochs=2, scale=1.0):
    """One regression model trained with SGD; the global norm ``transform_gradients`` received at each step.

    ``base`` is ``"custom"`` (a CustomModel recording what its transform
    receives, and clipping it to ``clip`` if given) or ``"keras"``.
    ``learning_rate=0`` keeps the weights, so every step's gradient is the
    same. Returns the norms (one per replica per step, in step order), the
    final weights, how far they moved in total (sum of |delta|) and the
    final loss scale (``None`` without one).
    """
    import custom_fit
    from custom_fit import keras

    norms: list[float] = []

    class Recording(custom_fit.CustomModel):
        def transform_gradients(self, grads_and_vars):
            norm = tf.linalg.global_norm([g for g, _ in grads_and_vars])
            tf.py_function(lambda n: norms.append(float(n)), [norm], [])
            if clip is not None:
                grads_and_vars = [(tf.clip_by_norm(g, clip), v) for g, v in grads_and_vars]
            return grads_and_vars

    d = data()
    with global_policy(policy):
        keras.utils.set_random_seed(SEED)
        with scope_of(strategy):
            inputs = keras.Input((8,))
            hidden = keras.layers.Dense(16, activation="relu")(inputs)
            model = (keras.Model if base == "keras" else Recording)(
                inputs, keras.layers.Dense(1, dtype="float32")(hidden)
            )
            model.compile(optimizer=keras.optimizers.SGD(learning_rate), loss="mse")
        initial = model.get_weights()
        y = d["y"].astype("float32")[:, None]
        model.fit(d["x"] * scale, y, batch_size=GLOBAL_BATCH, epochs=epochs, shuffle=False, verbose=0)
    weights = model.get_weights()
    optimizer = model.optimizer
    loss_scale = getattr(optimizer, "dynamic_scale", None)
    if loss_scale is None:
        loss_scale = getattr(optimizer, "loss_scale", None)  # tf_keras
    return {
        "norms": norms,
        "weights": [w.tolist() for w in weights],
        "moved": float(sum(np.abs(w - w0).sum() for w, w0 in zip(weights, initial, strict=True))),
        "loss_scale": None if loss_scale is None else float(np.asarray(loss_scale.numpy())),
    }


def mirrored_contract():
    """What ``transform_gradients`` receives under the strategy (float32, mixed_float16) vs one device."""
    strategy = mirrored_strategy()
    from tests.parity import max_delta

    results: dict = {"replicas": strategy.num_replicas_in_sync}
    for policy in ("float32", "mixed_float16"):
        single = contract_run(None, policy, learning_rate=0.0, epochs=1, scale=10.0)
        mirrored = contract_run(strategy, policy, learning_rate=0.0, epochs=1, scale=10.0)
        results[f"norms/{policy}"] = {"single": single["norms"], "mirrored": mirrored["norms"]}
        custom = contract_run(strategy, policy)
        plain = contract_run(strategy, policy, base="keras")
        results[f"custom_vs_keras/{policy}"] = max_delta(custom["weights"], plain["weights"])
        clipped_single = contract_run(None, policy, clip=0.5)
        clipped_mirrored = contract_run(strategy, policy, clip=0.5)
        results[f"clip/{policy}"] = {
            "mirrored_vs_single": max_delta(clipped_single["weights"], clipped_mirrored["weights"]),
            "moved_single": clipped_single["moved"],
            "moved_mirrored": clipped_mirrored["moved"],
        }
    return results


def accumulation_run(
    strategy=None, optimizer="sgd", policy="float32", steps_per_execution=1, named=False, scale=1.0, base=None
):
    """A model trained with gradient accumulation, 3 epochs of 6 steps.

    ``optimizer``: ``"sgd"`` (SGD, 4 steps) or ``"adam"`` (Adam with
    ``global_clipnorm``, 3 steps); ``named``: a two-member group (Adam for
    the hidden layer, SGD for the output layer) in a step with one
    ``minimize`` per member, over 3 and 2 steps on Keras 3, 3 each on Keras 2.
    Keras 3: the optimizers' ``gradient_accumulation_steps``; Keras 2:
    ``compile(gradient_accumulation_steps=N)`` (tf_keras' optimizers have none); ``scale`` multiplies the inputs (large
    values overflow float16 gradients: the loss-scale optimizer skips steps).
    Returns the weights, the history, the optimizers' variables (the
    accumulators and the counter of accumulated steps included) and the
    loss scale. ``base``: the model's class (default ``CustomModel``).
    """
    import custom_fit
    from custom_fit import keras

    def accumulating(steps):  # as the optimizer's argument (Keras 3) or compile's (Keras 2)
        return {} if custom_fit.KERAS_2 else {"gradient_accumulation_steps": steps}

    def make(kind):
        if kind == "sgd":
            return keras.optimizers.SGD(0.1, momentum=0.5, **accumulating(4))
        return keras.optimizers.Adam(0.01, global_clipnorm=0.5, **accumulating(3))

    on_compile = {"gradient_accumulation_steps": 3 if named or optimizer == "adam" else 4} if custom_fit.KERAS_2 else {}

    class TwoMembers(custom_fit.CustomModel):
        logged_values = ("loss",)

        def train_step(self, data):
            x, y = data
            with tf.GradientTape(persistent=True) as tape:
                loss = custom_fit.batch_mean(keras.losses.mean_squared_error(y, self(x, training=True)))
            self.minimize(loss, tape, self.layers[1].trainable_variables, optimizer="hidden")
            self.minimize(loss, tape, self.layers[2].trainable_variables, optimizer="out")
            self.log_values(x, loss=loss)
            return self.get_metrics_result()

    d = data()
    with global_policy(policy):
        keras.utils.set_random_seed(SEED)
        with scope_of(strategy):
            inputs = keras.Input((8,))
            hidden = keras.layers.Dense(16, activation="tanh")(inputs)
            outputs = keras.layers.Dense(1, dtype="float32")(hidden)
            if named:
                model = TwoMembers(inputs, outputs)
                group = {"hidden": make("adam"), "out": keras.optimizers.SGD(0.05, **accumulating(2))}
                model.compile(optimizer=group, steps_per_execution=steps_per_execution, **on_compile)
            else:
                model = (base or custom_fit.CustomModel)(inputs, outputs)
                model.compile(
                    optimizer=make(optimizer), loss="mse", steps_per_execution=steps_per_execution, **on_compile
                )
        y = (d["y"].astype("float32") - 1.0)[:, None]
        history = model.fit(d["x"] * scale, y, batch_size=GLOBAL_BATCH, epochs=3, shuffle=False, verbose=0)
    optimizer = model.optimizer
    members = list(getattr(optimizer, "optimizers", [optimizer]))
    scale = getattr(optimizer, "dynamic_scale", None)
    if scale is None:
        scale = getattr(optimizer, "loss_scale", None)  # tf_keras
    return {
        "weights": [w.tolist() for w in model.get_weights()],
        "history": history.history,
        "optimizer": [np.asarray(v.numpy()).tolist() for member in members for v in member.variables],
        "loss_scale": None if scale is None else float(np.asarray(scale.numpy())),
        "iterations": [int(member.iterations.numpy()) for member in members],
    }


def mirrored_accumulation():
    """Gradient accumulation under the strategy vs one device (see ``accumulation_run``)."""
    strategy = mirrored_strategy()
    from tests.parity import max_delta

    results: dict[str, Any] = {}
    cases: dict[str, dict[str, Any]] = {
        "sgd": {"optimizer": "sgd"},
        "adam": {"optimizer": "adam"},
        "named": {"named": True},
        "adam/mixed_float16": {"optimizer": "adam", "policy": "mixed_float16"},
        # inputs x 3000: float16 gradients overflow at the first scales, so steps are skipped
        "sgd/mixed_float16/skips": {"optimizer": "sgd", "policy": "mixed_float16", "scale": 3000.0},
    }
    for name, kwargs in cases.items():
        single = accumulation_run(None, **kwargs)
        mirrored = attempt(lambda kwargs=kwargs: accumulation_run(strategy, **kwargs))
        if "error" in mirrored:
            results[name] = mirrored
            continue
        mirrored = mirrored["ok"]
        fused = accumulation_run(strategy, steps_per_execution=3, **kwargs)
        results[name] = {
            "vs_single": {k: max_delta(single[k], mirrored[k]) for k in ("weights", "history", "optimizer")},
            "fused_vs_one_step": {k: max_delta(mirrored[k], fused[k]) for k in ("weights", "history", "optimizer")},
            "loss_scale": [single["loss_scale"], mirrored["loss_scale"]],
            "iterations": [single["iterations"], mirrored["iterations"]],
        }
    import custom_fit

    if not custom_fit.KERAS_2:  # Keras 3's own option on keras.Model (tf_keras' optimizers have none)
        from custom_fit import keras

        plain = attempt(lambda: accumulation_run(strategy, base=keras.Model))
        results["keras.Model/sgd"] = plain.get("error", "ok")[:3000]
    return results


def mirrored_gan():
    """A GAN (two named optimizers, seeded noise, steps_per_execution=2): the strategy vs one device."""
    strategy = mirrored_strategy()
    import custom_fit
    from custom_fit import keras
    from tests.parity import max_delta

    def gan_run(strategy_):
        keras.utils.set_random_seed(SEED)
        with strategy_.scope() if strategy_ else tf.distribute.get_strategy().scope():
            generator = keras.Sequential(
                [keras.Input((4,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(8)]
            )
            discriminator = keras.Sequential(
                [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)]
            )
            gan = custom_fit.GAN(generator, discriminator, latent_dim=4, seed=SEED)
            gan.compile(steps_per_execution=2)
        history = gan.fit(data()["x"], batch_size=GLOBAL_BATCH, epochs=2, shuffle=False, verbose=0)
        return {
            "weights": [w.tolist() for w in gan.get_weights()],
            "history": history.history,
            "iterations": {n: int(gan.optimizer[n].iterations.numpy()) for n in ("generator", "discriminator")},
        }

    gan_mirrored = attempt(lambda: gan_run(strategy))
    if "error" in gan_mirrored:
        return {"gan": gan_mirrored}
    gan_single = gan_run(None)
    return {
        "gan": {
            "weights": max_delta(gan_single["weights"], gan_mirrored["ok"]["weights"]),
            "history": max_delta(gan_single["history"], gan_mirrored["ok"]["history"]),
            "iterations": gan_mirrored["ok"]["iterations"],
        }
    }


# --------------------------------------------------------------------------
# Existing code (tests/existing_code.py) under the strategies
# --------------------------------------------------------------------------


def existing_code_run(name, base, strategy=None, prebuild=False, epochs=2, **extra_compile):
    """Builds, compiles and fits pattern ``name`` on ``base``, as its author would; weights and history.

    ``prebuild``: apply the manual workaround first (``existing_code.PREBUILD``).
    ``extra_compile`` goes to the pattern's own ``compile`` (e.g. ``steps_per_execution``).
    """
    import warnings

    from custom_fit import keras
    from tests import existing_code

    pattern = existing_code.pattern(name, base)
    keras.utils.set_random_seed(SEED)
    fit_arguments = pattern.fit()
    with (strategy or tf.distribute.get_strategy()).scope():
        model = pattern.make()
        model.compile(**pattern.compile(), **extra_compile)
        if prebuild:
            existing_code.PREBUILD[name](model, fit_arguments)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # keras.Model's deprecation warnings for Keras-2-style steps
        history = model.fit(**fit_arguments, epochs=epochs, shuffle=False, verbose=0)
    return {
        "weights": [w.tolist() for w in model.get_weights()],
        "history": {k: [float(v) for v in values] for k, values in history.history.items()},
    }


def short_error(result):
    """An ``attempt``'s error in a line (or ``"ok"``): its first line, and the telling one if that is generic."""
    if "ok" in result:
        return "ok"
    lines = [line.strip() for line in result["error"].splitlines() if line.strip()]
    if lines[0].endswith(":"):  # "Graph execution error:", "in user code:"
        markers = ("Detected at node", "Please use", "merge_call")
        telling = [line for line in lines if any(marker in line for marker in markers)] or lines[-1:]
        return f"{lines[0]} ... {telling[0]}"[:400]
    return lines[0][:400]


def existing_code_deltas(reference, custom, drop=()):
    """Max |delta| of weights and history (keys in ``drop`` left out) between two runs.

    History keys only one run logged are listed (``only_in_reference`` / ``only_in_custom``) and
    left out of the history delta.
    """
    from tests.parity import max_delta

    history = {k: v for k, v in reference["history"].items() if k not in drop}
    other = {k: v for k, v in custom["history"].items() if k not in drop}
    common = sorted(set(history) & set(other))
    deltas: dict[str, Any] = {
        "weights": max_delta(reference["weights"], custom["weights"]),
        "history": max_delta({k: history[k] for k in common}, {k: other[k] for k in common}),
    }
    if set(history) - set(other):
        deltas["only_in_reference"] = sorted(set(history) - set(other))
    if set(other) - set(history):
        deltas["only_in_custom"] = sorted(set(other) - set(history))
    return deltas


#: Keras-2-style steps (``self.compiled_loss`` / ``self.compiled_metrics``): keras.Model on Keras 3
#: logs the mean prediction as ``loss`` (or 0.0), and Keras 3.8 drops their ``val_`` metrics.
KERAS_2_STYLE_STEPS = {
    "guide_keras2",
    "sam",
    "distiller",
    "self_trainer",
    "masked_autoencoder",
    "gradient_accumulation",
}


def mirrored_existing_code():
    """Every pattern under MirroredStrategy: CustomModel, keras.Model, and the manual workaround.

    For each pattern: whether ``keras.Model`` and ``CustomModel`` train, and
    CustomModel's max |delta| from the reference: ``keras.Model`` where it
    trains, else ``keras.Model`` with the manual workaround
    (``existing_code.PREBUILD``). The patterns only this group runs are
    also compared with ``keras.Model`` on one device. Then ``steps_per_execution``
    2 and ``"auto"`` against 1, and what a hand-written ``tf.reduce_mean`` loss
    means under two replicas.
    """
    strategy = mirrored_strategy()
    tf.config.optimizer.set_experimental_options({"arithmetic_optimization": False})  # see conftest
    import custom_fit
    from custom_fit import keras
    from tests import existing_code

    results = {"replicas": strategy.num_replicas_in_sync}
    runs = {}
    for name in existing_code.ALL_PATTERNS:
        drop = ("loss", "val_loss") if name in KERAS_2_STYLE_STEPS and not custom_fit.KERAS_2 else ()
        row = {}
        if name in existing_code.MORE_PATTERNS:
            plain = attempt(lambda name=name: existing_code_run(name, keras.Model))
            custom = attempt(lambda name=name: existing_code_run(name, custom_fit.CustomModel))
            row["single"] = existing_code_deltas(plain["ok"], custom["ok"], drop) if "ok" in plain else plain
        custom = attempt(lambda name=name: existing_code_run(name, custom_fit.CustomModel, strategy))
        plain = attempt(lambda name=name: existing_code_run(name, keras.Model, strategy))
        row["custom"], row["keras"] = short_error(custom), short_error(plain)
        if "error" in custom:
            row["custom_error"], row["custom_traceback"] = custom["error"], custom["traceback"]
            reference = None
        elif "ok" in plain:
            row["reference"], reference = "keras.Model", plain
        elif name in existing_code.PREBUILD:
            reference = attempt(lambda name=name: existing_code_run(name, keras.Model, strategy, prebuild=True))
            row["reference"] = "keras.Model with the workaround"
            row["keras_with_workaround"] = short_error(reference)
        else:
            reference = None
        if reference is not None and "ok" in custom and "ok" in reference:
            row["vs_reference"] = existing_code_deltas(reference["ok"], custom["ok"], drop)
        runs[name] = custom
        results[f"pattern/{name}"] = row

    fused: dict[str, tuple[int | str, ...]] = {"masked_autoencoder": (2,), "vae": ("auto",)}
    if not custom_fit.KERAS_2:  # tf_keras refuses SimCLR's loss objects under a strategy
        fused["simclr"] = (2, "auto")
    for name, choices in fused.items():
        for steps in choices:
            run_ = attempt(
                lambda name=name, steps=steps: existing_code_run(
                    name, custom_fit.CustomModel, strategy, steps_per_execution=steps
                )
            )
            ok = "ok" in run_ and "ok" in runs[name]
            results[f"fused/{name}/{steps}"] = existing_code_deltas(runs[name]["ok"], run_["ok"]) if ok else run_
    results["handwritten_loss"] = handwritten_loss(strategy)
    results["decorated_step"] = decorated_step(strategy)
    return results


def decorated_step(strategy):
    """A ``train_step`` decorated with ``@tf.function`` (plain, and ``jit_compile=True`` as TF Privacy's), as
    Keras 2 code wrote it, under the strategy: each base's history and weights, or its error; and undecorated."""
    import custom_fit
    from custom_fit import keras

    d = data()
    x, y = d["x"][:GLOBAL_BATCH], d["x"][:GLOBAL_BATCH, :1]

    def step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compute_loss(x, y, self(x, training=True))
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(gradients, self.trainable_variables, strict=True))
        return {"loss": loss}

    def fit(base, decorate):
        keras.utils.set_random_seed(SEED)
        with strategy.scope():
            inputs = keras.Input((8,))
            model = type("Decorated", (base,), {"train_step": decorate(step)})(inputs, keras.layers.Dense(1)(inputs))
            model.compile(optimizer="sgd", loss="mse")
        history = model.fit(x, y, batch_size=GLOBAL_BATCH // 2, epochs=2, shuffle=False, verbose=0).history
        return {"history": history, "weights": [w.tolist() for w in model.get_weights()]}

    decorators = {
        "tf.function": tf.function,
        "tf.function(jit_compile=True)": tf.function(jit_compile=True),
        "undecorated": lambda function: function,
    }
    return {
        f"{base.__name__}/{label}": attempt(lambda base=base, decorate=decorate: fit(base, decorate))
        for base in (keras.Model, custom_fit.CustomModel)
        for label, decorate in decorators.items()
    }


def handwritten_loss(strategy):
    """One SGD step of a hand-written ``tf.reduce_mean`` loss (and of ``custom_fit.batch_mean``).

    Returns, per base class and loss, the update under the strategy divided
    by the update on one device (on the same global batch): the number of
    replicas for ``tf.reduce_mean``, 1 for the replica-correct loss.
    """
    import custom_fit
    from custom_fit import keras

    d = data()
    x, y = d["x"][:GLOBAL_BATCH], d["x"][:GLOBAL_BATCH, :1]

    def make(base: type, reduce):
        class Regression(base):
            def train_step(self, data):
                x, y = data
                with tf.GradientTape() as tape:
                    loss = reduce(tf.square(y - self(x, training=True)))
                gradients = tape.gradient(loss, self.trainable_variables)
                self.optimizer.apply_gradients(zip(gradients, self.trainable_variables, strict=True))
                return {"loss": loss}

        inputs = keras.Input((8,))
        return Regression(inputs, keras.layers.Dense(1, kernel_initializer="ones")(inputs))

    def update(base, reduce, strategy_):
        with (strategy_ or tf.distribute.get_strategy()).scope():
            model = make(base, reduce)
            model.compile(optimizer=keras.optimizers.SGD(0.01))
        before = model.get_weights()[0]
        model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=1, shuffle=False, verbose=0)
        return model.get_weights()[0] - before

    def global_mean(values):  # tf.nn.compute_average_loss with the global batch size
        per_sample = tf.reduce_mean(values, axis=-1)
        return tf.nn.compute_average_loss(per_sample, global_batch_size=GLOBAL_BATCH)

    ratios = {}
    for base in (keras.Model, custom_fit.CustomModel):
        for loss_name, reduce in (
            ("reduce_mean", tf.reduce_mean),
            ("batch_mean", custom_fit.batch_mean),
            ("compute_average_loss", global_mean),
        ):
            ratio = update(base, reduce, strategy) / update(base, reduce, None)
            ratios[f"{base.__name__}/{loss_name}"] = [float(ratio.min()), float(ratio.max())]
    return ratios


def worker(index: int, ports: list[int]):
    """One of two ``MultiWorkerMirroredStrategy`` workers, training on its own shard."""
    os.environ["TF_CONFIG"] = json.dumps(
        {
            "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
            "task": {"type": "worker", "index": index},
        }
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    import custom_fit
    from custom_fit import keras

    d = data()

    def shard(context: tf.distribute.InputContext):
        per_replica = context.get_per_replica_batch_size(GLOBAL_BATCH)
        dataset = tf.data.Dataset.from_tensor_slices((d["x"], d["y"]))
        # repeat(): tf_keras keeps one iterator across epochs when steps_per_epoch is set.
        return dataset.shard(context.num_input_pipelines, context.input_pipeline_id).batch(per_replica).repeat()

    keras.utils.set_random_seed(SEED)
    with strategy.scope():
        model = build(custom_fit.CustomModel, "base")
        model.compile(**compile_kwargs("base"))
    history = model.fit(
        strategy.distribute_datasets_from_function(shard),
        epochs=3,
        steps_per_epoch=N_SAMPLES // GLOBAL_BATCH,
        verbose=0,
    )
    evaluation = model.evaluate(d["x_val"], d["y_val"], batch_size=GLOBAL_BATCH, verbose=0, return_dict=True)

    # The same with NumPy input (Keras shards it) and with plain keras.Model.
    def numpy_fit(base, **fit_kwargs):
        keras.utils.set_random_seed(SEED)
        with strategy.scope():
            model = build(base, "base")
            model.compile(**compile_kwargs("base"))
        history = model.fit(d["x"], d["y"], batch_size=GLOBAL_BATCH, epochs=3, shuffle=False, verbose=0, **fit_kwargs)
        return [w.tolist() for w in model.get_weights()], history.history

    plain = attempt(lambda: numpy_fit(keras.Model))
    # validation_freq=Steps(4) on both workers (18 steps: runs after 4, 8, 12, 16).
    steps_weights, steps_history = numpy_fit(
        custom_fit.CustomModel, validation_data=(d["x_val"], d["y_val"]), validation_freq=custom_fit.Steps(4)
    )
    # Two named validation sets (the validation data's halves), Steps(4), on both workers.
    named_weights, named_history = numpy_fit(
        custom_fit.CustomModel, validation_data=validation_halves(d), validation_freq=custom_fit.Steps(4)
    )
    # Gradient accumulation: Adam over 3 steps on both workers.
    accumulation = accumulation_run(strategy, "adam")
    return {
        "accumulation": accumulation,
        "steps": {"weights": steps_weights, "history": steps_history},
        "named": {"weights": named_weights, "history": named_history},
        "numpy_weights": numpy_fit(custom_fit.CustomModel)[0],
        "keras_model": {"error": plain["error"]} if "error" in plain else {"ok": True},
        "evaluate": {k: float(v) for k, v in evaluation.items()},
        "workers": strategy.cluster_resolver.cluster_spec().num_tasks("worker"),
        "replicas": strategy.num_replicas_in_sync,
        "weights": [w.tolist() for w in model.get_weights()],
        "history": history.history,
    }


#: Patterns the two MultiWorkerMirroredStrategy workers train: a GAN with a nested tape, a
#: distiller, self-supervised models (SimCLR's sub-models are built by its step).
WORKER_PATTERNS = ("wgan_gp", "distiller", "simsiam", "simclr")


def worker_existing_code(index: int, ports: list[int]):
    """One of two ``MultiWorkerMirroredStrategy`` workers training ``WORKER_PATTERNS`` with CustomModel."""
    os.environ["TF_CONFIG"] = json.dumps(
        {
            "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
            "task": {"type": "worker", "index": index},
        }
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    tf.config.optimizer.set_experimental_options({"arithmetic_optimization": False})
    import custom_fit

    results = {"workers": strategy.cluster_resolver.cluster_spec().num_tasks("worker")}
    for name in WORKER_PATTERNS:
        run_ = attempt(lambda name=name: existing_code_run(name, custom_fit.CustomModel, strategy))
        results[name] = run_ if "ok" in run_ else {"error": short_error(run_), "traceback": run_["traceback"]}
    return results


def single_process_reference():
    """The same training as the workers', in one process on the global batch."""
    import custom_fit

    d = data()
    from custom_fit import keras

    keras.utils.set_random_seed(SEED)
    model = build(custom_fit.CustomModel, "base")
    model.compile(**compile_kwargs("base"))
    history = model.fit(d["x"], d["y"], batch_size=GLOBAL_BATCH, epochs=3, shuffle=False, verbose=0)
    evaluation = model.evaluate(d["x_val"], d["y_val"], batch_size=GLOBAL_BATCH, verbose=0, return_dict=True)
    keras.utils.set_random_seed(SEED)
    steps = build(custom_fit.CustomModel, "base")
    steps.compile(**compile_kwargs("base"))
    steps_history = steps.fit(
        d["x"], d["y"], batch_size=GLOBAL_BATCH, epochs=3, shuffle=False, verbose=0,
        validation_data=(d["x_val"], d["y_val"]), validation_freq=custom_fit.Steps(4),
    )  # fmt: skip
    keras.utils.set_random_seed(SEED)
    named = build(custom_fit.CustomModel, "base")
    named.compile(**compile_kwargs("base"))
    named_history = named.fit(
        d["x"], d["y"], batch_size=GLOBAL_BATCH, epochs=3, shuffle=False, verbose=0,
        validation_data=validation_halves(d), validation_freq=custom_fit.Steps(4),
    )  # fmt: skip
    return {
        "weights": [w.tolist() for w in model.get_weights()],
        "history": history.history,
        "evaluate": {k: float(v) for k, v in evaluation.items()},
        "steps": {"weights": [w.tolist() for w in steps.get_weights()], "history": steps_history.history},
        "named": {"weights": [w.tolist() for w in named.get_weights()], "history": named_history.history},
        "accumulation": accumulation_run(None, "adam"),
    }


GROUPS = {
    "mirrored_parity": mirrored_parity,
    "mirrored_fusion": mirrored_fusion,
    "mirrored_clipping": mirrored_clipping,
    "mirrored_contract": mirrored_contract,
    "mirrored_gan": mirrored_gan,
    "mirrored_accumulation": mirrored_accumulation,
    "mirrored_existing_code": mirrored_existing_code,
    "single": single_process_reference,
}


def main(argv):
    group, out = argv[0], argv[-1]
    if group in ("worker", "worker_existing_code"):
        work = worker if group == "worker" else worker_existing_code
        result = work(int(argv[1]), [int(p) for p in argv[2].split(",")])
    elif group in GROUPS:
        result = GROUPS[group]()
    else:
        raise SystemExit(f"unknown group {group!r}; expected one of {sorted(GROUPS)} or worker")
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1:])
