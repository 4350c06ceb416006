"""``CustomModel`` and ``CustomSequential``: ``fit()`` with a training step you can read.

The three steps below are the ones ``keras.Model`` runs, written out with
``tf.GradientTape``, the compiled loss, the compiled metrics and the optimizer.
Results match ``keras.Model`` bit for bit on CPU; the steps are meant to be
read, copied into a subclass and changed.

Override points, in the order ``train_step`` calls them:

============================  =================================================
``compute_loss``              (Keras) the loss for one batch, inside the tape.
``minimize``                  loss scaling, gradients, transform, update.
``compute_gradients``         ``tape.gradient`` of the (scaled) loss.
``transform_gradients``       clip, add noise, log: ``[(grad, var)] -> same``.
``apply_gradients``           hand the pairs to an optimizer.
``compute_metrics``           (Keras) update and return the compiled metrics.
============================  =================================================
"""

from __future__ import annotations

import warnings
import weakref
from typing import Any, Callable, Iterable, Sequence

import keras
import tensorflow as tf

from custom_fit import _compat
from custom_fit.compiled import CompiledLoss, CompiledMetrics

GradsAndVars = list[tuple[Any, Any]]

# Prefix of the entries `save_own_variables` adds for random seed generator states.
_SEED_STATE_KEY = "seed_generator_state_"


class MissingGradientWarning(UserWarning):
    """Some variables passed to ``minimize`` got no gradient (``None``).

    Emitted once per model and set of variables; those variables are left
    unchanged. Filter it with ``warnings.filterwarnings("ignore",
    category=custom_fit.MissingGradientWarning)`` when that is intended.
    """


# Which sets of gradient-less variables were already reported, per model. A weak
# mapping outside the model, because attributes set on a built Keras layer are
# tracked as layer state.
_reported_missing_gradients: "weakref.WeakKeyDictionary[Any, set]" = (
    weakref.WeakKeyDictionary()
)


@keras.saving.register_keras_serializable(package="custom_fit")
class CustomModel(_compat.TrainerHooks, keras.Model):
    """A drop-in ``keras.Model`` whose training step is written out explicitly.

    Build it the way you build a ``keras.Model`` (functional, subclassed, or
    through :class:`CustomSequential`), then ``compile`` and ``fit`` as usual:
    callbacks, ``tf.distribute``, ``steps_per_execution``, XLA and mixed
    precision keep working, and the weights, history, ``evaluate`` and
    ``predict`` equal ``keras.Model``'s exactly on CPU.

    Differences from ``keras.Model`` (all fixes):

    * ``CustomModel(inputs, outputs)`` does not rewrite the class' bases, so
      subclasses with their own ``__init__`` keep working afterwards. The
      instance's class is a subclass of yours that also derives from Keras'
      ``Functional`` (``isinstance`` checks hold, ``type(m).__name__`` is kept).
    * ``self.compiled_loss`` / ``self.compiled_metrics`` have their Keras 2
      meaning (see :mod:`custom_fit.compiled`), and step logs are flattened,
      so Keras-2-style steps report the true loss.
    * ``fit`` before ``compile``, a missing ``y``, unknown optimizers and
      variables without gradients produce errors that say how to fix them.

    Example:
        >>> import numpy as np, keras, custom_fit
        >>> inputs = keras.Input((4,))
        >>> outputs = keras.layers.Dense(1)(inputs)
        >>> model = custom_fit.CustomModel(inputs, outputs)
        >>> model.compile(optimizer="sgd", loss="mse")
        >>> x, y = np.ones((8, 4), "float32"), np.zeros((8, 1), "float32")
        >>> history = model.fit(x, y, epochs=2, verbose=0)
        >>> sorted(history.history)
        ['loss']
    """

    def __init__(self, *args: Any, **kwargs: Any):
        if _compat.is_functional_call(args, kwargs) and not isinstance(
            self, _compat.Functional
        ):
            # `keras.Model.__init__` would splice `Functional` into the bases of
            # this class (and of CustomModel) for good. Move only this instance
            # to a private subclass that has `Functional` among its bases.
            object.__setattr__(self, "__class__", _functional_class(type(self)))
        super().__init__(*args, **kwargs)

    # ------------------------------------------------------------------
    # Configuration
    # ------------------------------------------------------------------

    def compile(self, *args: Any, clip_after_aggregation: bool = False, **kwargs: Any) -> None:
        """Configures the model for training: ``keras.Model.compile`` plus one option.

        Args:
            *args: As for ``keras.Model.compile`` (``optimizer``, ``loss``, ...).
            clip_after_aggregation: Under a multi-replica ``tf.distribute``
                strategy, sum the gradients across replicas *before*
                :meth:`transform_gradients` and the optimizer's ``clipnorm``,
                ``global_clipnorm`` or ``clipvalue``, so clipping sees the
                global gradient and gives the update one device would. Keras
                clips each replica's gradient and then sums (the default,
                ``False``, keeps that). Without a strategy it changes nothing.
            **kwargs: As for ``keras.Model.compile``.

        Example:
            >>> import keras, custom_fit
            >>> model = custom_fit.CustomSequential([keras.Input((3,)), keras.layers.Dense(1)])
            >>> model.compile(optimizer=keras.optimizers.SGD(global_clipnorm=1.0),
            ...               loss="mse", clip_after_aggregation=True)
        """
        super().compile(*args, **kwargs)
        self.clip_after_aggregation = bool(clip_after_aggregation)
        if clip_after_aggregation:
            self._compile_config.config["clip_after_aggregation"] = True

    def compile_from_config(self, config: dict) -> None:
        """Re-runs :meth:`compile` from :meth:`get_compile_config` (used by ``load_model``)."""
        if type(self).compile is not CustomModel.compile:
            # A subclass with its own compile() signature: Keras' behaviour
            # (a warning that compile() must be called after loading).
            return super().compile_from_config(config)
        self.compile(**keras.saving.deserialize_keras_object(config))
        if self.optimizer is not None and self.built:
            self.optimizer.build(self.trainable_variables)

    # ------------------------------------------------------------------
    # The three steps
    # ------------------------------------------------------------------

    def train_step(self, data: Any) -> dict:
        """Runs forward pass, loss, gradients, update and metrics on one batch.

        Called by ``fit()`` once per batch, inside ``tf.function`` (unless
        ``run_eagerly``) and inside ``strategy.run`` (once per replica).

        Args:
            data: One batch as the dataset yields it: ``x``, ``(x,)``,
                ``(x, y)`` or ``(x, y, sample_weight)``.

        Returns:
            A flat ``{name: scalar}`` dict; ``fit()`` passes it to callbacks.
        """
        x, y, sample_weight = self._unpack(data)
        with tf.GradientTape() as tape:
            y_pred = _compat.forward(self, x, training=True)
            loss = _compat.compute_loss(self, x, y, y_pred, sample_weight, training=True)
        _compat.track_loss(self, loss, x)
        self.minimize(loss, tape, self.trainable_weights)
        return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def test_step(self, data: Any) -> dict:
        """Runs forward pass, loss and metrics on one batch, without updating weights.

        Called by ``evaluate()`` and by ``fit()``'s validation, once per batch.

        Args:
            data: One batch, as for :meth:`train_step`.

        Returns:
            A flat ``{name: scalar}`` dict.
        """
        x, y, sample_weight = self._unpack(data)
        y_pred = _compat.forward(self, x, training=False)
        loss = _compat.compute_loss(self, x, y, y_pred, sample_weight, training=False)
        _compat.track_loss(self, loss, x)
        return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def predict_step(self, data: Any) -> Any:
        """Returns the model's outputs for one batch (``training=False``).

        Called by ``predict()``; any ``y`` or ``sample_weight`` in ``data`` is
        ignored.
        """
        x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
        return _compat.forward(self, x, training=False)

    # ------------------------------------------------------------------
    # Override points of the update
    # ------------------------------------------------------------------

    def minimize(
        self,
        loss: tf.Tensor,
        tape: tf.GradientTape,
        variables: Iterable[Any],
        optimizer: keras.optimizers.Optimizer | str | None = None,
    ) -> None:
        """Updates ``variables`` to lower ``loss``, with one optimizer.

        Scales the loss (mixed precision: recorded on ``tape``), then calls
        :meth:`compute_gradients`, :meth:`transform_gradients` and
        :meth:`apply_gradients`. Call it once per optimizer in a multi-loss
        step; the tape may be persistent or nested in another.

        Args:
            loss: Scalar loss computed inside ``tape``.
            tape: The ``tf.GradientTape`` that recorded ``loss``.
            variables: The variables to update, e.g. ``self.trainable_weights``
                or ``self.generator.trainable_weights``.
            optimizer: ``None`` for the compiled optimizer, or an optimizer
                instance.

        Raises:
            ValueError: ``optimizer`` names no optimizer of this model, or
                none of ``variables`` has a gradient.

        Example:
            >>> import tensorflow as tf, keras, custom_fit
            >>> class TwoTapes(custom_fit.CustomModel):
            ...     def train_step(self, data):
            ...         x, y = data
            ...         with tf.GradientTape() as tape:
            ...             loss = self.compute_loss(x, y, self(x, training=True))
            ...         self.minimize(loss, tape, self.trainable_weights)
            ...         return {"loss": loss}
        """
        optimizer = self._resolve_optimizer(optimizer)
        variables = list(variables)
        if not variables:
            warnings.warn(
                f"{type(self).__name__}.minimize() received no variables to "
                "update, so nothing is trained. Expected trainable variables "
                "(e.g. `self.trainable_weights`); if the model has none, check "
                "that its layers are built and `trainable=True`.",
                stacklevel=2,
            )
            return
        with _compat.recording(tape):
            loss = optimizer.scale_loss(loss)
        gradients = self.compute_gradients(loss, tape, variables)
        grads_and_vars = self._drop_missing_gradients(gradients, variables, optimizer)
        replica_context = _compat.replica_context_with_peers()
        if replica_context is None or not getattr(self, "clip_after_aggregation", False):
            grads_and_vars = self.transform_gradients(grads_and_vars)
            self.apply_gradients(grads_and_vars, optimizer=optimizer)
            return
        # clip_after_aggregation: transform and clip the global gradient.
        grads_and_vars = _compat.sum_across_replicas(replica_context, grads_and_vars)
        grads_and_vars = self.transform_gradients(grads_and_vars)
        with _compat.gradients_already_summed(optimizer):
            self.apply_gradients(grads_and_vars, optimizer=optimizer)

    def compute_gradients(
        self, loss: tf.Tensor, tape: tf.GradientTape, variables: Sequence[Any]
    ) -> list:
        """Returns ``d loss / d variable`` for each variable (``None`` if unconnected).

        Called by :meth:`minimize` with the already scaled loss. Override it to
        change how gradients are taken (e.g. ``unconnected_gradients``).

        Example:
            >>> import custom_fit
            >>> class Zeros(custom_fit.CustomModel):
            ...     def compute_gradients(self, loss, tape, variables):
            ...         return tape.gradient(loss, variables,
            ...                              unconnected_gradients="zero")
        """
        return tape.gradient(loss, variables)

    def transform_gradients(self, grads_and_vars: GradsAndVars) -> GradsAndVars:
        """Changes gradients before they are applied; the default returns them as is.

        Called by :meth:`minimize` with ``(gradient, variable)`` pairs (only
        pairs whose gradient exists). Gradients are still scaled by the loss
        scale under mixed precision, and per replica under ``tf.distribute``.

        Example:
            >>> import tensorflow as tf, custom_fit
            >>> class Clipped(custom_fit.CustomModel):
            ...     def transform_gradients(self, grads_and_vars):
            ...         grads_and_vars = super().transform_gradients(grads_and_vars)
            ...         return [(tf.clip_by_value(g, -1.0, 1.0), v)
            ...                 for g, v in grads_and_vars]
        """
        return grads_and_vars

    def apply_gradients(
        self,
        grads_and_vars: GradsAndVars,
        optimizer: keras.optimizers.Optimizer | str | None = None,
    ) -> None:
        """Lets ``optimizer`` update the variables from the gradients.

        Called by :meth:`minimize` last. The optimizer unscales mixed-precision
        gradients, applies its own clipping and counts ``iterations``.

        Example:
            >>> import custom_fit
            >>> class Logged(custom_fit.CustomModel):
            ...     def apply_gradients(self, grads_and_vars, optimizer=None):
            ...         print("updating", len(grads_and_vars), "variables")
            ...         super().apply_gradients(grads_and_vars, optimizer)
        """
        self._resolve_optimizer(optimizer).apply_gradients(grads_and_vars)

    # ------------------------------------------------------------------
    # Keras 2 names
    # ------------------------------------------------------------------

    @property
    def compiled_loss(self) -> CompiledLoss:  # type: ignore[override]
        """Keras-2 ``compiled_loss``: see :class:`custom_fit.compiled.CompiledLoss`."""
        return CompiledLoss(self)

    @property
    def compiled_metrics(self) -> CompiledMetrics:  # type: ignore[override]
        """Keras-2 ``compiled_metrics``: see :class:`custom_fit.compiled.CompiledMetrics`."""
        return CompiledMetrics(self)

    # ------------------------------------------------------------------
    # Saving
    # ------------------------------------------------------------------

    def save_own_variables(self, store: Any) -> None:
        """Saves the model's own variables and the state of every random seed generator.

        Called by ``model.save``, ``save_weights``, ``ModelCheckpoint`` and
        ``BackupAndRestore``. Unlike ``keras.Model``, the states of
        ``SeedGenerator``s (``Dropout`` masks, noise) are saved too, so a run
        resumed from a file continues exactly like an uninterrupted one.
        """
        super().save_own_variables(store)
        for i, state in enumerate(_compat.seed_generator_states(self)):
            store[f"{_SEED_STATE_KEY}{i}"] = state

    def load_own_variables(self, store: Any) -> None:
        """Loads what :meth:`save_own_variables` saved (files without seed states load too)."""
        keys = list(store.keys())
        super().load_own_variables({k: store[k] for k in keys if not k.startswith(_SEED_STATE_KEY)})
        for i, state in enumerate(_compat.seed_generator_states(self)):
            if f"{_SEED_STATE_KEY}{i}" in keys:
                state.assign(store[f"{_SEED_STATE_KEY}{i}"])

    # ------------------------------------------------------------------
    # Step functions
    # ------------------------------------------------------------------

    def make_train_function(self, force: bool = False) -> Callable:
        """Builds ``self.train_function`` around :meth:`train_step` (logs flattened)."""
        if self.train_function is None or force:
            self.train_function = _compat.make_step_function(self, _flat_logs(self.train_step))
        return self.train_function

    def make_test_function(self, force: bool = False) -> Callable:
        """Builds ``self.test_function`` around :meth:`test_step` (logs flattened)."""
        if self.test_function is None or force:
            self.test_function = _compat.make_step_function(self, _flat_logs(self.test_step))
        return self.test_function

    def make_predict_function(self, force: bool = False) -> Callable:
        """Builds ``self.predict_function`` around :meth:`predict_step` (Keras' own loop)."""
        if self.predict_function is None or force:
            super().make_predict_function(force=True)
            self.predict_function = _compat.explain_xla_errors(self, self.predict_function)
        return self.predict_function

    # ------------------------------------------------------------------
    # Helpers
    # ------------------------------------------------------------------

    def _unpack(self, data: Any) -> tuple:
        """``(x, y, sample_weight)`` from a batch; a clear error if ``y`` is missing."""
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        if y is None and _compat.has_compiled_loss(self):
            raise ValueError(
                f"{type(self).__name__} '{self.name}' was compiled with "
                f"loss={self.loss!r}, which needs targets: expected batches of "
                "(x, y) or (x, y, sample_weight), received batches with inputs "
                "only. Fix: pass `y` to fit()/evaluate(), make the dataset yield "
                "(x, y) pairs, or compile without `loss` and add the loss with "
                "`self.add_loss()` or an overridden `compute_loss`."
            )
        return x, y, sample_weight

    def _resolve_optimizer(self, optimizer: Any) -> keras.optimizers.Optimizer:
        """The optimizer instance ``optimizer`` refers to (``None``: the compiled one).

        Under ``mixed_float16`` an optimizer passed by the caller is wrapped for
        loss scaling, like the compiled one.
        """
        if isinstance(optimizer, keras.optimizers.Optimizer):
            return _compat.loss_scaled(self, optimizer)
        compiled = getattr(self, "optimizer", None)
        if optimizer is None and compiled is not None:
            return compiled
        if optimizer is None:
            raise ValueError(
                f"{type(self).__name__} '{self.name}' has no optimizer: expected "
                "`compile(optimizer=...)` to have been called, received a model "
                "without one. Fix: call `model.compile(optimizer='adam', ...)` "
                "or pass `optimizer=` an optimizer instance."
            )
        compiled_name = type(compiled).__name__ if compiled is not None else "none"
        raise ValueError(
            f"{type(self).__name__}.minimize() received optimizer={optimizer!r}, "
            f"which names no optimizer of this model (compiled optimizer: "
            f"{compiled_name}). Expected `None` for the compiled optimizer or a "
            "`keras.optimizers.Optimizer` instance. Fix: omit `optimizer=` or "
            "pass the optimizer object itself."
        )

    def _drop_missing_gradients(
        self, gradients: Sequence[Any], variables: Sequence[Any], optimizer: Any
    ) -> GradsAndVars:
        """Pairs gradients with variables, dropping (and reporting once) ``None`` ones."""
        missing = [_compat.variable_name(v) for g, v in zip(gradients, variables) if g is None]
        if not missing:
            return list(zip(gradients, variables))
        if len(missing) == len(variables):
            raise ValueError(
                f"{type(self).__name__}.minimize(): none of the {len(variables)} "
                "variables has a gradient. Expected a loss computed from these "
                "variables inside the `tf.GradientTape` passed to minimize(); "
                f"received a loss that does not depend on any of {missing}. Fix: "
                "compute the loss inside `with tape:` and pass the variables it "
                "depends on."
            )
        reported = _reported_missing_gradients.setdefault(self, set())
        if tuple(missing) not in reported:
            reported.add(tuple(missing))
            warnings.warn(
                f"{type(self).__name__} '{self.name}': {len(missing)} of "
                f"{len(variables)} variables passed to minimize() got no gradient "
                f"and are not updated: {missing}. Expected every variable to "
                "influence the loss. Fix: use them in the loss computed inside "
                "the tape, leave them out of the `variables` you pass, or set "
                "their layer's `trainable = False` and recompile.",
                MissingGradientWarning,
                stacklevel=3,
            )
        if not optimizer.built:
            # Build on every variable, as Keras does when it filters `None`s,
            # so optimizer state does not depend on which gradients exist.
            optimizer.build(list(variables))
        return [(g, v) for g, v in zip(gradients, variables) if g is not None]


@keras.saving.register_keras_serializable(package="custom_fit")
class CustomSequential(CustomModel, keras.Sequential):
    """A drop-in ``keras.Sequential`` with :class:`CustomModel`'s explicit steps.

    Example:
        >>> import numpy as np, keras, custom_fit
        >>> model = custom_fit.CustomSequential(
        ...     [keras.Input((4,)), keras.layers.Dense(1)])
        >>> model.compile(optimizer="sgd", loss="mse")
        >>> model.fit(np.ones((8, 4)), np.zeros((8, 1)), verbose=0).history["loss"][0] > 0
        True
    """


def _flat_logs(step: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Wraps a step so nested dicts in its logs become flat ``{name: value}``.

    Keras-2-style steps return ``{m.name: m.result() for m in self.metrics}``,
    in which Keras 3's ``compile_metrics`` entry is itself a dict.
    """

    def step_with_flat_logs(data):
        logs = step(data)
        if not isinstance(logs, dict):
            return logs
        flat = {}
        for name, value in logs.items():
            if isinstance(value, dict):
                flat.update(value)
            else:
                flat[name] = value
        return flat

    return step_with_flat_logs


def _functional_class(cls: type) -> type:
    """A subclass of ``cls`` that is also ``Functional``, made once per class."""
    twin = _functional_classes.get(cls)
    if twin is None:
        twin = type(
            cls.__name__,
            (cls, _compat.Functional),
            {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "__doc__": cls.__doc__},
        )
        _compat.share_registered_name(twin, cls)
        _functional_classes[cls] = twin
    return twin


_functional_classes: dict[type, type] = {}
