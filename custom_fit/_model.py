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

Everything else lives with the object that owns its state:
:mod:`custom_fit._optimizers` (named optimizers), :mod:`custom_fit._diagnostics`
(misuse warnings), :mod:`custom_fit._logged_values` (epoch means of a step's
values), :mod:`custom_fit._compiled` (Keras-2-style ``compiled_loss``),
:mod:`custom_fit._saving` and :mod:`custom_fit._extra_state` (saving), and
:mod:`custom_fit._compat` (Keras' private names).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import tensorflow as tf

from custom_fit import _diagnostics as diagnostics
from custom_fit import _gradient_contract as gradient_contract
from custom_fit import _logged_values as epoch_means
from custom_fit import _optimizers as optimizers
from custom_fit._compat import keras, version
from custom_fit._compat.common import batch_size_of, marked_as, record_compile_option, recording
from custom_fit._compiled import CompiledAttributes
from custom_fit._diagnostics import GradsAndVars
from custom_fit._functional import functional_twin
from custom_fit._saving import Saving
from custom_fit._state import state_of
from custom_fit._trainer import step_fusion
from custom_fit._trainer.loop import Loop
from custom_fit._value_trackers import LoggedValues

__all__ = ["CustomModel", "CustomSequential"]

# One base depends on what the Keras in use provides (a capability `_compat` states): Keras 2's
# meaning of compiled_loss / compiled_metrics is added where Keras gives models none (Keras 3).
_COMPILED_ATTRIBUTES: tuple[type, ...] = () if version.HAS_COMPILED_LOSS_ATTRIBUTES else (CompiledAttributes,)


@keras.saving.register_keras_serializable(package="custom_fit")
class CustomModel(
    Saving,  # before the trainer: on Keras 2 both define get_config, and Saving's comes first
    Loop,  # the trainer: custom_fit's fit/evaluate/predict loop on its step functions
    *_COMPILED_ATTRIBUTES,  # type: ignore[misc]
    keras.Model,
):
    """A drop-in ``keras.Model`` whose training step is written out explicitly.

    Build it the way you build a ``keras.Model`` (functional, subclassed, or
    through :class:`CustomSequential`), then ``compile`` and ``fit`` as usual:
    callbacks, ``tf.distribute``, ``steps_per_execution``, XLA and mixed
    precision keep working, and the weights, history, ``evaluate`` and
    ``predict`` equal ``keras.Model``'s exactly on CPU. The README lists every
    difference from ``keras.Model``; all are fixes or additions.

    ``CustomModel`` subclasses the Keras TensorFlow is configured with: Keras 3,
    or Keras 2 (``tf_keras``) under ``TF_USE_LEGACY_KERAS=1``.

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
        if version.is_functional_call(args, kwargs) and not isinstance(self, version.Functional):
            # `keras.Model.__init__` would splice `Functional` into the bases of
            # this class (and of CustomModel) for good, even if it then raises.
            # Move only this instance to a twin class that derives from both.
            object.__setattr__(self, "__class__", functional_twin(type(self)))
        super().__init__(*args, **kwargs)

    # -- configuration ----------------------------------------------------

    def compile(
        self,
        optimizer: Any = optimizers.UNSET,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        """Configures the model for training: ``keras.Model.compile`` plus named optimizers.

        Args:
            optimizer: As for ``keras.Model.compile`` (default ``"rmsprop"``;
                ``None``: no optimizer), or a dict ``{name: optimizer}`` of
                several optimizers, e.g. ``{"generator": "adam",
                "discriminator": "adam"}``; then ``model.optimizer[name]`` is
                each one and a step selects it with ``minimize(...,
                optimizer=name)``. A member named like a sub-layer attribute
                (``self.generator``) is built on that layer's trainable
                variables. Under ``mixed_float16`` every member is wrapped for
                loss scaling.
            *args: As for ``keras.Model.compile`` (``loss``, ...).
            **kwargs: As for ``keras.Model.compile``; ``steps_per_execution``
                may also be ``"auto"``: the number of steps fused per
                execution is tuned during ``fit``, and
                ``model.steps_per_execution`` reads the number fused now
                (see :mod:`custom_fit._trainer.step_fusion`; a
                ``StepsPerExecutionTuner`` instance sets other tuning
                parameters). ``clip_after_aggregation`` (custom_fit 0.2) is no
                longer needed: optimizers always receive, and clip, the
                gradient summed over replicas (``True`` warns, ``False``
                raises). ``gradient_accumulation_steps=N`` (N >= 2) makes
                every optimizer (each member of a group) update once per N
                steps with the mean of their gradients, on both Kerases and
                under ``tf.distribute`` strategies: Keras 3's optimizer
                option, set on each; for tf_keras' optimizers, which have
                none, custom_fit's (docs/scaling.md, "Gradient accumulation").

        A subclass whose own ``compile`` (the keras.io GAN pattern) calls
        ``super().compile()`` without an optimizer gets none, not RMSprop.

        Example:
            >>> import keras, custom_fit
            >>> model = custom_fit.CustomSequential([keras.Input((3,)), keras.layers.Dense(1)])
            >>> model.compile(optimizer=keras.optimizers.SGD(global_clipnorm=1.0), loss="mse")
        """
        if optimizer is optimizers.UNSET:  # Keras' default, unless a subclass' compile() calls ours without one
            optimizer = optimizers.DEFAULT_OPTIMIZER if type(self).compile is CustomModel.compile else None
        kwargs = gradient_contract.without_clip_after_aggregation(kwargs)
        version.check_compile_arguments(self, optimizer, dict(kwargs, loss=args[0]) if args else kwargs)
        accumulation = optimizers.pop_accumulation_steps(kwargs)
        optimizer, kwargs = optimizers.for_compile(self, optimizer, kwargs)
        tuner = step_fusion.tuner_for(kwargs.get("steps_per_execution"))
        if tuner is not None:
            kwargs["steps_per_execution"] = 1  # what Keras sees; the tuner decides per execution
        super().compile(optimizer, *args, **kwargs)
        optimizers.give_keras2_api(self)
        state_of(self).steps_tuner = tuner
        if tuner is not None:
            record_compile_option(self, "steps_per_execution", step_fusion.AUTO)
        if accumulation is not None:
            if self.optimizer is None:
                raise ValueError(
                    f"compile(gradient_accumulation_steps={accumulation}) accumulates an optimizer's gradients, "
                    "but compile received no optimizer. Fix: pass optimizer=..., or leave the option out."
                )
            optimizers.accumulate_gradients(self, accumulation)
            record_compile_option(self, "gradient_accumulation_steps", accumulation)
        state_of(self).logged_values = LoggedValues.for_model(self)

    @property
    def steps_tuner(self) -> step_fusion.StepsPerExecutionTuner | None:
        """The tuner behind ``compile(steps_per_execution="auto")``, else ``None``.

        Read-only; to choose the tuner's settings, pass one to ``compile``:
        ``compile(steps_per_execution=StepsPerExecutionTuner(max_steps=16))``.
        Its ``steps`` is what ``fit`` fuses now and ``rates`` what it measured.
        """
        return state_of(self).steps_tuner

    def _after_compile(self) -> None:
        """After any ``compile``: optimizers kept as attributes become ``model.optimizer`` (named)."""
        optimizers.group_attribute_optimizers(self)
        optimizers.give_keras2_api(self)

    # -- the three steps ---------------------------------------------------

    def train_step(self, data: Any) -> dict[str, Any]:
        """Runs forward pass, loss, gradients, update and metrics on one batch.

        Called by ``fit()`` once per batch, inside ``tf.function`` (unless
        ``run_eagerly``) and inside ``strategy.run`` (once per replica).

        Args:
            data: One batch as the dataset yields it: ``x``, ``(x,)``,
                ``(x, y)`` or ``(x, y, sample_weight)``.

        Returns:
            A flat ``{name: scalar}`` dict; ``fit()`` passes it to callbacks.
        """
        x, y, sample_weight = self._unpack_batch(data)
        with tf.GradientTape() as tape:
            y_pred = self._forward_pass(x, training=True)
            loss = self._step_loss(x, y, y_pred, sample_weight, training=True)
        self.minimize(loss, tape, self.trainable_weights)
        self._track_loss(loss, x)
        return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def test_step(self, data: Any) -> dict[str, Any]:
        """Runs forward pass, loss and metrics on one batch, without updating weights.

        Called by ``evaluate()`` and by ``fit()``'s validation, once per batch.
        """
        x, y, sample_weight = self._unpack_batch(data)
        y_pred = self._forward_pass(x, training=False)
        loss = self._step_loss(x, y, y_pred, sample_weight, training=False)
        self._track_loss(loss, x)
        return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def predict_step(self, data: Any) -> Any:
        """Returns the model's outputs for one batch (``training=False``); ``y`` is ignored."""
        x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
        return self._forward_pass(x, training=False)

    # -- override points of the update -------------------------------------

    def minimize(self, loss: tf.Tensor, tape: tf.GradientTape, variables: Iterable[Any], optimizer: Any = None) -> None:
        """Updates ``variables`` to lower ``loss``, with one optimizer.

        Scales the loss (mixed precision: recorded on ``tape``), then calls
        :meth:`compute_gradients`, :meth:`transform_gradients` and
        :meth:`apply_gradients`. Call it once per optimizer in a multi-loss
        step; the tape may be persistent or nested in another.

        Args:
            loss: Scalar loss computed inside ``tape``.
            tape: The ``tf.GradientTape`` that recorded ``loss``.
            variables: The variables to update, e.g. ``self.trainable_weights``.
            optimizer: ``None`` for the compiled optimizer, a name given to
                ``compile(optimizer={name: ...})``, or an optimizer instance
                (wrapped for loss scaling under ``mixed_float16``).

        Raises:
            ValueError: ``loss`` is ``None`` (no loss compiled or added),
                ``optimizer`` names no optimizer of this model, a named
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
        if loss is None:
            raise diagnostics.no_loss_error(self)
        variables = list(variables)
        name = optimizer if isinstance(optimizer, str) else None
        optimizer = optimizers.resolve(self, optimizer, variables)
        checks = state_of(self).diagnostics
        checks.record_minimize(name, variables)
        if not variables:
            return
        with recording(tape):
            loss = version.scale_loss(optimizer, loss)
        gradients = self.compute_gradients(loss, tape, variables)
        grads_and_vars = checks.pair_with_gradients(gradients, variables)
        path = gradient_contract.GradientPath(optimizer)  # this optimizer's, in this step
        if len(grads_and_vars) < len(variables):
            path.build_state(variables)  # on every variable, as Keras builds before it drops `None` gradients
        grads_and_vars = path.true_gradients(grads_and_vars)
        with path.handing_over():
            self.apply_gradients(self.transform_gradients(grads_and_vars), optimizer)
        path.check_handed_over(self)

    def compute_gradients(self, loss: tf.Tensor, tape: tf.GradientTape, variables: Sequence[Any]) -> list[Any]:
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
        return list(tape.gradient(loss, variables))

    def transform_gradients(self, grads_and_vars: GradsAndVars) -> GradsAndVars:
        """Changes gradients before they are applied; the default returns them as is.

        Called by :meth:`minimize` with ``(gradient, variable)`` pairs (only
        pairs whose gradient exists) holding the true gradient of the global
        batch's loss, the same on every precision, replica count and Keras
        (:mod:`custom_fit._gradient_contract`): unscaled under mixed precision,
        summed over replicas under ``tf.distribute``, and zeros on a step the
        loss-scale optimizer skips (a non-finite scaled gradient). A clip here
        moves the weights as it would in float32 on one device.

        Example:
            >>> import tensorflow as tf, custom_fit
            >>> class Clipped(custom_fit.CustomModel):
            ...     def transform_gradients(self, grads_and_vars):
            ...         grads_and_vars = super().transform_gradients(grads_and_vars)
            ...         return [(tf.clip_by_value(g, -1.0, 1.0), v)
            ...                 for g, v in grads_and_vars]
        """
        return grads_and_vars

    def apply_gradients(self, grads_and_vars: GradsAndVars, optimizer: Any = None) -> None:
        """Lets ``optimizer`` update the variables from the gradients.

        Called by :meth:`minimize` last, with the true gradients
        :meth:`transform_gradients` returned; this hands them to the
        optimizer in the form it takes (scaled again for Keras 3's
        ``LossScaleOptimizer``, not summed over replicas a second time, a
        skipped step kept skipped). The optimizer applies its own clipping
        (to the global gradient) and counts ``iterations``. An override hands
        them on with ``super().apply_gradients(...)``; called outside
        :meth:`minimize`, it gives the pairs to the optimizer as they are.

        Args:
            grads_and_vars: ``(gradient, variable)`` pairs.
            optimizer: As for :meth:`minimize`. From :meth:`minimize`, the
                optimizer it resolved, used as it is (resolved once per
                call); any other is resolved here.

        Example:
            >>> import custom_fit
            >>> class Logged(custom_fit.CustomModel):
            ...     def apply_gradients(self, grads_and_vars, optimizer=None):
            ...         print("updating", len(grads_and_vars), "variables")
            ...         super().apply_gradients(grads_and_vars, optimizer)
        """
        if not gradient_contract.handing_over_to(optimizer):  # minimize() passes the one it resolved
            optimizer = optimizers.resolve(self, optimizer, [v for _, v in grads_and_vars])
        gradient_contract.hand_over(optimizer, grads_and_vars)

    # -- what a step reports -----------------------------------------------

    #: Names of the values a custom step reports with :meth:`log_values`
    #: (e.g. ``("d_loss", "g_loss")``). ``compile()`` creates one batch-size
    #: weighted ``Mean`` per name; they appear in ``History``, the progress bar
    #: and callbacks (``val_`` prefixed in validation) as epoch means. Names
    #: ending in ``loss`` or ``penalty`` are "lower is better" for callbacks
    #: that monitor them (``EarlyStopping(monitor="g_loss")`` needs no ``mode``).
    logged_values: Sequence[str] = ()

    def log_values(self, batch: Any, **values: Any) -> None:
        """Adds this batch's named values to their epoch means (see :attr:`logged_values`).

        Call it from a custom ``train_step`` / ``test_step`` and return
        ``self.get_metrics_result()``. Each value is averaged over the epoch
        weighted by batch size, reset every epoch and at the start of
        ``evaluate``. Values follow Keras' loss convention under
        ``tf.distribute`` (as :func:`custom_fit.batch_mean` returns them).
        ``loss=`` updates Keras' own ``loss`` tracker.

        Args:
            batch: The batch's inputs (any structure) or its size.
            **values: Scalar tensors, by name; each name must be in
                :attr:`logged_values`.

        Raises:
            ValueError: The model is not compiled, or a name is not in
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
        epoch_means.log(self, batch, values)

    @property
    def metrics(self) -> list[Any]:
        """Keras' metrics, with the trackers of :attr:`logged_values` after ``loss``.

        A model compiled without a loss has a ``loss`` entry only once a step
        reported one (``CustomModel``'s own steps, ``compiled_loss``,
        ``log_values(loss=...)``), as on Keras 2; Keras 3 would log ``loss: 0``.
        """
        return epoch_means.with_trackers(self, super().metrics)

    def get_metrics_result(self) -> dict[str, Any]:
        """The current value of every metric, as a flat dict.

        Unlike ``keras.Model``, compiled metrics that no step updated yet are
        left out instead of raising "Cannot get result() since the metric has
        not yet been built".
        """
        return epoch_means.metrics_result(self)

    # -- helpers of the steps ----------------------------------------------

    def _unpack_batch(self, data: Any) -> tuple[Any, Any, Any]:
        """``(x, y, sample_weight)``; a clear error if ``y`` is missing while a loss is compiled."""
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        if y is None and version.has_compiled_loss(self):
            raise diagnostics.missing_targets_error(self)
        return x, y, sample_weight

    def _forward_pass(self, x: Any, training: bool) -> Any:
        """``self(x, training=...)`` as Keras' steps call it: ``training`` only if ``call`` takes it.

        ``call(x)`` is called as ``self(x)``, which leaves sublayers such as
        ``Dropout`` in their default mode, exactly as ``keras.Model`` does.
        """
        return self(x, training=training) if version.call_accepts_training(self) else self(x)

    def _step_loss(self, x: Any, y: Any, y_pred: Any, sample_weight: Any, training: bool) -> Any:
        """:meth:`compute_loss`, without ``training`` for overrides written before Keras 3.3 (as Keras does)."""
        if version.compute_loss_accepts_training(self):
            return self.compute_loss(x, y, y_pred, sample_weight, training=training)
        return self.compute_loss(x, y, y_pred, sample_weight)

    def _track_loss(self, loss: Any, x: Any) -> None:
        """Adds the batch's loss to the ``loss`` tracker as Keras 3's steps do (Keras 2's loss did already)."""
        if version.STEP_UPDATES_LOSS_TRACKER and version.loss_tracker(self) is not None:
            epoch_means.add_to_loss_tracker(self, loss, batch_size_of(x))


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

    @marked_as(keras.Sequential.build)
    def build(self, input_shape: Any = None) -> None:
        """``keras.Sequential.build``; defined here as ``Sequential`` defines it (and marked as it is marked).

        tf_keras raises "Weights for model ... have not yet been created" for
        an unbuilt model only when the model's own class defines ``build``;
        without this, an unbuilt ``CustomSequential`` would report no weights
        where ``Sequential`` raises.
        """
        super().build(input_shape)
