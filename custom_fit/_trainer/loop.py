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
  call's :class:`~custom_fit._trainer.data_position.EpochPosition`;
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
import dataclasses
from typing import Any

from custom_fit import _compat
from custom_fit._compat import keras
from custom_fit._compat.common import report_execution
from custom_fit._state import LoopCall, state_of
from custom_fit._tool_wrappers import runs_tool_wrappers
from custom_fit._trainer.callbacks import LazyCallbackList
from custom_fit._trainer.progress import Progress, hand_to_callbacks
from custom_fit._trainer.step_functions import StepFunctions
from custom_fit._trainer.step_fusion import ExecutionPlan, FixedPlan
from custom_fit._trainer.validation import Steps, ValidationSchedule, epoch_end, keeping_training_metrics, run_end
from custom_fit._trainer.validation_sets import ValidationSet, named_logs, validation_sets

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
            return self._fit_in_legacy_graph(
                x=x, y=y, batch_size=batch_size, epochs=epochs, verbose=verbose, callbacks=callbacks,
                validation_split=validation_split, validation_data=validation_data, shuffle=shuffle,
                class_weight=class_weight, sample_weight=sample_weight, initial_epoch=initial_epoch,
                steps_per_epoch=steps_per_epoch, validation_steps=validation_steps,
                validation_batch_size=validation_batch_size, validation_freq=validation_freq, **kwargs,
            )  # fmt: skip
        verbose = parts.begin_call(self, "fit", verbose)
        options = parts.data_options(kwargs, "fit")  # Keras 2: max_queue_size, workers, use_multiprocessing
        epochs = parts.capped_epochs(epochs)
        if validation_split and validation_data is None:
            # The last fraction of the arrays, as in Keras (arrays only).
            (x, y, sample_weight), validation_data = parts.train_validation_split(
                (x, y, sample_weight), validation_split
            )
        sets = validation_sets(
            validation_data, batch_size=validation_batch_size, steps=validation_steps, fit_batch_size=batch_size,
            validation_split=validation_split, output_names=_several_output_names(self),
        )  # fmt: skip
        # validation_freq=Steps(N): validation after every N-th step (custom_fit._trainer.validation).
        schedule = ValidationSchedule.for_fit(validation_freq, validates=bool(sets))
        progress = Progress()
        call = LoopCall("fit", progress=progress)
        # The loop asks the plan how many steps each execution fuses and tells it what ran.
        fixed = self._fixed_steps_per_execution()
        plan: ExecutionPlan = state_of(self).steps_tuner or FixedPlan(fixed)
        steps_for = plan.plan if schedule is None else schedule.capped(plan.plan, progress)  # executions end at runs
        data = {"x": x, "y": y, "sample_weight": sample_weight, "batch_size": batch_size, "shuffle": shuffle,
                "class_weight": class_weight, "steps_per_epoch": steps_per_epoch, **options}  # fmt: skip
        with (
            self._running(call),
            parts.call_scope(self, "fit"),
            parts.epoch_iterator(
                self,
                plan=steps_for,
                position=progress.data,
                initial_epoch=initial_epoch,
                epochs=epochs,
                steps_per_execution=fixed,
                **data,
            ) as epoch_iterator,
        ):
            parts.build_before_loop(self, epoch_iterator)
            epoch_iterator.reset()
            callbacks = self._callback_list(
                callbacks, add_history=True, verbose=verbose, epochs=epochs, steps=epoch_iterator.num_batches
            )
            hand_to_callbacks(progress, callbacks)
            run = _FitRun(self, call, callbacks, plan, schedule, _Validation(sets, options), validation_freq)
            self.stop_training = False
            self.make_train_function()
            parts.reset_counter(self, "fit")
            callbacks.on_train_begin()
            # Where a backup loaded into the progress says (custom_fit.BackupAndRestore), else where
            # Keras' own BackupAndRestore says, else the argument.
            first = (
                progress.first_epoch(initial_epoch)
                if progress.loaded
                else parts.first_epoch(self, initial_epoch, epoch_iterator)
            )
            training_logs = self._train_epochs(run, epoch_iterator, range(first, epochs))
            if isinstance(self.optimizer, keras.optimizers.Optimizer) and epochs > 0:
                self.optimizer.finalize_variable_values(self.trainable_weights)
            call.close_validation()  # it holds the validation data: not kept past fit, as in Keras
            callbacks.on_train_end(logs=training_logs)
            return self.history

    def _fit_in_legacy_graph(self, *, validation_freq: Any, validation_batch_size: int | None, **arguments: Any) -> Any:
        """``fit`` in a TF1 graph (Keras 2 only): tf_keras' v1 engine runs it, as it does for ``tf_keras.Model``."""
        if isinstance(validation_freq, Steps):
            raise ValueError(
                f"fit(validation_freq={validation_freq!r}) runs in custom_fit's loop, but this model was built "
                "in a TF1 graph (tf.Graph().as_default()), where tf_keras' v1 engine runs fit. "
                "Fix: build and fit the model outside the graph, or pass an int validation_freq."
            )
        if validation_batch_size is not None:  # the v1 engine has no such argument: it raises, as for tf_keras
            arguments["validation_batch_size"] = validation_batch_size
        return super().fit(validation_freq=validation_freq, **arguments)

    def _train_epochs(self, run: _FitRun, epoch_iterator: Any, epochs: range) -> dict[str, Any] | None:
        """Trains ``epochs`` until the data runs out or a callback stops training; returns the last epoch's logs.

        Each epoch: the metrics reset, ``on_epoch_begin``, its executions
        (:meth:`_run_epoch`), its end (:meth:`_FitRun.epoch_ends`). ``None``
        if no epoch ran.
        """
        training_logs = None
        logs: Any = None  # no step ran yet
        for epoch in epochs:
            if epoch_iterator.exhausted:  # Keras 2 ends fit when the data ran out before its steps
                break
            self.reset_metrics()
            run.progress.epoch_begins(epoch)
            run.callbacks.on_epoch_begin(epoch)
            logs, stepped = self._run_epoch(epoch_iterator, run.callbacks, logs=logs, fit=run)
            run.progress.epoch_ends()
            # The metrics' results replace the last step's logs where they name the same values
            # (after an epoch that ran no step, the logs are the epoch before's, as in Keras).
            training_logs = run.epoch_ends(epoch, dict(_compat.loop.epoch_logs(self, logs, returned=stepped)))
            if self.stop_training:
                break
        else:
            epoch_iterator.epochs_done()
        return training_logs

    def _run_epoch(
        self, epoch_iterator: Any, callbacks: Any, *, logs: Any, fit: _FitRun | None = None
    ) -> tuple[Any, bool]:
        """Runs the train function (``fit``'s run given) or the test function on each execution of one epoch.

        Between the batch hooks: ``fit``'s (:meth:`_FitRun.batch_begins`,
        :meth:`_FitRun.execution_ends`) or ``on_test_batch_begin`` and
        ``on_test_batch_end``. The function is read per execution (a callback
        may rebuild it) and called on the execution itself: nothing of
        custom_fit's stands between this frame and the step function.

        Returns:
            The last execution's logs (``logs`` if none ran) and whether any ran.
        """
        execution = None
        stepped = False
        try:
            with epoch_iterator.catch_stop_iteration():
                for first, steps, execution in epoch_iterator:
                    if fit is not None:
                        fit.batch_begins(first)
                        logs = self.train_function(execution)
                        stepped = True
                        fit.execution_ends(first, steps, execution, logs)
                    else:
                        callbacks.on_test_batch_begin(first)
                        logs = self.test_function(execution)
                        stepped = True
                        callbacks.on_test_batch_end(_compat.loop.batch_end_step(first, steps), logs)
                    if self.stop_training if fit is not None else self.stop_evaluating:
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
        validating = fit_calls[-1] if use_fit_validation and fit_calls else None  # fit's call, when it validates
        owned = contextlib.ExitStack()  # closes an epoch iterator made here, not fit's validation one
        with owned, self._running(LoopCall("evaluate")), parts.call_scope(self, "evaluate"):
            if validating is not None and validating.validation is not None:
                epoch_iterator = validating.validation
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
            logs, stepped = self._run_epoch(epoch_iterator, callbacks, logs={})
            epoch_iterator.epochs_done()
            logs = parts.evaluation_logs(parts.epoch_logs(self, logs, returned=stepped))
            # A named validation set's values reach on_test_end under its name (MLflow logs them there).
            callbacks.on_test_end(named_logs(validating.validation_name if validating else None, logs))
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


@dataclasses.dataclass
class _Validation:
    """``fit``'s validation sets (none: it does not validate) and the data options each run passes on."""

    sets: list[ValidationSet]
    options: dict[str, Any]


def _several_output_names(model: Any) -> list[str] | None:
    """The model's output names where it has several (their metrics are named after them), else ``None``."""
    names = getattr(model, "output_names", None)
    return list(names) if names and len(names) > 1 else None


class _FitRun:
    """What one ``fit`` call's epochs share, and the hooks they run around each execution.

    Made once ``fit``'s callbacks exist; :meth:`Loop._train_epochs` and
    :meth:`Loop._run_epoch` call its methods. Methods of an object rather than
    closures over ``fit``'s locals, so ``fit`` reads as its phases.
    """

    def __init__(
        self,
        model: Loop,
        call: LoopCall,
        callbacks: Any,
        plan: ExecutionPlan,
        schedule: ValidationSchedule | None,
        validation: _Validation,
        validation_freq: Any,
    ) -> None:
        assert call.progress is not None  # fit's call has one
        self.model, self.call, self.progress, self.callbacks = model, call, call.progress, callbacks
        self.plan, self.schedule, self.validation, self.validation_freq = plan, schedule, validation, validation_freq

    def batch_begins(self, step: int) -> None:
        """Before an execution whose first step is ``step``: the progress, then ``on_train_batch_begin``."""
        self.progress.step_begins(step)
        self.callbacks.on_train_batch_begin(step)

    def execution_ends(self, first: int, steps: int, execution: Any, logs: Any) -> None:
        """After an execution: the plan is told, ``on_train_batch_end``, then a validation run if one is due."""
        report_execution(self.plan, execution.steps, logs, execution.iterator)
        self.callbacks.on_train_batch_end(_compat.loop.batch_end_step(first, steps), logs)
        self.progress.execution_ends(first + steps)
        trained = self.progress.trained_steps
        if self.schedule is not None and self.schedule.due(trained):
            train_logs = dict(_compat.loop.epoch_logs(self.model, logs, returned=True))  # the epoch so far
            with keeping_training_metrics(self.model):  # evaluate resets the metrics training shares
                val_logs = self.validate()
            self.progress.validated(val_logs)
            run_end(self.callbacks, self.schedule.run_index(trained), trained, train_logs, val_logs)

    def epoch_ends(self, epoch: int, epoch_logs: dict[str, Any]) -> dict[str, Any]:
        """``on_epoch_end``, after the epoch's validation if it validates; returns the logs the callbacks got."""
        if self.schedule is not None:  # the runs inside the epoch reached the monitors already
            return epoch_end(self.callbacks, epoch, epoch_logs, self.progress.validation_logs)
        if self.validation.sets and _compat.loop.validates_after(self.model, epoch, self.validation_freq):
            epoch_logs.update(self.validate())
        self.callbacks.on_epoch_end(epoch, epoch_logs)
        return epoch_logs

    def validate(self) -> dict[str, Any]:
        """One validation run: ``evaluate`` on each validation set with ``fit``'s callbacks; their logs ``val_``-named.

        Raises:
            ValueError: Two sets logged a value under the same name.
        """
        val_logs: dict[str, Any] = {}
        for index, data in enumerate(self.validation.sets):
            if index not in self.call.validation_iterators:  # made at the set's first run, kept until fit ends
                self.call.validation_iterators[index] = self.model._epoch_iterator(
                    x=data.x, y=data.y, sample_weight=data.sample_weight, batch_size=data.batch_size,
                    steps_per_epoch=data.steps, **self.validation.options,
                )  # fmt: skip
            # What evaluate reads, and the name its on_test_end logs carry.
            self.call.validation, self.call.validation_name = self.call.validation_iterators[index], data.name
            try:
                evaluated = self.model.evaluate(
                    x=data.x, y=data.y, sample_weight=data.sample_weight, batch_size=data.batch_size,
                    steps=data.steps, callbacks=self.callbacks, return_dict=True, **self.validation.options,
                    **_compat.loop.FIT_VALIDATION_KWARGS,
                )  # fmt: skip
            except Exception as error:
                if data.name is not None:
                    error.add_note(f"(custom_fit: while fit validated on the validation set {data.name!r})")
                raise
            logs = data.logs(evaluated)
            _check_no_name_twice(val_logs, logs, data.name)
            val_logs.update(logs)
        return val_logs


def _check_no_name_twice(earlier: dict[str, Any], logs: dict[str, Any], name: str | None) -> None:
    """Raises if the set ``name`` logs a value under a name an earlier set of the run used."""
    twice = sorted(set(earlier) & set(logs))
    if twice:
        raise ValueError(
            f"fit(validation_data=dict): the validation set {name!r} logs {', '.join(twice)}, which an earlier "
            "set logged in the same run (a metric's name begins with the rest of a longer set name). Expected each "
            "set's values under names of their own. Fix: rename the set so that no set's name is another's "
            "followed by '_'."
        )


for _method in (Loop.fit, Loop.evaluate, Loop.predict):
    _method.__doc__ = getattr(keras.Model, _method.__name__).__doc__  # Keras' documentation of the arguments
