"""The composition root: every part of a run is built here, from the config, and nowhere else.

Two phases, because a rank should fail on bad input before it joins the process group:

1. :func:`build_workload` (before ``init_process_group``): the data splits, the model (on the
   CPU, seeded) and the step — built-ins or the user's import paths, or objects handed to
   :func:`trainer.fit` — then :func:`preflight` runs the step on one batch of each split.
2. :func:`build_parts` (after): device placement, the DDP wrapper, the optimizer, the
   sampler and the loaders; then :func:`build_trainer` adds what the loop talks to (the
   reporter, the agreement, the saver, the batch plan) and hands it all to
   :class:`trainer.loop.trainer.Trainer`, which builds nothing.

``ddp-trainer evaluate`` builds its model through :func:`build_workload` too, so a checkpoint
is always scored by the same code that trained it.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from trainer import data, plugins
from trainer.components import models, sharding, steps, storage
from trainer.components.optim import Schedule, build_optimizer
from trainer.components.precision import Precision
from trainer.components.steps import StepFn
from trainer.components.tree import to_device
from trainer.config import JobConfig
from trainer.data import DataSplits
from trainer.data.loaders import (
    build_train_sampler,
    eval_loader,
    train_loader,
    worker_options,
)
from trainer.distributed.agreement import Agreement, Collective
from trainer.distributed.bootstrap import is_distributed
from trainer.distributed.phases import Beacon
from trainer.distributed.preemption import StopFlag
from trainer.errors import ConfigError
from trainer.loop.global_batch import BatchPlan
from trainer.loop.interval_stats import Interval
from trainer.loop.parts import LoopParts, TrainParts
from trainer.loop.policies import Policies
from trainer.loop.reporting import MetricsLogger, Reporter
from trainer.loop.save_policy import Saver
from trainer.loop.state import Progress
from trainer.loop.trainer import Trainer
from trainer.placement import DistContext

log = logging.getLogger(__name__)


@dataclass
class Workload:
    """What the user brings, resolved and checked before the rank joins the group."""

    splits: DataSplits
    model: nn.Module
    step: StepFn
    model_name: str
    """Short model name for logs and the ``trainer_info`` metric."""
    objects: dict[str, str] = field(default_factory=dict)
    """Parts passed to fit() as objects ({"model": "pkg.mod:Class", ...}): a checkpoint
    records them because ``ddp-trainer evaluate`` cannot rebuild them from the config."""


def check_config(cfg: JobConfig) -> None:
    """The launcher's cheap check before it starts any rank: import paths resolve and files
    exist; nothing is loaded or built."""
    data.resolve(cfg.data, cfg.train.seed)
    models.resolve(cfg.model)
    steps.build_step(cfg.train.step)


def build_workload(cfg: JobConfig, *, model: nn.Module | None = None, dataset: Any = None,
                   step: StepFn | None = None) -> Workload:
    """Data, model and step from `cfg`, or the objects given instead (see :func:`trainer.fit`)."""
    objects: dict[str, str] = {}
    splits = data.build_splits(cfg.data, cfg.train.seed, dataset)
    if dataset is not None:
        objects["dataset"] = plugins.describe(type(dataset))
    if model is None:
        model = models.build_model(cfg.model, splits.num_classes, splits.sample_shape,
                                   cfg.train.seed)
        model_name = cfg.model.name.rpartition(":")[2]
    else:
        if not isinstance(model, nn.Module):
            raise ConfigError(f"the model passed to fit() is a {type(model).__name__}, not a "
                              "torch.nn.Module", "pass an nn.Module instance")
        objects["model"] = plugins.describe(type(model))
        model_name = type(model).__name__
    if step is None:
        step = steps.build_step(cfg.train.step)
    else:
        if not callable(step):
            raise ConfigError(f"the step passed to fit() is a {type(step).__name__}, not a "
                              "callable", "pass a function (model, batch) -> StepOutput")
        objects["step"] = plugins.describe(step)
    return Workload(splits, model, step, model_name, objects)


def preflight(workload: Workload, device: torch.device, batch_size: int) -> None:
    """One batch of each split through the step, on `device`, before any optimizer step:
    non-tensor fields, a wrong batch convention, a class-count mismatch or a non-scalar loss
    fail here with one line instead of mid-run (or, worse, only on some ranks)."""
    workload.model.to(device)
    for split in (workload.splits.train, workload.splits.val):
        if len(split) == 0:
            continue
        batch = to_device(split.batch(list(range(min(batch_size, len(split))))), device)
        steps.preflight(workload.step, workload.model, batch, workload.splits.num_classes)


def check_strategy(strategy: str, ctx: DistContext) -> None:
    """DataParallel runs in one process: refuse it in a distributed job (checked before the
    rendezvous, see :mod:`trainer.ranks.runner`)."""
    if strategy == "dp" and is_distributed(ctx):
        raise ConfigError("train.strategy 'dp' (DataParallel) runs in one process, but "
                          f"WORLD_SIZE is {ctx.world_size}",
                          "use --strategy ddp with several ranks")


def wrap_model(model: nn.Module, strategy: str, ctx: DistContext) -> nn.Module:
    """DDP or DataParallel around `model` (fsdp: see :func:`sharding.shard`); `model` alone
    in one process."""
    check_strategy(strategy, ctx)
    if strategy == "dp":
        warnings.warn("DataParallel is single-process and re-scatters the model every step; "
                      "DistributedDataParallel (--strategy ddp) is recommended", stacklevel=2)
        return nn.DataParallel(model)
    if not ctx.initialized:
        return model
    device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)


def build_parts(cfg: JobConfig, ctx: DistContext, workload: Workload) -> TrainParts:
    t = cfg.train
    workers = worker_options(cfg)
    model = workload.model.to(ctx.device)
    # DDP's constructor checks the parameters' shapes across ranks and broadcasts rank 0's
    # weights: the first collectives after the join, where a peer killed meanwhile shows.
    with Collective("sharding the model (FSDP)" if t.strategy == "fsdp" else
                    "building DistributedDataParallel", cfg.dist.timeout_seconds):
        wrapped = (sharding.shard(model, t.fsdp_wrap, t.precision)
                   if t.strategy == "fsdp" and ctx.initialized else
                   wrap_model(model, t.strategy, ctx))
    if t.compile:
        # DDP first, then compile: dynamo's DDPOptimizer splits the graph at DDP's buckets so
        # communication still overlaps the backward pass. FSDP2's units are sharded first too:
        # dynamo traces their all-gather and reduce-scatter hooks (the same losses as eager to
        # 1e-6 here, tests/test_fsdp.py).
        wrapped = torch.compile(wrapped)  # type: ignore[assignment]
    splits = workload.splits
    sampler = build_train_sampler(t.sampler, splits.train, ctx, t.seed)
    val, val_valid = eval_loader(splits.val, t.batch_size, ctx, workers)

    def make_train_loader(micro_batch: int) -> DataLoader[Any]:
        return train_loader(splits.train, sampler, micro_batch, ctx, workers)

    return TrainParts(
        model=model,
        wrapped=wrapped,
        optimizer=build_optimizer(cfg.optim, model),
        schedule=Schedule(cfg.optim, total_steps=0),
        step=workload.step,
        train_set=splits.train,
        sampler=sampler,
        train_loader=make_train_loader,
        val_loader=val,
        val_valid=val_valid,
        num_classes=splits.num_classes,
        class_names=splits.class_names,
    )


def build_loop(cfg: JobConfig, ctx: DistContext, parts: TrainParts, metrics: MetricsLogger,
               stop: StopFlag) -> LoopParts:
    t = cfg.train
    saver = Saver(cfg.checkpoint, ctx.is_main, epochs=t.epochs, max_steps=t.max_steps,
                  report=metrics.log)
    agreement = Agreement(ctx, stop, t.log_every, t.stop_check_seconds,
                          cfg.dist.timeout_seconds, min_seconds=t.log_seconds)
    step_log = storage.local_dir(cfg.output.dir) / "steps.jsonl" if cfg.output.step_log else None
    reporter = Reporter(metrics, ctx.device, ctx.is_main, step_log, cfg.optim.grad_clip)
    progress = Progress()
    grad_comm: contextlib.AbstractContextManager[None] = (
        Collective("the gradient all-reduce", cfg.dist.timeout_seconds)
        if ctx.initialized else contextlib.nullcontext())
    return LoopParts(
        plan=BatchPlan(t.batch_size, t.grad_accum_steps, ctx.world_size),
        precision=Precision(t.precision, ctx.device),
        progress=progress, saver=saver, agreement=agreement, reporter=reporter,
        policies=Policies(progress, saver, agreement, reporter, Interval(ctx.device),
                          parts.optimizer, ctx.rank),
        zero_grad=grad_zeroing(parts.optimizer),
        no_sync=no_sync_of(parts.wrapped, grad_comm),
        grad_comm=grad_comm,
        beacon=Beacon(),
    )


def build_trainer(cfg: JobConfig, ctx: DistContext, parts: TrainParts, metrics: MetricsLogger,
                  stop: StopFlag | None = None, objects: Mapping[str, str] | None = None
                  ) -> Trainer:
    """A Trainer over `parts` (`objects`: the parts given to fit() as objects, which its
    checkpoints record)."""
    loop = build_loop(cfg, ctx, parts, metrics, stop or StopFlag())
    return Trainer(cfg, ctx, parts, loop, dict(objects or {}))


def no_sync_of(wrapped: nn.Module, grad_comm: contextlib.AbstractContextManager[None]
               ) -> Callable[[], contextlib.AbstractContextManager[None]] | None:
    """What the non-final micro-batches of an accumulation run under: DDP's no_sync(),
    FSDP2's gradient sync turned off, or None (nothing is synced in the backward pass)."""
    if (ddp := ddp_inside(wrapped)) is not None:
        return ddp.no_sync
    if sharding.is_sharded(wrapped):
        return lambda: sharding.no_sync(wrapped, grad_comm)
    return None


def ddp_inside(wrapped: nn.Module) -> DistributedDataParallel | None:
    """The DistributedDataParallel module training calls, seen through torch.compile's
    OptimizedModule (its `_orig_mod`), or None when gradients are not all-reduced by DDP."""
    inner = getattr(wrapped, "_orig_mod", wrapped)
    return inner if isinstance(inner, DistributedDataParallel) else None


def grad_zeroing(optimizer: torch.optim.Optimizer) -> Callable[[], None]:
    """``optimizer.zero_grad(set_to_none=True)``. For torch's own optimizers that is a loop
    setting each parameter's ``.grad`` to None inside a profiler range and a dynamo guard,
    which cost about 100 us of a 2.9 ms step on 2 CPU ranks here against 0.4 us for the loop
    alone (measured 2026-12-02); an optimizer that overrides zero_grad keeps its own."""
    if type(optimizer).zero_grad is not torch.optim.Optimizer.zero_grad:
        return lambda: optimizer.zero_grad(set_to_none=True)

    def zero() -> None:
        for group in optimizer.param_groups:
            for p in group["params"]:
                p.grad = None
    return zero
