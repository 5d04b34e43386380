"""What one rank does: join the group, build the pieces, train or evaluate, tear down."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch.distributed as dist

from trainer import __version__, checkpoint
from trainer.config import JobConfig, merge, validate
from trainer.data import load_splits
from trainer.distributed import DistContext, init_distributed, teardown
from trainer.errors import CheckpointError, DataError, Preempted, RankLost
from trainer.evaluate import evaluate
from trainer.metrics import RunInfo, build_metrics
from trainer.models import build_model
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


def run_info(cfg: JobConfig, ctx: DistContext, dataset: str) -> RunInfo:
    return RunInfo(rank=ctx.rank, local_rank=ctx.local_rank, world_size=ctx.world_size,
                   local_world_size=ctx.local_world_size, backend=ctx.backend,
                   strategy=cfg.train.strategy, model=cfg.model.name, dataset=dataset,
                   device=ctx.device.type, version=__version__)


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


def train(cfg: JobConfig) -> dict[str, Any]:
    """Train on this rank; rank 0 writes ``summary.json``. Returns the summary.

    After a completed run the process group is left initialized (see
    :func:`trainer.distributed.teardown`); the CLI exits the process right after.
    """
    splits = load_splits(cfg.data, cfg.train.seed)  # before joining: bad data fails fast
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
        metrics = build_metrics(cfg.metrics, run_info(cfg, ctx, splits.name))
        metrics.log({"run/restarts": float(restart_count())}, 0)
        trainer = Trainer(cfg, ctx, splits, metrics, stop)
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


def evaluate_checkpoint(path: str, dataset: str | None, output_dir: str) -> dict[str, Any]:
    """Score the validation split of the checkpoint's (or `dataset`'s) data on this rank."""
    try:
        state = checkpoint.read(Path(path))
    except CheckpointError:
        if not Path(path).exists():
            raise CheckpointError(f"checkpoint {path} does not exist",
                                  "pass a ckpt-*.pt file from --checkpoint-dir") from None
        raise
    cfg = merge(JobConfig(), state["config"], f"checkpoint {path}")
    if dataset:
        cfg.data.dataset = dataset
    validate(cfg)
    splits = load_splits(cfg.data, cfg.train.seed)
    ctx = init_distributed(cfg.dist, cfg.train.device)
    completed = False
    try:
        model = build_model(cfg.model, splits.feature_shape, splits.num_classes,
                            cfg.train.seed).to(ctx.device)
        try:
            model.load_state_dict(state["model"])
        except RuntimeError:
            raise DataError(f"dataset {cfg.data.dataset} does not fit the checkpoint's model "
                            f"(features {splits.feature_shape}, {splits.num_classes} classes)",
                            "evaluate on data shaped like the training data") from None
        _, result = evaluate(model, splits.val, ctx, cfg.train.batch_size)
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
