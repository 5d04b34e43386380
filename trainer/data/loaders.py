"""The one seam between samplers and the loop: a rank's training sampler and its loaders.

Loaders take the batches of :class:`~trainer.sampling.BatchedSampler` and fetch each with one
``IndexView.batch`` call, in the rank's process or in ``data.num_workers`` worker processes
(each dataset reopens its files there: memory maps, Arrow tables; image folders pass a numpy
listing). Training batches carry their epoch (:class:`~trainer.data.EpochIndices`) so that
augmentation is a function of (seed, epoch, sample), whatever the worker count.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
import pickle
import threading
import traceback
import warnings
import weakref
from collections.abc import Iterable, Iterator, Sized
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info
from torch.utils.data.distributed import DistributedSampler

from trainer.config import JobConfig
from trainer.data import EpochIndices, IndexView, fetch
from trainer.errors import DataError, TrainerError
from trainer.placement import DistContext
from trainer.sampling import BatchedSampler, DistributedEvalSampler, DistributedShuffleSampler
from trainer.sampling.permutation import derive_key
from trainer.stacks import dump_on_signal


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
    start: str = "forkserver"
    """``data.worker_start``: the multiprocessing start method of the workers."""


def worker_options(cfg: JobConfig) -> WorkerOptions:
    d = cfg.data
    return WorkerOptions(d.num_workers, d.prefetch_factor, d.persistent_workers, cfg.train.seed,
                         d.worker_start)


def worker_context(start: str) -> multiprocessing.context.BaseContext:
    """The workers' multiprocessing context. A forkserver imports torch once, when it starts
    (about 2 s here), so that each loader's workers start in 0.1 s instead of 2 s; it starts
    here, when the loader is built, so that import overlaps the rest of the set-up. The preload
    list is the one process-wide setting this touches; `__main__` stays in it, as in
    multiprocessing's default, so a user script is imported once by the server, not once per
    worker."""
    context = multiprocessing.get_context(start)
    if start == "forkserver":
        context.set_forkserver_preload(["__main__", "torch"])
        multiprocessing.forkserver.ensure_running()
    return context


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


_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()
"""The loaders' live iterators, whose worker processes :func:`worker_pids` lists."""


def worker_pids() -> list[int]:
    """The pids of this process's live DataLoader workers (the hang watchdog signals them:
    see :func:`trainer.stacks.dump_on_signal`)."""
    return [w.pid for it in list(_LIVE) for w in getattr(it, "_workers", ())
            if w.pid is not None and w.is_alive()]


class Loader(DataLoader[Any]):
    """A DataLoader that raises a worker's TrainerError as itself, and a dataset that its
    workers cannot receive as one line."""

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        try:
            with warnings.catch_warnings():
                # torch warns before re-raising, with advice this error replaces
                warnings.filterwarnings("ignore", "Got pickle error", UserWarning)
                batches = super().__iter__()  # starts the workers (once, if persistent)
            _LIVE.add(batches)
        except (pickle.PicklingError, AttributeError, TypeError) as err:
            # the types torch's worker start takes for "does not pickle" (a lambda, a local
            # class, an open file or lock), in _MultiProcessingDataLoaderIter.__init__
            start = _start_method(self)
            if self.num_workers == 0 or start == "fork":
                raise
            raise DataError(
                f"data.num_workers={self.num_workers} workers start with {start}, which pickles "
                f"the dataset, and it does not pickle: {err}",
                "define the dataset's classes and functions at module level (no lambdas, open "
                "files or locks in it), or set data.worker_start=fork, or "
                "data.num_workers=0") from err
        try:
            for batch in batches:
                if isinstance(batch, _Failed):
                    raise batch.error()
                yield batch
        except Exception:
            # Stop the workers here: the traceback keeps this frame, and with it the iterator,
            # which torch stops only when collected, at any later point (one 5 s join timeout
            # per worker when that point was inside another worker's start).
            self.close()
            del batches
            raise

    def close(self) -> None:
        """Stop persistent workers now. A rank ends with os._exit, which skips the iterator's
        finalizer: the workers would outlive it and, with forkserver or spawn, the resource
        tracker would warn about the queues' semaphores it then removes."""
        # torch keeps persistent workers in DataLoader._iterator and stops them when that
        # iterator is collected (torch/utils/data/dataloader.py, __iter__ and __del__)
        self._iterator = None


def _forked_worker(worker_id: int) -> None:
    """Each forked worker's init: its stacks on the hang watchdog's signal."""
    dump_on_signal()


def _exit_with_the_rank(worker_id: int) -> None:
    """Each worker's init (workers not forked from the rank): its stacks on the hang
    watchdog's signal (:func:`trainer.stacks.dump_on_signal`); exit when the rank
    is gone.
    torch's workers watch their parent process, which for forkserver workers is the server,
    and the server lives as long as any worker (each holds its "alive" pipe): a rank that died
    without stopping them (SIGKILL, os._exit) would leave them waiting for ever."""
    dump_on_signal()
    rank = multiprocessing.parent_process()  # the process that started this worker
    if rank is not None:
        threading.Thread(target=_exit_after, args=(rank,), name="rank-watch",
                         daemon=True).start()


def _exit_after(rank: multiprocessing.process.BaseProcess) -> None:
    rank.join()  # returns when the rank's end of the worker's pipe closes
    os._exit(0)


def _start_method(loader: Any) -> str:
    context = getattr(loader, "multiprocessing_context", None)
    if context is not None:
        return str(context.get_start_method())
    # the process's default, without fixing it as get_start_method() would
    return multiprocessing.get_start_method(allow_none=True) or \
        multiprocessing.get_all_start_methods()[0]


def forks_training_process(loader: Any) -> bool:
    """Whether `loader` starts worker processes by forking the process that iterates it."""
    return getattr(loader, "num_workers", 0) > 0 and _start_method(loader) == "fork"


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
                workers: int | WorkerOptions = 0) -> Loader:
    """The loader of `batches` of `dataset` (an IndexView, whose batches come whole, or any
    map-style dataset, fetched by :func:`trainer.data.fetch`); `workers` is the worker count
    or all options."""
    opts = workers if isinstance(workers, WorkerOptions) else WorkerOptions(workers)
    extra: dict[str, Any] = {}
    if opts.num_workers > 0:
        extra = {"prefetch_factor": opts.prefetch_factor,
                 "persistent_workers": opts.persistent_workers,
                 "multiprocessing_context": worker_context(opts.start)}
        extra["worker_init_fn"] = _forked_worker if opts.start == "fork" else _exit_with_the_rank
    return Loader(
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
                 ctx: DistContext, workers: int | WorkerOptions = 0) -> Loader:
    batches = BatchedSampler(sampler, batch_size, drop_last=False)
    return make_loader(dataset, _EpochTagged(batches, sampler), ctx, workers)


def eval_loader(dataset: IndexView, batch_size: int, ctx: DistContext,
                workers: int | WorkerOptions = 0) -> tuple[Loader, int]:
    """The rank's eval loader and how many of its items are real (the rest is padding)."""
    sampler = DistributedEvalSampler(dataset, num_replicas=ctx.world_size, rank=ctx.rank)
    return make_loader(dataset, BatchedSampler(sampler, batch_size, drop_last=False), ctx,
                       workers), int(sampler.num_valid)
