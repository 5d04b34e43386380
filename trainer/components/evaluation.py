"""Exact distributed evaluation: integer counts are reduced, never per-rank ratios averaged.

Every rank runs the same number of batches (the eval sampler pads short shards), so no rank
waits forever in the final all_reduce; padded items are masked out of the counts, so no sample
is counted twice. Global accuracy = sum(correct) / sum(total) over ranks: exact integers, hence
bit-identical for any world size. The step is the training step, so this holds for any model.
The loss is not: the step returns one mean loss per batch, and which samples share a batch depends
on the world size, so the count-weighted mean agrees across world sizes to float32 rounding only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainer.components.steps import StepFn, Tally, as_output, counts_vector
from trainer.components.tree import batch_len, take, to_device
from trainer.placement import DistContext


@dataclass(frozen=True)
class EvalResult:
    correct: int
    total: int
    loss_sum: float

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
    local = local_sums(model, step, loader, num_valid, ctx.device)
    return result(local), result(reduce_sums(local, ctx))


@torch.no_grad()
def local_sums(model: nn.Module, step: StepFn, loader: Iterable[Any], num_valid: int,
               device: torch.device) -> torch.Tensor:
    """This rank's [correct, count, loss x count] as float64 (exact for integer counts up to
    2^53), to be summed over ranks by :func:`reduce_sums` (or by a caller's own reduction
    carrying more values: the Trainer adds its epoch loss sums to save a collective)."""
    was_training = model.training
    model.eval()
    # Kept per batch and summed once at the end: one host sync, and no per-batch in-place adds
    # (~7 us a batch on the CPU).
    correct = Tally(device)
    count: list[torch.Tensor | int] = []
    losses: list[torch.Tensor] = []
    seen = 0
    for batch in loader:
        size = batch_len(batch)
        n_real = max(0, min(size, num_valid - seen))
        seen += size
        if n_real == 0:
            continue
        if n_real < size:
            batch = take(batch, n_real)
        out = as_output(step(model, to_device(batch, device)))
        correct.add(out.correct)
        count.append(out.count)
        losses.append(out.loss.detach())
    model.train(was_training)
    if not losses:
        return torch.zeros(3, dtype=torch.float64, device=device)
    counts = counts_vector(count, device)
    loss_sum = torch.dot(torch.stack(losses).double(), counts)
    return torch.stack([correct.total(), counts.sum(), loss_sum])


def reduce_sums(sums: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    """The sums over all ranks (a collective when distributed)."""
    total = sums.clone()
    if ctx.initialized:
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total


def result(sums: torch.Tensor) -> EvalResult:
    """The result of [correct, count, loss x count] sums."""
    correct, total, loss_sum = sums[:3].tolist()
    return EvalResult(int(correct), int(total), float(loss_sum))
