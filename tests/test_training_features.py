"""Optimizers, schedules, clipping, accumulation, precision and compile: what they compute and
how bad values fail."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import run_cli
from torch import nn

import trainer
from trainer.components import optim
from trainer.components.optim import Schedule, build_optimizer
from trainer.config import OptimConfig
from trainer.data import InMemoryDataset


@pytest.mark.parametrize(("schedule", "step", "expected"), [
    ("constant", 0, 0.1 * 1 / 10), ("constant", 9, 0.1), ("constant", 500, 0.1),
    ("cosine", 10, 0.1), ("cosine", 99, 0.01),
    ("cosine", 10 + 89 // 2, 0.01 + 0.09 * 0.5 * (1 + math.cos(math.pi * 44 / 89))),
    ("linear", 10, 0.1), ("linear", 99, 0.01), ("linear", 10 + 89 // 2, 0.1 - 0.09 * 44 / 89),
    ("step", 10, 0.1), ("step", 39, 0.1), ("step", 40, 0.05), ("step", 70, 0.025),
])
def test_schedule_follows_its_closed_form(schedule: str, step: int, expected: float) -> None:
    cfg = OptimConfig(lr=0.1, schedule=schedule, warmup_steps=10, min_lr=0.01, step_size=30,
                      gamma=0.5)
    assert Schedule(cfg, total_steps=100).lr_at(step) == pytest.approx(expected, rel=1e-12)


def test_adamw_does_not_decay_biases_and_norm_weights() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    opt = build_optimizer(OptimConfig(name="adamw", weight_decay=0.1), model)
    decayed, kept = opt.param_groups
    assert decayed["weight_decay"] == 0.1 and [p.shape for p in decayed["params"]] == [(4, 4)]
    assert kept["weight_decay"] == 0.0 and len(kept["params"]) == 3


@pytest.mark.parametrize("name", ["sgd", "adam", "adamw"])
def test_optimizers_use_fused_kernels_on_cpu_and_match_the_per_parameter_loop(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    twin = copy.deepcopy(model)
    cfg = OptimConfig(name=name, lr=0.01, momentum=0.9, weight_decay=0.01)
    fused = build_optimizer(cfg, model)
    monkeypatch.setattr(optim, "fused_supported", lambda _model: False)
    plain = build_optimizer(cfg, twin)
    assert all(g["fused"] for g in fused.param_groups)
    assert not any(g["fused"] for g in plain.param_groups)
    x, y = torch.randn(16, 6), torch.arange(16) % 3
    for m, opt in ((model, fused), (twin, plain)):
        for _ in range(20):
            opt.zero_grad()
            nn.functional.cross_entropy(m(x), y).backward()
            opt.step()
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_parameters_fused_kernels_cannot_take_get_torchs_default_kernels() -> None:
    on_meta = nn.Linear(2, 2).to("meta")  # a device without fused kernels
    on_two_devices = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2).to("meta"))
    for model in (on_meta, on_two_devices):
        assert not optim.fused_supported(model)
        assert not any(g["fused"] for g in build_optimizer(OptimConfig(), model).param_groups)
    assert not optim.fused_supported(nn.Linear(2, 2).requires_grad_(False))


def _data(n: int = 64) -> InMemoryDataset:
    g = torch.Generator().manual_seed(0)
    return InMemoryDataset(torch.randn(n, 6, generator=g) * 5, torch.arange(n) % 3)


def _one_step(tmp_path: Path, name: str, model: nn.Module, **train: Any) -> nn.Module:
    optim = train.pop("optim", {})
    cfg = {"train": {"max_steps": 1, "epochs": 1, "log_every": 1, **train},
           "optim": {"lr": 1.0, "momentum": 0.0, **optim},
           "data": {"val_fraction": 0.0}, "metrics": {"port": 0},
           "output": {"dir": str(tmp_path / name)}}
    trainer.fit(cfg, model=model, dataset=_data())
    return model


def test_accumulating_k_micro_batches_equals_one_batch_k_times_larger(tmp_path: Path) -> None:
    torch.manual_seed(0)
    start = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    whole = _one_step(tmp_path, "whole", copy.deepcopy(start), batch_size=32)
    split = _one_step(tmp_path, "split", copy.deepcopy(start), batch_size=8,
                      grad_accum_steps=4)
    for a, b, s in zip(whole.parameters(), split.parameters(), start.parameters(), strict=True):
        assert not torch.equal(a, s)  # a real update happened
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_clipping_bounds_the_update_norm(tmp_path: Path) -> None:
    torch.manual_seed(0)
    start = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    free = _one_step(tmp_path, "free", copy.deepcopy(start), batch_size=32)
    clipped = _one_step(tmp_path, "clipped", copy.deepcopy(start), batch_size=32,
                        optim={"grad_clip": 0.01})

    def update_norm(m: nn.Module) -> float:
        return float(torch.sqrt(sum(((p.detach() - s.detach()) ** 2).sum() for p, s in
                                    zip(m.parameters(), start.parameters(), strict=True))))

    assert update_norm(free) > 0.1  # lr 1: without clipping the step is the gradient
    assert update_norm(clipped) == pytest.approx(0.01, rel=1e-4)


def test_bf16_autocast_trains_on_cpu(tmp_path: Path) -> None:
    proc = run_cli("train", "--dataset", "digits", "--epochs", "3", "--metrics-port", "0",
                   "--set", "train.precision=bf16", "--output-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(("args", "env", "needle"), [
    (["--set", "optim.name=lamb"], {}, "optim.name: unknown optimizer 'lamb'"),
    (["--set", "optim.warmup_steps=-5"], {}, "optim.warmup_steps: -5 < 0"),
    (["--set", "optim.schedule=onecycle"], {}, "optim.schedule: unknown schedule"),
    (["--set", "train.precision=fp16"], {}, "'fp16' needs a CUDA device"),
    (["--set", "train.grad_accum_steps=0"], {}, "train.grad_accum_steps: 0 < 1"),
    # No working C++ compiler: inductor cannot compile, and there is no silent eager fallback.
    (["--set", "train.compile=true"], {"CXX": "/bin/false", "CC": "/bin/false"},
     "train.compile: torch.compile failed"),
])
def test_bad_training_settings_are_one_line_exit_2(tmp_path: Path, args: list[str],
                                                  env: dict[str, str], needle: str) -> None:
    proc = run_cli("train", "--dataset", "digits", "--epochs", "1", "--metrics-port", "0",
                   "--output-dir", str(tmp_path), *args, env=env)
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert len(errors) == 1 and needle in errors[0] and "(fix:" in errors[0], proc.stderr
    assert not (tmp_path / "summary.json").exists()


def test_compiled_ddp_all_reduces_once_per_accumulated_step(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.compile wraps DDP in an OptimizedModule: the micro-batches before the last of an
    accumulation must still run under DDP's no_sync (one gradient all-reduce a step)."""
    import functools

    import torch.distributed as dist
    from conftest import free_port
    from torch.nn.parallel import DistributedDataParallel

    from trainer import build

    reduces: list[int] = []

    def counting(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        reduces.append(bucket.index())
        fut: torch.futures.Future[torch.Tensor] = dist.all_reduce(
            bucket.buffer(), async_op=True).get_future()  # type: ignore[union-attr]
        return fut.then(lambda f: f.value()[0])

    # DDP checks the hook's annotations as objects; this module's are strings (PEP 563).
    counting.__annotations__.update(bucket=dist.GradBucket,
                                    **{"return": torch.futures.Future[torch.Tensor]})

    wrap = build.wrap_model

    def wrap_counting(model: nn.Module, strategy: str, ctx: Any) -> nn.Module:
        wrapped = wrap(model, strategy, ctx)
        assert isinstance(wrapped, DistributedDataParallel)
        wrapped.register_comm_hook(None, counting)
        return wrapped

    monkeypatch.setattr(build, "wrap_model", wrap_counting)
    # The eager backend: an OptimizedModule like inductor's, without compiling C++ for a minute.
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    # A one-rank process group: DDP, its reducer and no_sync, in this process.
    for name, value in {"WORLD_SIZE": "1", "RANK": "0", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(name, value)
    try:
        trainer.fit({"train": {"max_steps": 3, "epochs": 1, "batch_size": 4,
                               "grad_accum_steps": 4, "compile": True},
                     "data": {"val_fraction": 0.0}, "metrics": {"port": 0},
                     "output": {"dir": str(tmp_path)}},
                    model=nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)),
                    dataset=_data())
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    assert reduces == [0, 0, 0]  # one bucket, one all-reduce per optimizer step
