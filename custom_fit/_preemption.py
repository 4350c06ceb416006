"""Preemption notices: a ``SIGTERM`` while ``fit`` runs becomes a backup at the next step and an exit.

Kubernetes, Slurm, cloud spot instances and ``timeout`` stop a job with
``SIGTERM``, then ``SIGKILL`` after a grace period (Kubernetes: 30 s by
default). Python's default action for ``SIGTERM`` ends the process at once,
losing everything since the last backup. :class:`PreemptionNotice` catches
it instead; :class:`custom_fit.BackupAndRestore` then saves at the next step
boundary and exits with :data:`PREEMPTION_EXIT_CODE`, so that the job's
restart resumes at that step.

Python runs signal handlers in the main thread, between bytecodes: a
``SIGTERM`` that arrives while a step runs in TensorFlow is handled when the
step returns, which is when the backup is due anyway. Written by hand rather
than with ``tf.distribute.experimental.PreemptionCheckpointHandler``, which
owns the checkpoint and the training-step counter itself, where
``BackupAndRestore`` keeps its own backups and resumes through the loop.

Under a multi-worker strategy one worker gets the ``SIGTERM``, but every
worker must save at the same step boundary (reading a cluster's variables
and every training step are collectives). :class:`ClusterAgreement` does what
``PreemptionCheckpointHandler`` does there, through the key-value store of
TensorFlow's coordination service: the signalled worker proposes "the next
boundary after mine" and waits until every worker has acknowledged it before
it trains another step, so no worker can pass that boundary unaware.
"""

from __future__ import annotations

import itertools
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

import tensorflow as tf

from custom_fit._compat.common import cluster_key_get, cluster_key_insert

__all__ = ["EPOCH_END", "PREEMPTION_EXIT_CODE", "Boundary", "ClusterAgreement", "PreemptionNotice", "cluster_workers"]

#: The exit status after a save on ``SIGTERM``: 128 + 15, what a shell reports for a process
#: ``SIGTERM`` ended (TensorFlow's preemption handling uses it on Google Cloud too). Any
#: non-zero status makes a Kubernetes Job (``restartPolicy: OnFailure``) or a restart loop run
#: the script again.
PREEMPTION_EXIT_CODE = 143


class PreemptionNotice:
    """Records a ``SIGTERM`` while the ``fit`` that installed it runs; otherwise passes it on.

    Python says nothing when ``fit`` ends by an exception (``on_train_end``
    is skipped), so the notice asks ``fit_runs`` (a predicate the loop
    answers: its record of the running ``fit`` is still there) whenever a
    ``SIGTERM`` comes: while ``fit`` runs it is recorded (:attr:`received`);
    after that it goes to the handler installed before, or ends the process
    as Python's default does.

    Args:
        fit_runs: Whether the ``fit`` the notice belongs to still runs (asked
            from the signal handler and from other threads).

    Example:
        >>> running = [True]
        >>> notice = PreemptionNotice(lambda: running[0])
        >>> notice.install(), notice.received
        (True, False)
        >>> notice.uninstall()
    """

    def __init__(self, fit_runs: Callable[[], bool]):
        self.fit_runs = fit_runs
        self._previous: Any = None
        self._installed = False
        #: Whether a ``SIGTERM`` came while ``fit`` ran.
        self.received = False

    def install(self) -> bool:
        """Catches ``SIGTERM`` from now on; ``False`` where Python cannot (not the main thread)."""
        if self._installed:
            return True
        if threading.current_thread() is not threading.main_thread():
            return False  # signal.signal works in the main thread only
        self._previous = signal.signal(signal.SIGTERM, self._handle)
        self._installed = True
        return True

    def uninstall(self) -> None:
        """Puts the previous ``SIGTERM`` handler back."""
        if self._installed:
            # None: a handler installed outside Python; the default is the nearest Python can restore.
            signal.signal(signal.SIGTERM, signal.SIG_DFL if self._previous is None else self._previous)
            self._installed = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.fit_runs():
            self.received = True
            return
        self.uninstall()
        previous = self._previous
        if callable(previous):
            previous(signum, frame)
        elif previous is not signal.SIG_IGN:  # the default action: end the process
            signal.raise_signal(signum)


#: A step boundary of ``fit``: ``(epoch, step)`` before a training step, ``(epoch, EPOCH_END)`` at an epoch's end.
Boundary = tuple[int, int]
EPOCH_END = sys.maxsize

#: How long a proposing worker waits for every worker's acknowledgement: far longer than a
#: key-value round trip; a worker that does not answer is gone, and the cluster fails anyway.
_ACK_TIMEOUT_S = 120.0
_fits = itertools.count()  # the same sequence on every worker: they all run the same script


def cluster_workers(strategy: tf.distribute.Strategy) -> tuple[list[str], str]:
    """The training tasks of a multi-worker strategy's cluster (``"chief/0"``, ``"worker/1"``, ...) and this one's."""
    resolver = strategy.cluster_resolver
    spec = resolver.cluster_spec()
    jobs = [job for job in ("chief", "worker") if job in spec.jobs]  # the jobs that train
    return [
        f"{job}/{index}" for job in jobs for index in spec.task_indices(job)
    ], f"{resolver.task_type}/{resolver.task_id}"


class ClusterAgreement:
    """The workers of one multi-worker ``fit`` agree on the step boundary where all of them save and exit.

    When it runs: made in ``on_train_begin`` of every worker (each ``fit``
    gets its own keys); :meth:`propose` from the boundary where a worker
    first sees its own ``SIGTERM``; :meth:`due` at every boundary. A watcher
    thread per worker waits for a proposal, records it, then acknowledges it.

    Why it is exact: a worker proposes at a boundary ``b`` before its next
    step, and asks for the first boundary after ``b``. No other worker can
    have passed ``b`` (the step before it is a collective that needs the
    proposer), and the proposer trains no step before every worker's watcher
    has recorded the proposal. So every worker meets the proposal at the
    same boundary, the first one after ``b`` on all of them. When two
    workers propose, the first proposal stored holds.

    Args:
        strategy: The multi-worker strategy ``fit`` runs under.
        notice: This worker's notice; the watcher stops once its ``fit`` ends.
    """

    def __init__(self, strategy: tf.distribute.Strategy, notice: PreemptionNotice):
        self._workers, self._me = cluster_workers(strategy)
        self._key = f"custom_fit/preemption/fit_{next(_fits)}"
        self._notice = notice
        self._agreed: Boundary | None = None  # set once, by the watcher, before it acknowledges
        self._proposed = False
        self._stopped = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="custom_fit preemption watcher", daemon=True)
        self._watcher.start()

    def propose(self, boundary: Boundary) -> None:
        """Asks every worker to save at the first boundary after ``boundary``; returns once all recorded it."""
        if self._proposed:
            return
        self._proposed = True
        cluster_key_insert(f"{self._key}/after", f"{boundary[0]},{boundary[1]}")  # the first one holds
        for worker in self._workers:
            if cluster_key_get(f"{self._key}/recorded/{worker}", _ACK_TIMEOUT_S) is None:
                print(
                    f"custom_fit.BackupAndRestore: worker {worker} did not acknowledge the preemption within "
                    f"{_ACK_TIMEOUT_S:.0f} s; going on without it.",
                    file=sys.stderr,
                    flush=True,
                )

    def due(self, boundary: Boundary) -> bool:
        """Whether the workers agreed to save at ``boundary`` (or before it: this is the first one after)."""
        return self._agreed is not None and boundary > self._agreed

    def stop(self) -> None:
        """Ends the watcher (at its next poll, within a second)."""
        self._stopped.set()

    def _watch(self) -> None:
        while not self._stopped.is_set() and self._notice.fit_runs():
            try:
                value = cluster_key_get(f"{self._key}/after", timeout_s=1.0)
            except tf.errors.OpError:  # the coordination service is gone: the cluster is shutting down
                return
            if value is not None:
                epoch, step = (int(part) for part in value.split(","))
                self._agreed = (epoch, step)  # before the acknowledgement: the proposer then trains on
                cluster_key_insert(f"{self._key}/recorded/{self._me}", "1")
                return
