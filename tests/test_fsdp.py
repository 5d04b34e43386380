"""train.strategy fsdp (FSDP2) end to end on real gloo ranks: the same training as DDP,
checkpoints that resume on another world size and score with evaluate, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import read_json, run_cli

COMMON = ["--dataset", "digits", "--batch-size", "12", "--epochs", "2", "--metrics-port", "0",
          # clipped on every step (the digits MLP's norm is about 1): a norm computed over one
          # rank's shard only would scale the updates differently and the losses would part
          "--set", "optim.grad_clip=0.05", "--set", "train.grad_accum_steps=2",
          "--set", "optim.name=adamw", "--set", "optim.lr=0.003"]


def step_losses(out: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (out / "steps.jsonl").read_text().splitlines()]


def test_fsdp_trains_as_ddp_does_with_accumulation_and_clipping(tmp_path: Path) -> None:
    runs = {}
    for strategy in ("ddp", "fsdp"):
        proc = run_cli("run", "--nproc-per-node", "2", "--strategy", strategy, *COMMON,
                       "--output-dir", str(tmp_path / strategy))
        assert proc.returncode == 0, proc.stderr
        runs[strategy] = read_json(tmp_path / strategy / "summary.json")
    ddp, fsdp = runs["ddp"], runs["fsdp"]
    assert fsdp["steps"] == ddp["steps"] and fsdp["global_batch"] == 48
    # Equal up to float rounding (sharded reduce-scatter vs all-reduce, foreach vs fused AdamW).
    assert step_losses(tmp_path / "fsdp") == pytest.approx(step_losses(tmp_path / "ddp"),
                                                           rel=1e-4)
    assert fsdp["train_loss"] == pytest.approx(ddp["train_loss"], rel=1e-5)
    assert fsdp["val_total"] == 359 and abs(fsdp["val_correct"] - ddp["val_correct"]) <= 1
    assert fsdp["val_accuracy"] > 0.5


def test_fsdp_checkpoint_resumes_on_three_ranks_and_scores_with_evaluate(
        tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    full = run_cli("run", "--nproc-per-node", "2", "--strategy", "fsdp", *COMMON,
                   "--output-dir", str(tmp_path / "full"))
    assert full.returncode == 0, full.stderr
    first = run_cli("run", "--nproc-per-node", "2", "--strategy", "fsdp", *COMMON,
                    "--max-steps", "17", "--checkpoint-every", "5", "--output-dir",
                    str(tmp_path / "a"), "--checkpoint-dir", str(ckpt))
    assert first.returncode == 0, first.stderr
    second = run_cli("run", "--nproc-per-node", "3", "--strategy", "fsdp", *COMMON,
                     "--output-dir", str(tmp_path / "b"), "--checkpoint-dir", str(ckpt))
    assert second.returncode == 0, second.stderr
    assert "resumed from ckpt-000000017.pt: step 17" in second.stderr
    # 48 = 8 per rank x 3 ranks x 2 accumulation steps: the global batch is kept exactly
    assert "world size changed 2 -> 3: keeping the global batch 48" in second.stderr
    resumed, uninterrupted = (read_json(tmp_path / d / "summary.json") for d in ("b", "full"))
    assert resumed["world_size"] == 3 and resumed["resumed_from_step"] == 17
    assert resumed["global_batch"] == uninterrupted["global_batch"] == 48
    assert resumed["steps"] == uninterrupted["steps"]
    assert resumed["train_loss"] == pytest.approx(uninterrupted["train_loss"], rel=1e-3)
    scored = run_cli("evaluate", "--checkpoint", str(ckpt), "--output-dir",
                     str(tmp_path / "eval"))
    assert scored.returncode == 0, scored.stderr
    assert read_json(tmp_path / "eval" / "eval.json")["correct"] == resumed["val_correct"]


@pytest.mark.parametrize(("setting", "named"), [
    ("train.compile=true", "train.compile is not supported with train.strategy 'fsdp'"),
    ("train.fsdp_wrap=[NoSuchBlock]", "train.fsdp_wrap: the model has no module of class "
                                      "'NoSuchBlock'"),
])
def test_fsdp_refuses_what_it_cannot_do_with_one_line(tmp_path: Path, setting: str,
                                                      named: str) -> None:
    proc = run_cli("run", "--nproc-per-node", "2", "--strategy", "fsdp", "--dataset",
                   "synthetic", "--epochs", "1", "--set", setting, "--output-dir",
                   str(tmp_path), "--metrics-port", "0")
    assert proc.returncode == 2, proc.stderr
    assert named in proc.stderr and "Traceback" not in proc.stderr
