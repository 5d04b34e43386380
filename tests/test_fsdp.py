"""train.strategy fsdp (FSDP2) end to end on real gloo ranks: the same training as DDP,
checkpoints that resume on another world size and score with evaluate, refusals."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from conftest import REPO, read_json, run_cli
from torch import nn

from trainer.components import checkpoint, models, sharding
from trainer.components.sharding import block_classes
from trainer.errors import ConfigError

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
        if strategy == "fsdp":
            held = re.search(r"parameters held per rank: (\d+) \+ (\d+) of (\d+)",
                             proc.stderr)
            assert held, proc.stderr
    ddp, fsdp = runs["ddp"], runs["fsdp"]
    # Each rank holds its half of every unit (dim-0 slices: one row apart at most per unit).
    first, second, total = (int(n) for n in held.groups())
    assert first + second == total and abs(first - second) <= 0.02 * total
    assert fsdp["steps"] == ddp["steps"] and fsdp["global_batch"] == 48
    # Equal up to float rounding (sharded reduce-scatter vs all-reduce, foreach vs fused AdamW).
    assert step_losses(tmp_path / "fsdp") == pytest.approx(step_losses(tmp_path / "ddp"),
                                                           rel=1e-4)
    assert fsdp["train_loss"] == pytest.approx(ddp["train_loss"], rel=1e-5)
    assert fsdp["val_total"] == 359 and abs(fsdp["val_correct"] - ddp["val_correct"]) <= 1
    assert fsdp["val_accuracy"] > 0.5


def test_compiled_fsdp_trains_as_eager_fsdp_with_accumulation_and_clipping(
        tmp_path: Path) -> None:
    for compiled in ("false", "true"):
        proc = run_cli("run", "--nproc-per-node", "2", "--strategy", "fsdp", *COMMON,
                       "--set", f"train.compile={compiled}",
                       "--output-dir", str(tmp_path / compiled))
        assert proc.returncode == 0, proc.stderr
    assert step_losses(tmp_path / "true") == pytest.approx(step_losses(tmp_path / "false"),
                                                           rel=1e-5)
    eager, compiled_run = (read_json(tmp_path / c / "summary.json") for c in ("false", "true"))
    assert compiled_run["steps"] == eager["steps"]
    assert compiled_run["val_correct"] == eager["val_correct"]


def test_checkpoints_resume_across_strategies_and_world_sizes_and_score_with_evaluate(
        tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    full = run_cli("run", "--nproc-per-node", "2", "--strategy", "fsdp", *COMMON,
                   "--output-dir", str(tmp_path / "full"))
    assert full.returncode == 0, full.stderr
    # ddp on 2 ranks -> fsdp on 3 -> fsdp on 2 -> ddp on 2: either format resumes either strategy
    legs = [("ddp", "2", "12"), ("fsdp", "3", "24"), ("fsdp", "2", "36"), ("ddp", "2", "0")]
    resumed_from = None
    for leg, (strategy, nproc, max_steps) in enumerate(legs):
        proc = run_cli("run", "--nproc-per-node", nproc, "--strategy", strategy, *COMMON,
                       "--max-steps", max_steps, "--checkpoint-every", "5",
                       "--output-dir", str(tmp_path / str(leg)), "--checkpoint-dir", str(ckpt))
        assert proc.returncode == 0, proc.stderr
        if resumed_from is not None:
            # ddp writes one file; fsdp on a directory all ranks see, a folder of shards
            kind = "pt" if legs[leg - 1][0] == "ddp" else "dcp"
            assert f"resumed from ckpt-{resumed_from:09d}.{kind}: step {resumed_from}" \
                in proc.stderr
        resumed_from = int(max_steps)
    # 48 = 8 per rank x 3 ranks x 2 accumulation steps: the global batch is kept exactly
    leg1 = read_json(tmp_path / "1" / "summary.json")
    assert leg1["world_size"] == 3 and leg1["global_batch"] == 48
    resumed, uninterrupted = (read_json(tmp_path / d / "summary.json") for d in ("3", "full"))
    assert resumed["resumed_from_step"] == 36
    assert resumed["global_batch"] == uninterrupted["global_batch"] == 48
    assert resumed["steps"] == uninterrupted["steps"]
    assert resumed["train_loss"] == pytest.approx(uninterrupted["train_loss"], rel=1e-3)
    assert abs(resumed["val_correct"] - uninterrupted["val_correct"]) <= 1
    scored = run_cli("evaluate", "--checkpoint", str(ckpt), "--output-dir",
                     str(tmp_path / "eval"))
    assert scored.returncode == 0, scored.stderr
    assert read_json(tmp_path / "eval" / "eval.json")["correct"] == resumed["val_correct"]


@pytest.mark.parametrize(("strategy", "setting", "named"), [
    ("fsdp", "train.fsdp_wrap=[NoSuchBlock]", "train.fsdp_wrap: the model has no module of "
                                              "class 'NoSuchBlock'"),
    ("fsdp", "train.precision=fp16", "train.precision 'fp16' is not supported with "
                                     "train.strategy 'fsdp'"),
    ("ddp", "train.fsdp_wrap=[Linear]", "train.fsdp_wrap is set but train.strategy is 'ddp'"),
])
def test_fsdp_refuses_what_it_cannot_do_with_one_line(tmp_path: Path, strategy: str,
                                                      setting: str, named: str) -> None:
    proc = run_cli("run", "--nproc-per-node", "2", "--strategy", strategy, "--dataset",
                   "synthetic", "--epochs", "1", "--set", setting, "--output-dir",
                   str(tmp_path), "--metrics-port", "0")
    assert proc.returncode == 2, proc.stderr
    assert named in proc.stderr and "Traceback" not in proc.stderr


def test_units_default_to_transformers_decoder_and_encoder_layers() -> None:
    from transformers import BertConfig, BertModel, GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=32,
                                      n_positions=8, bos_token_id=0, eos_token_id=0))
    bert = BertModel(BertConfig(num_hidden_layers=2, hidden_size=16, num_attention_heads=2,
                                intermediate_size=32, vocab_size=32))
    assert [c.__name__ for c in block_classes(gpt2, [])] == ["GPT2Block"]
    # BERT lists its embeddings too: their own unit
    assert [c.__name__ for c in block_classes(bert, [])] == ["BertEmbeddings", "BertLayer"]


def test_units_default_to_layers_for_built_in_models_and_follow_fsdp_wrap() -> None:
    mlp = models.mlp(10, (64,))
    assert block_classes(mlp, []) == (nn.Linear, nn.Conv2d)
    assert block_classes(mlp, ["Sequential"]) == (nn.Sequential,)
    assert block_classes(mlp, ["trainer.components.models:MLP"]) == (models.MLP,)
    with pytest.raises(ConfigError, match="'Block'.*its classes: Linear, MLP, ReLU"):
        block_classes(mlp, ["Block"])
    with pytest.raises(ConfigError, match="'trainer.components.models:mlp' is not an nn.Module"):
        block_classes(mlp, ["trainer.components.models:mlp"])


@pytest.mark.parametrize(("precision", "dtype"), [("bf16", torch.bfloat16),
                                                  ("fp32", torch.float32)])
def test_units_run_on_parameters_of_the_precision_and_reduce_in_fp32(
        precision: str, dtype: torch.dtype) -> None:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = sharding.shard(models.mlp(10, (64,)), [], precision)
        # no autocast here: the units' gathered parameters (and inputs) alone set the dtype
        out = model(torch.randn(4, 64))
        assert out.dtype == dtype
        out.float().sum().backward()
        # parameters and their gradients stay fp32 shards: the optimizer updates fp32
        assert {p.dtype for p in model.parameters()} == {torch.float32}
        assert {p.grad.dtype for p in model.parameters() if p.grad is not None} == {
            torch.float32}
    finally:
        dist.destroy_process_group()


def test_sigterm_saves_the_sharded_state_where_it_stops_and_the_restart_resumes_there(
        tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    # ~270 steps: a signal sent at the first checkpoint (step 5) lands mid-run
    args = ["run", "--nproc-per-node", "2", "--strategy", "fsdp", "--dataset", "digits",
            "--batch-size", "8", "--epochs", "6", "--checkpoint-every", "5", "--metrics-port",
            "0", "--set", "train.grad_accum_steps=2", "--output-dir", str(tmp_path),
            "--checkpoint-dir", str(ckpt)]
    env = {k: v for k, v in os.environ.items()
           if k not in {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.Popen([sys.executable, "-m", "trainer", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not checkpoint.list_checkpoints(ckpt):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    stopped_at = int(err.split("stopped by SIGTERM at step ")[1].split(";")[0])
    assert checkpoint.list_checkpoints(ckpt)[0].name == f"ckpt-{stopped_at:09d}.dcp"
    again = run_cli(*args, "--max-steps", str(stopped_at + 5))
    assert again.returncode == 0, again.stderr
    summary = read_json(tmp_path / "summary.json")
    assert summary["resumed_from_step"] == stopped_at and summary["steps"] == stopped_at + 5


def test_validation_leaves_training_resharding_as_it_was() -> None:
    from torch.distributed.tensor import DTensor

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = sharding.shard(nn.Sequential(nn.Linear(8, 4), nn.ReLU(),
                                             nn.Sequential(nn.Linear(4, 2))), ["Sequential"],
                               "fp32")

        def after_a_training_forward() -> tuple[bool, bool]:
            out = model(torch.randn(3, 8))
            # unsharded parameters are plain tensors: the root's kept for the backward pass,
            # the unit's freed until then
            kept = (not isinstance(model[0].weight, DTensor),
                    not isinstance(model[2][0].weight, DTensor))
            out.sum().backward()
            return kept

        assert after_a_training_forward() == (True, False)
        with sharding.full_params(model):
            model(torch.randn(3, 8))
        assert after_a_training_forward() == (True, False)
    finally:
        dist.destroy_process_group()


def test_a_transformers_model_is_sharded_by_its_layers_and_trains_as_ddp_does(
        tmp_path: Path) -> None:
    example = REPO / "examples" / "mytask"
    env = {"PYTHONPATH": f"{REPO}:{example}"}
    for strategy in ("ddp", "fsdp"):
        proc = run_cli("run", "--nproc-per-node", "2", "--config", str(example / "text.yaml"),
                       "--strategy", strategy, "--max-steps", "15", "--metrics-port", "0",
                       "--set", "train.grad_accum_steps=2", "--set", "optim.grad_clip=0.5",
                       "--output-dir", str(tmp_path / strategy), env=env)
        assert proc.returncode == 0, proc.stderr
    # the default units: BERT's _no_split_modules, half of the 28,386 parameters per rank
    assert ("fsdp: 4 units (BertEmbeddings, BertLayer and the root); parameters held per "
            "rank: 14193 + 14193 of 28386") in proc.stderr
    assert step_losses(tmp_path / "fsdp") == pytest.approx(step_losses(tmp_path / "ddp"),
                                                           rel=1e-5)
