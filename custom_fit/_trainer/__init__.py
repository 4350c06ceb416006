"""The trainer: what runs ``fit``, ``evaluate`` and ``predict`` on a ``CustomModel``, one module a concern.

Separation of concerns, in the order one training execution passes through them:

* :mod:`~custom_fit._trainer.loop` (``Loop``, both Kerases) holds ``fit``,
  ``evaluate`` and ``predict``: custom_fit's copy of the Keras in use's loop.
  It owns each call's state (a ``LoopCall`` on the model's stack), the order
  of the callbacks' hooks, validation, and the epoch's logs; what differs
  between the Kerases it asks ``_compat.loop``
  (:class:`custom_fit._compat.contract.LoopParts`).
* The epoch iterator turns the data into executions: which batches, in which
  order, how many per execution. It is Keras' (``TFEpochIterator`` or
  tf_keras' ``DataHandler``) and reads Keras' private state, so it lives with
  the version code: :class:`custom_fit._compat.keras3_only.EpochIterator` and
  :class:`custom_fit._compat.keras2_loop.EpochIterator`, whose start the progress sets.
* :mod:`~custom_fit._trainer.step_fusion` is the execution plan: how many steps
  one execution fuses (``compile(steps_per_execution=N or "auto")``). The loop
  asks it before each execution (through the epoch iterator, which knows the
  steps left) and tells it what ran.
* :mod:`~custom_fit._trainer.step_functions` (``StepFunctions``) builds the
  functions the loop calls per execution (``train_function`` & co.) around
  the model's steps; the fused, distributed loop inside them is the version
  module's ``make_step_function``.
* :mod:`~custom_fit._trainer.progress` is where a ``fit`` is (epoch, step,
  data position): state the loop owns and moves along, with ``state_dict``
  and ``load_state_dict``, handed to the callbacks that take it
  (:class:`custom_fit.BackupAndRestore`).
* :mod:`~custom_fit._trainer.validation` is ``validation_freq=Steps(N)``:
  when a validation run inside the epochs is due, and which callbacks see it
  as an epoch's end.
* :mod:`~custom_fit._trainer.callbacks` is the callback list the loop calls
  (``LazyCallbackList``: no host wait per step where no callback reads the
  logs).

``CustomModel`` inherits the trainer (``Loop`` on ``StepFunctions``) and holds
the steps and the override points. Nothing in this package
is public API; ``custom_fit.StepsPerExecutionTuner`` and ``custom_fit.Steps`` are exported by the package.
"""
