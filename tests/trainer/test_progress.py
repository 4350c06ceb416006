"""``custom_fit._trainer.progress``: the progress a ``fit`` owns, moves along, hands to callbacks and loads."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import custom_fit
from custom_fit._compat import keras
from custom_fit._trainer.progress import Progress, hand_to_callbacks


def test_state_dict_round_trip_starts_the_loaded_fit_where_the_other_stopped() -> None:
    progress = Progress()
    data = progress.data
    data.iterator_made()
    data.epoch_begins()
    data.reading(batches_before_step_0=0)
    progress.epoch_begins(2)
    progress.step_begins(5)
    state = progress.state_dict()
    assert state == {
        "epoch": 2, "step": 5, "iterator": 0, "skip": 5, "data_epoch": None,
        "trained_steps": 5, "validation_logs": None,
    }  # fmt: skip

    resumed = Progress()
    assert not resumed.loaded and resumed.first_epoch(initial_epoch=1) == 1
    resumed.load_state_dict(state)
    assert resumed.loaded and resumed.first_epoch(initial_epoch=1) == 2
    assert resumed.data.take_resume() is not None  # the epoch iterator's start


def test_after_the_epochs_steps_the_state_points_at_the_next_epoch() -> None:
    progress = Progress()  # no data iterator made: the next epoch makes the first
    progress.epoch_begins(0)
    progress.step_begins(7)
    progress.execution_ends(8)
    progress.epoch_ends()
    assert progress.state_dict() == {
        "epoch": 1, "step": 0, "iterator": 0, "skip": 0, "data_epoch": None,
        "trained_steps": 8, "validation_logs": None,
    }  # fmt: skip


def test_trained_steps_count_across_epochs_and_a_resume_keeps_the_epochs_last_run() -> None:
    """What ``validation_freq=Steps(N)`` reads: steps since the fit began, and the last run inside the epoch."""
    progress = Progress()
    progress.epoch_begins(0)
    progress.step_begins(0)
    progress.execution_ends(4)
    progress.epoch_ends()  # an epoch of 4 steps
    progress.epoch_begins(1)
    progress.step_begins(0)
    progress.execution_ends(3)
    progress.validated({"val_loss": 0.5})
    progress.step_begins(3)
    assert progress.trained_steps == 7
    state = progress.state_dict()
    assert (state["epoch"], state["step"], state["trained_steps"]) == (1, 3, 7)
    assert state["validation_logs"] == {"val_loss": 0.5}

    resumed = Progress()
    resumed.load_state_dict(state)
    assert resumed.trained_steps == 7  # the epoch iterator plans the first execution from here
    resumed.epoch_begins(1)
    assert resumed.validation_logs == {"val_loss": 0.5}  # the resumed epoch's logs keep that run
    resumed.step_begins(3)
    resumed.execution_ends(5)
    resumed.epoch_ends()
    resumed.epoch_begins(2)
    assert resumed.trained_steps == 9 and resumed.validation_logs is None


class _Recorder(keras.callbacks.Callback):
    """Records the progress it was handed, and its state at each hook."""

    def __init__(self) -> None:
        super().__init__()
        self.progress: Progress | None = None
        self.states: list[tuple[str, dict[str, Any]]] = []
        self.handed_before_train_begin = False

    def set_progress(self, progress: Progress) -> None:
        self.progress = progress

    def on_train_begin(self, logs: Any = None) -> None:
        self.handed_before_train_begin = self.progress is not None

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        assert self.progress is not None
        self.states.append((f"batch {batch}", self.progress.state_dict()))

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        assert self.progress is not None
        self.states.append((f"end {epoch}", self.progress.state_dict()))


def _model() -> Any:
    model = custom_fit.CustomSequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model


@pytest.mark.parametrize("as_list", [True, False], ids=["list", "CallbackList"])
def test_fit_hands_its_progress_to_callbacks_and_moves_it_along(as_list: bool) -> None:
    model = _model()
    recorder = _Recorder()
    callbacks: Any = [recorder] if as_list else keras.callbacks.CallbackList([recorder], add_history=True, model=model)
    model.fit(np.zeros((6, 2)), np.zeros((6, 1)), batch_size=2, epochs=2, callbacks=callbacks, verbose=0)
    assert recorder.handed_before_train_begin
    assert recorder.progress is not None and not recorder.progress.running  # fit returned
    ends = [state for hook, state in recorder.states if hook.startswith("end")]
    assert [(state["epoch"], state["step"]) for state in ends] == [(1, 0), (2, 0)]
    batches = [(state["epoch"], state["step"]) for hook, state in recorder.states if hook.startswith("batch")]
    assert batches == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]  # the loop tells the progress each step
    if not as_list:  # the user's list is left as it was
        assert callbacks.callbacks == [recorder, *callbacks.callbacks[1:]]
        assert not any(type(c).__name__ == "_ProgressReporter" for c in callbacks.callbacks)


def test_hand_to_callbacks_takes_a_list_a_callback_list_one_callback_or_none() -> None:
    progress = Progress()
    recorders = [_Recorder() for _ in range(3)]
    hand_to_callbacks(progress, [recorders[0], keras.callbacks.History()])
    hand_to_callbacks(progress, keras.callbacks.CallbackList([recorders[1]]))
    hand_to_callbacks(progress, recorders[2])
    hand_to_callbacks(progress, None)
    assert all(recorder.progress is progress for recorder in recorders)


def test_fit_takes_its_arguments_by_position_also_where_keras_model_is_replaced(monkeypatch: Any) -> None:
    """``fit`` takes Keras' arguments by position, also where ``tf_keras.Model`` names ``CustomModel``.

    tf_keras' own tests, run with ``CustomModel`` swapped in for ``tf_keras.Model`` (``make keras2-peer``),
    replace the module's ``Model``; the arguments must still reach the loop, callbacks by position.
    """
    model = _model()
    recorder = _Recorder()
    if custom_fit.KERAS_2:
        monkeypatch.setattr(keras, "Model", custom_fit.CustomModel)
    history = model.fit(np.zeros((6, 2)), np.zeros((6, 1)), 2, 2, 0, [recorder])
    assert recorder.progress is not None and len(history.history["loss"]) == 2
