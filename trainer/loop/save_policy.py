"""When progress is saved, and where, and when training ends: the save policy of the loop.

Every rank evaluates the same policy at the same steps: it depends on the step count, the
config and, for ``checkpoint.every_seconds``, on rank 0's clock as the ranks' agreement carries
it (rank 0 asks at a check, every rank reads the answer at the next one and saves at the step
after: :meth:`Saver.clock_due`, :meth:`Saver.agreed_due`), so the ranks agree on where to save
without talking more; the save itself is collective in the Trainer (the epoch's loss sums are
reduced), and rank 0 alone writes, on a background thread
(:class:`trainer.components.checkpoint.AsyncWriter`).

For an ``s3://`` dir each checkpoint is uploaded after its local write, retried
(:mod:`trainer.components.retry`); one whose upload still fails mid-run is skipped with a
warning and counted (``checkpoint/failed_saves``), training going on from the last durable one
(``checkpoint/durable_step``); the one that ends the run (its last step, a SIGTERM) must be
durable or the run stops with :class:`trainer.errors.CheckpointUnsaved`.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.components import checkpoint, storage
from trainer.components import sharded_checkpoint as sharded
from trainer.components.retry import Backoff
from trainer.config import CheckpointConfig
from trainer.data.loaders import forks_training_process
from trainer.errors import CheckpointUnsaved, StorageError

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Decision:
    """What follows an optimizer step (see :meth:`Saver.after_step`)."""

    ends_epoch: bool
    """The step used the epoch's last micro-batch."""
    save_now: bool
    """A step checkpoint inside the epoch (an epoch end is saved after its validation)."""
    saved: bool
    """Progress is saved at this step (`save_now`, or an epoch end that is saved)."""
    final: bool
    """Training ends with this step."""

    @property
    def awaited(self) -> bool:
        """Where progress is saved (a checkpoint, the last step) the ranks' agreement is
        awaited, so that a diverged or stopped model is never written as progress."""
        return self.saved or self.final


class Saver:
    """Every ``checkpoint.every`` steps and ``checkpoint.every_seconds``, or every epoch end
    when both are 0; always the end of training (as Lightning's every_n_train_steps and
    Hugging Face's save_strategy="steps" replace epoch-end saves). Training ends after
    `epochs` epochs or `max_steps` steps (0: no limit), whichever comes first."""

    def __init__(self, cfg: CheckpointConfig, is_main: bool, *, epochs: int = 1,
                 max_steps: int = 0,
                 report: Callable[[Mapping[str, float], int], None] | None = None) -> None:
        self.epochs = epochs
        self.max_steps = max_steps
        self.directory = storage.local_dir(cfg.dir) if cfg.dir else None
        """None: checkpointing is off. For an ``s3://`` dir: the local staging folder, each
        checkpoint uploaded from there after its save (trainer.components.storage)."""
        self._upload = (functools.partial(storage.push_checkpoint, cfg.dir, keep=cfg.keep,
                                          verify=checkpoint.problem_of_bytes,
                                          backoff=Backoff(cfg.upload_retries,
                                                          cfg.upload_deadline_seconds))
                        if storage.is_remote(cfg.dir) else None)
        if self.directory is not None:
            # Created (and probed) now, not found missing at the first save after an epoch
            # of training, when the Trainer is used without the runner.
            checkpoint.check_writable(self.directory)
        self.spec = cfg.dir
        self.every = cfg.every
        self.every_seconds = cfg.every_seconds
        self.keep = cfg.keep
        self.is_main = is_main
        self.writer = checkpoint.AsyncWriter()
        self.sharded = sharded.ShardedWriter(cfg.async_save)
        """An FSDP run's per-rank shards (:mod:`trainer.components.sharded_checkpoint`)."""
        self._shards: bool | None = None
        """Whether an FSDP run saves shards: decided at its first save."""
        self._last_save = time.monotonic()
        """Rank 0's clock at the last save (or the start)."""
        self._asked = False
        """Rank 0 asked for a timed save that has not happened yet."""
        self._agreed = False
        """The ranks agreed on a timed save: the next step saves."""
        self._epoch_end: tuple[int, bool] | None = None
        """(step, saved) decided by after_step for an epoch ending at that step."""
        self._report = report
        """Where the outcome of each save goes (the metrics' log), on rank 0."""
        self._pending: int | None = None
        """The step of the save submitted and not yet settled."""
        self.durable_step: int | None = None
        """The step of the newest checkpoint this run made durable (None: none yet)."""
        self.failed_saves = 0
        """Checkpoints skipped: their upload failed after every retry."""

    def done(self, step: int) -> bool:
        """`max_steps` is reached."""
        return bool(self.max_steps) and step >= self.max_steps

    def final(self, step: int, epoch: int, ends_epoch: bool) -> bool:
        """Training ends at `step` (in the 0-based `epoch`)."""
        return self.done(step) or (ends_epoch and epoch + 1 >= self.epochs)

    def epoch_end_saved(self, step: int, epoch: int) -> bool:
        """Whether `epoch`, ending at `step`, is checkpointed: as :meth:`after_step` decided
        at that step (a timed save agreed later waits for the next step: the ranks' agreement
        was awaited only where a save was decided)."""
        if self._epoch_end is not None and self._epoch_end[0] == step:
            return self._epoch_end[1]
        return self.at_epoch_end(step, self.final(step, epoch, ends_epoch=True))

    def after_step(self, step: int, epoch: int, ends_epoch: bool) -> Decision:
        if self._pending is not None and not self.writer.in_flight():
            self._settle(final=False)  # a finished save's outcome, reported at once
        save_now = not ends_epoch and self.due(step)
        final = self.final(step, epoch, ends_epoch)
        saved = save_now or (ends_epoch and self.at_epoch_end(step, final))
        if ends_epoch:
            self._epoch_end = (step, saved)
        return Decision(ends_epoch, save_now, saved, final)

    def due(self, step: int) -> bool:
        """A step checkpoint falls due at `step` (by steps, or a timed save agreed)."""
        return self.directory is not None and (
            self._agreed or (self.every > 0 and step % self.every == 0))

    def at_epoch_end(self, step: int, final: bool) -> bool:
        """Whether an epoch ending at `step` is saved (`final`: training ends with it)."""
        if self.directory is None:
            return False
        return (self.every == 0 and self.every_seconds == 0) or final or self.due(step)

    def clock_due(self) -> bool:
        """Rank 0 asks for a timed save (what it gives the ranks' next check); once, until
        the save happens."""
        if not self.is_main or self.directory is None or self.every_seconds <= 0 or \
                self._asked or time.monotonic() - self._last_save < self.every_seconds:
            return False
        self._asked = True
        return True

    def agreed_due(self) -> None:
        """The ranks agreed on a timed save (rank 0 asked): it happens at the next step."""
        self._agreed = True

    def save(self, step: int, state: Callable[[], dict[str, Any]]) -> Path | None:
        """Write the `state()` of `step` on rank 0 (the others build nothing); its path."""
        self._agreed = self._asked = False
        self._last_save = time.monotonic()
        if self.directory is None or not self.is_main:
            return None
        self._settle(final=False)
        path = self.writer.submit(self.directory, step, state(), self.keep, then=self._upload)
        self._pending = step
        log.debug("saved %s", path)
        return path

    def shards(self) -> bool:
        """Whether an FSDP run saves each rank's shard (a collective at its first save): only
        where every rank sees the same directory. Elsewhere (per-pod emptyDirs, an ``s3://``
        dir staged per process) rank 0 gathers the full state into one file, as before."""
        if self._shards is None:
            assert self.directory is not None
            self._shards = (not storage.is_remote(self.spec)
                            and sharded.all_see(self.directory, self.is_main))
            if not self._shards and self.is_main:
                log.warning("checkpoint.dir %s is not shared by all ranks: FSDP checkpoints "
                            "are gathered into one file on rank 0 (sharded ones need a "
                            "directory every rank sees, such as a ReadWriteMany PVC)", self.spec)
        return self._shards

    def save_sharded(self, step: int, model: Any, optimizer: Any,
                     state: Callable[[], dict[str, Any]]) -> Path | None:
        """Every rank writes its shard of `step`; rank 0 adds the rest of `state()` (without
        model and optimizer) and publishes the checkpoint. A collective."""
        self._agreed = self._asked = False
        self._last_save = time.monotonic()
        assert self.directory is not None
        directory, keep = self.directory, self.keep
        train = checkpoint.framed(checkpoint.serialize(state())) if self.is_main else None
        path = self.sharded.save(directory, step, model, optimizer, train, self.writer,
                                 lambda final: checkpoint.rotate(directory, keep, final))
        return path if self.is_main else None

    def shown(self, path: Path) -> str:
        """A saved checkpoint as the user named its place: for ``s3://`` its URL."""
        return storage.shown(self.spec, path)

    def before_fork(self, loader: Any) -> None:
        """Let a write in flight finish before `loader` forks this process into workers
        (`data.worker_start=fork`): a fork while the writer thread is inside torch.save can
        leave a worker waiting for ever on a lock that thread held. Costs a wait only where a
        save just began (an epoch end)."""
        if not forks_training_process(loader):
            return
        # Persistent workers are forked once, at the loader's first iteration; torch keeps
        # them in DataLoader._iterator (torch/utils/data/dataloader.py, __iter__).
        if getattr(loader, "persistent_workers", False) and \
                getattr(loader, "_iterator", None) is not None:
            return
        self._settle(final=False)

    def wait(self, share: Callable[[Any], Any] | None = None) -> None:
        """Until the last checkpoint, the one that ends the run, is durable: its write error,
        if any, is raised; an upload that failed every retry as CheckpointUnsaved. `share`
        (:meth:`trainer.distributed.agreement.Agreement.rank0s`, a collective) makes rank 0's
        verdict every rank's: all leave with its one line together, none before it (the
        launcher would stop rank 0 while it still tries)."""
        problem = None
        try:
            self._settle(final=True)
        except CheckpointUnsaved as exc:
            problem = (exc.problem, exc.fix)
        if share is not None:
            problem = share(problem)
        if problem is not None:
            raise CheckpointUnsaved(*problem)

    def _settle(self, final: bool) -> None:
        """Wait for the save in flight; report its outcome. A failed upload mid-run (not
        `final`) is a warning: the run goes on from the last durable checkpoint."""
        step, self._pending = self._pending, None
        self.sharded.wait()  # a sharded save is local: nothing to upload, nothing to retry
        try:
            self.writer.wait()
        except StorageError as exc:
            assert step is not None  # only a submitted save uploads
            if final:
                raise CheckpointUnsaved(
                    f"the checkpoint of step {step} could not be uploaded: {exc.problem}; "
                    f"{self._last_durable()}", exc.fix) from None
            self.failed_saves += 1
            log.warning("checkpoint of step %d skipped, training goes on (%s): %s", step,
                        self._last_durable(), exc.problem)
            self._send({"checkpoint/failed_saves": 1.0}, step)
            return
        if step is not None:
            self.durable_step = step
            self._send({"checkpoint/durable_step": float(step)}, step)

    def _last_durable(self) -> str:
        if self.durable_step is None:
            return "no checkpoint of this run is durable yet (a restart resumes from an " \
                   "earlier run's, if any)"
        path = checkpoint.checkpoint_path(self.directory or Path(), self.durable_step)
        return f"the last durable checkpoint is step {self.durable_step}, {self.shown(path)}"

    def _send(self, values: Mapping[str, float], step: int) -> None:
        if self._report is not None:
            self._report(values, step)

    def close(self) -> None:
        try:
            self.sharded.wait()
        finally:
            self.writer.close()
