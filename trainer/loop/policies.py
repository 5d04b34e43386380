"""What follows each optimizer step: report the log interval, agree with the other ranks on
stopping (SIGTERM, a diverged loss), save, as the save policy
(:class:`trainer.loop.save_policy.Saver`) and the agreement
(:class:`trainer.distributed.agreement.Agreement`) decide."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path

import torch

from trainer.distributed.agreement import Agreement, Verdict
from trainer.errors import Preempted, TrainingDiverged
from trainer.loop.interval_stats import Interval
from trainer.loop.reporting import IntervalReport, Reporter
from trainer.loop.save_policy import Decision, Saver
from trainer.loop.state import Progress, fsum

log = logging.getLogger(__name__)

SaveFn = Callable[[int | None], Path | None]
"""Checkpoint at a global sample position of the epoch (None: its end); the path rank 0
wrote."""


class Policies:
    """Applied after every optimizer step by :meth:`after_step`, on every rank alike."""

    def __init__(self, progress: Progress, saver: Saver, agreement: Agreement,
                 reporter: Reporter, interval: Interval, optimizer: torch.optim.Optimizer,
                 rank: int) -> None:
        self.progress, self.saver, self.agreement = progress, saver, agreement
        self.reporter, self.optimizer, self.rank = reporter, optimizer, rank
        self.interval = interval
        """The log interval in progress (it may span epochs: see _end_epoch_losses)."""
        self.samples = 0
        """Samples this process trained since it started (for samples_per_second)."""
        self._diverged_value: float | None = None
        self._reduced_epoch_loss: tuple[int, tuple[float, ...]] | None = None
        """(step, epoch loss sums over ranks) when the agreement reduced them at that step."""

    def after_step(self, ends_epoch: bool, position: int, save: SaveFn) -> None:
        """`position`: the global sample position the step reached in its epoch."""
        step = self.progress.step
        decision = self.saver.after_step(step, self.progress.epoch, ends_epoch)
        if self.agreement.due(step) or decision.awaited:
            self._check(decision, position, save)
        elif ends_epoch:
            self._end_epoch_losses()
        if decision.save_now:
            save(position)

    def reduced_epoch_loss(self) -> tuple[float, float] | None:
        """The epoch's loss sum and count over ranks, when the agreement reduced them at the
        current step."""
        reduced = self._reduced_epoch_loss
        if reduced is None or reduced[0] != self.progress.step:
            return None
        loss_sum, count = reduced[1]
        return loss_sum, count

    def _check(self, decision: Decision, position: int, save: SaveFn) -> None:
        """End the log interval and exchange with the other ranks. The exchange is awaited
        where progress is saved (see Decision.awaited); elsewhere it is read at the next
        check (an await is a barrier: ~1 ms on 2 CPU ranks). A save inside the epoch records
        the epoch's loss sums over ranks: they ride the awaited reduction."""
        interval, p = self.interval, self.progress
        mean_step = interval.mean_step()
        self._flush(interval)
        self.interval = interval.next()
        carry = decision.awaited and not decision.ends_epoch
        verdict = self.agreement.exchange(
            p.step, self._diverged_value is not None, mean_step, wait=decision.awaited,
            sums=(p.epoch_loss_sum, float(p.epoch_loss_count)) if carry else (),
            save_due=self.saver.clock_due())
        if verdict.sums is not None:
            self._reduced_epoch_loss = (p.step, verdict.sums)
        if verdict.save_due:
            self.saver.agreed_due()
        self._act(verdict, position, save)

    def _act(self, verdict: Verdict, position: int, save: SaveFn) -> None:
        """Leave on every rank at once when the ranks agreed to."""
        if verdict.diverged_rank is None and not verdict.stop:
            return
        self.agreement.drain()  # nothing left in flight when the ranks leave the group
        step = self.progress.step
        if verdict.diverged_rank is not None:
            value = self._diverged_value if verdict.diverged_rank == self.rank else None
            raise TrainingDiverged(
                f"training loss became {value if value is not None else 'non-finite'} on rank "
                f"{verdict.diverged_rank} by step {step}",
                "lower --lr or check the data for extreme values")
        # Preempted: checkpoint where every rank stands and leave with a retryable status.
        saved = save(position)
        self.saver.wait(self.agreement.rank0s)
        if self.saver.directory is None:
            raise Preempted(f"stopped by SIGTERM at step {step}; progress is not kept "
                            "(checkpointing is off)", "set --checkpoint-dir so that a restart "
                            "resumes; restarting now starts again from step 0")
        where = (f"checkpoint {self.saver.shown(saved)}" if saved
                 else "the last checkpoint (rank 0 saved it)")
        raise Preempted(f"stopped by SIGTERM at step {step}; progress kept in {where}",
                        "nothing to fix: restarting the job resumes from there")

    def _end_epoch_losses(self) -> None:
        """Add the current epoch's steps of the interval to the epoch's loss sums without
        ending the interval (a flush exports metrics: ~0.1 ms, once a fast epoch
        otherwise). A loss that is not finite is caught by the interval's flush."""
        self.progress.add_losses(self.interval.epoch_losses())

    def _flush(self, interval: Interval) -> None:
        """Read the interval's values (one device sync) and report them. A loss that is not
        finite is kept in `_diverged_value`: the next check stops every rank (see _act)."""
        losses, correct, count, grad_norm = interval.totals()
        loss_sum, step = fsum(losses), self.progress.step
        if not math.isfinite(loss_sum):
            self.reporter.diverged(loss_sum / len(losses), step)
            if self._diverged_value is None:
                log.warning("training loss became %s on this rank by step %d; stopping with "
                            "the other ranks at the next check", loss_sum, step)
            self._diverged_value = loss_sum
            return
        # The steps of earlier epochs in this interval were added at their epoch's end.
        self.progress.add_losses(losses[interval.epoch_from:])
        self.samples += interval.samples
        self.reporter.interval(IntervalReport(
            step=step, epoch=self.progress.epoch, losses=losses, loss_sum=loss_sum,
            epochs=interval.epochs, correct=correct, count=count, grad_norm=grad_norm,
            lr=float(self.optimizer.param_groups[0]["lr"]), samples=interval.samples,
            step_seconds=interval.step_times, data_wait_seconds=interval.wait,
            forward_seconds=interval.forward.seconds(),
            skipped=interval.skipped))
