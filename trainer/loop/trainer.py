"""The training loop: a Trainer that loops over the parts it is handed and checkpoints its
progress as a :class:`trainer.loop.state.TrainingState`."""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainer.components import sharded_checkpoint, sharding
from trainer.components.compiling import compile_errors
from trainer.components.evaluation import EvalResult, local_sums, reduce_sums, result
from trainer.components.steps import as_output
from trainer.components.tasks import task_of
from trainer.components.tree import batch_len, to_device
from trainer.config import CONFIG_VERSION, JobConfig
from trainer.distributed.agreement import Resumed, collective
from trainer.distributed.phases import (
    AGREEMENT,
    BACKWARD,
    CHECKPOINT,
    DATA,
    DONE,
    OPTIMIZER,
    REDUCTION,
    STEP,
    VALIDATION,
)
from trainer.errors import CheckpointError
from trainer.loop.global_batch import plan_batches
from trainer.loop.interval_stats import Interval
from trainer.loop.parts import LoopParts, TrainParts
from trainer.loop.resume_check import load_checked, training_state
from trainer.loop.state import TrainingState
from trainer.placement import DistContext

log = logging.getLogger(__name__)


class Trainer:
    """Loops over the parts it is handed (see :func:`trainer.build.build_trainer`), which
    builds them all. Settings (intervals, timeouts) are read from `cfg`."""

    def __init__(self, cfg: JobConfig, ctx: DistContext, parts: TrainParts, loop: LoopParts,
                 objects: dict[str, str]) -> None:
        self.cfg, self.ctx, self.parts, self.loop, self.objects = cfg, ctx, parts, loop, objects
        # Per-process bookkeeping, not checkpointed.
        self.resumed_step: int | None = None
        self.last_eval: EvalResult | None = None
        self._config = cfg.to_dict()
        """The config as checkpoints record it (built once: ~0.1 ms a save otherwise)."""
        self._compiled = compile_errors if cfg.train.compile else contextlib.nullcontext
        self._validation_seconds = 0.0
        """The last validation's length: the hang watchdog allows a few times it."""
        self.task = task_of(parts.step)
        """What the step's outputs score (its sums and metrics)."""
        loop.reporter.accuracy = "accuracy" in self.task.names()

    # -- checkpointable state ------------------------------------------------------------
    def _snapshot(self, consumed: int | None, loss_sum: float, loss_count: int,
                  gathered: tuple[dict[str, Any], dict[str, Any]] | None) -> TrainingState:
        """All progress; `consumed`: the epoch's global sample positions trained so far, or
        None at an epoch boundary (a resume starts the next epoch); `gathered`: a sharded
        model's full model and optimizer state."""
        p = self.loop.progress
        model, optimizer = gathered or (self.parts.model.state_dict(),
                                        self.parts.optimizer.state_dict())
        return TrainingState(
            model=model, optimizer=optimizer,
            epoch=p.epoch if consumed is not None else p.epoch + 1, step=p.step,
            sampler=self.parts.sampler.state_dict(consumed) if consumed is not None else None,
            epoch_loss_sum=loss_sum, epoch_loss_count=loss_count, train_loss=p.train_loss,
            global_batch=self.loop.plan.global_batch, world_size=self.ctx.world_size,
            rng_cpu=torch.get_rng_state(),
            rng_cuda=torch.cuda.get_rng_state() if self.ctx.device.type == "cuda" else None,
            updates=p.updates,
            schedule_total_steps=self.parts.schedule.total_steps if self.parts.schedule else 0,
            precision=self.loop.precision.state_dict(), config=self._config,
            config_version=CONFIG_VERSION, objects=self.objects,
            class_names=list(self.parts.class_names or []))

    def _restore(self, state: TrainingState, shards: Path | None = None) -> None:
        if shards is not None:  # each rank reads its own shard of a sharded checkpoint
            sharded_checkpoint.load_into(shards, self.parts.model, self.parts.optimizer)
        elif sharding.is_sharded(self.parts.model):
            sharding.load_state(self.parts.model, self.parts.optimizer, state.model,
                                state.optimizer)
        else:
            self.parts.model.load_state_dict(state.model)
            self.parts.optimizer.load_state_dict(state.optimizer)
        # The curve continues as planned when the run started, whatever the world size now.
        if self.parts.schedule is not None:
            self.parts.schedule.total_steps = state.schedule_total_steps
        if state.precision:
            self.loop.precision.load_state_dict(state.precision)
        # The saved sums cover all ranks: rank 0 carries them on, the others start from zero.
        # A sampler that cannot resume mid-epoch (torch's) replays the epoch from its start,
        # so the sums of its first attempt must not be counted again.
        main = self.ctx.is_main and getattr(self.parts.sampler, "resumes_mid_epoch", True)
        p = self.loop.progress
        p.epoch, p.step, p.updates, p.train_loss = (state.epoch, state.step, state.updates,
                                                    state.train_loss)
        p.epoch_loss_sum = state.epoch_loss_sum if main else 0.0
        p.epoch_loss_count = state.epoch_loss_count if main else 0
        if state.sampler is not None:
            self.parts.sampler.load_state_dict(state.sampler)
        torch.set_rng_state(state.rng_cpu)
        if state.rng_cuda is not None and self.ctx.device.type == "cuda":
            torch.cuda.set_rng_state(state.rng_cuda)
        if state.global_batch != self.loop.plan.global_batch:
            plan = self.loop.plan = plan_batches(state.global_batch, self.ctx.world_size,
                                                 max_micro=self.cfg.train.batch_size)
            log.warning("world size changed %d -> %d: keeping the global batch %d as %d per "
                        "rank x %d accumulation steps", state.world_size, self.ctx.world_size,
                        plan.global_batch, plan.micro_batch, plan.accum_steps)
        self.resumed_step = state.step

    def _shards_of(self, state: dict[str, Any], name: str) -> Path | None:
        """The folder of a sharded checkpoint every rank reads its shard from (None for a
        single file); one line on every rank when some rank does not see it."""
        if not state.get("shards"):
            return None
        directory = self.loop.saver.directory
        assert directory is not None
        path = directory / name
        seen: list[Any] = [path.is_dir()]
        if self.ctx.initialized:
            seen = [None] * self.ctx.world_size
            with collective("finding the sharded checkpoint", self.cfg.dist.timeout_seconds):
                dist.all_gather_object(seen, path.is_dir())
        if not all(seen):
            lacking = ", ".join(str(r) for r, ok in enumerate(seen) if not ok)
            raise CheckpointError(
                f"sharded checkpoint {name} is not in the checkpoint dir of rank {lacking}",
                "give all ranks one shared --checkpoint-dir (a ReadWriteMany PVC)")
        return path

    def resume(self, resumed: Resumed) -> None:
        """Continue from the state the ranks agreed on (see :func:`agreement.agree_resume`)."""
        state = training_state(resumed.state, resumed.name)
        shards = self._shards_of(state, resumed.name)
        if shards is not None and not sharding.is_sharded(self.parts.model):
            state, shards = sharded_checkpoint.with_shards(state, shards), None  # a DDP run
        load_checked(state, self._config, resumed.name,
                     lambda saved: self._restore(TrainingState.from_dict(saved), shards))
        position = state["sampler"]["position"] if state["sampler"] else 0
        log.info("resumed from %s: step %d, epoch %d, sample position %d (saved by %d ranks)%s",
                 resumed.name, self.loop.progress.step, self.loop.progress.epoch, position,
                 state["world_size"],
                 "; sent by rank 0 to the ranks without a copy" if resumed.sent else "")

    # -- loop ----------------------------------------------------------------------------
    def planned_steps(self) -> int:
        per_rank = math.ceil(len(self.parts.train_set) / self.ctx.world_size)
        micro_steps = math.ceil(per_rank / self.loop.plan.micro_batch)
        total = math.ceil(micro_steps / self.loop.plan.accum_steps) * self.cfg.train.epochs
        return min(total, self.cfg.train.max_steps) if self.cfg.train.max_steps else total

    def train(self) -> dict[str, Any]:
        """Train to `train.epochs` or `train.max_steps`; return the summary (same on all ranks)."""
        plan = self.loop.plan
        loader = self.parts.train_loader(plan.micro_batch)
        planned = self.planned_steps()
        if self.parts.schedule is not None and not self.parts.schedule.total_steps:
            self.parts.schedule.total_steps = planned
        if self.ctx.is_main:
            log.info("global batch %d = %d per rank x %d ranks x %d accumulation steps; %d "
                     "optimizer steps planned", plan.global_batch, plan.micro_batch,
                     self.ctx.world_size, plan.accum_steps, planned)
        start, p = time.perf_counter(), self.loop.progress
        self.loop.reporter.start(planned, p.step, self.resumed_step)
        try:
            while p.epoch < self.cfg.train.epochs and not self.loop.saver.done(p.step):
                consumed = self._train_epoch(loader)
                self.last_eval = self._validate(epoch_end=True)
                if consumed is not None:  # stopped by max_steps inside the epoch
                    self._save(consumed)
                    break
                if self.loop.saver.epoch_end_saved(p.step, p.epoch):
                    self._save(None)
                p.next_epoch()
            if self.last_eval is None:  # resumed after the last epoch: nothing left to train
                self.last_eval = self._validate()
            beacon = self.loop.beacon
            beacon.enter(CHECKPOINT, p.step)
            # the final checkpoint is durable before the summary says done, on every rank
            self.loop.saver.wait(self.loop.agreement.rank0s)
            beacon.enter(AGREEMENT, p.step)
            self.loop.agreement.drain()
        finally:
            self.loop.reporter.close()
            for done in (loader, self.parts.val_loader):
                getattr(done, "close", lambda: None)()  # their workers, before os._exit
        return self._summary(time.perf_counter() - start)

    def _train_epoch(self, loader: Any) -> int | None:
        """Run the rest of the current epoch; return None when its data is exhausted, else the
        global sample position reached (max_steps stopped it)."""
        self.parts.sampler.set_epoch(self.loop.progress.epoch)
        position = self.parts.sampler.start_position
        positions_per_micro = self.loop.plan.micro_batch * self.ctx.world_size
        micro_total = len(loader)  # equal on every rank: the sampler pads short shards
        self.parts.wrapped.train()
        self.loop.saver.before_fork(loader)
        batches = iter(loader)
        micro = 0
        while micro < micro_total and not self.loop.saver.done(self.loop.progress.step):
            k = min(self.loop.plan.accum_steps, micro_total - micro)
            self._optimizer_step(batches, k)
            micro += k
            position += k * positions_per_micro
            self.loop.beacon.enter(AGREEMENT, self.loop.progress.step)
            self.loop.policies.after_step(micro == micro_total, position, self._save)
        return None if micro == micro_total else position

    def _optimizer_step(self, batches: Iterator[Any], k: int) -> None:
        """Zero the gradients, accumulate `k` micro-batches, clip, step."""
        t0 = time.perf_counter()
        interval, loop, precision = self.loop.policies.interval, self.loop, self.loop.precision
        beacon, step = loop.beacon, loop.progress.step + 1
        loop.zero_grad()
        losses: list[torch.Tensor] = []
        for j in range(k):
            tw = time.perf_counter()
            beacon.enter(DATA, step)
            batch = to_device(next(batches), self.ctx.device)
            interval.wait += time.perf_counter() - tw
            # Gradients are all-reduced only on the last micro-batch of an accumulation.
            with loop.grad_comm if j == k - 1 or loop.no_sync is None else loop.no_sync():
                with precision.autocast(), self._compiled():
                    beacon.enter(STEP, step)
                    interval.forward.start()
                    out = as_output(self.parts.step(self.parts.wrapped, batch), task=self.task)
                    interval.forward.stop()
                loss = out.loss
                beacon.enter(BACKWARD, step)
                precision.backward(loss / k if k > 1 else loss)
            losses.append(loss.detach())
            interval.correct.add(out.correct)
            interval.count.append(out.count)
            interval.samples += batch_len(batch)
        beacon.enter(OPTIMIZER, step)
        self._update(interval)
        self.loop.progress.step += 1
        interval.losses.append(losses[0] if k == 1 else torch.stack(losses).mean())
        interval.epochs.append(self.loop.progress.epoch)
        seconds = time.perf_counter() - t0
        interval.step_times.append(seconds)
        beacon.stepped(seconds)

    def _update(self, interval: Interval) -> None:
        """Clip, step the optimizer at the scheduled learning rate, count a skipped step."""
        if (clip := self.cfg.optim.grad_clip) > 0:
            self.loop.precision.unscale(self.parts.optimizer)
            norm = sharding.plain_norm(
                torch.nn.utils.clip_grad_norm_(self.parts.model.parameters(), clip))
            interval.grad_norm = torch.maximum(interval.grad_norm, norm.detach().double())
        if self.parts.schedule is not None:
            self.parts.schedule.apply(self.parts.optimizer, self.loop.progress.updates)
        if self.loop.precision.step(self.parts.optimizer):
            self.loop.progress.updates += 1
        else:
            interval.skipped += 1

    def _reduced(self, what: str, values: list[float]) -> list[float]:
        """`values` summed over ranks, in float64 (sums and counts, never means of means)."""
        t = torch.tensor(values, dtype=torch.float64, device=self.ctx.device)
        if self.ctx.initialized:
            with collective(what, self.cfg.dist.timeout_seconds):
                dist.all_reduce(t)
        return [float(v) for v in t.tolist()]

    def _validate(self, epoch_end: bool = False) -> EvalResult:
        """Evaluate; at an epoch end the same reduction also sums the epoch's training loss
        (one collective for both) into `train_loss`."""
        p, beacon, started = self.loop.progress, self.loop.beacon, time.perf_counter()
        # The first validation is expected to take its batches at the median step's pace.
        beacon.enter(VALIDATION, p.step, self._validation_seconds or
                     len(self.parts.val_loader) * beacon.median_step())
        self.loop.saver.before_fork(self.parts.val_loader)
        with sharding.full_params(self.parts.model):
            sums = local_sums(self.parts.model, self.parts.step, self.parts.val_loader,
                              self.parts.val_valid, self.ctx.device, self.task)
        self._validation_seconds = time.perf_counter() - started
        beacon.enter(REDUCTION, p.step)
        if epoch_end:
            epoch = [p.epoch_loss_sum, float(p.epoch_loss_count)]
            sums = torch.cat([sums, torch.tensor(epoch, dtype=torch.float64, device=sums.device)])
        with collective("the validation reduction", self.cfg.dist.timeout_seconds):
            total = reduce_sums(sums, self.ctx)
        local, glob = result(sums, self.task), result(total, self.task)
        if epoch_end:
            loss_sum, count = total[-2:].tolist()
            p.train_loss = loss_sum / count if count else p.train_loss
        self.loop.reporter.validation(local, glob, p.epoch, p.step)
        return glob

    def _save(self, consumed: int | None) -> Path | None:
        """Checkpoint (collective: all ranks call it; rank 0 writes, in the background). A
        save inside the epoch records the epoch's loss sums over all ranks: reduced here
        unless the agreement reduced them at this step."""
        if self.loop.saver.directory is None:
            return None
        p = self.loop.progress
        self.loop.beacon.enter(CHECKPOINT, p.step)
        if consumed is None:  # nothing to carry past an epoch boundary
            loss_sum, count = 0.0, 0.0
        elif (reduced := self.loop.policies.reduced_epoch_loss()) is not None:
            loss_sum, count = reduced
        else:
            loss_sum, count = self._reduced("the epoch loss reduction",
                                            [p.epoch_loss_sum, float(p.epoch_loss_count)])
        gathered = None
        saver, timeout = self.loop.saver, self.cfg.dist.timeout_seconds
        if sharding.is_sharded(self.parts.model):
            with collective("writing the sharded checkpoint", timeout):
                if saver.shards():
                    path = saver.save_sharded(
                        p.step, self.parts.model, self.parts.optimizer,
                        lambda: {**self._snapshot(consumed, loss_sum, int(count),
                                                  ({}, {})).to_dict(),
                                 "model": None, "optimizer": None, "shards": "dcp"})
                    if path is not None:
                        self.loop.reporter.saved(p.step)
                    return path
                gathered = sharding.gather_state(self.parts.model, self.parts.optimizer)
        path = saver.save(
            p.step, lambda: self._snapshot(consumed, loss_sum, int(count), gathered).to_dict())
        if path is not None:
            self.loop.reporter.saved(p.step)
        return path

    def _summary(self, wall: float) -> dict[str, Any]:
        self.loop.beacon.enter(REDUCTION, self.loop.progress.step)
        samples = self._reduced("the sample count reduction",
                                [float(self.loop.policies.samples)])[0]
        self.loop.beacon.enter(DONE, self.loop.progress.step)
        ev, names = self.last_eval, self.parts.class_names
        assert ev is not None
        return {
            "world_size": self.ctx.world_size, "epochs": self.loop.progress.epoch,
            "steps": self.loop.progress.step, "samples": int(samples),
            "samples_per_second": samples / wall if wall > 0 else 0.0,
            "train_loss": self.loop.progress.train_loss,
            # None: no validation split (data.val_fraction 0), or a task that scores no
            # accuracy (regression, lm: their metrics are in val_metrics), not an accuracy of 0
            "val_accuracy": ev.accuracy if ev.total and ev.task.weight == "count"
            and "accuracy" in ev.task.names() else None,
            "val_correct": ev.correct, "val_total": ev.total,
            "val_loss": ev.loss if ev.total else None,
            # The task's metrics by name ({"accuracy": ...} for classification)
            "val_metrics": ev.metrics if ev.total else {},
            "wall_seconds": wall, "global_batch": self.loop.plan.global_batch,
            "resumed_from_step": self.resumed_step,
            **({"class_names": list(names)} if names else {}),
        }
