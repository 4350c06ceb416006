"""How ``fit``, ``evaluate`` and ``predict`` run a ``CustomModel``'s steps.

Keras calls ``model.train_function(iterator)`` once per execution (one or
``steps_per_execution`` batches). :class:`StepFunctions` builds those
functions around the model's steps: logs flattened (Keras-2-style steps return
nested dicts), the training step traced under the model's
:class:`~custom_fit._diagnostics.StepDiagnostics`, and XLA and cross-replica
errors explained. Each piece is a call inside the step or the step function,
not a wrapper around it: between ``fit`` and ``train_step`` custom_fit puts at
most 3 frames more than Keras (``tests/trainer/test_loop.py``).
The fused, distributed loop itself is :func:`custom_fit._compat.version.make_step_function`.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

from custom_fit import _compat
from custom_fit import _distribution as distribution
from custom_fit._compat import version
from custom_fit._compat.common import in_replica, with_errors_explained
from custom_fit._logged_values import flattened_logs
from custom_fit._optimizers import NamedOptimizers, ensure_state
from custom_fit._state import LoopCall, state_of

__all__ = ["StepFunctions"]


class StepFunctions(_compat.TrainerHooks):
    """Gives ``CustomModel`` the ``make_*_function`` methods Keras' ``fit``/``evaluate``/``predict`` call.

    It builds on :class:`custom_fit._compat.TrainerHooks` (the private trainer
    methods of the Keras in use that custom_fit replaces);
    :class:`custom_fit._trainer.loop.Loop` builds on it in turn. Together they are
    ``CustomModel``'s trainer, layered as Keras' own (``TensorFlowTrainer`` on
    ``Trainer``).
    """

    @contextlib.contextmanager
    def _running(self, call: LoopCall) -> Iterator[LoopCall]:
        """Keeps ``call`` on the model's stack of running calls while it runs."""
        state_of(self).loop_calls.append(call)
        try:
            yield call
        finally:
            state_of(self).loop_calls.pop()
            call.close_validation()
            if call.progress is not None:
                call.progress.fit_ends()
                call.progress.forget_data()  # it holds the data: not kept past fit, as in Keras

    def make_train_function(self, force: bool = False) -> Callable[..., Any]:
        """Builds ``self.train_function`` around ``train_step`` (logs flattened, step checked, errors explained).

        Both Kerases call it at the start of ``fit``, before any callback. A
        model never called itself (a GAN, a distiller) is marked built when
        all its variables exist, so that Keras' ``BackupAndRestore`` accepts it.
        """
        version.mark_built_if_complete(self)
        if self.train_function is None or force:
            tuner = state_of(self).steps_tuner  # compile(steps_per_execution="auto")
            self.train_function = version.make_step_function(
                self,
                self._checked_train_step,
                training=True,
                tuner=tuner,
                explain=functools.partial(distribution.explained_merge_call_error, self),
            )
        return self.train_function

    def make_test_function(self, force: bool = False) -> Callable[..., Any]:
        """Builds ``self.test_function`` around ``test_step`` (logs flattened, XLA errors explained)."""
        if self.test_function is None or force:
            tuner = state_of(self).steps_tuner  # the number of steps may change between executions
            self.test_function = version.make_step_function(
                self, self._test_step_in_replica, training=False, tuner=tuner
            )
        return self.test_function

    def make_predict_function(self, force: bool = False) -> Callable[..., Any]:
        """Builds ``self.predict_function`` around ``predict_step`` (Keras' own loop, XLA errors explained).

        Keras builds a function that runs one step per call when
        ``steps_per_execution`` is 1, and its ``predict`` loop hands it as
        many batches as ``steps_per_execution`` says at each call. With
        ``steps_per_execution="auto"`` that number grows during ``fit``, so a
        function built for one step is built again for several, which would
        otherwise predict only the first batch of each execution.
        """
        steps = _steps_per_execution(self)
        built_for_one_step = state_of(self).predict_function_steps == 1
        if self.predict_function is None or force or (built_for_one_step and steps > 1):
            super().make_predict_function(force=True)
            self.predict_function = with_errors_explained(self, self.predict_function)
            state_of(self).predict_function_steps = steps
        return self.predict_function

    def _checked_train_step(self, data: Any) -> Any:
        """``train_step``, traced under the model's ``StepDiagnostics``, logs flattened; counts named optimizers' steps.

        Under a ``tf.distribute`` strategy, variables the step creates (an
        attribute optimizer's slots, a sub-model built by its first call) are
        created under the strategy, outside the replica context.
        """
        with distribution.variables_created_outside_replicas():
            self._build_optimizer_while_tracing()
            with state_of(self).diagnostics.tracing_train_step():
                logs = in_replica(self.train_step)(data)  # a @tf.function step, as Keras 3 runs it in replicas
            # A model its own step built, whose compiled optimizer the step does not use (it
            # updates with optimizers kept as attributes): still in the first trace, where
            # tf.function lets variables be created (a later trace must not).
            self._build_optimizer_while_tracing()
        version.mark_built_if_complete(self)  # sub-models without an input shape are built by now
        if isinstance(self.optimizer, NamedOptimizers):
            self.optimizer.count_step()
        return flattened_logs(logs)

    def _build_optimizer_while_tracing(self) -> None:
        """Creates the compiled optimizer's state on every trainable variable, in the step's first trace.

        Keras creates it at the same moment: lazily, in the first
        ``apply_gradients`` of the first trace (outside the graph, under
        ``tf.init_scope``). ``tf.function`` traces a function again when its
        first trace created variables, so creating them earlier would trace
        the step once where Keras traces it twice, and a step that draws
        Python or NumPy random numbers while it is traced (tf_keras'
        ``backend.random_normal`` draws its op seed from NumPy) would get
        other seeds than on ``keras.Model``. Unlike Keras, the state is
        created for every trainable variable, not only those the step
        updates, because ``BackupAndRestore``, ``load_model`` and Keras'
        ``BackupAndRestore`` build it that way before they restore it: every
        slot a backup holds finds its variable. Under a ``tf.distribute``
        strategy Keras 3 has built it before tracing.
        """
        # Checked before ensure_state, so the variables are gathered only in the trace that builds.
        if self.built and self.optimizer is not None and not version.optimizer_built(self.optimizer):
            ensure_state(self.optimizer, self.trainable_variables)

    def _test_step_in_replica(self, data: Any) -> Any:
        """``test_step``, logs flattened; variables it creates under a strategy are created outside replicas."""
        with distribution.variables_created_outside_replicas():
            return flattened_logs(self.test_step(data))


def _steps_per_execution(model: Any) -> int:
    """``model.steps_per_execution`` as a number (Keras 2 keeps a variable, ``None`` before ``compile``)."""
    steps = model.steps_per_execution
    if steps is None:
        return 1
    return int(steps.numpy() if hasattr(steps, "numpy") else steps)  # a MirroredVariable under a strategy
