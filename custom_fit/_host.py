# Declarations only: the bodies are `...` although most return something.
# mypy: disable-error-code="empty-body"
"""The model custom_fit's mixins are mixed into, as type checkers see it.

``CustomModel`` is ``keras.Model`` with three bases in front of it: ``Saving``,
its trainer (``Loop`` on ``StepFunctions`` on ``_compat.TrainerHooks``) and,
on Keras 3, ``CompiledAttributes``. Each of these mixins derives from
:data:`Host`: :class:`ModelHost` while type checking, ``object`` at run time
(so the method resolution order is the mixins', then Keras'). mypy thereby
checks what each mixin reads and calls on ``self``: Keras' model API (Keras
ships no type information, so those are ``Any``), and the state and methods
custom_fit adds to the model, with their types. A mixin's ``super().fit(...)``
resolves to the Keras method declared here.

It is a plain class, not a ``typing.Protocol``: mypy refuses ``super()``
calls to a protocol's empty methods, and every mixin makes such calls.
Nothing in this module is public API.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

__all__ = ["Host", "ModelHost"]


class ModelHost:
    """What custom_fit's mixins use of the model (never instantiated; see the module docstring)."""

    # -- Keras' model (Keras 3 or tf_keras), as the mixins use it -----------------------

    name: str
    built: bool
    trainable: bool
    optimizer: Any
    layers: list[Any]
    trainable_variables: list[Any]
    trainable_weights: list[Any]
    distribute_strategy: Any
    train_function: Any
    test_function: Any
    predict_function: Any

    @property
    def metrics(self) -> list[Any]: ...

    def fit(self, *args: Any, **kwargs: Any) -> Any: ...

    def evaluate(self, *args: Any, **kwargs: Any) -> Any: ...

    def predict(self, *args: Any, **kwargs: Any) -> Any: ...

    def train_on_batch(self, *args: Any, **kwargs: Any) -> Any: ...

    def test_on_batch(self, *args: Any, **kwargs: Any) -> Any: ...

    def compile(self, *args: Any, **kwargs: Any) -> None: ...

    def train_step(self, data: Any) -> dict[str, Any]: ...

    def test_step(self, data: Any) -> dict[str, Any]: ...

    def make_predict_function(self, force: bool = False) -> Callable[..., Any]: ...

    def get_config(self) -> dict[str, Any]: ...

    @classmethod
    def from_config(cls, config: dict[str, Any], custom_objects: Any = None) -> Any: ...

    def get_build_config(self) -> dict[str, Any] | None: ...

    def build_from_config(self, config: dict[str, Any]) -> None: ...

    def get_compile_config(self) -> dict[str, Any] | None: ...

    def compile_from_config(self, config: dict[str, Any]) -> None: ...

    def save_own_variables(self, store: dict[str, Any]) -> None: ...

    def load_own_variables(self, store: dict[str, Any]) -> None: ...

    def add_weight(self, *args: Any, **kwargs: Any) -> Any: ...

    # The trainer's state and methods the mixins use. Keras' private names are declared where they
    # are used: by each TrainerHooks, in custom_fit._compat.keras3 and custom_fit._compat.keras2.

    compiled: bool
    history: Any
    stop_training: bool
    stop_evaluating: bool
    stop_predicting: bool

    def reset_metrics(self) -> None: ...

    def make_train_function(self, force: bool = False) -> Callable[..., Any]: ...

    def make_test_function(self, force: bool = False) -> Callable[..., Any]: ...

    def call(self, *args: Any, **kwargs: Any) -> Any: ...

    # -- what custom_fit adds to the model ----------------------------------------------

    # Its state lives in one object, custom_fit._state.state_of(model).

    #: Names a step may log with ``log_values`` (a class attribute).
    logged_values: Sequence[str]

    def minimize(self, loss: Any, tape: Any, variables: Iterable[Any], optimizer: Any = None) -> None: ...

    def log_values(self, batch: Any, **values: Any) -> None: ...

    def get_metrics_result(self) -> dict[str, Any]: ...

    def _after_compile(self) -> None: ...


if TYPE_CHECKING:
    Host = ModelHost
else:
    Host = object
