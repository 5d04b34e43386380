"""Exact distributed evaluation: integer counts are reduced, never per-rank ratios averaged.

Every rank runs the same number of batches (the eval sampler pads short shards), so no rank
waits forever in the final all_reduce; padded items are masked out of the counts, so no sample
is counted twice. Global accuracy = sum(correct) / sum(total) over ranks: exact integers, hence
bit-identical for any world size. The step is the training step, so this holds for any model.
The loss is not: the step returns one mean loss per batch, and which samples share a batch depends
on the world size, so the count-weighted mean agrees across world sizes to float32 rounding only.
A task's further sums (:mod:`trainer.components.tasks`: MAE, RMSE, perplexity, ...) are summed in
the same float64 vector and reduced in the same all_reduce.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainer.components.steps import StepFn, Tally, as_output, counts_vector
from trainer.components.tasks import CLASSIFICATION, Task, task_of
from trainer.components.tree import batch_len, take, to_device
from trainer.placement import DistContext


@dataclass(frozen=True)
class EvalResult:
    correct: int
    total: int
    loss_sum: float
    task: Task = CLASSIFICATION
    sums: dict[str, float] = field(default_factory=dict)
    """The task's further sums by name."""

    @property
    def metrics(self) -> dict[str, float]:
        """The task's metrics by name (none when nothing was scored)."""
        return self.task.metrics({"correct": float(self.correct), self.task.weight:
                                  float(self.total), "loss_sum": self.loss_sum, **self.sums})

    @property
    def accuracy(self) -> float:
        return self.correct / self.total if self.total else 0.0

    @property
    def loss(self) -> float:
        return self.loss_sum / self.total if self.total else 0.0


def evaluate(model: nn.Module, step: StepFn, loader: Iterable[Any], num_valid: int,
             ctx: DistContext) -> tuple[EvalResult, EvalResult]:
    """Return (this rank's result, the exact global result).

    `loader` yields this rank's share with padding after the first `num_valid` samples; the
    padding is cut off before the step sees a batch. `model` is the unwrapped module: a
    forward-only pass needs no DDP, so there is no collective until the final reduction.
    The loss is weighted by each batch's count (sum of loss x count over sum of count).
    """
    task = task_of(step)
    local = local_sums(model, step, loader, num_valid, ctx.device, task)
    return result(local, task), result(reduce_sums(local, ctx), task)


@torch.no_grad()
def local_sums(model: nn.Module, step: StepFn, loader: Iterable[Any], num_valid: int,
               device: torch.device, task: Task = CLASSIFICATION) -> torch.Tensor:
    """This rank's [correct, count, loss x count, *task.sums] as float64 (exact for integer
    counts up to 2^53), to be summed over ranks by :func:`reduce_sums` (or by a caller's own
    reduction carrying more values: the Trainer adds its epoch loss sums to save a collective)."""
    was_training = model.training
    model.eval()
    # Kept per batch and summed once at the end: one host sync, and no per-batch in-place adds
    # (~7 us a batch on the CPU).
    correct = Tally(device)
    count: list[torch.Tensor | int] = []
    losses: list[torch.Tensor] = []
    named: list[list[torch.Tensor | float | int]] = [[] for _ in task.sums]
    seen = 0
    for batch in loader:
        size = batch_len(batch)
        n_real = max(0, min(size, num_valid - seen))
        seen += size
        if n_real == 0:
            continue
        if n_real < size:
            batch = take(batch, n_real)
        out = as_output(step(model, to_device(batch, device)), "train.step", task)
        correct.add(out.correct)
        count.append(out.count)
        losses.append(out.loss.detach())
        for values, name in zip(named, task.sums, strict=True):
            values.append(out.sums[name])
    model.train(was_training)
    if not losses:
        return torch.zeros(3 + len(task.sums), dtype=torch.float64, device=device)
    counts = counts_vector(count, device)
    loss_sum = torch.dot(torch.stack(losses).double(), counts)
    extra = [_sum64(values, device) for values in named]
    return torch.stack([correct.total(), counts.sum(), loss_sum, *extra])


def _sum64(values: list[torch.Tensor | float | int], device: torch.device) -> torch.Tensor:
    """The per-batch values of one named sum, each widened to float64 first, summed."""
    return torch.stack([v.to(device, torch.float64) if isinstance(v, torch.Tensor)
                        else torch.tensor(v, dtype=torch.float64, device=device)
                        for v in values]).sum()


def reduce_sums(sums: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    """The sums over all ranks (a collective when distributed)."""
    total = sums.clone()
    if ctx.initialized:
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total


def result(sums: torch.Tensor, task: Task = CLASSIFICATION) -> EvalResult:
    """The result of [correct, count, loss x count, *task.sums] sums (more values after them,
    a caller's own, are ignored)."""
    values = sums[:3 + len(task.sums)].tolist()
    correct, total, loss_sum = values[:3]
    return EvalResult(int(correct), int(total), float(loss_sum), task,
                      dict(zip(task.sums, values[3:], strict=True)))
