"""Exact distributed evaluation: integer counts are reduced, never per-rank ratios averaged.

Every rank runs the same number of batches (the eval sampler pads short shards), so no rank
waits forever in the final all_reduce; padded items are masked out of the counts, so no sample
is counted twice. Global accuracy = sum(correct) / sum(total) over ranks: exact integers, hence
bit-identical for any world size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from trainer.data import InMemoryDataset
from trainer.distributed import DistContext
from trainer.loaders import eval_loader, to_device


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


@torch.no_grad()
def evaluate(model: nn.Module, dataset: InMemoryDataset, ctx: DistContext,
             batch_size: int) -> tuple[EvalResult, EvalResult]:
    """Return (this rank's result, the exact global result)."""
    was_training = model.training
    model.eval()
    loader, num_valid = eval_loader(dataset, batch_size, ctx)
    # Accumulate on the device: one host sync at the end instead of one per batch.
    correct = torch.zeros((), dtype=torch.int64, device=ctx.device)
    loss_sum = torch.zeros((), dtype=torch.float64, device=ctx.device)
    seen = 0
    for batch in loader:
        x, y = to_device(batch, ctx.device)
        n_real = max(0, min(len(y), num_valid - seen))
        seen += len(y)
        logits = model(x)[:n_real]
        y = y[:n_real]
        correct += (logits.argmax(dim=1) == y).sum()
        loss_sum += F.cross_entropy(logits.float(), y, reduction="sum").double()
    local = torch.stack([correct.double(), torch.tensor(float(num_valid), device=ctx.device,
                                                        dtype=torch.float64), loss_sum])
    local_result = _result(local)
    if ctx.initialized:
        # float64 holds integer counts exactly up to 2^53 samples.
        dist.all_reduce(local, op=dist.ReduceOp.SUM)
    model.train(was_training)
    return local_result, _result(local)


def _result(t: torch.Tensor) -> EvalResult:
    correct, total, loss_sum = t.tolist()
    return EvalResult(int(correct), int(total), float(loss_sum))
