"""``compiled_loss`` and ``compiled_metrics`` with their Keras 2 meaning, on Keras 3.

Tutorials, blog posts and older projects write training steps like this::

    loss = self.compiled_loss(y, y_pred, sample_weight,
                              regularization_losses=self.losses)
    ...
    self.compiled_metrics.update_state(y, y_pred, sample_weight)
    return {m.name: m.result() for m in self.metrics}

Keras 3 keeps both names only as deprecated shims: they warn on every trace,
feed ``y_pred`` to the ``loss`` tracker (so the history reports the mean of
the predictions as the loss) and fail on multi-output models with a dict of
losses. On a :class:`custom_fit.CustomModel` the two names are these objects
instead, which do what Keras 2 did:

* :class:`CompiledLoss` returns the compiled loss plus exactly the
  regularization losses it is given, and updates the ``loss`` tracker (and the
  per-output loss trackers) with the distribution-unscaled value weighted by
  batch size, as Keras 3's own ``train_step`` does.
* :class:`CompiledMetrics` updates only the metrics given to ``compile()``.

The nested ``{"compile_metrics": {...}}`` entry that ``self.metrics`` yields on
Keras 3 is flattened by ``CustomModel`` before the logs reach callbacks.

:class:`CompiledAttributes` puts both on ``CustomModel``. On Keras 2
(``TF_USE_LEGACY_KERAS=1``) the two names are Keras' own objects, which
already mean this; the classes here then refuse to be made, with a message
that says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from custom_fit import _compat
from custom_fit import _logged_values as epoch_means
from custom_fit._compat import keras, version
from custom_fit._compat.common import batch_size_of
from custom_fit._host import Host

__all__ = ["CompiledAttributes", "CompiledLoss", "CompiledMetrics"]


def _keras_3_only(model: Any, name: str, attribute: str) -> None:
    """Refuses to make ``name`` on Keras 2, where ``model.<attribute>`` is Keras' own."""
    if version.HAS_COMPILED_LOSS_ATTRIBUTES:
        raise ValueError(
            f"custom_fit.{name} gives Keras 3 models Keras 2's `model.{attribute}`; this process "
            f"runs Keras 2 ({version.KERAS_VERSION}, TF_USE_LEGACY_KERAS=1), where model "
            f"'{model.name}' has Keras' own. Expected a Keras 3 model, received a tf_keras one. "
            f"Fix: use `model.{attribute}` itself."
        )


class CompiledLoss:
    """Keras-2 ``model.compiled_loss``: the loss from ``compile()``, callable in a step.

    Example:
        >>> import numpy as np, keras, custom_fit
        >>> inputs = keras.Input((3,))
        >>> model = custom_fit.CustomModel(inputs, keras.layers.Dense(1)(inputs))
        >>> model.compile(optimizer="sgd", loss="mse")
        >>> y, y_pred = np.ones((4, 1), "float32"), np.zeros((4, 1), "float32")
        >>> float(model.compiled_loss(y, y_pred))
        1.0
    """

    def __init__(self, model: keras.Model):
        _keras_3_only(model, "CompiledLoss", "compiled_loss")
        self._model = model

    def __call__(
        self,
        y_true: Any,
        y_pred: Any,
        sample_weight: Any = None,
        regularization_losses: Sequence[Any] | None = None,
    ) -> Any:
        """Returns the total loss and updates the loss trackers.

        Args:
            y_true: Targets, structured like the model's outputs.
            y_pred: Predictions (``self(x, training=True)``).
            sample_weight: Optional per-sample weights.
            regularization_losses: Extra losses to add, usually ``self.losses``.
                They are added once, reduced like Keras 3's trainer reduces
                ``model.losses`` (so passing ``self.losses`` gives exactly the
                loss ``keras.Model`` minimizes).

        Returns:
            A scalar tensor: the compiled loss (weighted by ``loss_weights``)
            plus the regularization losses, scaled for distribution like every
            Keras loss.

        Raises:
            ValueError: no loss was compiled and no regularization loss given.
        """
        model = self._model
        losses = []
        compiled = _compat.keras3_only.compiled_loss_value(model, y_true, y_pred, sample_weight)
        if compiled is not None:
            losses.append(compiled)
        for loss in regularization_losses or ():
            losses.append(_compat.keras3_only.aggregate_additional_loss(model, loss))
        if not losses:
            raise ValueError(
                "`compiled_loss` has nothing to compute: expected a `loss` passed "
                "to `compile()` or a non-empty `regularization_losses`, received "
                f"neither for model '{model.name}'. Fix: call "
                "`model.compile(optimizer=..., loss=...)` with a loss."
            )
        total = _compat.keras3_only.sum_losses(losses)
        if version.loss_tracker(model) is not None:
            epoch_means.add_to_loss_tracker(model, total, batch_size_of(y_pred))
        return total

    @property
    def metrics(self) -> list:
        """The loss trackers this object updates (``loss`` and per-output losses)."""
        tracker = version.loss_tracker(self._model)
        trackers = [tracker] if tracker is not None else []
        return trackers + _compat.keras3_only.compiled_loss_trackers(self._model)


class CompiledMetrics:
    """Keras-2 ``model.compiled_metrics``: the metrics given to ``compile()``.

    Example:
        >>> import numpy as np, keras, custom_fit
        >>> inputs = keras.Input((3,))
        >>> model = custom_fit.CustomModel(inputs, keras.layers.Dense(1)(inputs))
        >>> model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
        >>> model.compiled_metrics.update_state(np.ones((4, 1)), np.zeros((4, 1)))
        >>> {name: float(v) for name, v in model.compiled_metrics.result().items()}
        {'mae': 1.0}
    """

    def __init__(self, model: keras.Model):
        _keras_3_only(model, "CompiledMetrics", "compiled_metrics")
        self._model = model

    def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
        """Updates the compiled ``metrics`` and ``weighted_metrics`` (not the loss)."""
        container = version.compiled_metrics_container(self._model)
        if container is not None:
            container.update_state(y_true, y_pred, sample_weight)

    def result(self) -> dict:
        """A flat ``{name: value}`` dict of the compiled metrics (empty before the first update)."""
        container = version.compiled_metrics_container(self._model)
        if container is None or not container.built:
            return {}
        return dict(container.result())

    def reset_state(self) -> None:
        """Resets the compiled metrics."""
        container = version.compiled_metrics_container(self._model)
        if container is not None:
            container.reset_state()

    @property
    def metrics(self) -> list:
        """The individual compiled metric objects (empty until the first update)."""
        container = version.compiled_metrics_container(self._model)
        return list(container.metrics) if container is not None else []


class CompiledAttributes(Host):
    """Gives ``CustomModel`` the Keras-2 ``compiled_loss`` and ``compiled_metrics`` (Keras 3 only).

    Keras 3 keeps both names only as deprecated shims with the wrong meaning;
    Keras 2 code expects these.
    """

    @property
    def compiled_loss(self) -> CompiledLoss:
        """Keras-2 ``compiled_loss``: see :class:`CompiledLoss`."""
        return CompiledLoss(self)

    @property
    def compiled_metrics(self) -> CompiledMetrics:
        """Keras-2 ``compiled_metrics``: see :class:`CompiledMetrics`."""
        return CompiledMetrics(self)
