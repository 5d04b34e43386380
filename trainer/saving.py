"""When progress is saved, and where: the checkpoint policy of the loop.

Every rank evaluates the same policy at the same steps (it depends only on the step count and
the config), so the ranks agree on where to save without talking; the save itself is
collective in the Trainer (the epoch's loss sums are reduced), and rank 0 alone writes, on a
background thread (:class:`trainer.checkpoint.AsyncWriter`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainer import checkpoint
from trainer.config import CheckpointConfig

log = logging.getLogger(__name__)


class Saver:
    """``checkpoint.every`` steps, or every epoch end when it is 0; always the end of
    training (as Lightning's every_n_train_steps and Hugging Face's save_strategy="steps"
    replace epoch-end saves)."""

    def __init__(self, cfg: CheckpointConfig, is_main: bool) -> None:
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

    def wait(self) -> None:
        """Until the last checkpoint is durable (its write error, if any, is raised)."""
        self.writer.wait()

    def close(self) -> None:
        self.writer.close()
