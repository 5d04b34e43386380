"""Typed configuration: one dataclass per component, one source of truth.

Precedence (highest first): command-line flags, the YAML file given with ``--config``,
the defaults below. The YAML file has one mapping per section, named as the fields of
:class:`JobConfig` (``data``, ``model``, ``optim``, ``train``, ``checkpoint``, ``dist``,
``metrics``, ``output``). Every value is validated before ``init_process_group`` so a bad
setting fails on every rank at once with one line naming the field and the fix.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import os
import re
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trainer.errors import ConfigError
from trainer.plugins import is_import_path


class Registry(Sequence[str]):
    """The names of a registry of named builders, read from the module that holds it (the one
    list of those names) when first asked: the registries import torch, the config does not."""

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


DATASET_NAMES = Registry("trainer.data.source:BUILTIN_DATASETS")
DATA_FORMATS = ("auto", "npy", "images", "arrow", "parquet", "csv", "npz")
WORKER_STARTS = ("forkserver", "spawn", "fork")
MODEL_NAMES = Registry("trainer.components.models:BUILTIN_MODELS")
STEP_NAMES = Registry("trainer.components.steps:BUILTIN_STEPS")
OPTIMIZERS = Registry("trainer.components.optim:OPTIMIZERS")
SCHEDULES = Registry("trainer.components.optim:SCHEDULES")
PRECISIONS = ("fp32", "bf16", "fp16")
STRATEGIES = ("ddp", "dp")
SAMPLERS = ("shuffle", "torch")
BACKENDS = ("auto", "nccl", "gloo")
DEVICES = ("auto", "cpu", "cuda")
MAX_TIMEOUT_SECONDS = 365 * 24 * 3600.0
"""Longest timeout accepted (a year); torch's stores and C++ timers overflow far above it."""
INT_BITS = 64
"""Config ints are 64-bit signed (torch seeds, counters, sizes)."""


def one_of(names: Sequence[str]) -> dict[str, Any]:
    """Field metadata: the value is one of `names`. :func:`validate` enforces it with a
    message naming the fix; the chart's values schema (tools/chart_schema.py) lists them so
    that ``helm install`` refuses a typo before any pod starts."""
    return {"enum": names}


def limits(**bounds: float) -> dict[str, Any]:
    """Field metadata: JSON Schema bounds (`minimum`, `maximum`, `exclusiveMinimum`,
    `exclusiveMaximum`) that :func:`validate` enforces too (tests/test_config_limits.py checks
    that they agree)."""
    return dict(bounds)


@dataclass
class DataConfig:
    dataset: str = "digits"
    """`digits` (scikit-learn's bundled 8x8 digits, no download), `synthetic` (the seed's
    random tensors), a path (a `.npz`, `.csv` or `.parquet` file, or a directory: x.npy +
    y.npy, image class folders, a `save_to_disk` directory, Parquet files, or `train/` +
    `val/` splits of one of these; see README 'Your data'), or an import path
    `package.module:callable` returning a map-style Dataset or a (train, val) pair of them."""
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
    needs room for the selected columns."""
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
    """`mymodel` (the seed's Linear->Linear), `mlp`, `cnn` (image-shaped data), or an import
    path `package.module:callable` returning an nn.Module; it is called with `num_classes`
    and `sample_shape` (when the dataset defines them and it accepts them) and `options`."""
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
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
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
    """`ddp` (DistributedDataParallel, recommended) or `dp` (single-node DataParallel, the
    seed's way)."""
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
    labels)` batches, or the model's own loss on mapping batches with a `labels` key), or an
    import path to a callable `(model, batch) -> (loss, correct, count)`."""
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


@dataclass
class CheckpointConfig:
    dir: str = ""
    """Directory for checkpoints; empty disables checkpointing. A run that finds a valid
    checkpoint here resumes from it."""
    every: int = field(default=0, metadata=limits(minimum=0))
    """Checkpoint every N optimizer steps instead of at every epoch end (0: at every epoch
    end). The end of training is always checkpointed."""
    keep: int = field(default=3, metadata=limits(minimum=1))
    """How many of the newest valid checkpoints (by step) to keep; an invalid one (torn,
    corrupt, not a checkpoint) is moved aside into `corrupt/` in this directory, never counted
    or deleted."""


@dataclass
class DistConfig:
    backend: str = field(default="auto", metadata=one_of(BACKENDS))
    """`auto` (NCCL on CUDA, gloo on CPU), `nccl` or `gloo`."""
    timeout_seconds: float = field(
        default=600.0, metadata=limits(exclusiveMinimum=0, maximum=MAX_TIMEOUT_SECONDS))
    """Timeout of rendezvous and of every collective; a stuck rank fails the job after it."""


@dataclass
class MetricsConfig:
    port: int = field(default=9310, metadata=limits(minimum=0, maximum=65535))
    """Port of the Prometheus endpoint serving every local rank (0 disables it). 9310 clashes
    with neither Prometheus (9090) nor the DCGM exporter (9400)."""
    bind_address: str = "0.0.0.0"
    """Address the metrics endpoint binds to."""
    linger_seconds: float = field(default=60.0, metadata=limits(minimum=0))
    """Keep serving the final values this long after the run ends or fails, so that a scrape
    sees them (a couple of scrape intervals; SIGTERM ends the wait; 0 for local runs)."""


@dataclass
class OutputConfig:
    dir: str = "outputs"
    """Directory for `summary.json`, `eval.json` and `steps.jsonl` (not empty; checked before
    training). `summary.json` is replaced only by a finished run."""
    step_log: bool = True
    """Rank 0 writes each step's training loss to `steps.jsonl` (once per log interval, so it
    costs no extra device sync): a fresh start truncates it at its first step, a resumed run
    appends."""


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


def _short(value: Any, limit: int = 40) -> str:
    """`repr(value)` cut to `limit` characters, for a one-line message."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit - 3]}... ({len(text)} characters)"


def check_timeout(where: str, value: float, fix: str) -> None:
    """A timeout in seconds: finite, > 0 and at most MAX_TIMEOUT_SECONDS."""
    if not (math.isfinite(value) and 0 < value <= MAX_TIMEOUT_SECONDS):
        raise ConfigError(f"{where}: {value:g} is not a number of seconds in (0, "
                          f"{MAX_TIMEOUT_SECONDS:.0f}]", fix)


def _check_type(where: str, value: Any, annotation: Any) -> Any:
    """Coerce YAML/CLI `value` to `annotation` or raise ConfigError naming `where`."""
    origin = typing.get_origin(annotation)
    if origin is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise ConfigError(f"{where}: expected a mapping with string keys, got {value!r}",
                              "write it as {key: value, ...}")
        return dict(value)
    if origin is list:
        (item_type,) = typing.get_args(annotation)
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {value!r}", "write it as [a, b, ...]")
        return [_check_type(f"{where}[{i}]", v, item_type) for i, v in enumerate(value)]
    if origin in (typing.Union, types.UnionType):
        raise AssertionError(f"unsupported annotation {annotation}")  # not used by any field
    if annotation is bool:
        if isinstance(value, bool):
            return value
    elif annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            if not -(2 ** (INT_BITS - 1)) <= value < 2 ** (INT_BITS - 1):
                raise ConfigError(f"{where}: {_short(value)} does not fit in {INT_BITS} bits",
                                  f"set {where} to a smaller int")
            return value
    elif annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                return float(value)
            except OverflowError:
                raise ConfigError(f"{where}: {_short(value)} is too large for a float",
                                  f"set {where} to a number below 1e308") from None
    elif annotation is str:
        if isinstance(value, str):
            return value
    else:
        raise AssertionError(f"unsupported annotation {annotation}")
    raise ConfigError(
        f"{where}: expected {annotation.__name__}, got {type(value).__name__} {_short(value)}",
        f"set {where} to a {annotation.__name__}",
    )


def _section_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


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


def merge(cfg: JobConfig, overrides: dict[str, Any], source: str) -> JobConfig:
    """Apply a nested mapping `{section: {key: value}}` onto `cfg`, checking every key."""
    if not isinstance(overrides, dict):
        raise ConfigError(f"{source}: expected a mapping of sections", "see README 'Configuration'")
    sections = _section_types(JobConfig)
    for section, values in overrides.items():
        if section not in sections:
            raise ConfigError(
                f"{source}: unknown section {section!r}",
                f"use one of: {', '.join(sections)}",
            )
        if values is None:
            continue
        if not isinstance(values, dict):
            raise ConfigError(f"{source}: section {section!r} must be a mapping",
                              "write it as key: value lines")
        target = getattr(cfg, section)
        hints = _section_types(type(target))
        for key, value in values.items():
            if key not in hints:
                raise ConfigError(
                    f"{source}: unknown key {section}.{key}",
                    f"valid keys of {section}: {', '.join(hints)}",
                )
            checked = _check_type(f"{section}.{key}", value, hints[key])
            if isinstance(checked, dict):  # free-form mappings merge key by key
                checked = {**getattr(target, key), **checked}
            setattr(target, key, checked)
    return cfg


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, except that a key given twice in one mapping is an error (PyYAML
    keeps the last one silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


# YAML 1.2's floats, which PyYAML (YAML 1.1) reads as strings when they have an exponent and no
# dot: `1e-05` is how Helm's toYaml writes `lr: 0.00001` from a chart's values, and how Python
# and JSON print small numbers.
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"))


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error in one line: the problem and where (PyYAML's own text spans lines)."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        return f"{exc.problem}{where}"
    return " ".join(str(exc).split())


def load_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    fix = "pass a readable UTF-8 YAML file to --config"
    if str(path) == "":
        raise ConfigError("--config '' names no file", "pass a YAML file, or leave --config out")
    if p.is_dir():
        raise ConfigError(f"config file {p} is a directory", fix)
    if not p.exists():
        raise ConfigError(f"config file {p} does not exist", "pass an existing file to --config")
    if not p.is_file():
        raise ConfigError(f"config file {p} is not a regular file (a device, pipe or socket)",
                          fix)
    try:
        text = p.read_bytes().decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"config file {p} cannot be read ({exc.strerror})", fix) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {p} is not UTF-8 text (byte "
                          f"0x{exc.object[exc.start]:02x} at offset {exc.start})",
                          "save it as UTF-8") from None
    try:
        loaded = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {p} is not valid YAML: {_yaml_problem(exc)}",
                          "fix the YAML there (each key once per mapping)") from None
    return loaded or {}


def parse_set(items: list[str]) -> dict[str, Any]:
    """Turn `--set section.key=value` items into a nested mapping; values are YAML scalars.

    A longer key reaches into a mapping field: `--set model.options.depth=4`.
    """
    out: dict[str, Any] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        parts = name.split(".")
        if not sep or len(parts) < 2 or not all(parts):
            raise ConfigError(f"--set {item!r} is malformed", "write --set section.key=value")
        node = out
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {item!r} conflicts with an earlier --set of "
                                  f"{part!r}", "set a key or its sub-keys, not both")
            node = child
        try:
            node[parts[-1]] = yaml.load(raw, Loader=_UniqueKeyLoader) if raw else ""  # noqa: S506
        except yaml.YAMLError as exc:
            raise ConfigError(f"--set {item!r}: the value is not valid YAML: "
                              f"{_yaml_problem(exc)}", "write a YAML scalar, [list] or {mapping} "
                              "with each key once (quote a string that is none of these)") from None
    return out


def build_config(config_file: str | None, *cli: dict[str, Any]) -> JobConfig:
    """Defaults, then the YAML file, then each layer of CLI overrides in turn (`--set`, then
    the flags: each value type-checked even when a later layer replaces it); validated."""
    cfg = JobConfig()
    if config_file is not None:
        merge(cfg, load_yaml(config_file), f"config file {config_file}")
    for layer in cli:
        merge(cfg, layer, "command line")
    validate(cfg)
    return cfg


def _require(ok: bool, where: str, problem: str, fix: str) -> None:
    if not ok:
        raise ConfigError(f"{where}: {problem}", fix)


def validate(cfg: JobConfig) -> None:
    d, m, o, t, c = cfg.data, cfg.model, cfg.optim, cfg.train, cfg.checkpoint
    if not (d.dataset in DATASET_NAMES or is_import_path(d.dataset)):
        looks_like_path = os.sep in d.dataset or bool(os.path.splitext(d.dataset)[1])
        _require(os.path.exists(d.dataset), "data.dataset",
                 f"data path {d.dataset} does not exist" if looks_like_path else
                 f"unknown dataset {d.dataset!r} (not a built-in, an import path or a path)",
                 "pass an existing file or directory" if looks_like_path else
                 f"use one of {', '.join(DATASET_NAMES)}, a data path or package.module:callable")
    _require(0.0 <= d.val_fraction < 1.0, "data.val_fraction",
             f"{d.val_fraction} is outside [0, 1)", "use e.g. --val-fraction 0.2")
    for name in ("synthetic_samples", "synthetic_features"):
        _require(getattr(d, name) >= 1, f"data.{name}", "must be >= 1",
                 f"set data.{name} to 1 or more")
    _require(d.synthetic_classes >= 2, "data.synthetic_classes", "must be >= 2", "use 2 or more")
    _require(d.num_classes >= 0, "data.num_classes", "must be >= 0", "use 0 to infer it")
    _require(d.num_workers >= 0, "data.num_workers", "must be >= 0", "use 0 or more")
    _require(d.prefetch_factor >= 1, "data.prefetch_factor", "must be >= 1", "use e.g. 2")
    _require(d.worker_start in WORKER_STARTS, "data.worker_start",
             f"unknown start method {d.worker_start!r}", f"use one of {', '.join(WORKER_STARTS)}")
    _require(d.format in DATA_FORMATS, "data.format", f"unknown format {d.format!r}",
             f"use one of {', '.join(DATA_FORMATS)}")
    _require(d.format == "auto" or not (d.dataset in DATASET_NAMES or is_import_path(d.dataset)),
             "data.format", f"{d.format!r} describes a data path, but data.dataset is "
             f"{d.dataset!r}", "leave data.format at auto, or pass a data path with --dataset")
    _require(d.image_size >= 8, "data.image_size", f"{d.image_size} < 8", "use e.g. 224")
    _require(len(d.image_mean) == 3, "data.image_mean", "needs 3 values (R, G, B)",
             "e.g. [0.485, 0.456, 0.406]")
    _require(len(d.image_std) == 3 and min(d.image_std) > 0, "data.image_std",
             "needs 3 values > 0 (R, G, B)", "e.g. [0.229, 0.224, 0.225]")
    _require(m.name in MODEL_NAMES or is_import_path(m.name), "model.name",
             f"unknown model {m.name!r}",
             f"use one of {', '.join(MODEL_NAMES)} or an import path package.module:callable")
    _require(t.step in STEP_NAMES or is_import_path(t.step), "train.step",
             f"unknown step {t.step!r}",
             f"use one of {', '.join(STEP_NAMES)} or an import path package.module:callable")
    _require(bool(m.hidden_sizes) and min(m.hidden_sizes) >= 1, "model.hidden_sizes",
             "needs at least one width, all >= 1", "e.g. [128, 64]")
    _require(len(m.cnn_channels) == 2 and min(m.cnn_channels) >= 1, "model.cnn_channels",
             "needs two channel counts >= 1", "e.g. [16, 32]")
    _require(math.isfinite(o.lr) and o.lr > 0, "optim.lr", f"{o.lr} is not a positive number",
             "use e.g. --lr 0.05")
    _require(o.name in OPTIMIZERS, "optim.name", f"unknown optimizer {o.name!r}",
             f"use one of {', '.join(OPTIMIZERS)}")
    _require(0.0 <= o.momentum < 1.0, "optim.momentum", "must be in [0, 1)", "use e.g. 0.9")
    _require(o.schedule in SCHEDULES, "optim.schedule", f"unknown schedule {o.schedule!r}",
             f"use one of {', '.join(SCHEDULES)}")
    _require(o.warmup_steps >= 0, "optim.warmup_steps", f"{o.warmup_steps} < 0",
             "use 0 (no warm-up) or more")
    _require(math.isfinite(o.min_lr) and 0 <= o.min_lr <= o.lr, "optim.min_lr",
             f"{o.min_lr} is not in [0, optim.lr]", "use e.g. 0 or lr / 10")
    _require(o.step_size >= 1, "optim.step_size", "must be >= 1", "use e.g. 1000")
    _require(math.isfinite(o.gamma) and 0 < o.gamma <= 1, "optim.gamma", "must be in (0, 1]",
             "use e.g. 0.1")
    _require(math.isfinite(o.grad_clip) and o.grad_clip >= 0, "optim.grad_clip", "must be >= 0",
             "use 0 (off) or a max norm such as 1.0")
    _require(len(o.betas) == 2 and all(0.0 <= b < 1.0 for b in o.betas), "optim.betas",
             f"{o.betas} is not two numbers in [0, 1)", "use e.g. [0.9, 0.999]")
    _require(math.isfinite(o.eps) and o.eps > 0, "optim.eps", "must be > 0", "use e.g. 1e-8")
    _require(math.isfinite(o.weight_decay) and o.weight_decay >= 0, "optim.weight_decay",
             f"{o.weight_decay} is not a finite number >= 0", "use 0 or more, e.g. 0.01")
    _require(t.epochs >= 1, "train.epochs", f"{t.epochs} < 1", "use --epochs 1 or more")
    _require(0 <= t.seed < 2 ** (INT_BITS - 1), "train.seed", f"{t.seed} is outside [0, 2**63)",
             "use e.g. --seed 0")
    _require(t.max_steps >= 0, "train.max_steps", "must be >= 0", "use 0 for no limit")
    _require(t.batch_size >= 1, "train.batch_size", f"{t.batch_size} < 1",
             "use --batch-size 1 or more")
    _require(t.precision in PRECISIONS, "train.precision", f"unknown precision {t.precision!r}",
             f"use one of {', '.join(PRECISIONS)}")
    _require(t.grad_accum_steps >= 1, "train.grad_accum_steps", f"{t.grad_accum_steps} < 1",
             "use 1 (no accumulation) or more")
    _require(t.strategy in STRATEGIES, "train.strategy", f"unknown strategy {t.strategy!r}",
             f"use one of {', '.join(STRATEGIES)}")
    _require(t.sampler in SAMPLERS, "train.sampler", f"unknown sampler {t.sampler!r}",
             f"use one of {', '.join(SAMPLERS)}")
    _require(t.log_every >= 1, "train.log_every", "must be >= 1", "use 1 or more")
    _require(math.isfinite(t.log_seconds) and t.log_seconds >= 0, "train.log_seconds",
             "must be >= 0", "use e.g. 1, or 0 to report every train.log_every steps")
    _require(math.isfinite(t.stop_check_seconds) and t.stop_check_seconds > 0,
             "train.stop_check_seconds", "must be > 0", "use e.g. 15")
    _require(t.device in DEVICES, "train.device", f"unknown device {t.device!r}",
             f"use one of {', '.join(DEVICES)}")
    _require(c.every >= 0, "checkpoint.every", "must be >= 0", "use 0 for epoch ends only")
    _require(bool(cfg.output.dir), "output.dir", "is empty (outputs never go to an unnamed "
             "directory)", "name the directory, e.g. --output-dir outputs")
    _require(c.keep >= 1, "checkpoint.keep", "must be >= 1", "keep at least one checkpoint")
    _require(cfg.dist.backend in BACKENDS, "dist.backend", f"unknown backend {cfg.dist.backend!r}",
             f"use one of {', '.join(BACKENDS)}")
    check_timeout("dist.timeout_seconds", cfg.dist.timeout_seconds, "use e.g. --timeout 600")
    _require(0 <= cfg.metrics.port <= 65535, "metrics.port", f"{cfg.metrics.port} is not a port",
             "use 0 (off) or 1-65535")
    _require(math.isfinite(cfg.metrics.linger_seconds) and cfg.metrics.linger_seconds >= 0,
             "metrics.linger_seconds", "must be >= 0", "use 0 to stop serving at once")
