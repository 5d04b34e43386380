"""Sharded (DCP) checkpoints of FSDP runs: complete only with every shard and the marker, a
torn one never resumed from, rotation, evaluate/export reading them whole, world-size changes
with resharding, asynchronous saves."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from conftest import REPO, free_port, read_json, run_cli
from test_fsdp import COMMON

from trainer.components import checkpoint, models, sharded_checkpoint, sharding, storage
from trainer.config import CheckpointConfig
from trainer.errors import CheckpointError
from trainer.export.loading import load_checkpoint
from trainer.loop.save_policy import Saver


@pytest.fixture
def one_rank() -> Iterator[None]:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def trained_fsdp_mlp() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = sharding.shard(models.mlp(10, (64,), (16,)), [], "fp32")
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(torch.randn(4, 64)).sum().backward()
    optimizer.step()
    return model, optimizer


def train_state(step: int) -> dict[str, object]:
    return {"config": {"model": {}}, "model": None, "optimizer": None, "shards": "dcp",
            "step": step, "epoch": 0}


def save_steps(tmp_path: Path, steps: list[int], *, keep: int = 3,
               async_save: bool = False) -> tuple[Saver, torch.nn.Module]:
    saver = Saver(CheckpointConfig(dir=str(tmp_path), keep=keep, async_save=async_save),
                  is_main=True)
    model, optimizer = trained_fsdp_mlp()
    assert saver.shards()  # one rank sees its own directory
    for step in steps:
        saver.save_sharded(step, model, optimizer, lambda step=step: train_state(step))
    saver.close()
    return saver, model


@pytest.mark.parametrize("async_save", [False, True])
def test_a_sharded_save_publishes_a_complete_folder_read_whole_by_evaluate_and_export(
        tmp_path: Path, one_rank: None, async_save: bool) -> None:
    _, model = save_steps(tmp_path, [5], async_save=async_save)
    path = tmp_path / "ckpt-000000005.dcp"
    assert checkpoint.list_checkpoints(tmp_path) == [path]
    assert {p.name for p in path.iterdir()} == {".metadata", "__0_0.distcp", "train.pt",
                                                 "COMPLETE"}
    assert checkpoint.problem_of(path) is None
    assert checkpoint.resolve(tmp_path) == path
    state = checkpoint.read(path)  # evaluate's read: the full model, no process group
    full = sharding.full_model_state(model)
    assert state["step"] == 5 and "shards" not in state
    assert state["model"].keys() == full.keys()
    assert all(torch.equal(state["model"][k], full[k]) for k in full)
    assert set(state["optimizer"]["state"]) == set(range(len(full)))  # by index, as DDP's
    loaded = load_checkpoint(tmp_path)  # export's read
    assert loaded.metadata["step"] == 5
    assert all(torch.equal(loaded.model_state[k], full[k]) for k in full)


def test_rotation_keeps_the_newest_sharded_checkpoints_and_deletes_older_folders(
        tmp_path: Path, one_rank: None) -> None:
    save_steps(tmp_path, [1, 2, 3, 4], keep=2)
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == [
        "ckpt-000000004.dcp", "ckpt-000000003.dcp"]


@pytest.mark.parametrize(("tear", "problem"), [
    (lambda p: (p / "__0_0.distcp").unlink(), "is torn (__0_0.distcp is missing)"),
    (lambda p: (p / "COMPLETE").unlink(), "is torn (no COMPLETE marker"),
    (lambda p: (p / ".metadata").write_bytes(b"x" * (p / ".metadata").stat().st_size),
     "is corrupt (.metadata fails its checksum)"),
    (lambda p: (p / "__0_0.distcp").write_bytes(b"short"), "__0_0.distcp has 5 of"),
], ids=["shard-removed", "marker-missing", "metadata-changed", "shard-truncated"])
def test_a_torn_sharded_checkpoint_is_moved_aside_and_the_previous_one_is_resumed(
        tmp_path: Path, one_rank: None, tear: object, problem: str,
        caplog: pytest.LogCaptureFixture) -> None:
    save_steps(tmp_path, [5, 10])
    newest = tmp_path / "ckpt-000000010.dcp"
    tear(newest)  # type: ignore[operator]
    checkpoint._verified.clear()  # a new process: nothing known valid
    with caplog.at_level(logging.WARNING):
        found = checkpoint.load_latest(tmp_path, set_aside=True)
    assert found is not None and found[1].name == "ckpt-000000005.dcp"
    assert found[0]["step"] == 5
    assert problem in caplog.text and "moved bad checkpoint ckpt-000000010.dcp aside" in \
        caplog.text
    assert (tmp_path / "corrupt" / "ckpt-000000010.dcp").is_dir()


@pytest.mark.parametrize("async_save", [False, True])
def test_a_save_aborted_after_its_shards_is_never_listed_and_is_discarded_with_a_warning(
        tmp_path: Path, one_rank: None, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch, async_save: bool) -> None:
    saver = Saver(CheckpointConfig(dir=str(tmp_path), async_save=async_save), is_main=True)
    model, optimizer = trained_fsdp_mlp()
    assert saver.shards()
    saver.save_sharded(5, model, optimizer, lambda: train_state(5))
    saver.wait()

    def crash(tmp: Path, final: Path, train_file: bytes) -> None:
        (tmp / sharded_checkpoint.TRAIN).write_bytes(train_file)  # dies before the marker
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sharded_checkpoint, "finish", crash)
    with pytest.raises(CheckpointError, match="could not write checkpoint .*ckpt-000000010.dcp "
                                              r"\(No space left on device\); earlier"):
        saver.save_sharded(10, model, optimizer, lambda: train_state(10))
        saver.wait()
    unfinished = sharded_checkpoint.tmp_path(tmp_path, 10)
    assert (unfinished / ".metadata").exists() and (unfinished / "__0_0.distcp").exists()
    assert checkpoint.list_checkpoints(tmp_path) == [tmp_path / "ckpt-000000005.dcp"]
    with caplog.at_level(logging.WARNING):
        found = checkpoint.latest_payload(tmp_path, set_aside=True)
    assert found is not None and found[1].name == "ckpt-000000005.dcp"
    assert "discarding unfinished sharded checkpoint .ckpt-000000010.dcp.tmp" in caplog.text
    assert not unfinished.exists()


def test_fsdp_resumes_sharded_checkpoints_on_4_then_2_ranks_as_an_uninterrupted_run(
        tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    full = run_cli("run", "--nproc-per-node", "2", "--strategy", "fsdp", *COMMON,
                   "--output-dir", str(tmp_path / "full"))
    assert full.returncode == 0, full.stderr
    # 4 ranks saving asynchronously (the same global batch 48: 6 per rank x 4 x 2
    # accumulation steps), then 2 ranks resharding their shards
    first = run_cli("run", "--nproc-per-node", "4", "--strategy", "fsdp", *COMMON,
                    "--batch-size", "6", "--max-steps", "10", "--checkpoint-every", "5",
                    "--set", "checkpoint.async_save=true",
                    "--output-dir", str(tmp_path / "a"), "--checkpoint-dir", str(ckpt))
    assert first.returncode == 0, first.stderr
    assert {p.name for p in (ckpt / "ckpt-000000010.dcp").glob("*.distcp")} == {
        f"__{r}_0.distcp" for r in range(4)}
    second = run_cli("run", "--nproc-per-node", "2", "--strategy", "fsdp", *COMMON,
                     "--checkpoint-every", "5", "--output-dir", str(tmp_path / "b"),
                     "--checkpoint-dir", str(ckpt))
    assert second.returncode == 0, second.stderr
    assert re.search(r"resumed from ckpt-000000010\.dcp: step 10, epoch 0, sample position "
                     r"480 \(saved by 4 ranks\)", second.stderr), second.stderr
    resumed, uninterrupted = (read_json(tmp_path / d / "summary.json") for d in ("b", "full"))
    assert resumed["global_batch"] == uninterrupted["global_batch"] == 48
    assert resumed["steps"] == uninterrupted["steps"]
    assert resumed["train_loss"] == pytest.approx(uninterrupted["train_loss"], rel=1e-3)
    assert abs(resumed["val_correct"] - uninterrupted["val_correct"]) <= 1
    # the CLI's readers take the newest checkpoint, a folder of 2 shards, whole
    assert checkpoint.list_checkpoints(ckpt)[0].name.endswith(".dcp")
    scored = run_cli("evaluate", "--checkpoint", str(ckpt), "--output-dir",
                     str(tmp_path / "eval"))
    assert scored.returncode == 0, scored.stderr
    assert read_json(tmp_path / "eval" / "eval.json")["correct"] == resumed["val_correct"]
    exported = run_cli("export", "--checkpoint", str(ckpt), "--out", str(tmp_path / "model"))
    assert exported.returncode == 0, exported.stderr
    assert read_json(tmp_path / "model" / "ddp-trainer.json")["step"] == resumed["steps"]


def test_ranks_with_directories_of_their_own_save_one_gathered_file_with_a_warning(
        tmp_path: Path) -> None:
    # two "pods", each with its own emptyDir: shards could not be read back by one rank
    env = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    args = ["train", "--strategy", "fsdp", *COMMON, "--max-steps", "5", "--checkpoint-every",
            "5", "--timeout", "120"]
    peer = subprocess.Popen(
        [sys.executable, "-m", "trainer", *args, "--output-dir", str(tmp_path / "o1"),
         "--checkpoint-dir", str(tmp_path / "c1")],
        env={**os.environ, **env, "RANK": "1", "PYTHONPATH": str(REPO)}, cwd=REPO,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        proc = run_cli(*args, "--output-dir", str(tmp_path / "o0"), "--checkpoint-dir",
                       str(tmp_path / "c0"), env={**env, "RANK": "0"}, timeout=240)
    finally:
        _, peer_err = peer.communicate(timeout=120)
    assert proc.returncode == 0 and peer.returncode == 0, proc.stderr + peer_err
    assert "is not shared by all ranks: FSDP checkpoints are gathered into one file on " \
           "rank 0" in proc.stderr
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path / "c0")] == [
        "ckpt-000000005.pt"]
    assert checkpoint.list_checkpoints(tmp_path / "c1") == []


def test_an_s3_checkpoint_dir_keeps_the_gathered_single_file_with_a_warning(
        one_rank: None, caplog: pytest.LogCaptureFixture) -> None:
    # each process stages an s3:// dir in a folder of its own: no rank sees another's shards
    saver = Saver(CheckpointConfig(dir="s3://bucket/run"), is_main=True)
    try:
        with caplog.at_level(logging.WARNING):
            assert not saver.shards()
        assert "checkpoint.dir s3://bucket/run is not shared by all ranks: FSDP checkpoints " \
               "are gathered into one file on rank 0" in caplog.text
    finally:
        saver.close()
        storage.drop_staging("s3://bucket/run")
