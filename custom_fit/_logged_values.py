"""Values a custom step reports as epoch means: ``CustomModel.logged_values`` and ``log_values``.

``CustomModel.log_values``, ``metrics`` and ``get_metrics_result`` call the
functions here; the trackers live in the model's state (``compile()`` makes
them, :meth:`~custom_fit._value_trackers.LoggedValues.for_model`).

A GAN or VAE step computes several losses (``d_loss``, ``g_loss``,
``kl_loss``). Returned as they are, ``fit()`` would show the last batch's
value; tracked here, each is a batch-size weighted ``Mean`` that Keras resets
every epoch and at the start of ``evaluate``, so the history, the progress bar
and callbacks see epoch means (``val_`` prefixed in validation), also under
``steps_per_execution`` and ``tf.distribute``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from custom_fit._compat import version
from custom_fit._compat.common import batch_size_of, is_scalar
from custom_fit._state import state_of
from custom_fit._value_trackers import LoggedValues

__all__ = [
    "add_to_loss_tracker",
    "flattened_logs",
    "log",
    "metrics_result",
    "trackers_of",
    "with_trackers",
]


def trackers_of(model: Any) -> LoggedValues:
    """The trackers ``compile()`` made; none for a model compiled another way (tf_keras' TF1 paths)."""
    trackers = state_of(model).logged_values
    return trackers if trackers is not None else LoggedValues([])


def log(model: Any, batch: Any, values: Mapping[str, Any]) -> None:
    """``model.log_values(batch, **values)``: adds each value to its epoch mean (see ``CustomModel.log_values``)."""
    if not version.is_compiled(model):
        raise ValueError(
            f"log_values() needs a compiled model: expected `compile()` to have "
            f"created trackers for {list(model.logged_values)}; model '{model.name}' "
            "was not compiled. Fix: call `model.compile(...)` first."
        )
    batch_size = batch if is_scalar(batch) else batch_size_of(batch)
    trackers = trackers_of(model)
    for name, value in values.items():
        if name not in model.logged_values:
            raise ValueError(
                f"log_values() received {name!r}, which is not in "
                f"{type(model).__name__}.logged_values = {tuple(model.logged_values)}. "
                f"Expected only declared names. Fix: add {name!r} to `logged_values` "
                "(a class attribute) before compile()."
            )
        if name in trackers:
            trackers[name].update_state(version.unscale_loss_for_distribution(value), sample_weight=batch_size)
        else:  # "loss": Keras' own tracker
            add_to_loss_tracker(model, value, batch_size)


def add_to_loss_tracker(model: Any, loss: Any, batch_size: Any) -> None:
    """Adds a batch's loss (in Keras' distribution convention) to Keras' ``loss`` tracker.

    The tracker sees the global mean (unscaled for distribution) weighted by
    batch size, so the epoch value is right for a partial last batch. From
    then on the logs show ``loss``, also when no loss was compiled.
    """
    state_of(model).reports_loss = True
    version.loss_tracker(model).update_state(version.unscale_loss_for_distribution(loss), sample_weight=batch_size)


def with_trackers(model: Any, keras_metrics: list[Any]) -> list[Any]:
    """``model.metrics``: Keras' metrics, the trackers after ``loss``, ``loss`` only once a step reports one."""
    if not version.is_compiled(model):
        return keras_metrics
    loss_tracker = version.loss_tracker(model)
    keep_loss = version.has_compiled_loss(model) or state_of(model).reports_loss
    head = [loss_tracker] if keep_loss and loss_tracker in keras_metrics else []
    own: list[Any] = trackers_of(model).metrics_entries
    return head + own + [m for m in keras_metrics if m is not loss_tracker]


def metrics_result(model: Any) -> dict[str, Any]:
    """``model.get_metrics_result()``: every metric's value, compiled metrics no step updated left out."""
    results = {}
    for metric in model.metrics:
        if metric is version.compiled_metrics_container(model) and not metric.built:
            continue
        result = metric.result()
        results.update(result if isinstance(result, dict) else {metric.name: result})
    return version.finish_metrics_result(results)


def flattened_logs(logs: Any) -> Any:
    """``logs`` with nested dicts lifted into them: flat ``{name: value}``; logs that are not a dict as they are.

    Keras-2-style steps return ``{m.name: m.result() for m in self.metrics}``,
    in which Keras 3's ``compile_metrics`` entry is itself a dict.

    Example:
        >>> flattened_logs({"loss": 1.0, "compile_metrics": {"accuracy": 0.5}})
        {'loss': 1.0, 'accuracy': 0.5}
    """
    if not isinstance(logs, dict):
        return logs
    flat = {}
    for name, value in logs.items():
        if isinstance(value, dict):
            flat.update(value)
        else:
            flat[name] = value
    return flat
