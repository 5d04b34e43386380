"""DataLoaders: worker options, seeds distinct per rank and worker, epoch-tagged batches,
errors from workers raised as themselves."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset, get_worker_info

from trainer.data import EpochIndices, IndexView
from trainer.distributed import DistContext
from trainer.errors import ConfigError, DataError
from trainer.loaders import (
    WorkerOptions,
    build_train_sampler,
    eval_loader,
    make_loader,
    train_loader,
)


def _ctx(rank: int = 0, world: int = 1) -> DistContext:
    return DistContext(rank, world, rank, world, torch.device("cpu"), "gloo", False)


class Probe(Dataset[Any]):
    """Each batch reports what the fetching process saw."""

    def __init__(self, n: int = 16, fail_at: int = -1, error: type = DataError) -> None:
        self.n, self.fail_at, self.error = n, fail_at, error

    def __len__(self) -> int:
        return self.n

    def __getitems__(self, indices: list[int]) -> dict[str, torch.Tensor]:
        if self.fail_at in indices:
            raise self.error(f"sample {self.fail_at} is bad", "fix sample")
        info = get_worker_info()
        return {"index": torch.tensor(list(indices)),
                "epoch": torch.tensor(getattr(indices, "epoch", -1)),
                "worker": torch.tensor(-1 if info is None else info.id),
                "seed": torch.tensor(torch.initial_seed() % (1 << 62)),
                "numpy": torch.tensor(int(np.random.randint(0, 1 << 30)))}


def _batches(rank: int, workers: int, epoch: int = 0, world: int = 2,
             **kw: Any) -> list[dict[str, Any]]:
    view = IndexView(Probe(16, **kw))
    sampler = build_train_sampler("shuffle", view, _ctx(rank, world), seed=0)
    sampler.set_epoch(epoch)
    loader = train_loader(view, sampler, 2, _ctx(rank, world), WorkerOptions(workers, seed=7))
    return list(loader)


def test_worker_seeds_differ_per_rank_and_per_worker() -> None:
    seen = {(b["worker"].item(), b["seed"].item(), b["numpy"].item())
            for rank in (0, 1) for b in _batches(rank, workers=2)}
    seeds = {s for _, s, _ in seen}
    assert len(seeds) == 4  # 2 ranks x 2 workers
    assert len({n for _, _, n in seen}) >= 4  # numpy's generator is seeded per worker too


def test_worker_seeds_repeat_for_the_same_rank_and_seed() -> None:
    first = sorted(b["seed"].item() for b in _batches(0, workers=2))
    assert first == sorted(b["seed"].item() for b in _batches(0, workers=2))


def test_training_batches_carry_their_epoch_into_workers() -> None:
    batches = _batches(0, workers=2, epoch=3)
    assert {b["epoch"].item() for b in batches} == {3}
    assert {b["worker"].item() for b in batches} == {0, 1}


def test_eval_batches_are_not_tagged() -> None:
    loader, valid = eval_loader(IndexView(Probe(10)), 4, _ctx(), WorkerOptions(1))
    assert valid == 10 and {b["epoch"].item() for b in loader} == {-1}


def test_epoch_tags_survive_the_index_view() -> None:
    view = IndexView(Probe(16), np.arange(16, dtype=np.int64)[::-1].copy())
    batch = view.batch(EpochIndices([0, 1], epoch=5))
    assert batch["index"].tolist() == [15, 14] and batch["epoch"].item() == 5


@pytest.mark.parametrize("error", [DataError, ConfigError])
def test_a_trainer_error_in_a_worker_is_raised_as_itself(error: type) -> None:
    with pytest.raises(error) as info:
        _batches(0, workers=2, world=1, fail_at=3, error=error)
    assert info.value.problem == "sample 3 is bad" and info.value.fix == "fix sample"
    if sys.version_info >= (3, 11):  # exception notes; --debug shows the worker's traceback
        assert "raised in a DataLoader worker" in "".join(info.value.__notes__)


def test_other_errors_in_a_worker_keep_torchs_report() -> None:
    with pytest.raises(ValueError, match="Caught ValueError in DataLoader worker"):
        _batches(0, workers=1, world=1, fail_at=3, error=lambda problem, fix: ValueError(problem))


def test_worker_options_reach_the_loader_and_an_int_still_works() -> None:
    view = IndexView(Probe(8))
    loader = make_loader(view, [[0, 1]], _ctx(), WorkerOptions(2, prefetch_factor=4,
                                                              persistent_workers=False))
    assert (loader.num_workers, loader.prefetch_factor, loader.persistent_workers) == (2, 4,
                                                                                     False)
    assert not loader.pin_memory  # only on CUDA
    plain = make_loader(view, [[0, 1]], _ctx(), 0)
    assert plain.num_workers == 0 and [b["index"].tolist() for b in plain] == [[0, 1]]
