"""The training loop: a Trainer whose state is declared up front and is itself checkpointable."""

from __future__ import annotations

import logging
import math
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainer import checkpoint
from trainer.config import JobConfig
from trainer.data import DataSplits
from trainer.distributed import DistContext
from trainer.errors import ConfigError, TrainingDiverged
from trainer.evaluate import EvalResult, evaluate
from trainer.loaders import build_train_sampler, to_device, train_loader
from trainer.models import build_model

log = logging.getLogger(__name__)


class MetricsLogger(Protocol):
    def log(self, metrics: Mapping[str, float | Sequence[float]], step: int) -> None: ...
    def close(self) -> None: ...


def wrap_model(model: nn.Module, strategy: str, ctx: DistContext) -> nn.Module:
    if strategy == "dp":
        if ctx.world_size > 1:
            raise ConfigError("train.strategy 'dp' (DataParallel) runs in one process, but "
                              f"WORLD_SIZE is {ctx.world_size}",
                              "use --strategy ddp with several ranks")
        warnings.warn("DataParallel is single-process and re-scatters the model every step; "
                      "DistributedDataParallel (--strategy ddp) is recommended", stacklevel=2)
        return nn.DataParallel(model)
    if not ctx.initialized:
        return model
    device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)


class Trainer:
    """Owns model, optimizer, sampler and progress; ``state_dict`` captures all of it."""

    def __init__(self, cfg: JobConfig, ctx: DistContext, splits: DataSplits,
                 metrics: MetricsLogger) -> None:
        self.cfg = cfg
        self.ctx = ctx
        self.splits = splits
        self.metrics = metrics
        t = cfg.train
        self.raw_model = build_model(cfg.model, splits.feature_shape, splits.num_classes,
                                     t.seed).to(ctx.device)
        self.model = wrap_model(self.raw_model, t.strategy, ctx)
        self.optimizer = torch.optim.SGD(self.raw_model.parameters(), lr=cfg.optim.lr,
                                         momentum=cfg.optim.momentum,
                                         weight_decay=cfg.optim.weight_decay)
        self.sampler = build_train_sampler(t.sampler, splits.train, ctx, t.seed)
        self.loader = train_loader(splits.train, self.sampler, t.batch_size, ctx,
                                   cfg.data.num_workers)
        # Progress, all of it checkpointed.
        self.epoch = 0
        """Epoch in progress (0-based)."""
        self.step = 0
        """Optimizer steps taken in total."""
        self.epoch_loss_sum = 0.0
        """This rank's summed training loss over the epoch so far (for `train_loss`)."""
        self.epoch_loss_count = 0
        """Batches behind `epoch_loss_sum`."""
        self.train_loss: float | None = None
        """Global mean training loss of the last finished (or stopped) epoch."""
        self.resumed_step: int | None = None
        self.last_eval: EvalResult | None = None
        self.samples_this_run = 0
        """Samples this process trained since it started (for samples_per_second)."""

    # -- checkpointable state ------------------------------------------------------------
    def state_dict(self, consumed: int | None) -> dict[str, Any]:
        """`consumed`: global sample positions of the current epoch trained so far, or None
        at an epoch boundary (resume starts the next epoch)."""
        return {
            "model": self.raw_model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "epoch": self.epoch if consumed is not None else self.epoch + 1,
            "step": self.step,
            "sampler": self.sampler.state_dict(consumed) if consumed is not None else None,
            "epoch_loss_sum": self.epoch_loss_sum if consumed is not None else 0.0,
            "epoch_loss_count": self.epoch_loss_count if consumed is not None else 0,
            "train_loss": self.train_loss,
            "world_size": self.ctx.world_size,
            "rng_cpu": torch.get_rng_state(),
            "config": self.cfg.to_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.raw_model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.epoch = int(state["epoch"])
        self.step = int(state["step"])
        self.epoch_loss_sum = float(state["epoch_loss_sum"])
        self.epoch_loss_count = int(state["epoch_loss_count"])
        self.train_loss = state["train_loss"]
        if state["sampler"] is not None:
            self.sampler.load_state_dict(state["sampler"])
        torch.set_rng_state(state["rng_cpu"])
        self.resumed_step = self.step

    def maybe_resume(self) -> None:
        directory = self.checkpoint_dir
        if directory is None:
            return
        found = checkpoint.load_latest(directory)
        if found is None:
            return
        state, path = found
        self.load_state_dict(state)
        position = state["sampler"]["position"] if state["sampler"] else 0
        log.info("resumed from %s: step %d, epoch %d, sample position %d (saved by %d ranks)",
                 path.name, self.step, self.epoch, position, state["world_size"])

    @property
    def checkpoint_dir(self) -> Path | None:
        return Path(self.cfg.checkpoint.dir) if self.cfg.checkpoint.dir else None

    # -- loop ----------------------------------------------------------------------------
    def planned_steps(self) -> int:
        per_rank = math.ceil(len(self.splits.train) / self.ctx.world_size)
        total = math.ceil(per_rank / self.cfg.train.batch_size) * self.cfg.train.epochs
        return min(total, self.cfg.train.max_steps) if self.cfg.train.max_steps else total

    def _done(self) -> bool:
        return bool(self.cfg.train.max_steps) and self.step >= self.cfg.train.max_steps

    def train(self) -> dict[str, Any]:
        """Train to `train.epochs` or `train.max_steps`; return the summary (same on all ranks)."""
        planned = self.planned_steps()
        bar = _progress_bar(self.ctx.is_main, planned, self.step)
        start = time.perf_counter()
        self.metrics.log({"run/resumed_step": float(self.resumed_step or 0)}, self.step)
        try:
            while self.epoch < self.cfg.train.epochs and not self._done():
                consumed = self._train_epoch(planned, bar)
                self.train_loss = self._epoch_mean_loss()
                self.last_eval = self._validate()
                if consumed is not None:  # stopped by max_steps inside the epoch
                    self._save(consumed)
                    break
                self._save(None)
                self.epoch += 1
                self.epoch_loss_sum, self.epoch_loss_count = 0.0, 0
            if self.last_eval is None:  # resumed after the last epoch: nothing left to train
                self.last_eval = self._validate()
        finally:
            if bar is not None:
                bar.close()
        return self._summary(time.perf_counter() - start)

    def _train_epoch(self, planned: int, bar: Any) -> int | None:
        """Run the rest of the current epoch; return None when its data is exhausted, else the
        global sample position reached (max_steps stopped it)."""
        t, ctx = self.cfg.train, self.ctx
        self.sampler.set_epoch(self.epoch)
        start_position = int(getattr(self.sampler, "start_position", 0))
        batches = len(self.loader)
        self.model.train()
        global_batch = t.batch_size * ctx.world_size
        # Interval accumulators stay on the device: the loop waits for the GPU only once per
        # log interval, never per step.
        loss_acc = torch.zeros((), dtype=torch.float64, device=ctx.device)
        correct_acc = torch.zeros((), dtype=torch.int64, device=ctx.device)
        samples_acc = steps_acc = epoch_steps = 0
        wait_acc = 0.0
        step_times: list[float] = []
        it = iter(self.loader)
        while epoch_steps < batches and not self._done():
            t0 = time.perf_counter()
            batch = next(it)
            t1 = time.perf_counter()
            x, y = to_device(batch, ctx.device)
            self.optimizer.zero_grad(set_to_none=True)
            logits = self.model(x)
            loss = F.cross_entropy(logits, y)
            loss.backward()  # type: ignore[no-untyped-call]
            self.optimizer.step()
            self.step += 1
            epoch_steps += 1
            loss_acc += loss.detach().double()
            correct_acc += (logits.detach().argmax(dim=1) == y).sum()
            samples_acc += len(y)
            steps_acc += 1
            wait_acc += t1 - t0
            step_times.append(time.perf_counter() - t0)
            at_ckpt = self._checkpoint_due() and epoch_steps < batches
            if self.step % t.log_every == 0 or at_ckpt or epoch_steps == batches or self._done():
                self._flush(loss_acc, correct_acc, samples_acc, steps_acc, wait_acc, step_times,
                            planned, bar)
                loss_acc.zero_()
                correct_acc.zero_()
                samples_acc = steps_acc = 0
                wait_acc, step_times = 0.0, []
            if at_ckpt:
                self._save(start_position + epoch_steps * global_batch)
        if epoch_steps == batches:
            return None
        return start_position + epoch_steps * global_batch

    def _checkpoint_due(self) -> bool:
        every = self.cfg.checkpoint.every
        return self.checkpoint_dir is not None and every > 0 and self.step % every == 0

    def _flush(self, loss_acc: torch.Tensor, correct_acc: torch.Tensor, samples: int,
               steps: int, wait: float, step_times: list[float], planned: int,
               bar: Any) -> None:
        loss_sum, correct = loss_acc.item(), int(correct_acc.item())  # the one sync
        if not math.isfinite(loss_sum):
            raise TrainingDiverged(f"training loss became {loss_sum} by step {self.step}",
                                   "lower --lr or check the data for extreme values")
        self.epoch_loss_sum += loss_sum
        self.epoch_loss_count += steps
        self.samples_this_run += samples
        mean_loss = loss_sum / steps
        metrics: dict[str, float | Sequence[float]] = {
            "train/loss": mean_loss,
            "train/accuracy": correct / samples,
            "train/steps": float(steps),
            "train/samples": float(samples),
            "train/step_seconds": step_times,
            "train/data_wait_seconds": wait,
            "train/lr": float(self.optimizer.param_groups[0]["lr"]),
            "train/epoch": float(self.epoch),
            "train/progress_ratio": min(1.0, self.step / planned) if planned else 1.0,
            "train/last_step_timestamp": time.time(),
        }
        if self.ctx.device.type == "cuda":
            metrics["cuda/memory_allocated_bytes"] = float(torch.cuda.memory_allocated())
            metrics["cuda/max_memory_allocated_bytes"] = float(torch.cuda.max_memory_allocated())
        self.metrics.log(metrics, self.step)
        if bar is not None:
            bar.update(steps)
            bar.set_postfix(epoch=self.epoch, loss=f"{mean_loss:.4f}")
        elif self.ctx.is_main:
            log.info("epoch %d step %d loss %.4f acc %.3f", self.epoch, self.step, mean_loss,
                     correct / samples)

    def _epoch_mean_loss(self) -> float | None:
        """Sum and count reduced over ranks (never a mean of per-rank means)."""
        t = torch.tensor([self.epoch_loss_sum, float(self.epoch_loss_count)],
                         dtype=torch.float64, device=self.ctx.device)
        if self.ctx.initialized:
            torch.distributed.all_reduce(t)
        loss_sum, count = t.tolist()
        return loss_sum / count if count else self.train_loss

    def _validate(self) -> EvalResult:
        local, glob = evaluate(self.model, self.splits.val, self.ctx, self.cfg.train.batch_size)
        self.metrics.log({
            "val/loss": local.loss, "val/accuracy": local.accuracy,
            "val/correct": float(local.correct), "val/total": float(local.total),
            "val/global_loss": glob.loss, "val/global_accuracy": glob.accuracy,
            "val/global_correct": float(glob.correct), "val/global_total": float(glob.total),
        }, self.step)
        if self.ctx.is_main:
            log.info("epoch %d step %d validation accuracy %.4f (%d/%d) loss %.4f", self.epoch,
                     self.step, glob.accuracy, glob.correct, glob.total, glob.loss)
        return glob

    def _save(self, consumed: int | None) -> None:
        directory = self.checkpoint_dir
        if directory is None or not self.ctx.is_main:
            return
        path = checkpoint.save(directory, self.step, self.state_dict(consumed),
                               self.cfg.checkpoint.keep)
        self.metrics.log({"checkpoint/last_timestamp": time.time()}, self.step)
        log.debug("saved %s", path)

    def _summary(self, wall: float) -> dict[str, Any]:
        total = torch.tensor([float(self.samples_this_run)], dtype=torch.float64,
                             device=self.ctx.device)
        if self.ctx.initialized:
            torch.distributed.all_reduce(total)
        samples = total.item()
        ev = self.last_eval
        assert ev is not None
        return {
            "world_size": self.ctx.world_size,
            "epochs": self.epoch,
            "steps": self.step,
            "samples": int(samples),
            "samples_per_second": samples / wall if wall > 0 else 0.0,
            "train_loss": self.train_loss,
            "val_accuracy": ev.accuracy,
            "val_correct": ev.correct,
            "val_total": ev.total,
            "val_loss": ev.loss,
            "wall_seconds": wall,
            "resumed_from_step": self.resumed_step,
        }


def _progress_bar(is_main: bool, total: int, initial: int) -> Any:
    if not (is_main and sys.stderr.isatty()):
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True)
