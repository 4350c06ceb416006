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
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

__all__ = ["PREEMPTION_EXIT_CODE", "PreemptionNotice"]

#: The exit status after a save on ``SIGTERM``: 128 + 15, what a shell reports for a process
#: ``SIGTERM`` ended (TensorFlow's preemption handling uses it on Google Cloud too). Any
#: non-zero status makes a Kubernetes Job (``restartPolicy: OnFailure``) or a restart loop run
#: the script again.
PREEMPTION_EXIT_CODE = 143


class PreemptionNotice:
    """Records a ``SIGTERM`` while the ``fit`` that installed it runs; otherwise passes it on.

    Python says nothing when ``fit`` ends by an exception (``on_train_end``
    is skipped), so the handler looks at the main thread's stack: while the
    ``fit`` frame it was installed from is on it, a ``SIGTERM`` is recorded
    (:attr:`received`); after that it goes to the handler installed before,
    or ends the process as Python's default does.

    Example:
        >>> import sys
        >>> def fit():
        ...     notice = PreemptionNotice(sys._getframe())
        ...     notice.install()
        ...     return notice
        >>> notice = fit(); notice.received
        False
        >>> notice.uninstall()
    """

    def __init__(self, fit_frame: FrameType):
        # The frame's id and code, not the frame: holding it would keep fit's locals (its data
        # iterators) alive after fit ended.
        self._fit_frame = (id(fit_frame), fit_frame.f_code)
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

    def _fit_runs(self, frame: FrameType | None) -> bool:
        """Whether the ``fit`` frame is on the stack that ``frame`` (the main thread's now) is the top of."""
        while frame is not None:
            if (id(frame), frame.f_code) == self._fit_frame:
                return True
            frame = frame.f_back
        return False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._fit_runs(frame):
            self.received = True
            return
        self.uninstall()
        previous = self._previous
        if callable(previous):
            previous(signum, frame)
        elif previous is not signal.SIG_IGN:  # the default action: end the process
            signal.raise_signal(signum)
