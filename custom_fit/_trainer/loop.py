"""The ``fit``/``evaluate``/``predict`` loop ``CustomModel`` runs on both Kerases, and the state each call keeps.

:class:`Loop` is custom_fit's own copy of the Keras in use's loop (Keras 3's
``TensorFlowTrainer.fit``, ``evaluate``, ``predict``; tf_keras 2.21's
``Model.fit``, ``evaluate``, ``predict``): the same calls, in the same order,
on the same data, so histories and callbacks see what ``keras.Model`` gives
them. Where the two Kerases differ (their data adapters, the checks a call
begins with, how an execution is called, how logs and predictions are made),
the loop asks ``_compat.loop``
(:class:`~custom_fit._compat.contract.LoopParts`: :mod:`~custom_fit._compat.keras3_only`
or :mod:`~custom_fit._compat.keras2_loop`); the loop itself reads no Keras
private name. What it adds, it adds as collaborators it hands the pieces,
instead of patching Keras' objects from outside:

* the loop's *plan* (:class:`~custom_fit._trainer.step_fusion.ExecutionPlan`: with
  ``compile(steps_per_execution="auto")`` the model's
  :class:`~custom_fit._trainer.step_fusion.StepsPerExecutionTuner`, else a
  :class:`~custom_fit._trainer.step_fusion.FixedPlan`) says how many steps each
  execution fuses, and the loop tells it each execution that ran; the epoch
  iterator (over Keras' epoch iterator or tf_keras' data handler) asks it
  before each execution, where it knows the steps left, and reports to the
  call's :class:`~custom_fit._trainer.progress.EpochPosition`;
* each ``fit`` owns a :class:`~custom_fit._trainer.progress.Progress` (epoch, step,
  data position), which it moves along and hands to the callbacks that take
  it: :class:`~custom_fit.BackupAndRestore` saves its ``state_dict`` and
  loads one into it, and the loop starts where it says;
* with ``validation_freq=Steps(N)``, a
  :class:`~custom_fit._trainer.validation.ValidationSchedule` says after which
  steps a validation run is due (the loop counts them in the progress) and
  caps the plan there; what each callback sees of a run is that module's;
* the callbacks are a :class:`~custom_fit._trainer.callbacks.LazyCallbackList` (no
  host wait per step; Keras 3) unless the user passes a ``CallbackList``;
  tf_keras' own list skips unused batch hooks itself.

Data path, one execution: ``Loop.fit`` → the epoch iterator (Keras' data
adapter, distributed dataset) → an execution (data iterator, steps) →
``model.train_function`` (:func:`custom_fit._compat.version.make_step_function`)
→ ``train_step`` per replica → logs → the plan (``executed``) → the
callbacks. A resume: ``BackupAndRestore.on_train_begin`` →
``Progress.load_state_dict`` → ``Loop.fit`` (its first epoch) and the epoch
iterator (iterators replayed, batches skipped).

State: each ``fit``, ``evaluate`` and ``predict`` call on a model is a
:class:`LoopCall`, on a stack the model keeps while they run (``fit``'s
validation is an ``evaluate`` inside a ``fit``). Nothing else about a call is
kept on the model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from custom_fit import _compat
from custom_fit._compat import keras
from custom_fit._compat.common import report_execution
from custom_fit._state import LoopCall, state_of
from custom_fit._tool_wrappers import runs_tool_wrappers
from custom_fit._trainer.callbacks import LazyCallbackList
from custom_fit._trainer.progress import EpochPosition, Progress, hand_to_callbacks
from custom_fit._trainer.step_functions import StepFunctions
from custom_fit._trainer.step_fusion import ExecutionPlan, FixedPlan
from custom_fit._trainer.validation import Steps, ValidationSchedule, epoch_end, keeping_training_metrics, run_end

__all__ = ["Loop"]


class Loop(StepFunctions):
    """Gives ``CustomModel`` its ``fit``, ``evaluate`` and ``predict``: one loop, run by custom_fit on both Kerases.

    Each method takes the Keras in use's arguments and does what its
    ``Model``'s does (its docstring is Keras'), with the differences the module
    docstring lists. They are ordinary methods: a subclass may override them
    and call ``super()``; ``fit`` runs its validation through ``self.evaluate``,
    as Keras does.
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
        On Keras 2 it is tf_keras' variable, as on ``tf_keras.Model`` (setting
        it before ``compile`` creates it).
        """
        state = state_of(self)
        if state.steps_tuner is None or (state.loop_calls and state.loop_calls[-1].kind != "fit"):
            steps = self._fixed_steps_per_execution()
        else:
            steps = state.steps_tuner.steps
        return _compat.loop.steps_per_execution(self, steps)  # Keras 2: tf_keras' variable, as there

    @steps_per_execution.setter
    def steps_per_execution(self, value: int) -> None:
        state_of(self).fixed_steps_per_execution = value  # Keras 3 sets it in __init__ and compile
        _compat.loop.set_steps_per_execution(self, value)

    @runs_tool_wrappers  # a tool's wrapper of keras.Model.fit (MLflow, Comet) runs around it
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
        **kwargs: Any,
    ) -> Any:
        parts = _compat.loop
        if parts.in_legacy_graph():  # Keras 2 in a TF1 graph: tf_keras' v1 engine runs it, as for tf_keras.Model
            if isinstance(validation_freq, Steps):
                raise ValueError(
                    f"fit(validation_freq={validation_freq!r}) runs in custom_fit's loop, but this model was built "
                    "in a TF1 graph (tf.Graph().as_default()), where tf_keras' v1 engine runs fit. "
                    "Fix: build and fit the model outside the graph, or pass an int validation_freq."
                )
            if validation_batch_size is not None:  # the v1 engine has no such argument: it raises, as for tf_keras
                kwargs["validation_batch_size"] = validation_batch_size
            return super().fit(
                x=x, y=y, batch_size=batch_size, epochs=epochs, verbose=verbose, callbacks=callbacks,
                validation_split=validation_split, validation_data=validation_data, shuffle=shuffle,
                class_weight=class_weight, sample_weight=sample_weight, initial_epoch=initial_epoch,
                steps_per_epoch=steps_per_epoch, validation_steps=validation_steps,
                validation_freq=validation_freq, **kwargs,
            )  # fmt: skip
        verbose = parts.begin_call(self, "fit", verbose)
        options = parts.data_options(kwargs, "fit")  # Keras 2: max_queue_size, workers, use_multiprocessing
        epochs = parts.capped_epochs(epochs)
        if validation_split and validation_data is None:
            # The last fraction of the arrays, as in Keras (arrays only).
            (x, y, sample_weight), validation_data = parts.train_validation_split(
                (x, y, sample_weight), validation_split
            )
        validates = parts.has_validation_data(validation_data)
        # validation_freq=Steps(N): validation after every N-th step (custom_fit._trainer.validation).
        schedule = ValidationSchedule.for_fit(validation_freq, validates=validates)
        if validates:
            val_x, val_y, val_sample_weight = keras.utils.unpack_x_y_sample_weight(validation_data)
        progress = Progress(data=EpochPosition())
        call = LoopCall("fit", progress=progress)
        state = state_of(self)
        # The loop asks the plan how many steps each execution fuses and tells it what ran.
        fixed = self._fixed_steps_per_execution()
        plan: ExecutionPlan = state.steps_tuner or FixedPlan(fixed)
        # Executions end at validation runs.
        steps_for = plan.plan if schedule is None else schedule.capped(plan.plan, lambda: progress.trained_steps)
        with (
            self._running(call),
            parts.call_scope(self, "fit"),
            parts.epoch_iterator(
                self,
                plan=steps_for,
                position=progress.data,
                x=x,
                y=y,
                sample_weight=sample_weight,
                batch_size=batch_size,
                steps_per_epoch=steps_per_epoch,
                initial_epoch=initial_epoch,
                epochs=epochs,
                shuffle=shuffle,
                class_weight=class_weight,
                steps_per_execution=fixed,
                **options,
            ) as epoch_iterator,
        ):
            parts.build_before_loop(self, epoch_iterator)
            epoch_iterator.reset()
            callbacks = self._callback_list(
                callbacks, add_history=True, verbose=verbose, epochs=epochs, steps=epoch_iterator.num_batches
            )
            hand_to_callbacks(progress, callbacks)

            def train_batch_begin(step: int) -> None:
                progress.step_begins(step)
                callbacks.on_train_batch_begin(step)

            def validate() -> dict[str, Any]:
                """One validation run: ``evaluate`` on the validation data with ``fit``'s callbacks."""
                if call.validation is None:
                    call.validation = self._epoch_iterator(
                        x=val_x,
                        y=val_y,
                        sample_weight=val_sample_weight,
                        batch_size=validation_batch_size or batch_size,
                        steps_per_epoch=validation_steps,
                        **options,
                    )
                val_logs = self.evaluate(
                    x=val_x,
                    y=val_y,
                    sample_weight=val_sample_weight,
                    batch_size=validation_batch_size or batch_size,
                    steps=validation_steps,
                    callbacks=callbacks,
                    return_dict=True,
                    **options,
                    **parts.FIT_VALIDATION_KWARGS,
                )
                return {f"val_{name}": value for name, value in val_logs.items()}

            def train_execution_end(first: int, steps: int, logs: Any) -> None:
                progress.execution_ends(first + steps)
                trained = progress.trained_steps
                if schedule is not None and schedule.due(trained):
                    train_logs = dict(parts.epoch_logs(self, logs, returned=True))  # the epoch so far
                    with keeping_training_metrics(self):  # evaluate resets the metrics training shares
                        val_logs = validate()
                    progress.validated(val_logs)
                    run_end(callbacks, schedule.run_index(trained), trained, train_logs, val_logs)

            self.stop_training = False
            self.make_train_function()
            parts.reset_counter(self, "fit")
            callbacks.on_train_begin()
            training_logs = None
            logs: Any = None  # no step ran yet
            # Where a backup loaded into the progress says (custom_fit.BackupAndRestore), else where
            # Keras' own BackupAndRestore says, else the argument.
            if progress.loaded:
                first = progress.first_epoch(initial_epoch)
            else:
                first = parts.first_epoch(self, initial_epoch, epoch_iterator)
            for epoch in range(first, epochs):
                if epoch_iterator.exhausted:  # Keras 2 ends fit when the data ran out before its steps
                    break
                self.reset_metrics()
                progress.epoch_begins(epoch)
                callbacks.on_epoch_begin(epoch)
                logs, stepped = self._run_epoch(
                    epoch_iterator,
                    lambda execution: parts.run_execution(self.train_function, execution),  # read per execution
                    train_batch_begin,
                    callbacks.on_train_batch_end,
                    stopped=lambda: self.stop_training,
                    logs=logs,
                    plan=plan,
                    execution_end=train_execution_end,
                )
                progress.epoch_ends()
                # The metrics' results replace the last step's logs where they name the same values
                # (after an epoch that ran no step, the logs are the epoch before's, as in Keras).
                epoch_logs = dict(parts.epoch_logs(self, logs, returned=stepped))
                if schedule is not None:  # the runs inside the epoch reached the monitors already
                    training_logs = epoch_end(callbacks, epoch, epoch_logs, progress.validation_logs)
                else:
                    if validates and parts.validates_after(self, epoch, validation_freq):
                        epoch_logs.update(validate())
                    callbacks.on_epoch_end(epoch, epoch_logs)
                    training_logs = epoch_logs
                if self.stop_training:
                    break
            else:
                epoch_iterator.epochs_done()
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
        execution_end: Callable[[int, int, Any], None] | None = None,
    ) -> tuple[Any, bool]:
        """Runs ``function`` on each execution of one epoch between the batch hooks.

        Args:
            plan: Told each execution that ran (``fit``; the epoch iterator asked it for their steps).
            execution_end: Called with the execution's first step, its steps and
                logs after its last batch hook, before ``stopped`` is asked (``fit``).

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
                    batch_end(_compat.loop.batch_end_step(first, steps), logs)
                    if execution_end is not None:
                        execution_end(first, steps, logs)
                    if stopped():
                        break
            return logs, stepped
        finally:
            # A traceback keeps this frame: not the data iterator too (EpochIterator.close says why).
            execution = None

    @runs_tool_wrappers  # a tool's wrapper of keras.Model.evaluate runs around it
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
        parts = _compat.loop
        if parts.in_legacy_graph():  # Keras 2 in a TF1 graph (see fit); the v1 engine has no return_dict
            return super().evaluate(
                x=x, y=y, batch_size=batch_size, verbose=verbose, sample_weight=sample_weight, steps=steps,
                callbacks=callbacks, **({"return_dict": True} if return_dict else {}), **kwargs,
            )  # fmt: skip
        verbose = parts.begin_call(self, "evaluate", verbose, x, sample_weight)
        use_fit_validation = parts.pop_fit_validation(kwargs)  # fit's validation
        options = parts.data_options(kwargs, "evaluate")  # Keras 2: max_queue_size, workers, use_multiprocessing
        fit_calls = [call for call in state_of(self).loop_calls if call.kind == "fit"]
        owned = contextlib.ExitStack()  # closes an epoch iterator made here, not fit's validation one
        with owned, self._running(LoopCall("evaluate")), parts.call_scope(self, "evaluate"):
            if use_fit_validation and fit_calls and fit_calls[-1].validation is not None:
                epoch_iterator = fit_calls[-1].validation
            else:
                epoch_iterator = owned.enter_context(
                    self._epoch_iterator(
                        x=x, y=y, sample_weight=sample_weight, batch_size=batch_size, steps_per_epoch=steps, **options
                    )
                )
            parts.build_before_loop(self, epoch_iterator)
            epoch_iterator.reset()
            callbacks = self._callback_list(
                callbacks, add_history=False, verbose=verbose, epochs=1, steps=epoch_iterator.num_batches
            )
            self.make_test_function()
            parts.reset_counter(self, "evaluate")
            self.stop_evaluating = False
            callbacks.on_test_begin()
            self.reset_metrics()
            logs, stepped = self._run_epoch(
                epoch_iterator,
                lambda execution: parts.run_execution(self.test_function, execution),
                callbacks.on_test_batch_begin,
                callbacks.on_test_batch_end,
                stopped=lambda: self.stop_evaluating,
                logs={},
            )
            epoch_iterator.epochs_done()
            logs = parts.evaluation_logs(parts.epoch_logs(self, logs, returned=stepped))
            callbacks.on_test_end(logs)
        if return_dict:
            return logs
        return parts.flat_logs(self, logs)

    @runs_tool_wrappers  # a tool's wrapper of keras.Model.predict runs around it
    def predict(
        self,
        x: Any,
        batch_size: int | None = None,
        verbose: Any = "auto",
        steps: int | None = None,
        callbacks: Any = None,
        **kwargs: Any,
    ) -> Any:
        parts = _compat.loop
        if parts.in_legacy_graph():  # Keras 2 in a TF1 graph (see fit)
            return super().predict(
                x, batch_size=batch_size, verbose=verbose, steps=steps, callbacks=callbacks, **kwargs
            )
        verbose = parts.begin_call(self, "predict", verbose)
        options = parts.data_options(kwargs, "predict")  # Keras 2: max_queue_size, workers, use_multiprocessing
        with (
            self._running(LoopCall("predict")),
            parts.call_scope(self, "predict"),
            self._epoch_iterator(
                x=x, batch_size=batch_size, steps_per_epoch=steps, predicting=True, **options
            ) as epoch_iterator,
        ):
            if not isinstance(callbacks, keras.callbacks.CallbackList):
                # Keras' own list: predict's logs are the outputs, which no callback waits for anyway.
                callbacks = parts.callback_list(
                    None,
                    callbacks,
                    add_progbar=verbose != 0,
                    verbose=verbose,
                    epochs=1,
                    steps=epoch_iterator.num_batches,
                    model=self,
                )
            self.make_predict_function()
            parts.reset_counter(self, "predict")
            self.stop_predicting = False
            callbacks.on_predict_begin()
            outputs: list[Any] = []
            with epoch_iterator.catch_stop_iteration():
                for first, steps_run, execution in epoch_iterator:
                    callbacks.on_predict_batch_begin(first)
                    batch_outputs = parts.run_prediction(self.predict_function, execution)
                    outputs.append(batch_outputs)
                    callbacks.on_predict_batch_end(parts.batch_end_step(first, steps_run), {"outputs": batch_outputs})
                    if self.stop_predicting:
                        break
            epoch_iterator.epochs_done()
            callbacks.on_predict_end()
        if not outputs:
            raise ValueError(
                "predict() received no data: the input yielded no batch. Expected at least one batch; "
                f"received x={type(x).__name__} with steps={steps}. Pass data with at least one sample."
            )
        return parts.concat_predictions(outputs)

    def _fixed_steps_per_execution(self) -> int:
        """``compile(steps_per_execution=N)``'s ``N`` (1 with ``"auto"``, whose tuner decides in ``fit``)."""
        return _compat.loop.fixed_steps_per_execution(self, state_of(self).fixed_steps_per_execution)

    def _epoch_iterator(self, **data: Any) -> Any:
        """An epoch iterator for ``evaluate`` or ``predict``: not shuffled, ``compile``'s steps per execution."""
        fixed = self._fixed_steps_per_execution()
        return _compat.loop.epoch_iterator(
            self, plan=FixedPlan(fixed).plan, shuffle=False, steps_per_execution=fixed, **data
        )

    def _callback_list(self, callbacks: Any, *, add_history: bool, verbose: Any, epochs: int, steps: Any) -> Any:
        """``callbacks`` if it is a ``CallbackList`` (the user's, or fit's for its validation), else a new one."""
        if isinstance(callbacks, keras.callbacks.CallbackList):
            return callbacks
        return _compat.loop.callback_list(
            LazyCallbackList,
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
