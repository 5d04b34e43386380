"""What one rank does: check its input, join the group, train or evaluate, leave.

Everything that can be checked alone is checked before ``init_process_group`` (config, data,
model, step, the metrics port, the checkpoint directory), so bad input fails on every rank at
once with one line instead of leaving the others waiting in the rendezvous.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from torch import nn

from trainer import __version__
from trainer.build import Workload, build_parts, build_trainer, check_strategy
from trainer.components import checkpoint, restarts, sharding, storage
from trainer.components.compiling import check_available
from trainer.components.evaluation import evaluate
from trainer.components.precision import Precision
from trainer.components.retry import Backoff
from trainer.components.steps import StepFn
from trainer.components.tasks import task_of
from trainer.config import JobConfig, saved_config
from trainer.config_load import merge, validate
from trainer.data.loaders import eval_loader, worker_options
from trainer.distributed.agreement import agree_resume, collective
from trainer.distributed.preemption import StopFlag, linger
from trainer.distributed.watchdog import watching
from trainer.errors import CheckpointError, ConfigError, DataError, StorageError, missing
from trainer.export.files import export_run
from trainer.loop.resume_check import training_state
from trainer.metrics import RunInfo, build_metrics
from trainer.placement import DistContext
from trainer.ranks.dirlock import Held
from trainer.ranks.lifecycle import Rank, rank_life
from trainer.ranks.outputs import write_json

log = logging.getLogger(__name__)


def run_info(cfg: JobConfig, ctx: DistContext, workload: Workload) -> RunInfo:
    return RunInfo(rank=ctx.rank, local_rank=ctx.local_rank, world_size=ctx.world_size,
                   local_world_size=ctx.local_world_size, backend=ctx.backend,
                   strategy=cfg.train.strategy, model=workload.model_name,
                   dataset=workload.splits.name, device=ctx.device.type, version=__version__,
                   metrics=task_of(workload.step).names())


def restart_count(starts: int | None) -> int:
    """Restarts of this rank so far: the starts counted beside its checkpoints (they survive a
    pod's container restarts), or torch's elastic agent's count (its worker-group restarts)."""
    elastic = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    return max(elastic, starts - 1) if starts is not None else elastic


def _check_alone(cfg: JobConfig, ctx: DistContext) -> None:
    """What the config asks of this rank's environment (checked before the rendezvous)."""
    check_strategy(cfg.train.strategy, ctx)
    sharding.check(cfg.train.strategy, cfg.train.precision, cfg.train.fsdp_wrap)
    Precision.check(cfg.train.precision, ctx.device)
    if cfg.train.compile:
        check_available()


def train(cfg: JobConfig, *, model: nn.Module | None = None, dataset: Any = None,
          step: StepFn | None = None) -> dict[str, Any]:
    """Train on this rank; rank 0 writes ``summary.json``. Returns the summary.

    `model`, `dataset` and `step` replace what the config names (see :func:`trainer.fit`).
    After a completed (or agreed-stopped) run the process group is left initialized (see
    :func:`trainer.distributed.bootstrap.teardown`); the CLI exits the process right after.
    """
    with rank_life(cfg) as rank:
        _check_alone(cfg, rank.ctx)
        workload = rank.prepare(model=model, dataset=dataset, step=step)
        rank.check_output_dir(cfg.output.dir)
        out_dir = _staged_outputs(cfg.output.dir, rank)
        ckpt_spec = cfg.checkpoint.dir
        directory = storage.local_dir(ckpt_spec) if ckpt_spec else None
        if directory is not None:
            rank.close_at_exit(lambda: storage.drop_staging(ckpt_spec))
            storage.check(ckpt_spec, "checkpoint dir")
            checkpoint.check_writable(directory)
        if rank.ctx.rank == 0:  # for the whole run, before anything is written there
            held = Held()
            rank.close_at_exit(held.release)
            held.take(out_dir, "output.dir", "pass another --output-dir")
            if directory is not None:
                held.take(directory, "checkpoint dir", "pass another --checkpoint-dir")
        starts = None
        if directory is not None:
            starts = (storage.count_start(ckpt_spec, rank.ctx.rank)
                      if storage.is_remote(ckpt_spec)
                      else restarts.count_start(directory, rank.ctx.rank))
        stop = StopFlag()
        stop.install()  # before joining, so an early SIGTERM is not lost
        rank.close_at_exit(stop.uninstall)
        metrics = build_metrics(cfg.metrics, run_info(cfg, rank.ctx, workload))  # binds the port
        rank.close_at_exit(metrics.close)
        # when this process serves, after the last values and before the endpoint closes; after
        # a completed run a scrape of them ends it (a failed one's feed alerts: the whole bound)
        rank.close_at_exit(lambda: linger(
            cfg.metrics.linger_seconds, metrics.port,
            metrics.notify_after_scrapes if rank.completed else None, cfg.metrics.linger_scrapes))
        metrics.log({"run/restarts": float(restart_count(starts))}, 0)
        ctx = rank.join()
        trainer = build_trainer(cfg, ctx, build_parts(cfg, ctx, workload), metrics, stop,
                                workload.objects)
        rank.close_at_exit(trainer.loop.saver.close)
        with watching(cfg.dist, ctx, trainer.loop.beacon, metrics, directory,
                      cfg.metrics.linger_seconds if metrics.port else 0.0):
            if ctx.is_main and storage.is_remote(ckpt_spec):  # the others get rank 0's bytes
                storage.pull_latest(ckpt_spec, checkpoint.problem_of_bytes)
            resumed = agree_resume(directory, ctx, cfg.dist.timeout_seconds)
            if resumed is not None:
                trainer.resume(resumed)
            summary = trainer.train()
        rank.completed = True
        # an FSDP model's weights are pieces on every rank: gathered by all, for rank 0's export
        full = (sharding.full_model_state(workload.model)
                if cfg.output.export and sharding.is_sharded(workload.model) else None)
        if ctx.is_main:
            path = storage.shown(cfg.output.dir,
                                 write_json(str(out_dir), "summary.json", summary))
            accuracy, named = summary["val_accuracy"], summary["val_metrics"]
            # Classification's line as it was; another task names its own metrics.
            scored = ("val accuracy " + ("none" if accuracy is None else f"{accuracy:.4f}")
                      + f" ({summary['val_correct']}/{summary['val_total']})"
                      if accuracy is not None or not named else
                      "val " + " ".join(f"{k} {v:.4f}" for k, v in named.items())
                      + f" ({summary['val_total']} scored)")
            log.info("done: %d steps, %.0f samples/s, train loss %.4f, %s -> %s",
                     summary["steps"], summary["samples_per_second"],
                     # None (no step this run) prints nan; a loss of exactly 0.0 prints 0.0000
                     float("nan") if summary["train_loss"] is None else summary["train_loss"],
                     scored, path)
            if cfg.output.export:
                export_run(cfg, workload.model, num_classes=workload.splits.num_classes,
                           sample_shape=workload.splits.sample_shape,
                           class_names=workload.splits.class_names, objects=workload.objects,
                           summary=summary, state=full)
        metrics.log({"run/completed": 1.0}, summary["steps"])
        return summary


def evaluate_checkpoint(path: str, dataset_spec: str | None, output_dir: str, *,
                        model: nn.Module | None = None, dataset: Any = None,
                        step: StepFn | None = None,
                        timeout_seconds: float | None = None) -> dict[str, Any]:
    """Score the validation split of the checkpoint's (or `dataset_spec`'s) data on this rank.

    The model is rebuilt from the checkpoint's config by the code that trained it; parts that
    were passed to fit() as objects must be passed here again (`model`, `dataset`, `step`).
    """
    path = str(checkpoint.resolve(Path(path)))
    state = _scored_checkpoint(path)
    cfg = _scoring_config(state, path, dataset_spec, timeout_seconds,
                          {"model": model, "dataset": dataset, "step": step})
    with rank_life(cfg) as rank:
        rank.check_output_dir(output_dir)
        out_dir = _staged_outputs(output_dir, rank)
        workload = rank.prepare(model=model, dataset=None if dataset_spec else dataset,
                                step=step)
        if not len(workload.splits.val):
            raise ConfigError(f"dataset {cfg.data.dataset} has no validation samples to score "
                              f"(data.val_fraction {cfg.data.val_fraction})",
                              "pass --dataset with a validation split, or train with "
                              "data.val_fraction > 0")
        try:
            workload.model.load_state_dict(state["model"])
        except RuntimeError:
            raise DataError(f"dataset {cfg.data.dataset} does not fit the checkpoint's model "
                            f"(sample shape {workload.splits.sample_shape}, "
                            f"{workload.splits.num_classes} classes)",
                            "evaluate on data shaped like the training data") from None
        ctx = rank.join()
        loader, num_valid = eval_loader(workload.splits.val, cfg.train.batch_size, ctx,
                                        worker_options(cfg))
        rank.close_at_exit(loader.close)  # its workers, before the CLI's os._exit
        with collective("the evaluation reduction", cfg.dist.timeout_seconds):
            _, result = evaluate(workload.model.to(ctx.device), workload.step, loader,
                                 num_valid, ctx)
        # null for a task without accuracy (regression, lm): its metrics are in `metrics`
        scores_accuracy = "accuracy" in result.task.names()
        report = {"accuracy": result.accuracy if scores_accuracy else None,
                  "correct": result.correct, "total": result.total, "loss": result.loss,
                  "metrics": result.metrics, "world_size": ctx.world_size, "checkpoint": str(path),
                  "dataset": cfg.data.dataset}
        if ctx.is_main:
            out = storage.shown(output_dir, write_json(str(out_dir), "eval.json", report))
            named = result.metrics
            # Classification's line as it was; another task names its own metrics.
            scored = (f"accuracy {result.accuracy!r} ({result.correct}/{result.total})"
                      if result.task.names() == ("accuracy",) else
                      " ".join(f"{k} {v!r}" for k, v in named.items())
                      + f" ({result.total} {result.task.weight})")
            print(f"{scored} -> {out}")
        rank.completed = True
        return report


def _staged_outputs(spec: str, rank: Rank) -> Path:
    """Where this rank writes `spec`'s files: the directory, or for ``s3://`` a staging folder
    whose files rank 0 uploads when it leaves (step logs of earlier runs downloaded first)."""
    local = storage.local_dir(spec)
    if storage.is_remote(spec):
        rank.close_at_exit(lambda: storage.drop_staging(spec))
        if rank.ctx.rank == 0:
            storage.pull_outputs(spec)
            rank.close_at_exit(lambda: _push_outputs(spec, rank))
    return local


def _push_outputs(spec: str, rank: Rank) -> None:
    """Upload the outputs as rank 0 leaves. After a finished run each file must arrive
    (retried as configured); after a failed one its own error is the line to show and the
    grace period is spent already: one try, a failure only a warning."""
    c = rank.cfg.checkpoint
    if rank.completed:
        storage.push_outputs(spec, Backoff(c.upload_retries, c.upload_deadline_seconds))
        return
    try:
        storage.push_outputs(spec, Backoff(retries=0))
    except StorageError as exc:
        log.warning("outputs of the failed run not uploaded: %s", exc.problem)


def _scored_checkpoint(path: str) -> dict[str, Any]:
    """The training checkpoint at `path` (its config and model at least), or one line."""
    try:
        return training_state(checkpoint.read(Path(path)), path, ("config", "model"))
    except CheckpointError:
        if not Path(path).exists():
            why, fix = missing(path, "pass a ckpt-*.pt file or a --checkpoint-dir")
            raise CheckpointError(f"checkpoint {path} {why}", fix) from None
        raise


def _scoring_config(state: dict[str, Any], path: str, dataset_spec: str | None,
                    timeout_seconds: float | None, given: dict[str, Any]) -> JobConfig:
    """The checkpoint's config with `dataset_spec` and the timeout put in, validated; a part
    that fit() was given as an object must be `given` again: the config cannot rebuild it."""
    cfg = merge(JobConfig(), saved_config(state, f"checkpoint {path}"), f"checkpoint {path}")
    if dataset_spec:
        cfg.data.dataset = dataset_spec
    if timeout_seconds is not None:
        cfg.dist.timeout_seconds = timeout_seconds
    validate(cfg)
    for part, described in dict(state.get("objects") or {}).items():
        replaced = part == "dataset" and dataset_spec
        if given.get(part) is None and not replaced:
            raise ConfigError(f"checkpoint {path}: its {part} ({described}) was passed to fit() "
                              "as an object, so the config cannot rebuild it",
                              f"call trainer.evaluate({path!r}, {part}=...) with the same "
                              f"{part}, or train with an import path in the config")
    return cfg
