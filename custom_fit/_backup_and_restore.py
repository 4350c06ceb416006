"""Crash-safe training: :class:`BackupAndRestore` survives ``kill -9`` and resumes at the exact step.

Keras' ``BackupAndRestore`` restarts an interrupted epoch from its first
batch (with ``save_freq=N`` the batches already trained are trained again)
and overwrites its files in place, so a kill during a write leaves a backup
no restart can read. This callback has Keras' signature and meaning, plus:

* **atomic, checked backups** (:class:`~custom_fit._backup_store.BackupStore`):
  a new backup is complete on disk before it replaces the oldest one; every
  file's checksum is checked before anything of a backup is loaded, and a
  damaged backup falls back to the newest intact one, loudly;
* **written in the background**: training waits only while a backup's state
  is copied to host memory; a thread writes its files
  (:class:`~custom_fit._background_write.BackgroundWriter`);
* **exact resume**: a restarted ``fit`` continues at the step after the
  backup, with the same batches in the same order, the same random state,
  optimizer state and epoch accumulators (metrics, logged values), so the
  final weights and the last epoch's history equal an uninterrupted run's.

A backup holds the weights file Keras writes (model, optimizer, and with
``CustomModel`` the random seed generator states), the metric variables,
Python's and NumPy's global random states, and where ``fit`` is in its data:
:class:`~custom_fit._trainer.progress.Progress`, which the running ``fit`` hands the
callback: its ``state_dict`` (epoch, step, and which data iterator each
batch comes from) goes into each backup, and a resumed ``fit`` loads it;
the loop then makes and drops the iterators the interrupted run had made, and
skips the batches it had trained on.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import shutil
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import tensorflow as tf

from custom_fit import _compat
from custom_fit._background_write import BackgroundWriter
from custom_fit._backup_store import BackupStore, Damage, DamagedBackupWarning, PendingBackup, Restored
from custom_fit._compat import keras, version
from custom_fit._compat.common import cluster_key_get, cluster_key_insert
from custom_fit._optimizers import NamedOptimizers, ensure_state
from custom_fit._preemption import (
    EPOCH_END,
    PREEMPTION_EXIT_CODE,
    Boundary,
    ClusterAgreement,
    PreemptionNotice,
    cluster_workers,
)
from custom_fit._random_state import RandomState, random_state_arrays, random_states
from custom_fit._trainer.data_position import EpochPosition, Position
from custom_fit._trainer.progress import Progress, epoch_metrics

__all__ = ["Backup", "BackupAndRestore"]

_FORMAT = 1
_META = "meta.json"
_STATE = "state.npz"

#: How long a worker waits for the others' lists of intact backups (they check the same files).
_AGREEMENT_TIMEOUT_S = 600.0
_agreements = itertools.count()  # one agreement per fit, in the same order on every worker


#: The fields of :class:`~custom_fit._trainer.data_position.Position`: ``meta.json`` holds a ``Progress.state_dict()``
#: under them (a backup written before a field existed lacks it and gets the field's default).
_POSITION_FIELDS = tuple(field.name for field in dataclasses.fields(Position))


@dataclasses.dataclass
class Backup:
    """What a backup holds besides the weights: where to resume and the state Keras does not save.

    Attributes:
        progress: The running ``fit``'s ``Progress.state_dict()`` when it was
            taken, as it is (a :class:`~custom_fit._trainer.data_position.Position`'s
            fields): where the resumed ``fit`` starts.
        random_state: The global random state when the epoch to resume in began.
        hook_states: For data with epoch hooks of its own (a ``PyDataset``
            that reshuffles in ``on_epoch_end``): the random state before each
            earlier epoch's ``on_epoch_begin`` and ``on_epoch_end``.
        metric_values: The value of each variable of each of ``model.metrics``
            (none at an epoch's first step: Keras resets them when an epoch begins).
    """

    progress: dict[str, Any]
    random_state: RandomState
    hook_states: list[tuple[RandomState, RandomState]]
    metric_values: list[list[np.ndarray]]

    @property
    def position(self) -> Position:
        """Where the resumed ``fit`` starts."""
        return Position(**self.progress)

    def write(self, directory: Path) -> None:
        """Writes ``meta.json`` (the progress and the shapes of the rest) and ``state.npz`` into ``directory``."""
        meta = {
            "format": _FORMAT,
            **self.progress,
            "hook_epochs": len(self.hook_states),
            "metric_variables": [len(values) for values in self.metric_values],
        }
        # NumPy values (validation logs) as Python numbers: JSON keeps floats exactly (repr round-trips).
        (directory / _META).write_text(json.dumps(meta, default=lambda value: np.asarray(value).tolist()))
        arrays: dict[str, Any] = random_state_arrays("epoch_", [self.random_state])
        if self.hook_states:
            arrays.update(random_state_arrays("hook_begin_", [begin for begin, _ in self.hook_states]))
            arrays.update(random_state_arrays("hook_end_", [end for _, end in self.hook_states]))
        for i, values in enumerate(self.metric_values):
            arrays.update({f"metric_{i}_{j}": value for j, value in enumerate(values)})
        with open(directory / _STATE, "wb") as file:
            np.savez(file, **arrays)

    @staticmethod
    def position_of(directory: Path) -> str:
        """Where the backup in ``directory`` resumes, for messages (``meta.json`` alone)."""
        meta = json.loads((directory / _META).read_text())
        trained = meta.get("trained_steps")
        after = f", after {trained} steps" if trained is not None else ""
        return f"epoch {meta['epoch'] + 1}, step {meta['step']}{after}"

    @classmethod
    def read(cls, directory: Path) -> Backup:
        """Reads what :meth:`write` wrote.

        Raises:
            ValueError: A file is missing, damaged, or of another format.
        """
        try:
            meta = json.loads((directory / _META).read_text())
            with np.load(directory / _STATE, allow_pickle=False) as arrays:
                hooks = meta["hook_epochs"]
                progress = {name: meta[name] for name in _POSITION_FIELDS if name in meta}
                Position(**progress)  # a meta.json without an epoch or a step fails here
                return cls(
                    progress=progress,
                    random_state=random_states("epoch_", arrays)[0],
                    hook_states=list(
                        zip(random_states("hook_begin_", arrays), random_states("hook_end_", arrays), strict=True)
                    )
                    if hooks
                    else [],
                    metric_values=[
                        [arrays[f"metric_{i}_{j}"] for j in range(count)]
                        for i, count in enumerate(meta["metric_variables"])
                    ],
                )
        except (OSError, KeyError, TypeError, json.JSONDecodeError, EOFError) as error:
            raise ValueError(f"The backup in {directory} cannot be read ({type(error).__name__}: {error}).") from error


class BackupAndRestore(keras.callbacks.Callback):
    """Backs up the training state atomically and resumes an interrupted ``fit`` at the exact step.

    Use it like ``keras.callbacks.BackupAndRestore``: pass it to ``fit`` and,
    after a crash, run the same script again; ``fit`` continues from the last
    backup. What differs:

    * a backup is written into a new directory and renamed into place once
      it is complete and on disk, and removed by renaming it away first, so
      a ``SIGKILL`` at any instant (also during a write, a restore or the
      final deletion) leaves the last complete backup loadable, or, once
      the final deletion has begun, a directory the next ``fit`` starts
      afresh from;
    * every file of a backup carries a checksum, checked before anything of
      it is loaded: a backup whose bytes changed on disk is never loaded, in
      whole or in part. The newest ``max_to_keep`` backups stay, and a
      damaged newest one falls back to the newest intact one with a
      :class:`~custom_fit._backup_store.DamagedBackupWarning` naming the
      backup, the file and the steps each resumes at. When backups exist and
      none is intact, ``fit`` stops with a
      :class:`~custom_fit._backup_store.DamagedBackupError` that says how to
      start over, instead of starting over by itself;
    * a backup's files are written in a thread while training goes on
      (``write_in_background``): training waits only while its state is
      copied to host memory, and one backup is in flight at a time;
    * the directory is locked for one run: a second process given the
      same ``backup_dir`` gets an error instead of overwriting the backups.
      The workers of a ``MultiWorkerMirroredStrategy`` cluster share one
      ``backup_dir``: the chief locks it and writes the backups, every
      worker resumes from them;
    * with an integer ``save_freq`` (custom_fit models, both Kerases) the
      resumed run starts at the step after the backup instead of replaying
      the epoch, and reads the same batches, so the result equals an
      uninterrupted run bit for bit (see "Crash-safe training" in the README
      for what this needs: deterministic data and seeded randomness; on
      Keras 2, a model without random layers: tf_keras' layers draw from
      TensorFlow's global generator, which no file can save);
    * the epoch accumulators (metrics, ``logged_values``) and Python's and
      NumPy's global random states are part of the backup.

    When it runs: custom_fit's ``fit`` first hands it its progress
    (:meth:`set_progress`), whose ``state_dict()`` each backup records;
    ``on_train_begin`` locks ``backup_dir`` and loads the newest readable
    backup, into the model and into the progress (the model must be built); ``on_epoch_begin`` of
    the resumed epoch restores the metrics and random state; a batch-level
    backup is written at the ``on_train_batch_begin`` after every
    ``save_freq`` steps (so never at an epoch's end, where the epoch-end
    backup follows), its files in the background; ``on_train_end`` waits
    for the backup in flight, then deletes the backups when
    ``delete_checkpoint`` and unlocks ``backup_dir``. (A ``fit`` that raises
    keeps the lock until its process ends or a later ``fit`` of the same
    process takes it over.)

    Args:
        backup_dir: A directory for this run's backups only.
        save_freq: ``"epoch"`` (a backup after each epoch) or an integer
            ``N`` (a backup every ``N`` training steps, counted across
            epochs; an ``N`` that falls on an epoch's last step is made at
            that epoch's end).
        double_checkpoint: Keras' argument (keep the previous backup too).
            Accepted for Keras' signature: ``max_to_keep`` backups stay
            (``True`` with ``max_to_keep=1`` keeps 2).
        delete_checkpoint: Delete the backups when ``fit`` completes.
        save_before_preemption: On ``SIGTERM`` (a preemption notice:
            Kubernetes, Slurm, spot instances, ``timeout``), save a backup at
            the next step boundary and exit with status 143
            (:data:`custom_fit._preemption.PREEMPTION_EXIT_CODE`), so that the
            restarted script resumes at that step, with any ``save_freq``
            (a plain ``keras.Model`` on Keras 3 keeps ``SIGTERM``'s meaning,
            with a warning: its loop is Keras', which has no step boundary
            custom_fit acts at). Under
            ``MultiWorkerMirroredStrategy`` a ``SIGTERM`` to any worker makes
            every worker save (the chief writes) and exit at the same step:
            the one after the signalled worker's next step (see
            :class:`custom_fit._preemption.ClusterAgreement`). ``False``:
            ``SIGTERM`` ends the process as before.
        max_to_keep: How many backups stay (at least 1; default 2): a
            damaged newest backup falls back to the one before it. Under
            ``MultiWorkerMirroredStrategy`` every worker checks the backups
            and all resume from the newest one intact on every worker.
        write_in_background: Write each backup's files while training goes
            on (default): training waits only while the weights are copied
            to host memory (one copy of the model's and optimizer's state is
            held for it), then a thread writes, checks and renames the files
            into place; the next backup, ``on_train_end`` and a preemption's
            exit wait for it. A write that fails raises its error at the next
            backup or at the end of ``fit``. ``False``: each backup is on disk
            before training goes on.
        store: Advanced: the :class:`~custom_fit._backup_store.BackupStore`
            (or a subclass) that keeps the backups; by default one for
            ``backup_dir`` with ``max_to_keep``.

    Raises:
        ValueError: ``backup_dir`` is empty, ``save_freq`` is neither
            ``"epoch"`` nor a positive integer, or ``max_to_keep`` is not a
            positive integer.

    Example:
        >>> import tempfile, numpy as np, keras, custom_fit
        >>> model = custom_fit.CustomSequential([keras.Input((2,)), keras.layers.Dense(1)])
        >>> model.compile(optimizer="sgd", loss="mse")
        >>> backup = custom_fit.BackupAndRestore(tempfile.mkdtemp(), save_freq=2)
        >>> _ = model.fit(np.zeros((8, 2)), np.zeros((8, 1)), batch_size=2, epochs=2, callbacks=[backup], verbose=0)
    """

    def __init__(
        self,
        backup_dir: str | os.PathLike[str],
        save_freq: str | int = "epoch",
        *,
        double_checkpoint: bool = False,
        delete_checkpoint: bool = True,
        save_before_preemption: bool = True,
        max_to_keep: int = 2,
        write_in_background: bool = True,
        store: BackupStore | None = None,
    ):
        super().__init__()
        if not backup_dir:
            raise ValueError(
                f"BackupAndRestore needs a directory for its backups, received backup_dir={backup_dir!r}. "
                "Fix: pass a path such as BackupAndRestore('backups/run-1')."
            )
        is_steps = isinstance(save_freq, int) and not isinstance(save_freq, bool)
        if save_freq != "epoch" and not (is_steps and save_freq >= 1):  # type: ignore[operator]
            raise ValueError(
                f"save_freq must be 'epoch' or a positive number of training steps, received {save_freq!r}. "
                "Fix: BackupAndRestore(backup_dir, save_freq='epoch') or save_freq=100."
            )
        self.backup_dir = os.fspath(backup_dir)
        self.save_freq = save_freq
        self._every: int | None = None if save_freq == "epoch" else int(save_freq)  # steps between backups
        self.double_checkpoint = double_checkpoint
        self.delete_checkpoint = delete_checkpoint
        self.save_before_preemption = save_before_preemption
        self._notice: PreemptionNotice | None = None
        self._cluster: ClusterAgreement | None = None
        self._writes = True  # whether this process writes the backups (a cluster's chief does)
        if store is None:
            store = BackupStore(self.backup_dir, max(max_to_keep, 2) if double_checkpoint else max_to_keep)
        self._store = store
        self.write_in_background = write_in_background
        self._writer = BackgroundWriter(write_in_background)
        self._weights_written: Callable[[], None] | None = None  # the last backup's (version.snapshot_weights)
        self._resume: Backup | None = None
        self._progress: Progress | None = None  # the running fit's (set_progress), if it is custom_fit's
        self._epoch = 0
        self._epoch_random_state = RandomState.capture()
        self._hook_states: list[tuple[RandomState, RandomState]] = []
        self._saved_at = 0  # the progress' trained_steps at the last backup (or where fit resumed)

    # Hooks, in the order fit calls them ----------------------------------------------

    def set_progress(self, progress: Progress) -> None:
        """Takes the progress of the ``fit`` it runs in: custom_fit's loop calls it before ``on_train_begin``.

        A ``fit`` custom_fit does not run (a plain ``keras.Model``) hands none:
        the callback then resumes at epochs, through Keras' own means.
        """
        self._progress = progress
        progress.when_fit_ends(self._writer.wait)  # also when fit raises: the backup in flight is written

    def on_train_begin(self, logs: Any = None) -> None:
        """Locks ``backup_dir``, loads the newest readable backup into the model and its position into ``fit``.

        Raises:
            BackupDirectoryInUseError: Another process uses ``backup_dir``.
            OSError: Backups exist, but none can be read.
        """
        if self.save_freq != "epoch" and self._data is None:
            raise TypeError(
                f"BackupAndRestore(save_freq={self.save_freq}) resumes mid-epoch through custom_fit's fit "
                f"loop, but the model is a {type(self.model).__name__}. Fix: use custom_fit.CustomModel "
                "(also as CustomModel(inputs, outputs)) or custom_fit.CustomSequential, or save_freq='epoch'."
            )
        self._writer.wait()  # a backup an earlier fit (that raised) was writing
        if version.RESUMES_ONLY_CUSTOM_FIT_MODELS and not isinstance(self.model, _compat.TrainerHooks):
            raise TypeError(
                "custom_fit.BackupAndRestore on Keras 2 resumes through custom_fit's fit loop, but the model is "
                f"a {type(self.model).__name__}. Fix: use custom_fit.CustomModel (also as CustomModel(inputs, "
                "outputs)) or custom_fit.CustomSequential, or tf_keras.callbacks.BackupAndRestore."
            )
        # One backup_dir for a multi-worker cluster: its chief writes the backups (and holds the
        # lock, which still stops another run); every worker reads them.
        self._writes = bool(self.model.distribute_strategy.extended.should_checkpoint)
        if self._writes:
            self._store.acquire()
        if self.save_before_preemption:
            self._arm_preemption_notice()
        agree = self._agree_with_workers if _has_several_workers(self.model.distribute_strategy) else None
        restored = self._store.load_latest(self._load, agree=agree)
        self._resume = restored.value if restored is not None else None
        if restored is not None and restored.skipped:
            self._warn_fallback(restored)
        self._hook_states = list(self._resume.hook_states) if self._resume else []
        if self._progress is None:  # Keras' own loop (Keras 3, a plain keras.Model) reads it from the model
            version.set_initial_epoch(self.model, self._resume.position.epoch if self._resume else None)
            return
        if self._resume is not None:
            self._progress.load_state_dict(self._resume.progress)
        self._saved_at = self._progress.trained_steps
        self._progress.data.hook_states = self._hook_states

    def _arm_preemption_notice(self) -> None:
        """Catches ``SIGTERM`` while the ``fit`` running now runs (``on_train_begin``, after the strategy exists).

        After the strategy exists: its coordination service installs a
        ``SIGTERM`` handler of its own. The notice asks the running ``fit``'s
        progress whether ``fit`` still runs; a ``fit`` custom_fit does not run
        (a plain ``keras.Model``) has none, so its ``SIGTERM`` keeps Python's
        meaning, with a warning.
        """
        progress = self._progress
        if progress is None:
            warnings.warn(
                f"custom_fit.BackupAndRestore(save_before_preemption=True) saves on SIGTERM in the fit of a "
                f"custom_fit model, but the model is a {type(self.model).__name__}: a SIGTERM ends this run as "
                "in plain Keras, and it resumes from the last backup. Fix: use custom_fit.CustomModel or "
                "custom_fit.CustomSequential, or pass save_before_preemption=False.",
                UserWarning,
                stacklevel=3,
            )
            return
        self._notice = PreemptionNotice(lambda: progress.running)
        if self._notice.install() and _has_several_workers(self.model.distribute_strategy):
            self._cluster = ClusterAgreement(self.model.distribute_strategy, self._notice)

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        """Restores the metrics and the random state in the resumed epoch; remembers the random state."""
        self._epoch = epoch
        resume, self._resume = self._resume, None
        if resume is not None:
            if resume.position.step:
                self._restore_metrics(resume.metric_values)
            if self._data is not None:
                self._replay_data_hooks(resume.hook_states)
            resume.random_state.restore()
        self._epoch_random_state = RandomState.capture()

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        """Writes a backup when ``save_freq`` steps were trained since the last one, or a ``SIGTERM`` came."""
        if self._preemption_due((self._epoch, batch)):  # only custom_fit's loop arms the notice
            self._write(self._epoch_random_state)
            self._exit_preempted(f"saved a backup at epoch {self._epoch + 1}, step {batch}")
        if self._every is not None and self._unsaved_steps() >= self._every:
            self._write(self._epoch_random_state)

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        """Writes the epoch's backup (with an integer ``save_freq``: when one is due)."""
        preempted = self._preemption_due((epoch, EPOCH_END))
        if self._every is None or self._unsaved_steps() >= self._every or preempted:
            self._write(RandomState.capture(), next_epoch=epoch + 1)
        if preempted:
            self._exit_preempted(f"saved a backup at the end of epoch {epoch + 1}")

    def on_train_end(self, logs: Any = None) -> None:
        """Deletes the backups (``delete_checkpoint``) and unlocks ``backup_dir``.

        The next ``fit`` starts at its own ``initial_epoch``.
        """
        if self._progress is None:
            version.set_initial_epoch(self.model, None)
        self._progress = None
        self._stop_watching()
        self._writer.wait()
        self._weights_written = None  # its host copy of the weights goes with it
        if self._writes:
            if self.delete_checkpoint:
                self._store.clear()
            self._store.release()

    # Preemption ----------------------------------------------------------------------

    def _preemption_due(self, boundary: Boundary) -> bool:
        """Whether to save and exit at ``boundary``: at the first one after a ``SIGTERM``, cluster-wide.

        One process saves at the first boundary after its own ``SIGTERM``. In
        a cluster the signalled worker proposes at a step boundary (where no
        other worker can be ahead of it) and all save where they agreed.
        """
        if self._notice is None:
            return False
        if self._cluster is None:
            return self._notice.received
        if self._notice.received and boundary[1] != EPOCH_END:
            self._cluster.propose(boundary)
        return self._cluster.due(boundary)

    def _stop_watching(self) -> None:
        if self._cluster is not None:
            self._cluster.stop()
            self._cluster = None
        if self._notice is not None:
            self._notice.uninstall()
            self._notice = None

    def _exit_preempted(self, what: str) -> NoReturn:
        """Unlocks ``backup_dir``, exits with :data:`PREEMPTION_EXIT_CODE` (``SystemExit``: ``finally``s run)."""
        received = "SIGTERM received" if self._notice is not None and self._notice.received else "a worker got SIGTERM"
        self._stop_watching()
        self._writer.wait()
        if self._writes:
            self._store.release()
        print(
            f"custom_fit.BackupAndRestore: {received}; {what} in {self.backup_dir}. Exiting with status "
            f"{PREEMPTION_EXIT_CODE}; run the same script again to resume.",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(PREEMPTION_EXIT_CODE)

    # Writing and reading -------------------------------------------------------------

    @property
    def _data(self) -> EpochPosition | None:
        """Where the running ``fit`` reads its data (custom_fit's loop), else ``None``."""
        return self._progress.data if self._progress is not None else None

    def _unsaved_steps(self) -> int:
        """The steps trained since the last backup (or since where ``fit`` resumed); an integer ``save_freq`` only.

        An integer ``save_freq`` needs custom_fit's loop (``on_train_begin`` says
        so), whose progress counts the steps trained: at a step's
        ``on_train_batch_begin`` those before it, at ``on_epoch_end`` the epoch's.
        """
        assert self._progress is not None
        return self._progress.trained_steps - self._saved_at

    def _write(self, random_state: RandomState, *, next_epoch: int | None = None) -> None:
        """Takes a backup: the model, where the running ``fit`` is, ``random_state``.

        On the training thread, only what must not change while it is
        written: the weights (:func:`version.snapshot_weights`: copied to host
        memory), the metric values and the position. The files are written,
        checked and renamed into place by :class:`BackgroundWriter` (at once
        with ``write_in_background=False``), after the backup before is
        complete.

        Args:
            random_state: The global random state a resumed run restores.
            next_epoch: At an epoch's end, the next epoch: where a ``fit``
                custom_fit does not run (no progress) resumes.
        """
        self._writer.wait()  # the backup before is complete: its number is taken, its removals done
        if self._progress is not None:
            state = self._progress.state_dict()
            self._saved_at = self._progress.trained_steps
        else:  # Keras' own loop (a plain keras.Model on Keras 3): backups at epochs' ends only
            assert next_epoch is not None
            state = dataclasses.asdict(Position(next_epoch, 0))
        # Another worker of a cluster does not write, but reads the same values (reading a variable of a
        # cluster may take part in a collective the writer waits for) into a directory it then removes.
        pending = self._store.begin() if self._writes else PendingBackup(Path(tempfile.mkdtemp()), -1)
        write_weights = version.snapshot_weights(
            self.model, str(pending.directory / version.BACKUP_WEIGHTS_FILE), reuse=self._weights_written
        )
        self._weights_written = write_weights  # the next backup's copy reuses its host memory once it is written
        backup = Backup(
            progress=state,
            random_state=random_state,
            hook_states=list(self._hook_states),
            # At an epoch's start Keras resets the metrics: nothing to restore.
            metric_values=[[np.asarray(v.numpy()) for v in m.variables] for m in epoch_metrics(self.model)]
            if state["step"]
            else [],
        )

        def finish() -> None:
            write_weights()
            backup.write(pending.directory)
            if self._writes:
                self._store.commit(pending)
            else:
                shutil.rmtree(pending.directory, ignore_errors=True)

        self._writer.submit(
            finish, f"the backup of epoch {state['epoch'] + 1}, step {state['step']} (into {pending.directory})"
        )

    def _load(self, directory: Path) -> Backup:
        backup = Backup.read(directory)  # first: a damaged backup must not touch the model
        if not self.model.built:
            raise RuntimeError(
                f"BackupAndRestore found a backup in {self.backup_dir}, but model '{self.model.name}' is not "
                "built, so its weights cannot be loaded. Fix: build the model before fit() (call it on a "
                "batch, or model.build(input_shape))."
            )
        optimizer = self.model.optimizer
        # Its state is read only into a built optimizer (a group's members: on their saved variables, on load).
        if optimizer is not None and not isinstance(optimizer, NamedOptimizers):
            ensure_state(optimizer, self.model.trainable_variables)
        self.model.load_weights(str(directory / version.BACKUP_WEIGHTS_FILE))
        return backup

    def _warn_fallback(self, restored: Restored[Backup]) -> None:
        """Says once, loudly, which backups failed their check, where each would have resumed, where ``fit`` does."""

        def would_resume(damage: Damage) -> str:
            if damage.file == _META or self._store.check_file(damage.backup, _META) is not None:
                return "where it would have resumed is unknown (its meta.json is not intact)"
            return f"it would have resumed at {Backup.position_of(damage.backup)}"

        failed = "; ".join(f"{damage} ({would_resume(damage)})" for damage in restored.skipped)
        warnings.warn(
            f"custom_fit.BackupAndRestore: {len(restored.skipped)} newer backup(s) in {self.backup_dir} failed their "
            f"check and are not used: {failed}. Resuming from {restored.backup.name} instead, at "
            f"{Backup.position_of(restored.backup)}: the steps after it are trained again. The next backup "
            "written removes the damaged ones (copy them now to inspect them); check the storage under "
            f"{self.backup_dir} if this happens again.",
            DamagedBackupWarning,
            stacklevel=3,
        )

    def _agree_with_workers(self, intact: list[Path]) -> list[Path]:
        """The backups that passed their check on every worker of the cluster (each checks its own view).

        Through the coordination service's key-value store, as
        :class:`~custom_fit._preemption.ClusterAgreement`: each worker stores
        the names it found intact, reads every worker's, and keeps those all
        found intact, so all resume from the same backup.
        """
        workers, me = cluster_workers(self.model.distribute_strategy)
        key = f"custom_fit/backups/fit_{next(_agreements)}"
        cluster_key_insert(f"{key}/{me}", json.dumps([backup.name for backup in intact]))
        common = {backup.name for backup in intact}
        for worker in workers:
            found = cluster_key_get(f"{key}/{worker}", _AGREEMENT_TIMEOUT_S)
            if found is None:
                raise RuntimeError(
                    f"custom_fit.BackupAndRestore: worker {worker} did not report which backups in "
                    f"{self.backup_dir} are intact within {_AGREEMENT_TIMEOUT_S:.0f} s. Expected every worker "
                    "of the cluster to start fit. Fix: start all workers with the same script and TF_CONFIG."
                )
            common &= set(json.loads(found))
        return [backup for backup in intact if backup.name in common]

    def _restore_metrics(self, values: list[list[np.ndarray]]) -> None:
        """Sets each metric variable to its backed-up value (Keras reset them when the epoch began)."""
        if self._data is not None and self._data.element_spec is not None:
            _compat.loop.build_compiled_state(self.model, self._data.element_spec)
        metrics = epoch_metrics(self.model)
        shapes = [[tuple(v.shape) for v in metric.variables] for metric in metrics]
        if shapes != [[value.shape for value in saved] for saved in values]:
            raise ValueError(
                f"The backup in {self.backup_dir} holds metrics of another model: expected variables of shapes "
                f"{shapes}, the backup has {[[value.shape for value in saved] for saved in values]}. Fix: resume "
                "with the model and compile() arguments of the interrupted run, or use a new backup_dir."
            )
        for metric, saved in zip(metrics, values, strict=True):
            for variable, value in zip(metric.variables, saved, strict=True):
                variable.assign(value)

    def _replay_data_hooks(self, hook_states: list[tuple[RandomState, RandomState]]) -> None:
        """Runs the data's ``on_epoch_begin``/``on_epoch_end`` of the epochs before, each in its random state.

        A ``PyDataset`` that reshuffles in its hooks (``np.random.shuffle`` in
        ``on_epoch_end``) is then in the state it had when the interrupted
        epoch began.
        """
        if not hook_states:
            return
        assert self._data is not None and self._data.adapter is not None  # only such data records hooks
        adapter = self._data.adapter
        for begin, end in hook_states:
            begin.restore()
            adapter.on_epoch_begin()
            end.restore()
            adapter.on_epoch_end()


def _has_several_workers(strategy: tf.distribute.Strategy) -> bool:
    """Whether ``strategy`` spans a cluster of processes (``MultiWorkerMirroredStrategy`` with a ``TF_CONFIG``)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    return resolver is not None and bool(resolver.cluster_spec().jobs)
