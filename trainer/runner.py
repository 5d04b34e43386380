"""What one rank does: join the group, build the pieces, train or evaluate, tear down."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch import nn

from trainer import __version__, checkpoint
from trainer.build import Workload, build_parts, build_workload, preflight
from trainer.config import JobConfig, merge, validate
from trainer.distributed import DistContext, init_distributed, local_device, teardown
from trainer.errors import CheckpointError, ConfigError, DataError, Preempted, RankLost
from trainer.evaluation import evaluate
from trainer.loaders import eval_loader
from trainer.metrics import RunInfo, build_metrics
from trainer.steps import StepFn
from trainer.stopping import StopFlag
from trainer.trainer import Trainer

log = logging.getLogger(__name__)


def write_json(directory: str, name: str, payload: dict[str, Any]) -> Path:
    """Write `payload` atomically so a reader never sees half a file."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{name}.tmp"
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, out / name)
    return out / name


def run_info(cfg: JobConfig, ctx: DistContext, workload: Workload) -> RunInfo:
    return RunInfo(rank=ctx.rank, local_rank=ctx.local_rank, world_size=ctx.world_size,
                   local_world_size=ctx.local_world_size, backend=ctx.backend,
                   strategy=cfg.train.strategy, model=workload.model_name,
                   dataset=workload.splits.name, device=ctx.device.type, version=__version__)


def restart_count() -> int:
    """Restarts of this job so far: torch's elastic agent counts them in the environment."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


# Gloo and NCCL word their failures in many ways ("Connection reset by peer", "Application
# timeout caused pair closure", "NCCL communicator was aborted", ...); all name the transport
# or a timeout. The first line of the original error is kept in the message.
_LOST_RANK_SIGNS = ("gloo", "Gloo", "NCCL", "nccl", "ProcessGroup", "Connection", "pair closure",
                    "Broken pipe", "timed out", "Timed out", "timeout", "Timeout")


def lost_rank_error(err: Exception, cfg: JobConfig) -> RankLost | None:
    """A collective failure caused by another rank, as one clear error; None otherwise."""
    text = str(err)
    if not isinstance(err, dist.DistError) and not any(s in text for s in _LOST_RANK_SIGNS):
        return None
    first = text.strip().splitlines()[0][:200] if text.strip() else type(err).__name__
    return RankLost(
        f"another rank stopped responding or died (collective failed: {first}); "
        f"collectives time out after dist.timeout_seconds={cfg.dist.timeout_seconds:g}",
        "read the other ranks' logs for the first error; raise --timeout only if a step "
        "legitimately takes longer")


def train(cfg: JobConfig, *, model: nn.Module | None = None, dataset: Any = None,
          step: StepFn | None = None) -> dict[str, Any]:
    """Train on this rank; rank 0 writes ``summary.json``. Returns the summary.

    `model`, `dataset` and `step` replace what the config names (see :func:`trainer.fit`).
    After a completed run the process group is left initialized (see
    :func:`trainer.distributed.teardown`); the CLI exits the process right after.
    """
    # Before joining: bad input fails fast, on every rank alike, with one line.
    workload = build_workload(cfg, model=model, dataset=dataset, step=step)
    preflight(workload, local_device(cfg.train.device), cfg.train.batch_size)
    if cfg.checkpoint.dir:
        checkpoint.check_writable(Path(cfg.checkpoint.dir))
    stop = StopFlag()
    stop.install()  # before joining, so an early SIGTERM is not lost
    ctx = init_distributed(cfg.dist, cfg.train.device)
    metrics = None
    trainer = None
    group_broken = False
    completed = False
    try:
        metrics = build_metrics(cfg.metrics, run_info(cfg, ctx, workload))
        metrics.log({"run/restarts": float(restart_count())}, 0)
        trainer = Trainer(cfg, ctx, build_parts(cfg, ctx, workload), metrics, stop,
                          workload.objects)
        trainer.maybe_resume()
        try:
            summary = trainer.train()
        except Preempted:
            completed = True  # every rank stopped at the same agreed step
            raise
        except (RuntimeError, dist.DistError) as err:
            lost = lost_rank_error(err, cfg) if ctx.initialized else None
            if lost is None:
                raise
            group_broken = True
            raise lost from err
        completed = True
        if ctx.is_main:
            path = write_json(cfg.output.dir, "summary.json", summary)
            log.info("done: %d steps, %.0f samples/s, train loss %.4f, val accuracy %.4f "
                     "(%d/%d) -> %s", summary["steps"], summary["samples_per_second"],
                     summary["train_loss"] or float("nan"), summary["val_accuracy"],
                     summary["val_correct"], summary["val_total"], path)
        return summary
    finally:
        stop.uninstall()
        if trainer is not None:
            trainer.writer.close()
        if metrics is not None:
            metrics.close()
        if not group_broken:  # tearing down a broken group can hang or abort the process
            teardown(ctx, completed)


def evaluate_checkpoint(path: str, dataset_spec: str | None, output_dir: str, *,
                        model: nn.Module | None = None, dataset: Any = None,
                        step: StepFn | None = None) -> dict[str, Any]:
    """Score the validation split of the checkpoint's (or `dataset_spec`'s) data on this rank.

    The model is rebuilt from the checkpoint's config by the code that trained it; parts that
    were passed to fit() as objects must be passed here again (`model`, `dataset`, `step`).
    """
    try:
        state = checkpoint.read(Path(path))
    except CheckpointError:
        if not Path(path).exists():
            raise CheckpointError(f"checkpoint {path} does not exist",
                                  "pass a ckpt-*.pt file from --checkpoint-dir") from None
        raise
    cfg = merge(JobConfig(), state["config"], f"checkpoint {path}")
    if dataset_spec:
        cfg.data.dataset = dataset_spec
    validate(cfg)
    given = {"model": model, "dataset": dataset if not dataset_spec else None, "step": step}
    for part, described in dict(state.get("objects") or {}).items():
        if given.get(part) is None and not (part == "dataset" and dataset_spec):
            raise ConfigError(f"checkpoint {path}: its {part} ({described}) was passed to fit() "
                              "as an object, so the config cannot rebuild it",
                              f"call trainer.evaluate({path!r}, {part}=...) with the same "
                              f"{part}, or train with an import path in the config")
    workload = build_workload(cfg, model=model, dataset=given["dataset"], step=step)
    preflight(workload, local_device(cfg.train.device), cfg.train.batch_size)
    ctx = init_distributed(cfg.dist, cfg.train.device)
    completed = False
    try:
        net = workload.model.to(ctx.device)
        try:
            net.load_state_dict(state["model"])
        except RuntimeError:
            raise DataError(f"dataset {cfg.data.dataset} does not fit the checkpoint's model "
                            f"(sample shape {workload.splits.sample_shape}, "
                            f"{workload.splits.num_classes} classes)",
                            "evaluate on data shaped like the training data") from None
        loader, num_valid = eval_loader(workload.splits.val, cfg.train.batch_size, ctx,
                                        cfg.data.num_workers)
        _, result = evaluate(net, workload.step, loader, num_valid, ctx)
        report = {"accuracy": result.accuracy, "correct": result.correct, "total": result.total,
                  "loss": result.loss, "world_size": ctx.world_size, "checkpoint": str(path),
                  "dataset": cfg.data.dataset}
        if ctx.is_main:
            out = write_json(output_dir, "eval.json", report)
            print(f"accuracy {result.accuracy!r} ({result.correct}/{result.total}) -> {out}")
        completed = True
        return report
    finally:
        teardown(ctx, completed)
