"""Values a custom step reports as epoch means: ``CustomModel.logged_values`` and ``log_values``.

A GAN or VAE step computes several losses (``d_loss``, ``g_loss``,
``kl_loss``). Returned as they are, ``fit()`` would show the last batch's
value; tracked here, each is a batch-size weighted ``Mean`` that Keras resets
every epoch and at the start of ``evaluate``, so the history, the progress bar
and callbacks see epoch means (``val_`` prefixed in validation), also under
``steps_per_execution`` and ``tf.distribute``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from custom_fit import _compat
from custom_fit._compat import keras
from custom_fit._host import Host
from custom_fit._state import state_of

__all__ = ["LoggedValues", "LoggedValuesMixin", "flat_logs"]


class LoggedValues:
    """One batch-size weighted ``Mean`` per name, made by ``compile()``.

    ``"loss"`` is not tracked here when the model has Keras' own ``loss``
    tracker: ``log_values(loss=...)`` updates that one.

    Args:
        names: The names a step may log.
    """

    def __init__(self, names: Sequence[str]):
        self._trackers = {name: keras.metrics.Mean(name=name) for name in names}
        #: What these trackers add to ``model.metrics`` (Keras resets and reads them there).
        trackers = list(self._trackers.values())
        self.metrics_entries: list[Any] = _compat.logged_value_entries(trackers) if trackers else []

    @classmethod
    def for_model(cls, model: Any) -> LoggedValues:
        """The trackers ``model.logged_values`` needs (``"loss"`` goes to Keras' tracker if there is one)."""
        has_loss_tracker = _compat.loss_tracker(model) is not None
        return cls([name for name in model.logged_values if name != "loss" or not has_loss_tracker])

    def __contains__(self, name: object) -> bool:
        return name in self._trackers

    def __getitem__(self, name: str) -> Any:
        return self._trackers[name]


class LoggedValuesMixin(Host):
    """Gives ``CustomModel`` :attr:`logged_values`, :meth:`log_values` and the metrics they add."""

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
        if not _compat.is_compiled(self):
            raise ValueError(
                f"log_values() needs a compiled model: expected `compile()` to have "
                f"created trackers for {list(self.logged_values)}; model '{self.name}' "
                "was not compiled. Fix: call `model.compile(...)` first."
            )
        batch_size = batch if _compat.is_scalar(batch) else _compat.batch_size_of(batch)
        trackers = self._logged_value_trackers()
        for name, value in values.items():
            if name not in self.logged_values:
                raise ValueError(
                    f"log_values() received {name!r}, which is not in "
                    f"{type(self).__name__}.logged_values = {tuple(self.logged_values)}. "
                    f"Expected only declared names. Fix: add {name!r} to `logged_values` "
                    "(a class attribute) before compile()."
                )
            if name in trackers:
                trackers[name].update_state(_compat.unscale_loss_for_distribution(value), sample_weight=batch_size)
            else:  # "loss": Keras' own tracker
                self._add_to_loss_tracker(value, batch_size)

    def _add_to_loss_tracker(self, loss: Any, batch_size: Any) -> None:
        """Adds a batch's loss (in Keras' distribution convention) to Keras' ``loss`` tracker.

        The tracker sees the global mean (unscaled for distribution) weighted by
        batch size, so the epoch value is right for a partial last batch. From
        then on the logs show ``loss``, also when no loss was compiled.
        """
        state_of(self).reports_loss = True
        _compat.loss_tracker(self).update_state(_compat.unscale_loss_for_distribution(loss), sample_weight=batch_size)

    @property
    def metrics(self) -> list[Any]:
        """Keras' metrics, with the trackers of :attr:`logged_values` after ``loss``.

        A model compiled without a loss has a ``loss`` entry only once a step
        reported one (``CustomModel``'s own steps, ``compiled_loss``,
        ``log_values(loss=...)``), as on Keras 2; Keras 3 would log ``loss: 0``.
        """
        metrics = super().metrics
        if not _compat.is_compiled(self):
            return metrics
        loss_tracker = _compat.loss_tracker(self)
        keep_loss = _compat.has_compiled_loss(self) or state_of(self).reports_loss
        head = [loss_tracker] if keep_loss and loss_tracker in metrics else []
        own: list[Any] = self._logged_value_trackers().metrics_entries
        return head + own + [m for m in metrics if m is not loss_tracker]

    def get_metrics_result(self) -> dict[str, Any]:
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
            results.update(result if isinstance(result, dict) else {metric.name: result})
        return _compat.finish_metrics_result(results)

    def _make_logged_value_trackers(self) -> None:
        """Creates the trackers for :attr:`logged_values` (``compile()`` calls it)."""
        state_of(self).logged_values = LoggedValues.for_model(self)

    def _logged_value_trackers(self) -> LoggedValues:
        """The trackers ``compile()`` made; none for a model compiled another way (tf_keras' TF1 paths)."""
        trackers = state_of(self).logged_values
        return trackers if trackers is not None else LoggedValues([])


def flat_logs(step: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Wraps a step so nested dicts in its logs become flat ``{name: value}``.

    Keras-2-style steps return ``{m.name: m.result() for m in self.metrics}``,
    in which Keras 3's ``compile_metrics`` entry is itself a dict.
    """

    def step_with_flat_logs(data: Any) -> Any:
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
