"""DataLoaders: worker options, how workers start, seeds distinct per rank and worker,
epoch-tagged batches, errors from workers raised as themselves."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset, get_worker_info

from trainer.data import EpochIndices, IndexView
from trainer.data.loaders import (
    WorkerOptions,
    build_train_sampler,
    eval_loader,
    make_loader,
    train_loader,
)
from trainer.errors import ConfigError, DataError
from trainer.placement import DistContext


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


def _value_error(problem: str, fix: str) -> ValueError:
    return ValueError(problem)


def test_other_errors_in_a_worker_keep_torchs_report() -> None:
    with pytest.raises(ValueError, match="Caught ValueError in DataLoader worker"):
        _batches(0, workers=1, world=1, fail_at=3, error=_value_error)


def test_worker_options_reach_the_loader_and_an_int_still_works() -> None:
    view = IndexView(Probe(8))
    loader = make_loader(view, [[0, 1]], _ctx(), WorkerOptions(2, prefetch_factor=4,
                                                              persistent_workers=False))
    assert (loader.num_workers, loader.prefetch_factor, loader.persistent_workers) == (2, 4,
                                                                                     False)
    assert not loader.pin_memory  # only on CUDA
    plain = make_loader(view, [[0, 1]], _ctx(), 0)
    assert plain.num_workers == 0 and [b["index"].tolist() for b in plain] == [[0, 1]]


class ParentProbe(Dataset[Any]):
    """Each sample is the process id of the fetching process's parent."""

    def __init__(self, n: int = 4, extra: Any = None) -> None:
        self.n, self.extra = n, extra

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> Any:
        return torch.tensor(os.getppid())


def _parents(start: str, dataset: Dataset[Any] | None = None) -> set[int]:
    loader = make_loader(dataset or ParentProbe(), [[0, 1], [2, 3]], _ctx(),
                         WorkerOptions(2, start=start))
    return {int(p) for batch in loader for p in batch}


def test_workers_start_from_a_forkserver_not_from_the_training_process() -> None:
    # A worker forked from a process whose other threads hold interpreter locks can hang for
    # ever (gloo's threads take one every step, python/cpython#112275): by default workers
    # are forked from a clean server instead.
    assert WorkerOptions().start == "forkserver"
    parents = _parents("forkserver")
    assert len(parents) == 1 and os.getpid() not in parents
    assert _parents("fork") == {os.getpid()}


@pytest.mark.parametrize("start", ["forkserver", "spawn"])
def test_a_dataset_that_does_not_pickle_is_one_error_naming_the_fixes(start: str) -> None:
    unpicklable = ParentProbe(extra=lambda: None)
    with pytest.raises(DataError) as info:
        _parents(start, unpicklable)
    assert f"data.num_workers=2 workers start with {start}, which pickles the dataset, " \
        "and it does not pickle" in info.value.problem
    assert "data.worker_start=fork" in info.value.fix and "data.num_workers=0" in info.value.fix
    assert _parents("fork", unpicklable) == {os.getpid()}  # fork does not pickle it


def test_closing_a_loader_stops_its_persistent_workers() -> None:
    loader = make_loader(ParentProbe(), [[0, 1], [2, 3]], _ctx(), WorkerOptions(1))
    assert len(list(loader)) == 2
    workers = loader._iterator._workers  # type: ignore[union-attr]
    assert all(w.is_alive() for w in workers)
    loader.close()
    assert not any(w.is_alive() for w in workers)


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def test_workers_exit_when_the_training_process_is_killed(tmp_path: Any) -> None:
    # forkserver workers watch the server, not the rank; without their own watch of the
    # rank they would outlive a rank killed with SIGKILL for ever.
    script = tmp_path / "rank.py"
    script.write_text(
        "import sys, time\n"
        f"sys.path[:0] = [{os.path.dirname(__file__)!r}, {os.getcwd()!r}]\n"
        "from test_loaders import ParentProbe, _ctx\n"
        "from trainer.data.loaders import WorkerOptions, make_loader\n"
        "if __name__ == '__main__':\n"
        "    loader = make_loader(ParentProbe(), [[0, 1], [2, 3]], _ctx(), WorkerOptions(2))\n"
        "    next(iter(loader))\n"
        "    print(*(w.pid for w in loader._iterator._workers), flush=True)\n"
        "    time.sleep(120)\n")
    rank = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        workers = [int(p) for p in rank.stdout.readline().split()]  # type: ignore[union-attr]
        assert len(workers) == 2 and all(_running(p) for p in workers)
    finally:
        rank.kill()
        rank.wait()
    deadline = time.monotonic() + 30
    while any(_running(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_running(p) for p in workers)
