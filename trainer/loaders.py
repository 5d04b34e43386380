"""The one seam between samplers and the loop: a rank's training sampler and its loaders."""

from __future__ import annotations

from collections.abc import Iterable, Sized
from typing import Any

from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from trainer.data import IndexView
from trainer.distributed import DistContext
from trainer.sampling import BatchedSampler, DistributedEvalSampler, DistributedShuffleSampler


class TorchSamplerAdapter:
    """torch's DistributedSampler behind the same resumable interface.

    torch's sampler cannot start mid-epoch, so a resumed epoch restarts from its first sample
    (documented); use ``train.sampler: shuffle`` for exact mid-epoch resume.
    """

    resumes_mid_epoch = False
    """The Trainer then drops the saved loss sums of the epoch it replays."""

    def __init__(self, dataset: Sized, ctx: DistContext, seed: int) -> None:
        self.inner: DistributedSampler[Any] = DistributedSampler(
            dataset, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=seed,  # type: ignore[arg-type]
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


TrainSampler = DistributedShuffleSampler | TorchSamplerAdapter


def build_train_sampler(kind: str, dataset: Sized, ctx: DistContext, seed: int) -> TrainSampler:
    if kind == "torch":
        return TorchSamplerAdapter(dataset, ctx, seed)
    return DistributedShuffleSampler(dataset, num_replicas=ctx.world_size, rank=ctx.rank,
                                     shuffle=True, seed=seed, drop_last=False)


def _passthrough(batch: Any) -> Any:
    """IndexView.__getitems__ already returns a collated batch."""
    return batch


def make_loader(dataset: IndexView, batches: Iterable[list[int]], ctx: DistContext,
                num_workers: int) -> DataLoader[Any]:
    return DataLoader(
        dataset,
        batch_sampler=batches,
        collate_fn=_passthrough,
        num_workers=num_workers,
        # pinned host memory lets the host->GPU copy run asynchronously (non_blocking=True)
        pin_memory=ctx.device.type == "cuda",
        persistent_workers=num_workers > 0,
    )


def train_loader(dataset: IndexView, sampler: TrainSampler, batch_size: int, ctx: DistContext,
                 num_workers: int) -> DataLoader[Any]:
    return make_loader(dataset, BatchedSampler(sampler, batch_size, drop_last=False), ctx,
                       num_workers)


def eval_loader(dataset: IndexView, batch_size: int, ctx: DistContext,
                num_workers: int = 0) -> tuple[DataLoader[Any], int]:
    """The rank's eval loader and how many of its items are real (the rest is padding)."""
    sampler = DistributedEvalSampler(dataset, num_replicas=ctx.world_size, rank=ctx.rank)
    return make_loader(dataset, BatchedSampler(sampler, batch_size, drop_last=False), ctx,
                       num_workers), int(sampler.num_valid)
