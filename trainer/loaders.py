"""The one seam between samplers and the loop: build a rank's training and eval loaders."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from trainer.data import InMemoryDataset, passthrough_collate
from trainer.distributed import DistContext
from trainer.sampling import BatchedSampler, DistributedEvalSampler, DistributedShuffleSampler


class TorchSamplerAdapter:
    """torch's DistributedSampler behind the same resumable interface.

    torch's sampler cannot start mid-epoch, so a resumed epoch restarts from its first sample
    (documented); use ``train.sampler: shuffle`` for exact mid-epoch resume.
    """

    def __init__(self, dataset: InMemoryDataset, ctx: DistContext, seed: int) -> None:
        self.inner: DistributedSampler[Any] = DistributedSampler(
            dataset, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=seed,
            drop_last=False)
        self.start_position = 0
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.inner.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.inner)

    def __iter__(self) -> Any:
        return iter(self.inner)

    def state_dict(self, consumed: int) -> dict[str, int]:
        return {"epoch": self.epoch, "position": 0, "seed": self.inner.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch = int(state["epoch"])


def build_train_sampler(kind: str, dataset: InMemoryDataset, ctx: DistContext,
                        seed: int) -> DistributedShuffleSampler | TorchSamplerAdapter:
    if kind == "torch":
        return TorchSamplerAdapter(dataset, ctx, seed)
    return DistributedShuffleSampler(dataset, num_replicas=ctx.world_size, rank=ctx.rank,
                                     shuffle=True, seed=seed, drop_last=False)


def _loader(dataset: InMemoryDataset, batches: Iterable[list[int]], ctx: DistContext,
            num_workers: int) -> DataLoader[Any]:
    return DataLoader(
        dataset,
        batch_sampler=batches,
        collate_fn=passthrough_collate,  # type: ignore[arg-type]
        num_workers=num_workers,
        # pinned host memory lets the host->GPU copy run asynchronously (non_blocking=True)
        pin_memory=ctx.device.type == "cuda",
        persistent_workers=num_workers > 0,
    )


def train_loader(dataset: InMemoryDataset, sampler: Any, batch_size: int, ctx: DistContext,
                 num_workers: int) -> DataLoader[Any]:
    return _loader(dataset, BatchedSampler(sampler, batch_size, drop_last=False), ctx,
                   num_workers)


def eval_loader(dataset: InMemoryDataset, batch_size: int,
                ctx: DistContext) -> tuple[DataLoader[Any], int]:
    """The rank's eval loader and how many of its items are real (the rest is padding)."""
    sampler = DistributedEvalSampler(dataset, num_replicas=ctx.world_size, rank=ctx.rank)
    return _loader(dataset, BatchedSampler(sampler, batch_size, drop_last=False), ctx,
                   0), int(sampler.num_valid)


def to_device(batch: tuple[torch.Tensor, torch.Tensor],
              device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = batch
    return x.to(device, non_blocking=True), y.to(device, non_blocking=True)
