"""What the Trainer loops over (`TrainParts`) and what its loop talks to (`LoopParts`): built
by :mod:`trainer.build`, the composition root, and handed to :class:`trainer.loop.trainer.Trainer`,
which builds nothing."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from trainer.components.optim import Schedule
from trainer.components.precision import Precision
from trainer.components.steps import StepFn
from trainer.data import IndexView
from trainer.data.loaders import TrainSampler
from trainer.distributed.agreement import Agreement
from trainer.distributed.phases import Beacon
from trainer.loop.global_batch import BatchPlan
from trainer.loop.policies import Policies
from trainer.loop.reporting import Reporter
from trainer.loop.save_policy import Saver
from trainer.loop.state import Progress


@dataclass
class TrainParts:
    """Everything the Trainer loops over; built by :func:`build_parts`."""

    model: nn.Module
    """The unwrapped module on the device: what is checkpointed and evaluated."""
    wrapped: nn.Module
    """What training calls: DistributedDataParallel (or DataParallel) around `model`, or,
    under FSDP, `model` itself (sharded in place)."""
    optimizer: torch.optim.Optimizer
    step: StepFn
    train_set: IndexView
    sampler: TrainSampler
    train_loader: Callable[[int], DataLoader[Any]]
    """Micro-batch size -> the training loader over `sampler` (the micro-batch is known only
    after a resume, which may change the world size)."""
    val_loader: DataLoader[Any]
    val_valid: int
    """Real (non-padding) validation samples of this rank."""
    num_classes: int | None
    class_names: tuple[str, ...] | None = None
    schedule: Schedule | None = None
    """Learning rate per optimizer step (its total is set by the Trainer once planned); None
    leaves the optimizer's learning rate alone."""


@dataclass
class LoopParts:
    """What the Trainer's loop talks to besides the model and the data; built by
    :func:`build_loop`."""

    plan: BatchPlan
    """Per-rank micro-batch and accumulation as configured (a resume may replan them)."""
    precision: Precision
    """fp32, bf16 autocast or fp16 with its loss scaler (train.precision); checkpointed."""
    progress: Progress
    """The run's counters (restored on a resume), shared with `policies`."""
    saver: Saver
    """When progress is saved, when training ends, and the writes."""
    agreement: Agreement
    """Decides with the other ranks when to stop (SIGTERM, a diverged loss)."""
    reporter: Reporter
    policies: Policies
    """Applied after every optimizer step (log, agree, save)."""
    zero_grad: Callable[[], None]
    no_sync: Callable[[], contextlib.AbstractContextManager[Any]] | None
    """What micro-batches before the last of an accumulation run under (DDP's no_sync(),
    FSDP2's gradient sync off), or None when the backward pass syncs nothing."""
    grad_comm: contextlib.AbstractContextManager[None]
    """Entered around each gradient all-reduce: a DDP backward talks to every rank, so its
    failure is a lost rank."""
    beacon: Beacon
    """Where the loop is (its phase and step), read by the hang watchdog."""
