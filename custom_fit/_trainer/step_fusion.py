"""``compile(steps_per_execution="auto")``: how many steps each execution fuses, tuned during ``fit``.

Fusing steps (running several in one ``tf.function`` call) removes Python and
callback overhead per step (how much: docs/performance.md); the best number
depends on the model, the batch and the machine, so nobody picks it well by
hand. With ``"auto"``, :class:`StepsPerExecutionTuner` chooses it while ``fit``
runs: it measures steps per second over windows of executions that end on
a host sync (so it measures the device, not the dispatch) and doubles the
number of fused steps: while executions are short (under 0.25 s) unless
that makes training measurably slower, then only while it helps by more
than 5%. It keeps the best and probes one step up again every 30 s. It runs
on the main thread, between executions (tf_keras' tuner is a thread that
races its data handler).

What changes, and what does not:

* weights, history and every epoch-level callback equal ``steps_per_execution=1``
  exactly: each step runs the same computation in the same order;
* an execution never crosses the end of an epoch, so epoch logs and
  validation are unchanged;
* batch-level callbacks (``on_train_batch_end``) run once per execution, as with
  any ``steps_per_execution > 1``: the progress bar advances in jumps and a
  ``ModelCheckpoint(save_freq=N)`` saves at the first execution end past each
  N steps;
* inputs of unknown length (a generator, a ``tf.data`` pipeline without
  cardinality) run one step per execution for the whole ``fit``, also with
  ``steps_per_epoch`` and after an epoch has counted their batches: with one
  step per execution, the execution that finds the data exhausted still
  counts an optimizer iteration (the step's state updates do not wait for the
  batch), which a fused execution would not (the epoch iterators ask
  :meth:`StepsPerExecutionTuner.plan` with ``remaining=None``);
* ``model.steps_per_execution`` reads the number fused now (1 until ``fit``
  has tuned it); ``get_compile_config()`` and saved models keep ``"auto"``;
* ``evaluate`` and ``predict`` run one step per execution (fusing would
  change their results on Keras 3: Keras 3.15 runs ``steps_per_execution``
  batches even when their ``steps`` asks for fewer); Keras 2 does the same
  (one loop), where ``model.steps_per_execution`` is tf_keras' variable:
  the tuned number while ``fit`` runs, 1 again after it.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
import weakref
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["AUTO", "ExecutionPlan", "FixedPlan", "StepsPerExecutionTuner", "tuner_for"]

#: The ``compile(steps_per_execution=...)`` value that turns tuning on.
AUTO = "auto"


class StepsPerExecutionTuner:
    """Chooses the number of steps per execution from measured throughput.

    The model asks :meth:`plan` before each execution and reports it with
    :meth:`executed` afterwards. Each execution's rate is its steps divided by
    the time since the previous execution ended (so the loop's and the
    callbacks' time between executions counts), unless the execution read
    from another data iterator than the previous one: a new epoch or a new
    ``fit``, whose gap holds validation, epoch-end callbacks or time spent
    outside ``fit``, none of which fusing changes. A window of at least
    ``window_executions`` executions and ``window_seconds`` ends with
    ``sync()``, a host read of the last execution's output, so that queued
    device work is paid inside the window; the window's rate is the median
    of its executions' rates, so an epoch boundary (validation, checkpoints)
    or a first trace inside it does not count.

    Each doubling is judged against the number it doubled. While those
    executions were shorter than ``short_execution_seconds``, it is kept
    unless it made training slower by more than ``improvement``: a short
    execution's fixed cost (the Python loop, callbacks, dispatch) can weigh
    a few percent over several doublings that each gain less than a
    measurement window resolves. Past that, it is kept only if it made
    training faster by more than ``improvement``, so that batch callbacks
    keep running as often as fusing allows without paying for it.

    Args:
        max_steps: The largest number of steps fused (a power of two).
        window_executions: The fewest executions a measurement window holds.
        window_seconds: The shortest measurement window.
        improvement: The relative change in throughput that counts as
            better or worse (0.05: 5%).
        short_execution_seconds: Below this duration, an execution is worth
            doubling unless that measurably hurts.
        reprobe_seconds: How long a settled choice is kept before one step up
            is tried again.
        clock: A monotonic clock in seconds (tests pass their own).

    Example:
        >>> import custom_fit._trainer.step_fusion
        >>> tuner = custom_fit._trainer.step_fusion.StepsPerExecutionTuner(max_steps=8)
        >>> tuner.plan(remaining=100)
        1
        >>> tuner.plan(remaining=None)  # unknown length: one step at a time
        1
    """

    def __init__(
        self,
        max_steps: int = 256,
        window_executions: int = 8,
        window_seconds: float = 0.3,
        improvement: float = 0.05,
        short_execution_seconds: float = 0.25,
        reprobe_seconds: float = 30.0,
        clock: Callable[[], float] = time.perf_counter,
    ):
        if max_steps < 1 or max_steps & (max_steps - 1):
            raise ValueError(f"max_steps must be a power of two >= 1, received {max_steps}.")
        self.max_steps = max_steps
        self.window_executions = window_executions
        self.window_seconds = window_seconds
        self.improvement = improvement
        self.short_execution_seconds = short_execution_seconds
        self.reprobe_seconds = reprobe_seconds
        self._clock = clock
        self.steps = 1  # the number a full execution fuses now
        self._rates: dict[int, float] = {}  # the best measured steps/s per number of fused steps
        self._settled_at: float | None = None
        self._last_end: float | None = None
        self._source: Callable[[], object] = lambda: None  # the previous execution's data iterator
        self._window: list[float] = []
        self._window_start = 0.0

    @property
    def rates(self) -> dict[int, float]:
        """The best measured steps per second for each number of fused steps tried (a copy)."""
        return dict(self._rates)

    @property
    def settled(self) -> bool:
        """Whether the tuner keeps its choice (until ``reprobe_seconds`` pass) rather than climbing."""
        return self._settled_at is not None

    def plan(self, remaining: int | None) -> int:
        """Decides the next execution: the current choice, at most ``remaining`` steps (``None``: unknown).

        Inputs of unknown length run one step per execution, so that no
        execution runs into the end of the data.
        """
        return 1 if remaining is None else max(1, min(self.steps, remaining))

    def executed(self, steps: int, sync: Callable[[], Any], source: object = None) -> None:
        """Records an execution of ``steps`` steps.

        Args:
            steps: The steps the execution ran.
            sync: Waits for the execution's results; called when a window ends.
            source: The data iterator the execution read. When it is not the
                previous execution's, the time since that one is not counted.
        """
        now = self._clock()
        new_source = source is not self._source()
        self._source = _reference(source)
        if self._last_end is None:  # the first execution (a trace) has nothing to compare with
            self._last_end = self._window_start = now
            return
        if new_source:  # a new epoch or fit: the gap is not the loop's per-execution cost
            self._last_end = now
            return
        self._window.append(steps / max(now - self._last_end, 1e-12))
        self._last_end = now
        if len(self._window) < self.window_executions or now - self._window_start < self.window_seconds:
            return
        sync()
        self._choose(statistics.median(self._window))
        self._window = []
        self._last_end = self._window_start = self._clock()

    def _choose(self, rate: float) -> None:
        """Hill climbing over 1, 2, 4, ...: up while it pays, back to the best, re-probe later."""
        current = self.steps
        self._rates[current] = rate
        best = max(self._rates, key=lambda n: self._rates[n])
        if current > 1 and current // 2 in self._rates and not self._doubling_pays(current // 2, rate):
            self.steps = best if best != current else current // 2  # settle (a gain within improvement: fewer)
            self._settled_at = self._clock()
        elif self._settled_at is None and current < self.max_steps:
            self.steps = current * 2  # still climbing
        elif self._settled_at is not None and current < self.max_steps:
            if self._clock() - self._settled_at >= self.reprobe_seconds:
                self._settled_at = None  # try one step up again
                self.steps = current * 2
        else:
            self._settled_at = self._settled_at or self._clock()

    def _doubling_pays(self, half: int, rate: float) -> bool:
        """Whether ``2 * half`` fused steps, measured at ``rate`` steps/s, are worth keeping over ``half``."""
        half_rate = self._rates[half]
        if half / half_rate < self.short_execution_seconds:  # short executions: unless it hurts
            return rate >= half_rate * (1 - self.improvement)
        return rate >= half_rate * (1 + self.improvement)


class ExecutionPlan(Protocol):
    """How many steps each execution of an epoch fuses: asked by the loop before it, told after it.

    A :class:`StepsPerExecutionTuner` is one (``steps_per_execution="auto"``);
    :class:`FixedPlan` is ``compile``'s fixed number.
    """

    def plan(self, remaining: int | None) -> int:
        """The steps of the next execution, given the steps left in the epoch (``None``: unknown)."""
        ...

    def executed(self, steps: int, sync: Callable[[], Any], source: object = None) -> None:
        """The execution the loop ran: ``steps`` steps read from ``source``; ``sync()`` waits for its results."""
        ...


@dataclasses.dataclass(frozen=True)
class FixedPlan:
    """``compile(steps_per_execution=N)``: ``N`` steps per execution, fewer where the epoch ends first.

    Example:
        >>> FixedPlan(4).plan(remaining=10), FixedPlan(4).plan(remaining=None)
        (4, 4)
    """

    steps: int

    def plan(self, remaining: int | None) -> int:
        """``steps`` (Keras' epoch iterator shortens the last execution of an epoch itself)."""
        return self.steps

    def executed(self, steps: int, sync: Callable[[], Any], source: object = None) -> None:
        """Nothing to learn: the number is fixed."""


def tuner_for(steps_per_execution: Any) -> StepsPerExecutionTuner | None:
    """The tuner that ``compile(steps_per_execution=...)`` asks for, or ``None`` for a fixed number.

    ``"auto"`` makes one with the default settings. A
    :class:`StepsPerExecutionTuner` given instead is used as it is (an
    advanced setting, for other tuning parameters); the model's compile
    config says ``"auto"`` either way.

    Example:
        >>> tuner_for("auto").steps, tuner_for(4)
        (1, None)
        >>> mine = StepsPerExecutionTuner(max_steps=16)
        >>> tuner_for(mine) is mine
        True
    """
    if isinstance(steps_per_execution, StepsPerExecutionTuner):
        return steps_per_execution
    if isinstance(steps_per_execution, str) and steps_per_execution == AUTO:
        return StepsPerExecutionTuner()
    return None


def _reference(obj: object) -> Callable[[], object]:
    """A weak reference to ``obj`` where it takes one (a finished epoch's iterator is freed), else a strong one."""
    try:
        return weakref.ref(obj)
    except TypeError:  # None, object(): nothing to free
        return lambda: obj
