"""Typed configuration: one dataclass per component, one source of truth.

Every field has a default, a docstring (the CLI help, the table of docs/configuration.md) and,
where it has them, its names (:func:`one_of`, a :class:`Registry`) and bounds
(:func:`limits`), which :mod:`trainer.config_load` enforces and the chart's values schema
lists. Checkpoints store the config with :data:`CONFIG_VERSION`; :data:`MIGRATIONS` reads
older layouts.
"""

from __future__ import annotations

import dataclasses
import importlib
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from trainer.errors import ConfigError


class Registry(Sequence[str]):
    """The names of a registry of named builders, read from the module that holds it (the one
    list of those names) each time they are asked for: the registries import torch, the config
    does not, and a builder added at run time is a valid name at once."""

    def __init__(self, where: str) -> None:
        self.where = where
        """``package.module:ATTRIBUTE``, a mapping keyed by the names."""

    @property
    def names(self) -> tuple[str, ...]:  # read each time: a module's attribute, ~1 us
        module, _, attribute = self.where.partition(":")
        return tuple(getattr(importlib.import_module(module), attribute))

    @typing.overload
    def __getitem__(self, index: int) -> str: ...
    @typing.overload
    def __getitem__(self, index: slice) -> Sequence[str]: ...
    def __getitem__(self, index: int | slice) -> str | Sequence[str]:
        return self.names[index]

    def __len__(self) -> int:
        return len(self.names)

    def __iter__(self) -> typing.Iterator[str]:
        return iter(self.names)

    def __contains__(self, name: object) -> bool:
        return name in self.names


DATASET_NAMES = Registry("trainer.data.source:BUILTIN_DATASETS")
DATA_FORMATS = ("auto", "npy", "images", "arrow", "parquet", "csv", "npz")
WORKER_STARTS = ("forkserver", "spawn", "fork")
MODEL_NAMES = Registry("trainer.components.models:BUILTIN_MODELS")
STEP_NAMES = Registry("trainer.components.steps:BUILTIN_STEPS")
OPTIMIZERS = Registry("trainer.components.optim:OPTIMIZERS")
SCHEDULES = Registry("trainer.components.optim:SCHEDULES")
PRECISIONS = ("fp32", "bf16", "fp16")
STRATEGIES = ("ddp", "fsdp", "dp")
SAMPLERS = ("shuffle", "torch")
BACKENDS = ("auto", "nccl", "gloo")
DEVICES = ("auto", "cpu", "cuda")
MAX_TIMEOUT_SECONDS = 365 * 24 * 3600.0
"""Longest timeout accepted (a year); torch's stores and C++ timers overflow far above it."""
MAX_CPU_THREADS = 1024
"""Most intra-op threads a rank may be given (`train.cpu_threads`, `OMP_NUM_THREADS`): more is
a typo (a machine with more cores than this is rare); a count above the usable cores is capped
at them (trainer/distributed/threads.py)."""
MAX_LINGER_SCRAPES = 100
"""Most scrapes a completed run may wait for before it stops serving (`metrics.linger_scrapes`;
`metrics.linger_seconds` bounds the wait anyway)."""
INT_BITS = 64
"""Config ints are 64-bit signed (torch seeds, counters, sizes)."""


def one_of(names: Sequence[str]) -> dict[str, Any]:
    """Field metadata: the value is one of `names`. :func:`trainer.config_load.validate`
    enforces it with a message naming the fix; the chart's values schema
    (tools/chart_schema.py) lists them so that ``helm install`` refuses a typo before any pod
    starts."""
    return {"enum": names}


def limits(**bounds: float) -> dict[str, Any]:
    """Field metadata: JSON Schema bounds (`minimum`, `maximum`, `exclusiveMinimum`,
    `exclusiveMaximum`) that :func:`trainer.config_load.validate` enforces too
    (tests/test_config_limits.py checks that they agree)."""
    return dict(bounds)


def numbers(count: int, **item_bounds: float) -> dict[str, Any]:
    """Field metadata of a list of numbers: exactly `count` of them, each within JSON Schema
    bounds (as :func:`limits`), enforced by :func:`trainer.config_load.validate` and written
    into the chart's values schema."""
    return {"minItems": count, "maxItems": count, "items": {"type": "number", **item_bounds}}


@dataclass
class DataConfig:
    dataset: str = "digits"
    """`digits` (scikit-learn's bundled 8x8 digits, no download), `synthetic` (random
    tensors, as in the article this project grew from), a path (a `.npz`, `.csv` or
    `.parquet` file, or a directory: x.npy + y.npy, image class folders, a `save_to_disk`
    directory, Parquet files, or `train/` + `val/` splits of one of these; see
    docs/data.md; `s3://bucket/key-or-prefix`: one of these in S3, copied into
    `cache_dir` once per machine), or an import path `package.module:callable` returning a
    map-style Dataset or a (train, val) pair of them."""
    format: str = field(default="auto", metadata=one_of(DATA_FORMATS))
    """What a `dataset` path holds: `auto` (detected from the files, and logged), `npy`,
    `images`, `arrow` (save_to_disk), `parquet`, `csv` or `npz`; only `auto` with a built-in
    or import-path dataset."""
    options: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of an import-path dataset callable (free-form)."""
    num_classes: int = field(default=0, metadata=limits(minimum=0))
    """Number of classes; 0 infers max(label) + 1 (image folders: the number of class
    folders; an import-path dataset: its `num_classes` or class names, else the labels it
    exposes as `targets` or `labels`, else a model callable taking `num_classes` stops
    asking for this field). A label outside [0, num_classes) is an error."""
    label_column: str = "label"
    """Name of the label column (integer class indices) of a CSV, Parquet or Arrow table."""
    feature_columns: list[str] = field(default_factory=list)
    """Feature columns of a table: numeric scalars, or one column of equal-length (nested)
    lists of numbers; empty: every column but the label column."""
    val_fraction: float = field(default=0.2, metadata=limits(minimum=0, exclusiveMaximum=1))
    """Fraction of the dataset held out for validation (0 <= f < 1), split deterministically
    from `train.seed`; unused when the data has its own `train/` and `val/` splits."""
    image_size: int = field(default=224, metadata=limits(minimum=8))
    """Side of the square images fed to the model: random resized crop for training,
    resize + center crop (of `image_size / 0.875`) for validation."""
    image_mean: list[float] = field(default_factory=lambda: [0.485, 0.456, 0.406])
    """Per-channel (RGB) mean subtracted from images scaled to [0, 1] (ImageNet's)."""
    image_std: list[float] = field(default_factory=lambda: [0.229, 0.224, 0.225])
    """Per-channel (RGB) standard deviation images are divided by (ImageNet's)."""
    cache_dir: str = ""
    """Where Parquet files are converted once into a memory-mapped Arrow file (empty: the
    Hugging Face datasets cache, `$HF_DATASETS_CACHE` or ~/.cache/huggingface/datasets); it
    needs room for the selected columns. An `s3://` dataset is copied into `s3/` here (empty:
    `ddp-trainer-data` in the temporary directory)."""
    synthetic_samples: int = field(default=1200, metadata=limits(minimum=1))
    """Number of samples of the `synthetic` dataset."""
    synthetic_features: int = field(default=10, metadata=limits(minimum=1))
    """Features per sample of the `synthetic` dataset (the seed uses 10)."""
    synthetic_classes: int = field(default=10, metadata=limits(minimum=2))
    """Classes of the `synthetic` dataset (the seed uses 10)."""
    num_workers: int = field(default=0, metadata=limits(minimum=0))
    """DataLoader worker processes per rank; 0 loads in the training process, which is
    fastest for in-memory tensors; images need workers (about one per core a rank can
    spare)."""
    prefetch_factor: int = field(default=2, metadata=limits(minimum=1))
    """Batches each worker prepares ahead (with `num_workers` > 0)."""
    persistent_workers: bool = True
    """Keep the workers between epochs (with `num_workers` > 0) instead of restarting them
    and re-opening the data every epoch."""
    worker_start: str = field(default="forkserver", metadata=one_of(WORKER_STARTS))
    """How worker processes start (with `num_workers` > 0): `forkserver` forks them from a
    clean single-threaded server, so no lock held by a training thread can hang them; `spawn`
    starts fresh interpreters (slower); `fork` copies the training process (the dataset need
    not pickle, but a worker can then hang for ever on CPython 3.11.7 and older: gloo's
    threads take an interpreter lock every step, python/cpython#112275). With `forkserver` and
    `spawn` the dataset is pickled to each worker and a user script needs
    `if __name__ == "__main__":`."""


@dataclass
class ModelConfig:
    name: str = "mlp"
    """`mymodel` (the two-layer Linear->Linear model of the article this project grew from:
    see the README), `mlp`, `cnn` (image-shaped data), or an import path
    `package.module:callable` returning an nn.Module; it is called with `num_classes` and
    `sample_shape` (when the dataset defines them and it accepts them) and `options`."""
    options: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the model callable (free-form); they override the fields below
    for the built-in models."""
    hidden_sizes: list[int] = field(default_factory=lambda: [128, 64])
    """Hidden layer widths of `mlp`; the first one is also `mymodel`'s hidden width."""
    cnn_channels: list[int] = field(default_factory=lambda: [16, 32])
    """Output channels of the two convolution blocks of `cnn`."""


@dataclass
class OptimConfig:
    name: str = field(default="sgd", metadata=one_of(OPTIMIZERS))
    """Optimizer: `sgd`, `adamw` or `adam` (torch.optim; its fused kernels when every trainable
    parameter is floating point on one CPU or CUDA device)."""
    lr: float = field(default=0.05, metadata=limits(exclusiveMinimum=0))
    """Peak learning rate (set it for the optimizer: e.g. 1e-3 for adamw)."""
    momentum: float = field(default=0.9, metadata=limits(minimum=0, exclusiveMaximum=1))
    """SGD momentum."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999],
                               metadata=numbers(2, minimum=0, exclusiveMaximum=1))
    """Adam/AdamW coefficients of the running averages of the gradient and its square."""
    eps: float = field(default=1e-8, metadata=limits(exclusiveMinimum=0))
    """Adam/AdamW term added to the denominator for numerical stability."""
    weight_decay: float = field(default=0.0, metadata=limits(minimum=0))
    """Weight decay: L2 for sgd and adam (all parameters); decoupled for adamw, and there
    not applied to parameters with fewer than 2 dimensions (biases, norm weights)."""
    schedule: str = field(default="constant", metadata=one_of(SCHEDULES))
    """Learning-rate schedule after the warm-up, per optimizer step: `constant`, `cosine`
    (to `min_lr` at the last planned step), `linear` (likewise) or `step` (x `gamma` every
    `step_size` steps)."""
    warmup_steps: int = field(default=0, metadata=limits(minimum=0))
    """Optimizer steps of linear warm-up from lr/warmup_steps to lr (0: none)."""
    min_lr: float = field(default=0.0, metadata=limits(minimum=0))
    """Learning rate that `cosine` and `linear` reach at the last planned step."""
    step_size: int = field(default=1000, metadata=limits(minimum=1))
    """Optimizer steps between decays of the `step` schedule."""
    gamma: float = field(default=0.1, metadata=limits(exclusiveMinimum=0, maximum=1))
    """Decay factor of the `step` schedule."""
    grad_clip: float = field(default=0.0, metadata=limits(minimum=0))
    """Clip the global L2 norm of the gradients to this (0: off); the norm before clipping is
    exported as trainer_grad_norm."""


@dataclass
class TrainConfig:
    epochs: int = field(default=10, metadata=limits(minimum=1))
    """Number of passes over the training split."""
    max_steps: int = field(default=0, metadata=limits(minimum=0))
    """Stop after this many optimizer steps in total (0: no limit)."""
    batch_size: int = field(default=32, metadata=limits(minimum=1))
    """Samples per rank per forward/backward pass (micro-batch); the global batch is
    batch_size x world size x grad_accum_steps."""
    seed: int = field(default=0, metadata=limits(minimum=0, exclusiveMaximum=2 ** (INT_BITS - 1)))
    """Seed of the data split, the shuffling and the model initialisation."""
    strategy: str = field(default="ddp", metadata=one_of(STRATEGIES))
    """`ddp` (DistributedDataParallel, recommended), `fsdp` (FSDP2: parameters, gradients and
    optimizer state sharded over the ranks, for models larger than one device; see
    `fsdp_wrap`) or `dp` (single-node DataParallel, as the article ran it)."""
    fsdp_wrap: list[str] = field(default_factory=list)
    """With `strategy: fsdp`, the module classes sharded as one unit each (class names found
    in the model, or import paths); empty: a `transformers` model's decoder/encoder layers
    (its `_no_split_modules`), else every Linear and Conv2d layer; the root takes the rest."""
    sampler: str = field(default="shuffle", metadata=one_of(SAMPLERS))
    """Training sampler: `shuffle` (ddp-trainer's memory-free, resumable sampler) or
    `torch` (torch.utils.data.distributed.DistributedSampler)."""
    precision: str = field(default="fp32", metadata=one_of(PRECISIONS))
    """`fp32`, `bf16` (autocast, on CPU and CUDA) or `fp16` (CUDA only: autocast and a
    GradScaler; steps skipped for inf gradients are counted and do not advance the
    schedule)."""
    grad_accum_steps: int = field(default=1, metadata=limits(minimum=1))
    """Micro-batches per optimizer step (DDP syncs gradients on the last one only); the
    global batch is batch_size x world size x grad_accum_steps."""
    compile: bool = False
    """Wrap the model with torch.compile; a backend that cannot compile here is an error,
    never a silent fallback to eager."""
    step: str = "classification"
    """The training and evaluation step: `classification` (cross-entropy on `(inputs,
    labels)` batches, or the model's own loss on mapping batches with a `labels` key; accuracy),
    `regression` (mean squared error; MAE, RMSE), `lm` (next-token cross entropy; perplexity,
    token accuracy), or an import path to a callable `(model, batch) -> (loss, correct,
    count)` or a mapping of its task's named sums (docs/custom-code.md)."""
    log_every: int = field(default=10, metadata=limits(minimum=1))
    """Steps between progress lines, metric updates and the ranks' stop/divergence check (one
    device sync each); with steps faster than `log_seconds` / `log_every`, more steps."""
    log_seconds: float = field(default=1.0, metadata=limits(minimum=0))
    """Least time between those reports: an interval spans at least `log_every` steps and, by
    the ranks' agreed step time, about this long (0: exactly `log_every` steps), across epoch
    ends if epochs are shorter. Each report costs ~1 ms on a CPU rank, 3 % of a 3 ms step's
    interval of 10 steps."""
    stop_check_seconds: float = field(default=15.0, metadata=limits(exclusiveMinimum=0))
    """Bound on how long a SIGTERM or a diverged loss waits to be acted on when steps are slow:
    checks then come every few steps instead of every `log_every`. Keep it well under the
    pod's termination grace period (the chart sets it from that)."""
    device: str = field(default="auto", metadata=one_of(DEVICES))
    """`auto` (CUDA when available), `cpu` or `cuda`."""
    cpu_threads: int = field(default=0, metadata=limits(minimum=0, maximum=MAX_CPU_THREADS))
    """Intra-op CPU threads of each rank; 0: `OMP_NUM_THREADS` if set, else the pod's CPU
    (its limit, else its request, else the cgroup quota, else the cores) divided by the ranks
    in the pod, at least 1; at most the cores the rank may use (more are capped). Logged once
    by rank 0. More threads than cores spin: 2 one-rank
    pods of 2 threads each on 2 cores spent 31.7 % of rank 0's time in libgomp."""


@dataclass
class CheckpointConfig:
    dir: str = ""
    """Directory for checkpoints; empty disables checkpointing. A run that finds a valid
    checkpoint here resumes from it. `s3://bucket/prefix`: in S3 or an S3-compatible store
    (the `s3` extra; the AWS variables, `AWS_ENDPOINT_URL`: docs/checkpoints.md)."""
    every: int = field(default=0, metadata=limits(minimum=0))
    """Checkpoint every N optimizer steps (0: off). With `every_seconds` also 0, every epoch
    end is checkpointed. The end of training and a SIGTERM are always checkpointed."""
    every_seconds: float = field(default=300.0, metadata=limits(minimum=0))
    """Checkpoint when this long has passed since the last checkpoint, by rank 0's clock,
    agreed by the ranks within two checks (~2 x `train.log_seconds`); 0: off. A crash loses
    at most about this much training. A save of the chart's default job costs ~2 ms of CPU
    and ~23 ms of fsync: every 300 s, under 0.01 % (docs/checkpoints.md)."""
    keep: int = field(default=3, metadata=limits(minimum=1))
    """How many of the newest valid checkpoints (by step) to keep; an invalid one (torn,
    corrupt, not a checkpoint) is moved aside into `corrupt/` in this directory, never counted
    or deleted."""
    async_save: bool = False
    """Under `train.strategy: fsdp` with sharded checkpoints: each rank's shard is copied to
    host memory and written on a background thread (DCP's `async_save`), so training waits only
    for the copy, not for the disk (docs/checkpoints.md). DDP's single-file checkpoints are
    always written in the background."""
    upload_retries: int = field(default=5, metadata=limits(minimum=0, maximum=20))
    """For an `s3://` `checkpoint.dir` or `output.dir`: how many times a failed upload is
    tried again, after 1, 2, 4, ... s (at most 30 s apart). A checkpoint still not uploaded
    is skipped (a WARNING line, `trainer_checkpoint_failed_saves_total`) and training goes on
    from the last durable one; the final or SIGTERM one stops the run with exit 203."""
    upload_deadline_seconds: float = field(default=60.0, metadata=limits(minimum=0,
                                                                          maximum=3600))
    """No retry of an upload starts later than this after its first try: keep it under the
    pod's grace period (the chart's `terminationGracePeriodSeconds`, 120 s) less the time
    to stop at a step and write (docs/checkpoints.md)."""


@dataclass
class DistConfig:
    backend: str = field(default="auto", metadata=one_of(BACKENDS))
    """`auto` (NCCL on CUDA, gloo on CPU), `nccl` or `gloo`."""
    timeout_seconds: float = field(
        default=600.0, metadata=limits(exclusiveMinimum=0, maximum=MAX_TIMEOUT_SECONDS))
    """Timeout of rendezvous and of every collective; a stuck rank fails the job after it."""
    hang_seconds: float = field(
        default=180.0, metadata=limits(minimum=0, maximum=MAX_TIMEOUT_SECONDS))
    """Seconds with no rank making progress after which the hang watchdog names the stuck rank
    and its line, prints every thread's stack and exits 142, so the job restarts from its
    last checkpoint (0: off). Scaled up to 20 median steps, 3x a validation's or save's last
    length; the collective timeout rules until the first step (docs/distributed.md)."""


@dataclass
class MetricsConfig:
    port: int = field(default=9310, metadata=limits(minimum=0, maximum=65535))
    """Port of the Prometheus endpoint serving every local rank (0 disables it). 9310 clashes
    with neither Prometheus (9090) nor the DCGM exporter (9400)."""
    bind_address: str = "0.0.0.0"
    """Address the metrics endpoint binds to."""
    linger_seconds: float = field(default=60.0, metadata=limits(minimum=0))
    """After the run ends, keep serving the final values this long, so that Prometheus scrapes
    them and evaluates its alerts on them; a completed run stops sooner, at `linger_scrapes`
    scrapes of them (a couple of scrape intervals; SIGTERM ends the wait; 0 for local runs)."""
    linger_scrapes: int = field(default=1, metadata=limits(minimum=0, maximum=MAX_LINGER_SCRAPES))
    """Scrapes of a completed run's final values that end its linger (each began after them;
    any GET of the endpoint counts); 0: serve them the whole `linger_seconds`, as a failed run
    does."""


@dataclass
class OutputConfig:
    dir: str = "outputs"
    """Directory for `summary.json`, `eval.json`, `steps.jsonl` and `model/` (not empty;
    checked before training). `summary.json` is replaced only by a finished run.
    `s3://bucket/prefix`: uploaded there when rank 0 leaves (docs/checkpoints.md)."""
    step_log: bool = True
    """Rank 0 writes each step's training loss to `steps.jsonl` (once per log interval, so it
    costs no extra device sync): a fresh start moves the previous one aside to `steps.N.jsonl`
    at its first step, a resumed run appends."""
    export: bool = True
    """Rank 0 writes the trained model to `model/` here after `summary.json`, in formats
    loaded without ddp-trainer: `model.safetensors` (a plain state_dict; a `transformers`
    model by its `save_pretrained`) and `ddp-trainer.json` (class names, config); replaced
    by each finished run, atomically. Once per run: 13-32 ms for the default MLP, mostly
    fsync (docs/checkpoints.md)."""


@dataclass
class JobConfig:
    data: DataConfig = field(default_factory=DataConfig)
    """Dataset and split."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """Model architecture."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Training loop."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Checkpointing and resume."""
    dist: DistConfig = field(default_factory=DistConfig)
    """Distributed bootstrap."""
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    """Prometheus exporter."""
    output: OutputConfig = field(default_factory=OutputConfig)
    """Outputs."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


CONFIG_VERSION = 1
"""Layout version of the config a checkpoint stores (as `config_version`; checkpoints written
before versions have none: 0). Renaming or moving a field bumps it and adds the step from the
previous version to MIGRATIONS, so that older checkpoints still evaluate and resume."""
MIGRATIONS: dict[int, typing.Callable[[dict[str, Any]], dict[str, Any]]] = {
    0: lambda config: config,  # the first versioned layout is the unversioned one
}


def saved_config(state: typing.Mapping[str, Any], source: str) -> dict[str, Any]:
    """A checkpoint's config in this version's layout."""
    config, version = state["config"], state.get("config_version", 0)
    if not isinstance(version, int) or not 0 <= version <= CONFIG_VERSION:
        raise ConfigError(f"{source}: config version {version!r}, this ddp-trainer reads "
                          f"versions up to {CONFIG_VERSION}",
                          "use the ddp-trainer release that wrote it, or a newer one")
    for step in range(version, CONFIG_VERSION):
        config = MIGRATIONS[step](config)
    return dict(config)
