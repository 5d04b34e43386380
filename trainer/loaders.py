"""The one seam between samplers and the loop: a rank's training sampler and its loaders.

Loaders take the batches of :class:`~trainer.sampling.BatchedSampler` and fetch each with one
``IndexView.batch`` call, in the rank's process or in ``data.num_workers`` worker processes
(each dataset reopens its files there: memory maps, Arrow tables; image folders pass a numpy
listing). Training batches carry their epoch (:class:`~trainer.data.EpochIndices`) so that
augmentation is a function of (seed, epoch, sample), whatever the worker count.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterable, Iterator, Sized
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info
from torch.utils.data.distributed import DistributedSampler

from trainer.config import JobConfig
from trainer.data import EpochIndices, IndexView, fetch
from trainer.distributed import DistContext
from trainer.errors import TrainerError
from trainer.sampling import BatchedSampler, DistributedEvalSampler, DistributedShuffleSampler
from trainer.sampling.permutation import derive_key


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


@dataclass(frozen=True)
class WorkerOptions:
    """How a rank's DataLoaders load (see the ``data.*`` fields of the same names)."""

    num_workers: int = 0
    prefetch_factor: int = 2
    persistent_workers: bool = True
    seed: int = 0
    """``train.seed``: with the rank, it seeds the workers' torch/random/numpy generators."""


def worker_options(cfg: JobConfig) -> WorkerOptions:
    d = cfg.data
    return WorkerOptions(d.num_workers, d.prefetch_factor, d.persistent_workers, cfg.train.seed)


# Stream id of the worker seeds in derive_key(seed, rank, stream); the samplers use others.
_WORKER_STREAM = 0x5EED_0F_D474


def worker_generator(seed: int, rank: int) -> torch.Generator:
    """The loader's generator: torch seeds worker w of each epoch with ``base + w``, where
    ``base`` is drawn from it, so seeds differ per rank (by the key) and per worker (by w),
    and the global RNG (checkpointed) is left alone. Our own augmentation does not use these
    seeds (see :mod:`trainer.data.transforms`); they serve user datasets' own randomness."""
    key = derive_key(seed, rank, _WORKER_STREAM) & ((1 << 63) - 1)
    return torch.Generator().manual_seed(key)


@dataclass(frozen=True)
class _Failed:
    """A TrainerError raised in a worker, carried back as the batch. torch re-creates a
    worker's exception from its class and message alone, which (problem, fix) does not fit:
    it would surface as a RuntimeError with a worker traceback instead of one line."""

    kind: type[TrainerError]
    problem: str
    fix: str
    trace: str

    def error(self) -> TrainerError:
        err = self.kind(self.problem, self.fix)
        if hasattr(err, "add_note"):  # Python >= 3.11; shown by --debug
            err.add_note(f"raised in a DataLoader worker:\n{self.trace}")
        return err


class _Batches(Dataset[Any]):
    """What the loader fetches from: the view's collated batches (:func:`fetch`: an
    IndexView's own ``batch``, or any map-style dataset's), with errors from workers carried
    back as :class:`_Failed`."""

    def __init__(self, view: Dataset[Any]) -> None:
        self.view = view

    def __len__(self) -> int:
        return len(self.view)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        return self.view[index]

    def __getitems__(self, indices: list[int]) -> Any:
        try:
            # An IndexView's batch is final; only other datasets go through fetch's rule
            # (a list from __getitems__ is a list of samples to collate).
            if isinstance(self.view, IndexView):
                return self.view.batch(indices)
            return fetch(self.view, indices)
        except TrainerError as err:
            if get_worker_info() is None:
                raise
            return _Failed(type(err), err.problem, err.fix, traceback.format_exc())


class _Loader(DataLoader[Any]):
    """A DataLoader that raises a worker's TrainerError as itself."""

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        for batch in super().__iter__():
            if isinstance(batch, _Failed):
                raise batch.error()
            yield batch


class _EpochTagged:
    """Batches of a training sampler, tagged with the sampler's epoch (read when iterated,
    after the loop's ``set_epoch``) for per-sample augmentation seeds."""

    def __init__(self, batches: BatchedSampler, sampler: TrainSampler) -> None:
        self.batches = batches
        self.sampler = sampler

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[EpochIndices]:
        epoch = self.sampler.epoch
        for batch in self.batches:
            yield EpochIndices(batch, epoch)


def _passthrough(batch: Any) -> Any:
    """IndexView.__getitems__ already returns a collated batch."""
    return batch


def make_loader(dataset: Dataset[Any], batches: Iterable[list[int]], ctx: DistContext,
                workers: int | WorkerOptions = 0) -> DataLoader[Any]:
    """The loader of `batches` of `dataset` (an IndexView, whose batches come whole, or any
    map-style dataset, fetched by :func:`trainer.data.fetch`); `workers` is the worker count
    or all options."""
    opts = workers if isinstance(workers, WorkerOptions) else WorkerOptions(workers)
    extra: dict[str, Any] = {}
    if opts.num_workers > 0:
        extra = {"prefetch_factor": opts.prefetch_factor,
                 "persistent_workers": opts.persistent_workers}
    return _Loader(
        _Batches(dataset),
        batch_sampler=batches,
        collate_fn=_passthrough,
        num_workers=opts.num_workers,
        # pinned host memory lets the host->GPU copy run asynchronously (non_blocking=True)
        pin_memory=ctx.device.type == "cuda",
        generator=worker_generator(opts.seed, ctx.rank),
        **extra,
    )


def train_loader(dataset: IndexView, sampler: TrainSampler, batch_size: int,
                 ctx: DistContext, workers: int | WorkerOptions = 0) -> DataLoader[Any]:
    batches = BatchedSampler(sampler, batch_size, drop_last=False)
    return make_loader(dataset, _EpochTagged(batches, sampler), ctx, workers)


def eval_loader(dataset: IndexView, batch_size: int, ctx: DistContext,
                workers: int | WorkerOptions = 0) -> tuple[DataLoader[Any], int]:
    """The rank's eval loader and how many of its items are real (the rest is padding)."""
    sampler = DistributedEvalSampler(dataset, num_replicas=ctx.world_size, rank=ctx.rank)
    return make_loader(dataset, BatchedSampler(sampler, batch_size, drop_last=False), ctx,
                       workers), int(sampler.num_valid)
