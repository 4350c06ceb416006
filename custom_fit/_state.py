"""custom_fit's state of one model, in one typed object.

Keras keeps a model's trainer state on the model (``optimizer``, ``compiled_loss``,
``train_function``, ...). What custom_fit adds (the tuner, the step's
diagnostics, the trackers of logged values, the calls of ``fit``/``evaluate``/
``predict`` that run, the recorded constructor and ``compile`` arguments) lives
in one :class:`ModelState`, reached with :func:`state_of`: one attribute on the
model, out of Keras' tracking and out of every saved file.

The state is made the first time any part of custom_fit asks for it, not in a
constructor, because Keras itself calls into custom_fit (``steps_per_execution``,
``compile``) from its own ``__init__``, and TF1-style code can train a model whose
``compile`` ran in another graph. Nothing in this module is public API.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Literal

from custom_fit._compat.common import set_untracked
from custom_fit._diagnostics import StepDiagnostics

if TYPE_CHECKING:
    from custom_fit._trainer.progress import Progress
    from custom_fit._trainer.step_fusion import StepsPerExecutionTuner
    from custom_fit._value_trackers import LoggedValues

__all__ = ["LoopCall", "ModelState", "state_of"]

_ATTRIBUTE = "_custom_fit"


@dataclasses.dataclass(eq=False)  # a call is itself: two calls are never equal
class LoopCall:
    """One ``fit``, ``evaluate`` or ``predict`` call running on a model.

    custom_fit's loop records every call, on both Kerases.

    Attributes:
        kind: The method.
        progress: ``fit`` only: where it is (epoch, step, data), the state a resumed ``fit`` loads.
        validation: ``fit`` only: the epoch iterator of the validation set
            its ``evaluate`` reads now.
        validation_name: ``fit`` only: the name of the named validation set
            its ``evaluate`` reads now (``None``: Keras' one set).
        validation_iterators: ``fit`` only: each validation set's epoch
            iterator, made at the set's first run and kept until ``fit`` returns.
    """

    kind: Literal["fit", "evaluate", "predict"]
    progress: Progress | None = None
    validation: Any = None
    validation_name: str | None = None
    validation_iterators: dict[int, Any] = dataclasses.field(default_factory=dict)

    def close_validation(self) -> None:
        """Closes and drops the validation sets' epoch iterators (``fit`` ends)."""
        for iterator in self.validation_iterators.values():
            iterator.close()
        self.validation_iterators.clear()
        self.validation = self.validation_name = None


@dataclasses.dataclass(eq=False)
class ModelState:
    """Everything custom_fit keeps for one model beyond Keras' own attributes.

    Attributes:
        diagnostics: Records the training step while it is traced and warns about misuse.
        steps_tuner: The tuner of ``compile(steps_per_execution="auto")``, else ``None``.
        fixed_steps_per_execution: The ``steps_per_execution`` Keras or ``compile`` set.
        loop_calls: The ``fit``/``evaluate``/``predict`` calls running now, innermost last.
        logged_values: The trackers of ``logged_values`` (made by ``compile``).
        reports_loss: Whether a step added its loss to the ``loss`` tracker itself.
        constructor_arguments: ``__init__``'s arguments by name, for ``get_config``.
        compile_arguments: A custom ``compile``'s arguments by name, for ``get_compile_config``.
        recording_compile: Whether a custom ``compile`` is being recorded now.
        rebuilt_optimizers: ``{attribute: optimizer}``: the optimizers the model keeps as
            attributes that its constructor or its own ``compile`` made (``load_model`` re-runs them).
        predict_function_steps: The steps the predict function was made for.
    """

    diagnostics: StepDiagnostics
    steps_tuner: StepsPerExecutionTuner | None = None
    fixed_steps_per_execution: int = 1
    loop_calls: list[LoopCall] = dataclasses.field(default_factory=list)
    logged_values: LoggedValues | None = None
    reports_loss: bool = False
    constructor_arguments: dict[str, Any] | None = None
    compile_arguments: dict[str, Any] | None = None
    recording_compile: bool = False
    rebuilt_optimizers: dict[str, Any] = dataclasses.field(default_factory=dict)
    predict_function_steps: int | None = None


def state_of(model: Any) -> ModelState:
    """``model``'s :class:`ModelState`, made on first use.

    Example:
        >>> import custom_fit
        >>> model = custom_fit.CustomSequential([custom_fit.keras.layers.Dense(1)])
        >>> state_of(model) is state_of(model), state_of(model).steps_tuner
        (True, None)
    """
    state: ModelState | None = vars(model).get(_ATTRIBUTE)
    if state is None:
        state = ModelState(StepDiagnostics(model))
        set_untracked(model, _ATTRIBUTE, state)
    return state
