"""What a run has done so far (`Progress`) and what a checkpoint of it holds (`TrainingState`).

A checkpoint stays a plain dict on disk: ``ddp-trainer evaluate``, older checkpoints and
tools that read them never need this module's classes to unpickle it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import torch


@dataclass
class Progress:
    """The loop's counters; checkpointed through :class:`TrainingState`."""

    epoch: int = 0
    """Epoch in progress (0-based)."""
    step: int = 0
    """Optimizer steps taken in total (skipped fp16 steps included)."""
    updates: int = 0
    """Optimizer updates applied (the schedule's position: skipped steps do not count)."""
    epoch_loss_sum: float = 0.0
    """Summed per-step training loss of the epoch so far (this rank; all ranks in a
    checkpoint, which rank 0 alone reloads)."""
    epoch_loss_count: int = 0
    """Steps behind `epoch_loss_sum`."""
    train_loss: float | None = None
    """Global mean training loss of the last finished (or stopped) epoch."""

    def add_losses(self, losses: list[float]) -> None:
        self.epoch_loss_sum += fsum(losses)
        self.epoch_loss_count += len(losses)

    def next_epoch(self) -> None:
        self.epoch += 1
        self.epoch_loss_sum, self.epoch_loss_count = 0.0, 0


@dataclass
class TrainingState:
    """All progress of a run: what a training checkpoint holds, key for key."""

    model: dict[str, Any]
    optimizer: dict[str, Any]
    epoch: int
    """The epoch a resume starts in (the next one when saved at an epoch end)."""
    step: int
    sampler: dict[str, Any] | None
    """The sampler's position inside `epoch`; None at an epoch boundary."""
    epoch_loss_sum: float
    """Over all ranks (rank 0 alone carries it on)."""
    epoch_loss_count: int
    train_loss: float | None
    global_batch: int
    """What the learning rate was tuned for: kept when the world size changes."""
    world_size: int
    rng_cpu: torch.Tensor
    rng_cuda: torch.Tensor | None
    updates: int
    schedule_total_steps: int
    """The schedule's length as planned when the run started, whatever the world size now."""
    precision: dict[str, Any]
    config: dict[str, Any]
    config_version: int
    """trainer.config.CONFIG_VERSION when written (0: before versions)."""
    objects: dict[str, str]
    """Parts given to fit() as objects (see build.Workload)."""
    class_names: list[str]

    def to_dict(self) -> dict[str, Any]:
        """The on-disk form (shallow: `dataclasses.asdict` would copy every tensor)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> TrainingState:
        """Read a checkpoint's dict; keys added after the first release have defaults, so
        that older checkpoints still resume."""
        return cls(
            model=state["model"], optimizer=state["optimizer"], epoch=int(state["epoch"]),
            step=int(state["step"]), sampler=state["sampler"],
            epoch_loss_sum=float(state["epoch_loss_sum"]),
            epoch_loss_count=int(state["epoch_loss_count"]), train_loss=state["train_loss"],
            global_batch=int(state["global_batch"]), world_size=int(state["world_size"]),
            rng_cpu=state["rng_cpu"], rng_cuda=state.get("rng_cuda"),
            updates=int(state.get("updates", state["step"])),
            schedule_total_steps=int(state.get("schedule_total_steps") or 0),
            precision=dict(state.get("precision") or {}), config=state["config"],
            config_version=int(state.get("config_version", 0)),
            objects=dict(state.get("objects") or {}),
            class_names=list(state.get("class_names") or []))


def fsum(values: list[float]) -> float:
    """Exact sum; inf when it is not finite (math.fsum raises on inf + -inf or an overflow:
    diverged either way)."""
    try:
        return math.fsum(values)
    except (ValueError, OverflowError):
        return math.inf
