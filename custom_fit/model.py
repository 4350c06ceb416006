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

import inspect
import threading
import warnings
import weakref
from typing import Any, Callable, ClassVar, Iterable, Mapping, Sequence

import tensorflow as tf

from custom_fit import _compat
from custom_fit._compat import keras
from custom_fit.optimizers import NamedOptimizers

GradsAndVars = list[tuple[Any, Any]]

# Prefix of the entries `save_own_variables` adds for random seed generator states.
_SEED_STATE_KEY = "seed_generator_state_"


class MissingGradientWarning(UserWarning):
    """Some variables passed to ``minimize`` got no gradient (``None``).

    Emitted once per model and set of variables; those variables are left
    unchanged. Filter it with ``warnings.filterwarnings("ignore",
    category=custom_fit.MissingGradientWarning)`` when that is intended.
    """


class UnusedOptimizerWarning(UserWarning):
    """A named optimizer given to ``compile()`` is never used by the training step."""


class UnusedRegularizationWarning(UserWarning):
    """Variables with regularizers were updated, but their penalties were never computed.

    Keras adds ``model.losses`` only in ``compute_loss``; a multi-loss step
    must add ``sum(sub_model.losses)`` to the losses it minimizes itself.
    """


_DEFAULT_OPTIMIZER = "rmsprop"  # keras.Model.compile's default


class _Unset:
    """Marks a ``compile()`` call that passed no optimizer (``None`` means "no optimizer")."""

    def __repr__(self) -> str:
        return f"<keras default: {_DEFAULT_OPTIMIZER!r}>"


_UNSET = _Unset()

# What each model has already warned about (sets of gradient-less variables,
# warning categories). A weak mapping outside the model, because attributes set
# on a built Keras layer become tracked layer state.
_already_reported: "weakref.WeakKeyDictionary[Any, set]" = weakref.WeakKeyDictionary()


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
    * ``compile(optimizer={"generator": ..., "discriminator": ...})`` compiles
      several named optimizers; :attr:`logged_values` and :meth:`log_values`
      report a custom step's values as epoch means.
    * Random seed generator states (``Dropout``, noise) are saved with the
      weights, so resumed runs equal uninterrupted ones.
    * ``MirroredStrategy`` with ``steps_per_execution > 1`` and
      ``MultiWorkerMirroredStrategy`` train; ``compile(clip_after_aggregation=True)``
      clips the global gradient.
    * ``fit`` before ``compile``, a missing ``y``, unknown optimizers and
      variables without gradients produce errors that say how to fix them.

    ``CustomModel`` subclasses the Keras TensorFlow is configured with: Keras 3,
    or Keras 2 (``tf_keras``) under ``TF_USE_LEGACY_KERAS=1``, where it
    equals ``tf.keras.Model`` bit for bit in the same way (the list above is
    about Keras 3; on Keras 2 ``compiled_loss``/``compiled_metrics`` are
    Keras' own).

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
        if _compat.is_functional_call(args, kwargs) and not isinstance(self, _compat.Functional):
            # `keras.Model.__init__` would splice `Functional` into the bases of
            # this class (and of CustomModel) for good. Move only this instance
            # to a private subclass that has `Functional` among its bases.
            object.__setattr__(self, "__class__", _functional_class(type(self)))
        super().__init__(*args, **kwargs)

    # ------------------------------------------------------------------
    # Configuration
    # ------------------------------------------------------------------

    #: Names of the values a custom step reports with :meth:`log_values`
    #: (e.g. ``("d_loss", "g_loss")``). ``compile()`` creates one batch-size
    #: weighted ``Mean`` per name; they appear in ``History``, the progress bar
    #: and callbacks (``val_`` prefixed in validation) as epoch means. Names
    #: ending in ``loss`` or ``penalty`` are "lower is better" for callbacks
    #: that monitor them (``EarlyStopping(monitor="g_loss")`` needs no ``mode``).
    logged_values: ClassVar[Sequence[str]] = ()

    def compile(
        self,
        optimizer: Any = _UNSET,
        *args: Any,
        clip_after_aggregation: bool | None = None,
        **kwargs: Any,
    ) -> None:
        """Configures the model for training: ``keras.Model.compile`` plus named optimizers.

        Args:
            optimizer: As for ``keras.Model.compile`` (default ``"rmsprop"``),
                or a dict ``{name: optimizer}`` of several optimizers, e.g.
                ``{"generator": "adam", "discriminator": "adam"}``; then
                ``model.optimizer[name]`` is each one and a step selects it
                with ``minimize(..., optimizer=name)``. A member named like a
                sub-layer attribute (``self.generator``) is built on that
                layer's trainable variables. Under ``mixed_float16`` every
                member is wrapped for loss scaling.
            *args: As for ``keras.Model.compile`` (``loss``, ...).
            clip_after_aggregation: Under a multi-replica ``tf.distribute``
                strategy, ``True`` sums the gradients across replicas *before*
                :meth:`transform_gradients` and the optimizer's ``clipnorm``,
                ``global_clipnorm`` or ``clipvalue``, so clipping sees the
                global gradient and gives the update one device would.
                ``None`` (default) keeps what the Keras in use does: Keras 3
                clips each replica's gradient and then sums; Keras 2 always
                sums first (so ``False`` raises there). Without a strategy it
                changes nothing.
            **kwargs: As for ``keras.Model.compile``.

        A subclass that overrides ``compile`` with its own signature (the
        keras.io GAN pattern) and calls ``super().compile()`` without an
        optimizer gets no optimizer rather than a stray default RMSprop.

        Example:
            >>> import keras, custom_fit
            >>> model = custom_fit.CustomSequential([keras.Input((3,)), keras.layers.Dense(1)])
            >>> model.compile(optimizer=keras.optimizers.SGD(global_clipnorm=1.0),
            ...               loss="mse", clip_after_aggregation=True)
        """
        if optimizer is _UNSET:
            optimizer = None if self._compile_overridden() else _DEFAULT_OPTIMIZER
        named_args = dict(kwargs, clip_after_aggregation=clip_after_aggregation)
        _compat.check_compile_arguments(self, optimizer, dict(named_args, loss=args[0]) if args else named_args)
        if isinstance(optimizer, Mapping):
            optimizer = NamedOptimizers(optimizer)
        if isinstance(optimizer, NamedOptimizers):
            optimizer.set_owners({name: getattr(self, name, None) for name in optimizer})
            _compat.set_untracked(
                optimizer, "name_variables", lambda variables: _compat.variable_names(self, variables)
            )
            if self.dtype_policy.name == "mixed_float16" and kwargs.get("auto_scale_loss", True):
                optimizer.wrap_for_loss_scaling()
            kwargs = _compat.compile_kwargs_for_group(kwargs)  # members are wrapped, not the group
        super().compile(optimizer, *args, **kwargs)
        # "loss" goes to Keras' own tracker where there is one (Keras 2 has none without a compiled loss).
        names = [name for name in self.logged_values if name != "loss" or _compat.loss_tracker(self) is None]
        _compat.set_untracked(self, "_value_trackers", _compat.LoggedValues(names) if names else None)
        self.clip_after_aggregation = bool(clip_after_aggregation) or _compat.CLIPS_AFTER_AGGREGATION
        if clip_after_aggregation:
            _compat.record_compile_option(self, "clip_after_aggregation", True)

    def compile_from_config(self, config: dict) -> None:
        """Re-runs :meth:`compile` from :meth:`get_compile_config` (used by ``load_model``)."""
        config = keras.saving.deserialize_keras_object(config)
        try:
            inspect.signature(self.compile).bind(**config)
        except TypeError:
            # A compile() with a signature of its own (e.g. the keras.io GAN's
            # `compile(d_optimizer, g_optimizer, loss_fn)`): Keras' behaviour,
            # a warning that compile() must be called after loading.
            return super().compile_from_config(config)
        self.compile(**config)
        if self.optimizer is not None and self.built:
            self.optimizer.build(self.trainable_variables)

    def _compile_overridden(self) -> bool:
        """Whether a subclass replaced ``compile`` (and may call ours without an optimizer)."""
        return any("compile" in vars(cls) for cls in type(self).__mro__[: type(self).__mro__.index(CustomModel)])

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
            optimizer: ``None`` for the compiled optimizer, a name given to
                ``compile(optimizer={name: ...})``, or an optimizer instance
                (wrapped for loss scaling under ``mixed_float16``).

        Raises:
            ValueError: ``optimizer`` names no optimizer of this model, a named
                optimizer receives variables it does not update, or none of
                ``variables`` has a gradient.

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
        name = optimizer if isinstance(optimizer, str) else None
        optimizer = self._resolve_optimizer(optimizer)
        variables = list(variables)
        if name is not None:
            self._prepare_named_optimizer(name, variables)
        _trace_records().minimized.update(id(v) for v in variables)
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
            loss = _compat.scale_loss(optimizer, loss)
        gradients = self.compute_gradients(loss, tape, variables)
        gradients = _compat.unscale_gradients(optimizer, gradients)  # Keras 2 only
        grads_and_vars = self._drop_missing_gradients(gradients, variables, optimizer)
        replica_context = _compat.replica_context_with_peers()
        if replica_context is None or not getattr(self, "clip_after_aggregation", False):
            grads_and_vars = self.transform_gradients(grads_and_vars)
            self.apply_gradients(grads_and_vars, optimizer=optimizer)
            return
        # Transform and clip the global gradient (always on Keras 2).
        grads_and_vars = _compat.sum_across_replicas(replica_context, optimizer, grads_and_vars)
        grads_and_vars = self.transform_gradients(grads_and_vars)
        with _compat.gradients_already_summed(optimizer):
            self.apply_gradients(grads_and_vars, optimizer=optimizer)

    def compute_gradients(self, loss: tf.Tensor, tape: tf.GradientTape, variables: Sequence[Any]) -> list:
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
        pairs whose gradient exists). Under mixed precision they are still
        multiplied by the loss scale on Keras 3 (the optimizer unscales them)
        and already unscaled on Keras 2. Under ``tf.distribute`` they are this
        replica's on Keras 3, or the sum over replicas with
        ``compile(clip_after_aggregation=True)``; always the sum on Keras 2.

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
    # Reported values and metrics
    # ------------------------------------------------------------------

    def log_values(self, batch: Any, **values: Any) -> None:
        """Adds this batch's named values to their epoch means (see :attr:`logged_values`).

        Call it from a custom ``train_step`` / ``test_step``; return
        ``self.get_metrics_result()`` from the step. Each value is averaged
        over the epoch weighted by batch size, reset every epoch and at the
        start of ``evaluate``, and correct under ``steps_per_execution`` and
        ``tf.distribute`` (values follow Keras' loss convention, scaled by
        ``1 / num_replicas`` as :func:`custom_fit.batch_mean` returns them, and
        are unscaled here). ``loss=`` updates Keras' own ``loss`` tracker.

        Args:
            batch: The batch's inputs (any structure) or its size.
            **values: Scalar tensors, by name; each name must be in
                :attr:`logged_values`.

        Example:
            >>> import tensorflow as tf, custom_fit
            >>> class TwoLosses(custom_fit.CustomModel):
            ...     logged_values = ("mse", "mae")
            ...     def train_step(self, data):
            ...         x, y = data
            ...         with tf.GradientTape() as tape:
            ...             y_pred = self(x, training=True)
            ...             mse = custom_fit.batch_mean(tf.square(y_pred - y))
            ...             mae = custom_fit.batch_mean(tf.abs(y_pred - y))
            ...         self.minimize(mse, tape, self.trainable_weights)
            ...         self.log_values(x, mse=mse, mae=mae)
            ...         return self.get_metrics_result()
        """
        if not _compat.is_compiled(self):
            raise ValueError(
                f"log_values() needs a compiled model: expected `compile()` to have "
                f"created trackers for {list(self.logged_values)}; model '{self.name}' "
                "was not compiled. Fix: call `model.compile(...)` first."
            )
        batch_size = batch if _compat.is_scalar(batch) else _compat.batch_size_of(batch)
        trackers = self._value_trackers
        for name, value in values.items():
            declared = name in self.logged_values
            if not declared:
                raise ValueError(
                    f"log_values() received {name!r}, which is not in "
                    f"{type(self).__name__}.logged_values = {tuple(self.logged_values)}. "
                    f"Expected only declared names. Fix: add {name!r} to `logged_values` "
                    "(a class attribute) before compile()."
                )
            tracker = trackers[name] if trackers is not None and name in trackers else _compat.loss_tracker(self)
            tracker.update_state(_compat.unscale_loss_for_distribution(value), sample_weight=batch_size)

    @property
    def metrics(self) -> list:
        """Keras' metrics, plus one tracker per :attr:`logged_values` name after ``loss``.

        A model that declares ``logged_values`` and compiles no loss has no
        ``loss`` entry (it would always read 0).
        """
        metrics = super().metrics
        if not self.logged_values or not _compat.is_compiled(self):
            return metrics
        loss_tracker = _compat.loss_tracker(self)
        keep_loss = _compat.has_compiled_loss(self) or "loss" in self.logged_values
        head = [loss_tracker] if keep_loss and loss_tracker in metrics else []
        trackers = self._value_trackers
        own = _compat.logged_value_metrics(trackers) if trackers is not None else []
        return head + own + [m for m in metrics if m is not loss_tracker]

    def get_metrics_result(self) -> dict:
        """The current value of every metric, as a flat dict.

        Unlike ``keras.Model``, compiled metrics that no step updated yet are
        left out instead of raising "Cannot get result() since the metric has
        not yet been built".
        """
        results = {}
        for metric in self.metrics:
            if metric is _compat.compiled_metrics_container(self) and not metric.built:
                continue
            result = metric.result()
            if isinstance(result, dict):
                results.update(result)
            else:
                results[metric.name] = result
        return results

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
        """Builds ``self.train_function`` around :meth:`train_step` (logs flattened).

        Each trace of the step also checks how it used the model: named
        optimizers never used (:class:`UnusedOptimizerWarning`) and
        regularized variables updated without their penalties
        (:class:`UnusedRegularizationWarning`).
        """
        if self.train_function is None or force:
            self.train_function = _compat.make_train_function(self, _flat_logs(self._checked_train_step))
        return self.train_function

    def _checked_train_step(self, data: Any) -> Any:
        """:meth:`train_step`, recording which optimizers and variables it used."""
        records = _trace_records()
        records.used_optimizers, records.minimized = set(), set()
        regularized = (
            _compat.count_regularizer_calls(self) if type(self).train_step is not CustomModel.train_step else {}
        )
        calls_before = {key: r.calls for key, r in regularized.items()}
        logs = self.train_step(data)
        if isinstance(self.optimizer, NamedOptimizers):
            self.optimizer.iterations.assign_add(1)  # the group counts training steps
            unused = [n for n in self.optimizer if n not in records.used_optimizers]
            if unused:
                self._warn_once(
                    UnusedOptimizerWarning,
                    f"{type(self).__name__} '{self.name}' was compiled with optimizers "
                    f"{sorted(self.optimizer)}, but its train_step never used {unused}. "
                    "Expected every named optimizer to update something; their state is "
                    f"saved but never changes. Fix: call self.minimize(..., optimizer={unused[0]!r}) "
                    "in the step, or leave that name out of compile(optimizer={...}).",
                )
        skipped = [key for key, r in regularized.items() if key in records.minimized and r.calls == calls_before[key]]
        if skipped:
            owners = _top_level_owners(self, skipped)
            self._warn_once(
                UnusedRegularizationWarning,
                f"{type(self).__name__} '{self.name}': train_step updated regularized "
                f"variables of {owners} without computing their regularization losses. "
                "Expected `sum(layer.losses)` to be added to the loss minimized for those "
                "variables (Keras adds `model.losses` only in compute_loss). Fix: inside "
                f"the tape, add the penalties of '{owners[0]}' to its loss, e.g. "
                "`loss = loss + custom_fit.regularization_loss(sub_model)`.",
            )
        return logs

    def _warn_once(self, category: type, message: str) -> None:
        warned = _already_reported.setdefault(self, set())
        if category not in warned:
            warned.add(category)
            warnings.warn(message, category, stacklevel=3)

    def make_test_function(self, force: bool = False) -> Callable:
        """Builds ``self.test_function`` around :meth:`test_step` (logs flattened)."""
        if self.test_function is None or force:
            self.test_function = _compat.make_test_function(self, _flat_logs(self.test_step))
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
        if isinstance(compiled, NamedOptimizers):
            if optimizer in compiled:
                return compiled[optimizer]
            raise ValueError(
                f"{type(self).__name__}.minimize() received optimizer={optimizer!r}; "
                f"this model was compiled with named optimizers {sorted(compiled)}. "
                "Expected one of those names (or an optimizer instance). Fix: pass "
                f"optimizer={sorted(compiled)[0]!r}, or add {optimizer!r} to the dict "
                "given to compile(optimizer={...})."
            )
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
        if isinstance(optimizer, str):
            compiled_name += "; name optimizers with compile(optimizer={name: ...})"
        raise ValueError(
            f"{type(self).__name__}.minimize() received optimizer={optimizer!r}, "
            f"which names no optimizer of this model (compiled optimizer: "
            f"{compiled_name}). Expected `None` for the compiled optimizer or a "
            "`keras.optimizers.Optimizer` instance. Fix: omit `optimizer=` or "
            "pass the optimizer object itself."
        )

    def _prepare_named_optimizer(self, name: str, variables: list) -> None:
        """Builds named optimizer ``name`` if needed and checks it owns ``variables``."""
        group = self.optimizer
        # Optimizer variables are created outside the traced step (as Keras'
        # `apply_gradients` does), not lazily inside `tf.function`.
        with tf.init_scope():
            if not _compat.optimizer_built(group):
                group.build(self.trainable_variables)
            known = group.member_variables(name)
            if not known:
                group.build_member(name, variables)
        if known:
            known_ids = {id(v) for v in known}
            unknown = _compat.variable_names(self, [v for v in variables if id(v) not in known_ids])
            if unknown:
                raise ValueError(
                    f"minimize(..., optimizer={name!r}) received variables the {name!r} "
                    f"optimizer does not update: {unknown}. Expected the variables it "
                    f"was built with ({len(known)} variables, e.g. "
                    f"{_compat.variable_names(self, known[:3])}). Fix: pass the "
                    f"same variables every step (e.g. self.{name}.trainable_weights), or "
                    "compile another named optimizer for these variables."
                )
        _trace_records().used_optimizers.add(name)

    def _drop_missing_gradients(
        self, gradients: Sequence[Any], variables: Sequence[Any], optimizer: Any
    ) -> GradsAndVars:
        """Pairs gradients with variables, dropping (and reporting once) ``None`` ones."""
        missing = _compat.variable_names(self, [v for g, v in zip(gradients, variables) if g is None])
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
        reported = _already_reported.setdefault(self, set())
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
        if not _compat.optimizer_built(optimizer):
            # Build on every variable, as Keras does when it filters `None`s,
            # so optimizer state does not depend on which gradients exist.
            with tf.init_scope():
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


def _trace_records() -> threading.local:
    """What the step traced in this thread used (replicas trace in threads of their own)."""
    if not hasattr(_records, "used_optimizers"):
        _records.used_optimizers, _records.minimized = set(), set()
    return _records


_records = threading.local()


def _top_level_owners(model: keras.Model, variable_ids: list) -> list[str]:
    """Names of the direct sub-layers (or the model) owning the given variables."""
    wanted, owners = set(variable_ids), []
    for layer in model.layers:
        if any(id(v) in wanted for v in layer.trainable_variables):
            owners.append(layer.name)
    return owners or [model.name]


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
