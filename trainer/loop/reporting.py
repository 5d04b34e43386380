"""What the loop reports: one log interval, one validation, the run's summary.

The Trainer decides *when* (once per agreed check interval, once per validation) and hands
over plain numbers; the :class:`Reporter` turns them into metrics (behind ``log(metrics,
step)``), rank 0's ``steps.jsonl`` lines and the progress line or bar. Nothing here talks to the
other ranks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from trainer.components.evaluation import EvalResult
from trainer.distributed import queue_report, threads
from trainer.loop.interval_stats import StepLog, progress_bar

log = logging.getLogger(__name__)


class MetricsLogger(Protocol):
    def log(self, metrics: Mapping[str, float | Sequence[float]], step: int) -> None: ...
    def close(self) -> None: ...


@dataclass(frozen=True)
class IntervalReport:
    """An interval's values as plain numbers: its tensors read with its one device sync (see
    :meth:`Interval.totals`), its counters as they were kept."""

    step: int
    """The last step of the interval."""
    epoch: int
    losses: list[float]
    """Per-step training losses (all finite)."""
    loss_sum: float
    """Their exact sum (math.fsum)."""
    epochs: list[int]
    """The epoch of each step in `losses`."""
    correct: float
    count: float
    grad_norm: float
    lr: float
    samples: int
    step_seconds: list[float]
    data_wait_seconds: float
    forward_seconds: float
    skipped: int


class Reporter:
    """Exports what the Trainer measured; rank 0 also writes the step log and the progress."""

    def __init__(self, metrics: MetricsLogger, device: torch.device, is_main: bool,
                 step_log: Path | None, grad_clip: float) -> None:
        self.metrics = metrics
        self.device = device
        self.is_main = is_main
        self.step_log = StepLog(step_log) if step_log is not None and is_main else None
        """Rank 0's per-step losses (off: output.step_log false, or another rank)."""
        self.grad_clip = grad_clip
        self.planned = 0
        self._bar: Any = None
        self._said_no_validation = False
        self.accuracy = True
        """Whether the task scores an accuracy (off for regression and lm: no false 0s)."""
        self._throttled = threads.cgroup_throttled_seconds()

    def start(self, planned: int, step: int, resumed_step: int | None) -> None:
        self.planned = planned
        if self.step_log is not None:
            self.step_log.fresh = resumed_step is None  # steps.jsonl belongs to one run
        self._bar = progress_bar(self.is_main, planned, step)
        self.metrics.log({"run/resumed_step": float(resumed_step or 0)}, step)
        if self.is_main and (queued := queue_report.read()):
            self.metrics.log(queued, step)
            log.info("queue: this run's admission waited %.0f s in Kueue; evicted %d time(s) "
                     "before (%d preempted)", queued["queue/wait_seconds"],
                     queued["queue/evictions"], queued["queue/preemptions"])

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self.step_log is not None:
            self.step_log.close()

    def diverged(self, loss: float, step: int) -> None:
        """Exported at once, so the loss-not-finite alert fires even though the job stops."""
        self.metrics.log({"train/loss": loss}, step)

    def _throttled_since(self) -> float:
        """Seconds the container's CPU quota held this rank back since the last interval."""
        before, self._throttled = self._throttled, threads.cgroup_throttled_seconds()
        return max(0.0, self._throttled - before)

    def interval(self, r: IntervalReport) -> None:
        steps = len(r.losses)
        if self.step_log is not None:
            self.step_log.append(r.step, r.epochs, r.losses)
        mean_loss = r.loss_sum / steps
        accuracy = r.correct / r.count if r.count else 0.0
        metrics: dict[str, float | Sequence[float]] = {
            "train/loss": mean_loss,
            "train/steps": float(steps),
            "train/samples": float(r.samples),
            "train/step_seconds": r.step_seconds,
            "train/data_wait_seconds": r.data_wait_seconds,
            "train/forward_seconds": r.forward_seconds,
            "train/cpu_throttled_seconds": self._throttled_since(),
            "train/lr": r.lr,
            "train/skipped_steps": float(r.skipped),
            "train/epoch": float(r.epoch),
            "train/progress_ratio": min(1.0, r.step / self.planned) if self.planned else 1.0,
            "train/last_step_timestamp": time.time(),
        }
        if self.accuracy:
            metrics["train/accuracy"] = accuracy
        if self.grad_clip > 0:
            metrics["train/grad_norm"] = r.grad_norm
        if self.device.type == "cuda":
            metrics["cuda/memory_allocated_bytes"] = float(torch.cuda.memory_allocated())
            metrics["cuda/max_memory_allocated_bytes"] = float(torch.cuda.max_memory_allocated())
        self.metrics.log(metrics, r.step)
        if self._bar is not None:
            self._bar.update(steps)
            self._bar.set_postfix(epoch=r.epoch, loss=f"{mean_loss:.4f}")
        elif self.is_main and self.accuracy:
            log.info("epoch %d step %d loss %.4f acc %.3f", r.epoch, r.step, mean_loss,
                     accuracy)
        elif self.is_main:
            log.info("epoch %d step %d loss %.4f", r.epoch, r.step, mean_loss)

    def saved(self, step: int) -> None:
        self.metrics.log({"checkpoint/last_timestamp": time.time()}, step)

    def validation(self, local: EvalResult, glob: EvalResult, epoch: int, step: int) -> None:
        if not glob.total:  # data.val_fraction 0: an accuracy of 0 would be a false number
            if self.is_main and not self._said_no_validation:
                log.info("no validation samples (data.val_fraction 0): validation accuracy and "
                         "loss are not reported")
            self._said_no_validation = True
            return
        named = glob.metrics
        values: dict[str, float | Sequence[float]] = {
            "val/loss": local.loss, "val/correct": float(local.correct),
            "val/total": float(local.total), "val/global_loss": glob.loss,
            "val/global_correct": float(glob.correct), "val/global_total": float(glob.total),
            **{f"val/metric/{k}": v for k, v in local.metrics.items()},
            **{f"val/global_metric/{k}": v for k, v in named.items()},
        }
        if self.accuracy:
            values.update({"val/accuracy": local.accuracy, "val/global_accuracy": glob.accuracy})
        self.metrics.log(values, step)
        if not self.is_main:
            return
        if glob.task.names() == ("accuracy",):
            log.info("epoch %d step %d validation accuracy %.4f (%d/%d) loss %.4f", epoch,
                     step, glob.accuracy, glob.correct, glob.total, glob.loss)
        else:
            log.info("epoch %d step %d validation %s (%d %s) loss %.4f", epoch, step,
                     " ".join(f"{k} {v:.4f}" for k, v in named.items()), glob.total,
                     glob.task.weight, glob.loss)
