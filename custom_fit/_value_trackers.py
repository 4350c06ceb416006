"""The trackers of a model's ``logged_values``: one batch-size weighted ``Mean`` per name.

``compile()`` makes them (:meth:`LoggedValues.for_model`) and keeps them in the
model's state; :mod:`custom_fit._logged_values` updates and reads them. Apart
from that module so that the state can name their type without importing
what reads the state.

Nothing in this module is public API.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from custom_fit._compat import keras, version

__all__ = ["LoggedValues"]


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
        self.metrics_entries: list[Any] = version.logged_value_entries(trackers) if trackers else []

    @classmethod
    def for_model(cls, model: Any) -> LoggedValues:
        """The trackers ``model.logged_values`` needs (``"loss"`` goes to Keras' tracker if there is one)."""
        has_loss_tracker = version.loss_tracker(model) is not None
        return cls([name for name in model.logged_values if name != "loss" or not has_loss_tracker])

    def __contains__(self, name: object) -> bool:
        return name in self._trackers

    def __getitem__(self, name: str) -> Any:
        return self._trackers[name]
