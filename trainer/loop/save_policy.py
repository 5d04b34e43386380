"""When progress is saved, and where, and when training ends: the save policy of the loop.

Every rank evaluates the same policy at the same steps (it depends only on the step count and
the config), so the ranks agree on where to save without talking; the save itself is
collective in the Trainer (the epoch's loss sums are reduced), and rank 0 alone writes, on a
background thread (:class:`trainer.components.checkpoint.AsyncWriter`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.components import checkpoint
from trainer.config import CheckpointConfig
from trainer.data.loaders import forks_training_process

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
    """``checkpoint.every`` steps, or every epoch end when it is 0; always the end of
    training (as Lightning's every_n_train_steps and Hugging Face's save_strategy="steps"
    replace epoch-end saves). Training ends after `epochs` epochs or `max_steps` steps
    (0: no limit), whichever comes first."""

    def __init__(self, cfg: CheckpointConfig, is_main: bool, *, epochs: int = 1,
                 max_steps: int = 0) -> None:
        self.epochs = epochs
        self.max_steps = max_steps
        self.directory = Path(cfg.dir) if cfg.dir else None
        """None: checkpointing is off."""
        if self.directory is not None:
            # Created (and probed) now, not found missing at the first save after an epoch
            # of training, when the Trainer is used without the runner.
            checkpoint.check_writable(self.directory)
        self.every = cfg.every
        self.keep = cfg.keep
        self.is_main = is_main
        self.writer = checkpoint.AsyncWriter()

    def done(self, step: int) -> bool:
        """`max_steps` is reached."""
        return bool(self.max_steps) and step >= self.max_steps

    def final(self, step: int, epoch: int, ends_epoch: bool) -> bool:
        """Training ends at `step` (in the 0-based `epoch`)."""
        return self.done(step) or (ends_epoch and epoch + 1 >= self.epochs)

    def epoch_end_saved(self, step: int, epoch: int) -> bool:
        """Whether `epoch`, ending at `step`, is checkpointed."""
        return self.at_epoch_end(step, self.final(step, epoch, ends_epoch=True))

    def after_step(self, step: int, epoch: int, ends_epoch: bool) -> Decision:
        save_now = not ends_epoch and self.due(step)
        final = self.final(step, epoch, ends_epoch)
        saved = save_now or (ends_epoch and self.at_epoch_end(step, final))
        return Decision(ends_epoch, save_now, saved, final)

    def due(self, step: int) -> bool:
        """A step checkpoint falls due at `step`."""
        return self.directory is not None and self.every > 0 and step % self.every == 0

    def at_epoch_end(self, step: int, final: bool) -> bool:
        """Whether an epoch ending at `step` is saved (`final`: training ends with it)."""
        if self.directory is None:
            return False
        return self.every == 0 or step % self.every == 0 or final

    def save(self, step: int, state: Callable[[], dict[str, Any]]) -> Path | None:
        """Write the `state()` of `step` on rank 0 (the others build nothing); its path."""
        if self.directory is None or not self.is_main:
            return None
        path = self.writer.submit(self.directory, step, state(), self.keep)
        log.debug("saved %s", path)
        return path

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
        self.wait()

    def wait(self) -> None:
        """Until the last checkpoint is durable (its write error, if any, is raised)."""
        self.writer.wait()

    def close(self) -> None:
        self.writer.close()
