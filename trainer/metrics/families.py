"""The metric families of one rank and how logged keys map onto them.

Metric names and labels are a public API (docs/metrics.md); change them only with a
deprecation. Every family carries the global ``rank`` label and nothing unbounded (never
step or epoch); ``namespace``/``pytorchjob``/``pod`` come from the scrape, not from us.

Gauges use ``multiprocess_mode="mostrecent"``: in multiprocess mode (one endpoint for all
local ranks) the newest write wins, so a restarted rank replaces the values its dead
predecessor left behind; in single-process mode the argument is ignored.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from trainer.metrics.phases import PhaseMetrics
from trainer.metrics.queueing import QueueMetrics

log = logging.getLogger(__name__)

MetricValue = float | Sequence[float]

SPLITS = ("train", "val")

# Host-side step durations: ~1 ms (tiny CPU models) to minutes (large models with
# gradient accumulation); roughly 2.5x apart so p50/p95 interpolate within ~25 %.
STEP_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    25.0,
    60.0,
    150.0,
)


@dataclass(frozen=True)
class RunInfo:
    """Identity of one rank; becomes the labels of ``trainer_info`` and ``rank``."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    backend: str
    strategy: str
    model: str
    dataset: str
    device: str
    version: str
    metrics: tuple[str, ...] = ("accuracy",)
    """The task's metric names (trainer.components.tasks; classification's by default): the
    ``name`` label of ``trainer_metric`` and ``trainer_global_metric``, created up front."""


class TrainerMetrics:
    """Creates every family on `registry` and all children up front.

    Creating the children here (not on first use) makes every series exist from start-up
    at zero, and in multiprocess mode it means every value object is created while the
    multiprocess value class is active.
    """

    def __init__(self, registry: CollectorRegistry, info: RunInfo) -> None:
        rank = str(info.rank)
        self.info = info
        self._warned: set[str] = set()
        is_rank0 = info.rank == 0
        is_cuda = info.device.startswith("cuda")

        loss = Gauge(
            "trainer_loss",
            "Loss of this rank: split=train is the mean over the last log interval, "
            "split=val the last validation.",
            ["rank", "split"],
            registry=registry,
            multiprocess_mode="mostrecent",
        )
        accuracy = Gauge(
            "trainer_accuracy_ratio",
            "Accuracy (0-1) of this rank: split=train over the last log interval, "
            "split=val the last validation on this rank's shard.",
            ["rank", "split"],
            registry=registry,
            multiprocess_mode="mostrecent",
        )
        self.loss = {s: loss.labels(rank, s) for s in SPLITS}
        # A task without accuracy (regression, lm) exports none: no series stuck at a false 0.
        scores_accuracy = "accuracy" in info.metrics
        self.accuracy = {s: accuracy.labels(rank, s) for s in SPLITS} if scores_accuracy else {}

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, ["rank"], registry=registry).labels(rank)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(
                name, doc, ["rank"], registry=registry, multiprocess_mode="mostrecent"
            ).labels(rank)

        self.steps = counter("trainer_steps", "Optimizer steps taken by this rank.")
        self.samples = counter("trainer_samples", "Training samples processed by this rank.")
        self.step_duration = Histogram(
            "trainer_step_duration_seconds",
            "Host wall time of one optimizer step on this rank.",
            ["rank"],
            registry=registry,
            buckets=STEP_BUCKETS,
        ).labels(rank)
        self.data_wait = counter(
            "trainer_data_wait_seconds",
            "Seconds this rank was blocked waiting for the next batch from the DataLoader; "
            "its rate is the fraction of wall time the rank is input-bound.",
        )
        self.forward = counter(
            "trainer_forward_seconds",
            "Seconds this rank spent in the step function (forward and loss), without the "
            "data wait and the gradient all-reduce; per step, a straggler's exceeds its peers'.",
        )
        self.cpu_throttled = counter(
            "trainer_cpu_throttled_seconds",
            "Seconds the CFS quota of this rank's container (its cgroup's cpu.stat) held it "
            "back: a CPU limit, or a quota cut by hand. While a rank is throttled, the step "
            "function times of ranks sharing its cores are not comparable.",
        )
        self.restarts = counter(
            "trainer_restarts",
            "Restarts of the worker group (TORCHELASTIC_RESTART_COUNT) or of the pod "
            "seen by this rank.",
        )

        self.lr = gauge("trainer_learning_rate", "Current learning rate of the optimizer.")
        self.grad_norm = gauge(
            "trainer_grad_norm",
            "Largest global L2 norm of the gradients before clipping in the last log interval "
            "(only with optim.grad_clip > 0).",
        )
        self.skipped_steps = counter(
            "trainer_skipped_steps",
            "Optimizer steps skipped by the fp16 GradScaler (inf/NaN gradients).",
        )
        self.epoch = gauge("trainer_epoch", "Current epoch (0-based).")
        self.progress = gauge(
            "trainer_progress_ratio", "Global step divided by the planned steps (0-1)."
        )
        self.last_step = gauge(
            "trainer_last_step_timestamp_seconds",
            "Unix time of the last optimizer step of this rank (0 before the first).",
        )
        self.start_time = gauge(
            "trainer_start_timestamp_seconds", "Unix time this rank process started."
        )
        self.world_size = gauge("trainer_world_size", "Number of ranks in the job.")
        self.resumed_step = gauge(
            "trainer_resumed_step", "Global step this run resumed from (0 for a fresh run)."
        )
        self.info_gauge = Gauge(
            "trainer_info",
            "Constant 1; labels describe the run of this rank.",
            ["rank", "local_rank", "version", "backend", "strategy", "model", "dataset", "device"],
            registry=registry,
            multiprocess_mode="mostrecent",
        ).labels(
            rank,
            str(info.local_rank),
            info.version,
            info.backend,
            info.strategy,
            info.model,
            info.dataset,
            info.device,
        )

        # Only rank 0 saves checkpoints and reports the job-wide validation result: other
        # ranks would export series that stay 0 forever or duplicate rank 0's.
        self.last_checkpoint: Gauge | None = None
        self.durable_checkpoint: Gauge | None = None
        self.failed_saves: Counter | None = None
        self.global_loss: Gauge | None = None
        self.global_accuracy: Gauge | None = None
        if is_rank0:
            self.last_checkpoint = gauge(
                "trainer_last_checkpoint_timestamp_seconds",
                "Unix time of the last checkpoint saved (rank 0 only; 0 before the first).",
            )
            self.durable_checkpoint = gauge(
                "trainer_checkpoint_durable_step",
                "Step of the newest checkpoint this run made durable: written, and uploaded "
                "for an s3:// checkpoint.dir (rank 0 only; 0 before the first).",
            )
            self.failed_saves = counter(
                "trainer_checkpoint_failed_saves",
                "Checkpoints skipped because their upload failed after every retry; training "
                "went on from the last durable one (rank 0 only).",
            )
            self.global_loss = Gauge(
                "trainer_global_loss",
                "Exact loss of the last validation over the whole validation set (rank 0 only).",
                ["rank", "split"],
                registry=registry,
                multiprocess_mode="mostrecent",
            ).labels(rank, "val")
        if is_rank0 and scores_accuracy:
            self.global_accuracy = Gauge(
                "trainer_global_accuracy_ratio",
                "Exact accuracy (0-1) of the last validation over the whole validation set "
                "(rank 0 only).",
                ["rank", "split"],
                registry=registry,
                multiprocess_mode="mostrecent",
            ).labels(rank, "val")

        # The task's named metrics (MAE, RMSE, perplexity, ...; accuracy too): one series per
        # declared name, so a panel or an alert finds them all from start-up.
        named_family = Gauge(
            "trainer_metric",
            "A metric the task declares (label name: accuracy, mae, rmse, perplexity, "
            "token_accuracy, or a custom step's), of this rank's shard of the last validation.",
            ["rank", "split", "name"],
            registry=registry,
            multiprocess_mode="mostrecent",
        )
        self.named = {n: named_family.labels(rank, "val", n) for n in info.metrics}
        self.global_named: dict[str, Gauge] = {}
        if is_rank0:
            global_family = Gauge(
                "trainer_global_metric",
                "A metric the task declares, exact over the whole validation set of the last "
                "validation (rank 0 only).",
                ["rank", "split", "name"],
                registry=registry,
                multiprocess_mode="mostrecent",
            )
            self.global_named = {n: global_family.labels(rank, "val", n) for n in info.metrics}

        self.cuda_allocated: Gauge | None = None
        self.cuda_max_allocated: Gauge | None = None
        if is_cuda:
            self.cuda_allocated = gauge(
                "trainer_cuda_memory_allocated_bytes",
                "CUDA memory currently allocated by tensors of this rank.",
            )
            self.cuda_max_allocated = gauge(
                "trainer_cuda_memory_max_allocated_bytes",
                "Peak CUDA memory allocated by tensors of this rank.",
            )

        # In multiprocess mode a gauge never set() is not exported at all (its file entry
        # has timestamp 0), and one set by a dead predecessor would win; set() stamps the
        # value, so every series exists from start-up and a fresh process's zeros win.
        zeroed = (
            *self.loss.values(),
            *self.accuracy.values(),
            self.lr,
            self.grad_norm,
            self.epoch,
            self.progress,
            self.last_step,
            self.resumed_step,
            self.last_checkpoint,
            self.durable_checkpoint,
            self.global_loss,
            self.global_accuracy,
            self.cuda_allocated,
            self.cuda_max_allocated,
            *self.named.values(),
            *self.global_named.values(),
        )
        for g in zeroed:
            if g is not None:
                g.set(0.0)
        self.info_gauge.set(1.0)
        self.world_size.set(float(info.world_size))
        self.start_time.set(time.time())

        self._restarts_seen = 0.0
        self._handlers: dict[str, Callable[[MetricValue], None]] = {
            "train/loss": self._setter(self.loss["train"]),
            "train/steps": self._incrementer(self.steps),
            "train/samples": self._incrementer(self.samples),
            "train/step_seconds": self._observe_steps,
            "train/data_wait_seconds": self._incrementer(self.data_wait),
            "train/forward_seconds": self._incrementer(self.forward),
            "train/cpu_throttled_seconds": self._incrementer(self.cpu_throttled),
            "train/lr": self._setter(self.lr),
            "train/grad_norm": self._setter(self.grad_norm),
            "train/skipped_steps": self._incrementer(self.skipped_steps),
            "train/epoch": self._setter(self.epoch),
            "train/progress_ratio": self._setter(self.progress),
            "train/last_step_timestamp": self._setter(self.last_step),
            "val/loss": self._setter(self.loss["val"]),
            "run/restarts": self._set_restarts,
            "run/resumed_step": self._setter(self.resumed_step),
        }
        optional: dict[str, Gauge | None] = {
            "checkpoint/last_timestamp": self.last_checkpoint,
            "checkpoint/durable_step": self.durable_checkpoint,
            "val/global_loss": self.global_loss,
            "val/global_accuracy": self.global_accuracy,
            "train/accuracy": self.accuracy.get("train"),
            "val/accuracy": self.accuracy.get("val"),
            "cuda/memory_allocated_bytes": self.cuda_allocated,
            "cuda/max_memory_allocated_bytes": self.cuda_max_allocated,
        }
        for key, target in optional.items():
            if target is not None:
                self._handlers[key] = self._setter(target)
        if self.failed_saves is not None:
            self._handlers["checkpoint/failed_saves"] = self._incrementer(self.failed_saves)
        for name, child in self.named.items():
            self._handlers[f"val/metric/{name}"] = self._setter(child)
        for name, child in self.global_named.items():
            self._handlers[f"val/global_metric/{name}"] = self._setter(child)
        self.phases = PhaseMetrics(registry, rank)
        self._handlers.update(self.phases.handlers(self._scalar))
        if is_rank0:
            self._handlers.update(QueueMetrics(registry, rank).handlers(self._scalar))

    def set_restarts_baseline(self, already_counted: float) -> None:
        """Restarts already counted for this rank by earlier (dead) processes.

        In multiprocess mode counters are summed over every process file of the rank, so
        the first log of ``run/restarts`` must only add what those have not counted yet.
        """
        self._restarts_seen = already_counted

    def update(self, metrics: Mapping[str, MetricValue]) -> None:
        """Apply one log call. Unknown keys are ignored (the trainer may log more than we
        export); a malformed value is skipped with one warning per key, because metrics
        must never stop training."""
        for key, value in metrics.items():
            handler = self._handlers.get(key)
            if handler is None:
                continue
            try:
                handler(value)
            except (TypeError, ValueError) as err:
                if key not in self._warned:
                    self._warned.add(key)
                    log.warning("metrics: ignoring %s=%r: %s", key, value, err)

    # -- handlers --------------------------------------------------------------------

    @staticmethod
    def _scalar(value: MetricValue) -> float:
        if isinstance(value, (str, bytes)) or not isinstance(value, (int, float)):
            raise TypeError(f"expected a number, got {type(value).__name__}")
        return float(value)

    def _setter(self, child: Gauge) -> Callable[[MetricValue], None]:
        def handle(value: MetricValue) -> None:
            child.set(self._scalar(value))

        return handle

    def _incrementer(self, child: Counter) -> Callable[[MetricValue], None]:
        def handle(value: MetricValue) -> None:
            amount = self._scalar(value)
            if not math.isfinite(amount) or amount < 0:
                raise ValueError("a counter increment must be finite and >= 0")
            child.inc(amount)

        return handle

    def _observe_steps(self, value: MetricValue) -> None:
        if isinstance(value, (int, float)):
            value = [float(value)]
        durations = [self._scalar(v) for v in value]
        for d in durations:
            if math.isfinite(d) and d >= 0:
                self.step_duration.observe(d)

    def _set_restarts(self, value: MetricValue) -> None:
        # run/restarts is an absolute count; the counter tracks it by adding the difference.
        total = self._scalar(value)
        if not math.isfinite(total):
            raise ValueError("restarts must be finite")
        if total > self._restarts_seen:
            self.restarts.inc(total - self._restarts_seen)
            self._restarts_seen = total
