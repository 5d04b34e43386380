"""End to end on real gloo ranks: accuracy, exact evaluation, resume, sharding."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import free_port, read_json, run_cli

from trainer.components import checkpoint
from trainer.data import InMemoryDataset
from trainer.data.loaders import build_train_sampler, train_loader
from trainer.placement import DistContext


def test_make_run_recipe_reaches_ninety_percent_on_digits(tmp_path: Path) -> None:
    proc = run_cli("run", "--nproc-per-node", "2", "--dataset", "digits", "--output-dir",
                   str(tmp_path), "--metrics-port", "0")
    assert proc.returncode == 0, proc.stderr
    s = read_json(tmp_path / "summary.json")
    assert s["world_size"] == 2 and s["epochs"] == 10 and s["val_total"] == 359
    assert s["val_accuracy"] >= 0.90
    assert s["samples_per_second"] > 0 and s["wall_seconds"] > 0 and s["train_loss"] < 0.5


def test_validation_accuracy_is_bit_identical_on_1_2_3_ranks(tmp_path: Path) -> None:
    # 1013 samples, 10% validation: 101 samples, a prime, so 2 and 3 ranks get uneven shards.
    ckpt = tmp_path / "ckpt"
    proc = run_cli("train", "--dataset", "synthetic", "--set", "data.synthetic_samples=1013",
                   "--val-fraction", "0.1", "--epochs", "1", "--checkpoint-dir", str(ckpt),
                   "--output-dir", str(tmp_path / "train"), "--metrics-port", "0")
    assert proc.returncode == 0, proc.stderr
    latest = checkpoint.list_checkpoints(ckpt)[0]
    results = []
    for n in (1, 2, 3):
        out = tmp_path / f"eval{n}"
        proc = run_cli("evaluate", "--checkpoint", str(latest), "--nproc-per-node", str(n),
                       "--output-dir", str(out))
        assert proc.returncode == 0, proc.stderr
        results.append(read_json(out / "eval.json"))
    assert {r["total"] for r in results} == {101}
    assert len({(r["accuracy"], r["correct"]) for r in results}) == 1, results
    assert results[2]["world_size"] == 3
    assert 0.5 < results[0]["accuracy"] < 1.0  # a real score, not a degenerate one
    train_summary = read_json(tmp_path / "train" / "summary.json")
    assert train_summary["val_correct"] == results[0]["correct"]


def test_resume_continues_at_the_saved_step_and_matches_an_uninterrupted_run(
        tmp_path: Path) -> None:
    common = ["--dataset", "digits", "--batch-size", "16", "--epochs", "2", "--metrics-port",
              "0", "--checkpoint-every", "5"]
    full = run_cli("run", "--nproc-per-node", "2", *common, "--output-dir",
                   str(tmp_path / "full"), "--checkpoint-dir", str(tmp_path / "c-full"))
    assert full.returncode == 0, full.stderr
    ckpt = tmp_path / "c-split"
    first = run_cli("run", "--nproc-per-node", "2", *common, "--max-steps", "17",
                    "--output-dir", str(tmp_path / "a"), "--checkpoint-dir", str(ckpt))
    assert first.returncode == 0, first.stderr
    assert read_json(tmp_path / "a" / "summary.json")["steps"] == 17
    second = run_cli("run", "--nproc-per-node", "2", *common, "--output-dir",
                     str(tmp_path / "b"), "--checkpoint-dir", str(ckpt))
    assert second.returncode == 0, second.stderr
    assert "resumed from ckpt-000000017.pt: step 17" in second.stderr
    resumed, uninterrupted = (read_json(tmp_path / d / "summary.json") for d in ("b", "full"))
    assert resumed["resumed_from_step"] == 17
    assert resumed["steps"] == uninterrupted["steps"]
    assert resumed["val_accuracy"] == uninterrupted["val_accuracy"]
    assert resumed["train_loss"] == pytest.approx(uninterrupted["train_loss"], rel=1e-12)


def test_dataparallel_strategy_trains_in_one_process_with_a_warning(tmp_path: Path) -> None:
    proc = run_cli("train", "--strategy", "dp", "--dataset", "synthetic", "--epochs", "1",
                   "--output-dir", str(tmp_path), "--metrics-port", "0")
    assert proc.returncode == 0, proc.stderr
    assert "DistributedDataParallel (--strategy ddp) is recommended" in proc.stderr
    assert read_json(tmp_path / "summary.json")["world_size"] == 1


def _ctx(rank: int, world: int) -> DistContext:
    return DistContext(rank, world, 0, 1, torch.device("cpu"), "gloo", False)


@pytest.mark.parametrize("kind", ["shuffle", "torch"])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_train_shards_are_disjoint_and_cover_the_split(kind: str, world: int) -> None:
    n = 101
    ds = InMemoryDataset(torch.arange(n, dtype=torch.float32)[:, None], torch.arange(n))
    seen: list[int] = []
    for rank in range(world):
        sampler = build_train_sampler(kind, ds, _ctx(rank, world), seed=0)
        sampler.set_epoch(0)
        shard = [int(i) for batch in train_loader(ds, sampler, 8, _ctx(rank, world), 0)
                 for i in batch[1].tolist()]
        assert len(shard) == -(-n // world)  # padded to equal length like torch
        seen += shard
    assert set(seen) == set(range(n))
    assert len(seen) - n == (-n) % world  # only the padding repeats


@pytest.mark.parametrize("kind", ["shuffle", "torch"])
def test_set_epoch_changes_the_order(kind: str) -> None:
    ds = InMemoryDataset(torch.zeros(200, 1), torch.arange(200))
    sampler = build_train_sampler(kind, ds, _ctx(0, 2), seed=0)
    orders = []
    for epoch in (0, 1, 0):
        sampler.set_epoch(epoch)
        orders.append(list(sampler))
    assert orders[0] != orders[1] and orders[0] == orders[2]


def _gather_shard(rank: int, world: int, port: int, out: dict) -> None:  # type: ignore[type-arg]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    ds = InMemoryDataset(torch.zeros(97, 1), torch.arange(97))
    sampler = build_train_sampler("shuffle", ds, _ctx(rank, world), seed=3)
    sampler.set_epoch(1)
    mine = [i for batch in train_loader(ds, sampler, 5, _ctx(rank, world), 0)
            for i in batch[1].tolist()]
    shards: list[list[int]] = [[] for _ in range(world)]
    dist.all_gather_object(shards, mine)
    if rank == 0:
        out["shards"] = shards
    dist.destroy_process_group()


def test_real_gloo_ranks_train_on_disjoint_covering_shards() -> None:
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_gather_shard, args=(3, free_port(), out), nprocs=3, join=True)
        shards = out["shards"]
    flat = [i for s in shards for i in s]
    assert sorted(set(flat)) == list(range(97)) and len(flat) == 99  # 97 -> 3 x 33, 2 padded
