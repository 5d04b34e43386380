"""Where a rank runs: its place in the job, as the distributed bootstrap found it.

A plain record below every layer that reads it (the loaders, evaluation, the loop); only
:mod:`trainer.distributed.bootstrap` makes one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DistContext:
    """What a rank knows about its place in the job."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    backend: str
    initialized: bool
    """True when a process group was created (false in the single-process fallback)."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0
