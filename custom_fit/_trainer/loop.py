"""The ``fit``/``evaluate``/``predict`` loop ``CustomModel`` runs on Keras 3, and the state each call keeps.

:class:`Loop` is custom_fit's own copy of Keras 3's loop
(``TensorFlowTrainer.fit``, ``evaluate``, ``predict``): the same calls, in
the same order, on the same data, so histories and callbacks see what
``keras.Model`` gives them. What it adds, it adds as collaborators it hands
the pieces, instead of patching Keras' objects from outside:

* the loop's *plan* (:class:`~custom_fit._trainer.step_fusion.ExecutionPlan`: with
  ``compile(steps_per_execution="auto")`` the model's
  :class:`~custom_fit._trainer.step_fusion.StepsPerExecutionTuner`, else a
  :class:`~custom_fit._trainer.step_fusion.FixedPlan`) says how many steps each
  execution fuses, and the loop tells it each execution that ran; the epoch
  iterator (:class:`custom_fit._compat.keras3_only.EpochIterator`, a subclass
  of Keras') asks it before each execution, where it knows the steps left,
  and reports to the call's :class:`~custom_fit._trainer.progress.EpochPosition`;
* each ``fit`` owns a :class:`~custom_fit._trainer.progress.Progress` (epoch, step,
  data position), which it moves along and hands to the callbacks that take
  it: :class:`~custom_fit.BackupAndRestore` saves its ``state_dict`` and
  loads one into it, and the loop starts where it says;
* the callbacks are a :class:`~custom_fit._trainer.callbacks.LazyCallbackList` (no
  host wait per step) unless the user passes a ``CallbackList``.

Data path (Keras 3), one execution: ``Loop.fit`` → ``EpochIterator``
(Keras' data adapter, distributed dataset) → ``Execution(iterator, steps)``
→ ``model.train_function`` (:func:`custom_fit._compat.version.make_step_function`)
→ ``train_step`` per replica → logs → the plan (``executed``) →
``LazyCallbackList``. A resume: ``BackupAndRestore.on_train_begin`` →
``Progress.load_state_dict`` → ``Loop.fit`` (its first epoch) and the epoch
iterator (iterators replayed, batches skipped).

State: each ``fit``, ``evaluate`` and ``predict`` call on a model is a
:class:`LoopCall`, on a stack the model keeps while they run (``fit``'s
validation is an ``evaluate`` inside a ``fit``). Nothing else about a call is
kept on the model.

Keras 2 runs tf_keras' own loop (steered from ``_compat/keras2.py``): tf_keras
skips unused batch hooks itself, and its data handler reads the number of
steps per execution from a variable before every execution (the step function
asks and tells the tuner there). Its ``fit`` has a :class:`Progress` too, moved
along by tf_keras' epoch hooks (``StepFunctions.fit``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from custom_fit import _compat
from custom_fit._compat import keras
from custom_fit._compat.common import report_execution
from custom_fit._state import LoopCall, state_of
from custom_fit._trainer.callbacks import LazyCallbackList
from custom_fit._trainer.progress import EpochPosition, Progress, hand_to_callbacks
from custom_fit._trainer.step_functions import StepFunctions
from custom_fit._trainer.step_fusion import ExecutionPlan, FixedPlan

__all__ = ["Loop"]


class Loop(StepFunctions):
    """Gives ``CustomModel`` the ``fit``, ``evaluate`` and ``predict`` of Keras 3, run by custom_fit.

    Each method takes Keras' arguments and does what ``keras.Model``'s does
    (its docstring is Keras'), with the differences the module docstring
    lists. They are ordinary methods: a subclass may override them and call
    ``super()``; ``fit`` runs its validation through ``self.evaluate``, as
    Keras does.
    """

    @property
    def steps_per_execution(self) -> int:
        """The number of steps each call of the train, test or predict function runs.

        What ``compile`` was given. With ``compile(steps_per_execution="auto")``,
        the number of training steps the tuner fuses now (1 until ``fit`` has
        tuned it), but 1 while ``evaluate`` or ``predict`` run: Keras' own
        ``evaluate`` and ``predict`` run ``steps_per_execution`` batches even
        when their ``steps`` asks for fewer, so fusing the tuned number could
        change their results. ``get_compile_config()`` keeps ``"auto"``.
        """
        state = state_of(self)
        if state.steps_tuner is None or (state.loop_calls and state.loop_calls[-1].kind != "fit"):
            return state.fixed_steps_per_execution
        return state.steps_tuner.steps

    @steps_per_execution.setter
    def steps_per_execution(self, value: int) -> None:
        state_of(self).fixed_steps_per_execution = value  # Keras sets it in __init__ and compile

    def fit(
        self,
        x: Any = None,
        y: Any = None,
        batch_size: int | None = None,
        epochs: int = 1,
        verbose: Any = "auto",
        callbacks: Any = None,
        validation_split: float = 0.0,
        validation_data: Any = None,
        shuffle: bool = True,
        class_weight: Any = None,
        sample_weight: Any = None,
        initial_epoch: int = 0,
        steps_per_epoch: int | None = None,
        validation_steps: int | None = None,
        validation_batch_size: int | None = None,
        validation_freq: Any = 1,
    ) -> Any:
        _compat.keras3_only.assert_compiled(self, "fit")
        epochs = _compat.keras3_only.capped_epochs(epochs)
        if validation_split and validation_data is None:
            # The last fraction of the arrays, as in Keras (arrays only).
            (x, y, sample_weight), validation_data = _compat.keras3_only.train_validation_split(
                (x, y, sample_weight), validation_split
            )
        if validation_data is not None:
            val_x, val_y, val_sample_weight = keras.utils.unpack_x_y_sample_weight(validation_data)
        progress = Progress(data=EpochPosition())
        call = LoopCall("fit", progress=progress)
        state = state_of(self)
        # The loop asks the plan how many steps each execution fuses and tells it what ran.
        plan: ExecutionPlan = state.steps_tuner or FixedPlan(state.fixed_steps_per_execution)
        with (
            self._running(call),
            _compat.keras3_only.EpochIterator(
                plan=plan.plan,
                position=progress.data,
                x=x,
                y=y,
                sample_weight=sample_weight,
                batch_size=batch_size,
                steps_per_epoch=steps_per_epoch,
                shuffle=shuffle,
                class_weight=class_weight,
                distribute_strategy=self.distribute_strategy,
                steps_per_execution=state.fixed_steps_per_execution,
            ) as epoch_iterator,
        ):
            _compat.keras3_only.build_before_loop(self, epoch_iterator)
            epoch_iterator.reset()
            callbacks = self._callback_list(
                callbacks, add_history=True, verbose=verbose, epochs=epochs, steps=epoch_iterator.num_batches
            )
            hand_to_callbacks(progress, callbacks)

            def train_batch_begin(step: int) -> None:
                progress.step_begins(step)
                callbacks.on_train_batch_begin(step)

            self.stop_training = False
            self.make_train_function()
            callbacks.on_train_begin()
            training_logs = None
            logs: Any = {}
            # Where a backup loaded into the progress says (custom_fit.BackupAndRestore), else where
            # Keras' own BackupAndRestore says (model._initial_epoch), else the argument.
            for epoch in range(progress.first_epoch(_compat.keras3_only.first_epoch(self, initial_epoch)), epochs):
                self.reset_metrics()
                progress.epoch_begins(epoch)
                callbacks.on_epoch_begin(epoch)
                logs, stepped = self._run_epoch(
                    epoch_iterator,
                    lambda execution: self.train_function(execution),  # read per execution, as Keras does
                    train_batch_begin,
                    callbacks.on_train_batch_end,
                    stopped=lambda: self.stop_training,
                    logs=logs,
                    plan=plan,
                )
                progress.epoch_ends()
                # The metrics' results replace the last step's logs where they name the same values
                # (after an epoch that ran no step, the logs are the epoch before's, as in Keras).
                epoch_logs = dict(_compat.keras3_only.epoch_logs(self, logs, returned=stepped))
                if validation_data is not None and _compat.keras3_only.validates_after(self, epoch, validation_freq):
                    if call.validation is None:
                        call.validation = self._epoch_iterator(
                            x=val_x,
                            y=val_y,
                            sample_weight=val_sample_weight,
                            batch_size=validation_batch_size or batch_size,
                            steps_per_epoch=validation_steps,
                        )
                    val_logs = self.evaluate(
                        x=val_x,
                        y=val_y,
                        sample_weight=val_sample_weight,
                        batch_size=validation_batch_size or batch_size,
                        steps=validation_steps,
                        callbacks=callbacks,
                        return_dict=True,
                        **_compat.keras3_only.FIT_VALIDATION_KWARGS,
                    )
                    epoch_logs.update({f"val_{name}": value for name, value in val_logs.items()})
                callbacks.on_epoch_end(epoch, epoch_logs)
                training_logs = epoch_logs
                if self.stop_training:
                    break
            if isinstance(self.optimizer, keras.optimizers.Optimizer) and epochs > 0:
                self.optimizer.finalize_variable_values(self.trainable_weights)
            call.close_validation()  # it holds the validation data: not kept past fit, as in Keras
            callbacks.on_train_end(logs=training_logs)
            return self.history

    def _run_epoch(
        self,
        epoch_iterator: Any,
        function: Callable[[Any], Any],
        batch_begin: Callable[[int], None],
        batch_end: Callable[[int, Any], None],
        *,
        stopped: Callable[[], bool],
        logs: Any,
        plan: ExecutionPlan | None = None,
    ) -> tuple[Any, bool]:
        """Runs ``function`` on each execution of one epoch between the batch hooks.

        Args:
            plan: Told each execution that ran (``fit``; the epoch iterator asked it for their steps).

        Returns:
            The last execution's logs (``logs`` if none ran) and whether any ran.
        """
        execution = None
        stepped = False
        try:
            with epoch_iterator.catch_stop_iteration():
                for first, steps, execution in epoch_iterator:
                    batch_begin(first)
                    logs = function(execution)
                    if plan is not None:
                        report_execution(plan, execution.steps, logs, execution.iterator)
                    stepped = True
                    batch_end(_compat.keras3_only.batch_end_step(first, steps), logs)
                    if stopped():
                        break
            return logs, stepped
        finally:
            # A traceback keeps this frame: not the data iterator too (EpochIterator.close says why).
            execution = None

    def evaluate(
        self,
        x: Any = None,
        y: Any = None,
        batch_size: int | None = None,
        verbose: Any = "auto",
        sample_weight: Any = None,
        steps: int | None = None,
        callbacks: Any = None,
        return_dict: bool = False,
        **kwargs: Any,
    ) -> Any:
        _compat.keras3_only.assert_compiled(self, "evaluate")
        use_fit_validation = _compat.keras3_only.pop_fit_validation(kwargs)  # fit's validation
        if kwargs:
            raise ValueError(f"Arguments not recognized: {kwargs}")
        fit_calls = [call for call in state_of(self).loop_calls if call.kind == "fit"]
        owned = contextlib.ExitStack()  # closes an epoch iterator made here, not fit's validation one
        if use_fit_validation and fit_calls and fit_calls[-1].validation is not None:
            epoch_iterator = fit_calls[-1].validation
        else:
            epoch_iterator = owned.enter_context(
                self._epoch_iterator(
                    x=x, y=y, sample_weight=sample_weight, batch_size=batch_size, steps_per_epoch=steps
                )
            )
        with owned, self._running(LoopCall("evaluate")):
            _compat.keras3_only.build_before_loop(self, epoch_iterator)
            epoch_iterator.reset()
            callbacks = self._callback_list(
                callbacks, add_history=False, verbose=verbose, epochs=1, steps=epoch_iterator.num_batches
            )
            self.make_test_function()
            self.stop_evaluating = False
            callbacks.on_test_begin()
            self.reset_metrics()
            logs, stepped = self._run_epoch(
                epoch_iterator,
                lambda execution: self.test_function(execution),
                callbacks.on_test_batch_begin,
                callbacks.on_test_batch_end,
                stopped=lambda: self.stop_evaluating,
                logs={},
            )
            logs = _compat.keras3_only.evaluation_logs(_compat.keras3_only.epoch_logs(self, logs, returned=stepped))
            callbacks.on_test_end(logs)
        if return_dict:
            return logs
        return _compat.keras3_only.flat_logs(self, logs)

    def predict(
        self,
        x: Any,
        batch_size: int | None = None,
        verbose: Any = "auto",
        steps: int | None = None,
        callbacks: Any = None,
    ) -> Any:
        with (
            self._running(LoopCall("predict")),
            self._epoch_iterator(x=x, batch_size=batch_size, steps_per_epoch=steps) as epoch_iterator,
        ):
            if not isinstance(callbacks, keras.callbacks.CallbackList):
                # Keras' own list: predict's logs are the outputs, which no callback waits for anyway.
                callbacks = keras.callbacks.CallbackList(
                    callbacks,
                    add_progbar=verbose != 0,
                    verbose=verbose,
                    epochs=1,
                    steps=epoch_iterator.num_batches,
                    model=self,
                )
            self.make_predict_function()
            self.stop_predicting = False
            callbacks.on_predict_begin()
            outputs: list[Any] = []
            with epoch_iterator.catch_stop_iteration():
                for first, steps_run, execution in epoch_iterator:
                    callbacks.on_predict_batch_begin(first)
                    batch_outputs = self.predict_function(_batches(execution))
                    outputs.append(batch_outputs)
                    callbacks.on_predict_batch_end(
                        _compat.keras3_only.batch_end_step(first, steps_run), {"outputs": batch_outputs}
                    )
                    if self.stop_predicting:
                        break
            callbacks.on_predict_end()
        if not outputs:
            raise ValueError(
                "predict() received no data: the input yielded no batch. Expected at least one batch; "
                f"received x={type(x).__name__} with steps={steps}. Pass data with at least one sample."
            )
        joined = keras.tree.map_structure(lambda *batches: list(batches), *outputs)
        return _compat.keras3_only.concat_predictions(joined, outputs[0])

    def _epoch_iterator(self, **data: Any) -> Any:
        """An epoch iterator for ``evaluate`` or ``predict``: not shuffled, ``compile``'s steps per execution."""
        fixed = state_of(self).fixed_steps_per_execution
        return _compat.keras3_only.EpochIterator(
            plan=FixedPlan(fixed).plan,
            shuffle=False,
            distribute_strategy=self.distribute_strategy,
            steps_per_execution=fixed,
            **data,
        )

    def _callback_list(self, callbacks: Any, *, add_history: bool, verbose: Any, epochs: int, steps: Any) -> Any:
        """``callbacks`` if it is a ``CallbackList`` (the user's, or fit's for its validation), else a lazy one."""
        if isinstance(callbacks, keras.callbacks.CallbackList):
            return callbacks
        return LazyCallbackList(
            callbacks,
            add_history=add_history,
            add_progbar=verbose != 0,
            model=self,
            verbose=verbose,
            epochs=epochs,
            steps=steps,
        )


for _method in (Loop.fit, Loop.evaluate, Loop.predict):
    _method.__doc__ = getattr(keras.Model, _method.__name__).__doc__  # Keras' documentation of the arguments


def _batches(execution: Any) -> list[Any]:
    """The batches of one ``predict`` execution: up to ``execution.steps``, fewer where the data ends.

    Raises ``StopIteration`` (which the epoch iterator catches) when no batch is left.
    """
    batches: list[Any] = []
    for _ in range(execution.steps):
        try:
            batches.append(next(execution.iterator))
        except (StopIteration, tf.errors.OutOfRangeError):
            if batches:
                return batches
            raise
    return batches
