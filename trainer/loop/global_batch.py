"""Keeping the global batch when a job resumes on a different number of ranks."""

from __future__ import annotations

import logging
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchPlan:
    micro_batch: int
    """Samples per rank per forward/backward pass."""
    accum_steps: int
    """Micro-batches accumulated per optimizer step."""
    world_size: int

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.accum_steps * self.world_size


def plan_batches(global_batch: int, world_size: int, max_micro: int) -> BatchPlan:
    """The plan with the largest micro-batch <= `max_micro` that keeps `global_batch` exactly.

    The global batch is what the learning rate was tuned for, so a job that loses or gains
    ranks keeps it: per-rank batch first, then gradient accumulation. When `world_size` does
    not divide it, no exact plan exists; the nearest per-rank batch is used with a warning.
    """
    if global_batch % world_size == 0:
        per_rank = global_batch // world_size
        for accum in range(1, per_rank + 1):
            if per_rank % accum == 0 and per_rank // accum <= max_micro:
                return BatchPlan(per_rank // accum, accum, world_size)
    micro = max(1, round(global_batch / world_size))
    log.warning("global batch %d cannot be split over %d ranks; using %d per rank (global %d)",
                global_batch, world_size, micro, micro * world_size)
    return BatchPlan(micro, 1, world_size)
