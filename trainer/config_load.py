"""Reading a config: the defaults of :mod:`trainer.config`, then the YAML file given with
``--config``, then the command line (``--set`` items, then flags: highest first, flags win),
merged key by key with each value type-checked, then validated. The YAML file has one mapping
per section, named as the fields of :class:`~trainer.config.JobConfig` (``data``, ``model``,
``optim``, ``train``, ``checkpoint``, ``dist``, ``metrics``, ``output``). Every value is
validated before ``init_process_group`` so a bad setting fails on every rank at once with one
line naming the field and the fix.
"""

from __future__ import annotations

import math
import os
import types
import typing
from typing import Any

import yaml

from trainer import config_yaml
from trainer.config import (
    BACKENDS,
    DATA_FORMATS,
    DATASET_NAMES,
    DEVICES,
    INT_BITS,
    MAX_CPU_THREADS,
    MAX_LINGER_SCRAPES,
    MAX_TIMEOUT_SECONDS,
    MODEL_NAMES,
    OPTIMIZERS,
    PRECISIONS,
    SAMPLERS,
    SCHEDULES,
    STEP_NAMES,
    STRATEGIES,
    WORKER_STARTS,
    JobConfig,
)
from trainer.errors import ConfigError, missing
from trainer.plugins import is_import_path

SHOWN = 120  # characters of a user's value an error line quotes: the line stays readable


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
            raise ConfigError(f"{where}: expected a mapping with string keys, got "
                              f"{_short(value, SHOWN)}", "write it as {key: value, ...}")
        return dict(value)
    if origin is list:
        (item_type,) = typing.get_args(annotation)
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {_short(value, SHOWN)}",
                              "write it as [a, b, ...]")
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
        f"set {where} to {_KINDS[annotation]}",
    )


_KINDS = {int: "a whole number, e.g. 10", float: "a number, e.g. 0.1",
          bool: "true or false", str: "a string"}
"""What a value of each field type is, in the fix of a mistyped one."""


def _section_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _check_size(overrides: Any, source: str) -> None:
    """Refuse a layer that expands beyond :data:`~trainer.config_yaml.MAX_VALUES`, in at most
    that many steps (a walk that stops there, iterative: a deep nesting or a cycle of aliases
    cannot run it away)."""
    stack, seen = [overrides], 0
    while stack:
        value = stack.pop()
        seen += 1
        if seen > config_yaml.MAX_VALUES:
            raise config_yaml.too_many(source)
        if isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)


def merge(cfg: JobConfig, overrides: dict[str, Any], source: str) -> JobConfig:
    """Apply a nested mapping `{section: {key: value}}` onto `cfg`, checking every key."""
    if not isinstance(overrides, dict):
        raise ConfigError(f"{source}: expected a mapping of sections", "see docs/configuration.md")
    _check_size(overrides, source)
    sections = _section_types(JobConfig)
    for section, values in overrides.items():
        if section not in sections:
            raise ConfigError(
                f"{source}: unknown section {_short(section, SHOWN)}",
                f"use one of: {', '.join(sections)}",
            )
        if values is None:
            continue
        if not isinstance(values, dict):
            raise ConfigError(f"{source}: section {_short(section, SHOWN)} must be a mapping",
                              "write it as key: value lines")
        target = getattr(cfg, section)
        hints = _section_types(type(target))
        for key, value in values.items():
            if key not in hints:
                shown = key if isinstance(key, str) and key.isidentifier() else _short(key, SHOWN)
                raise ConfigError(
                    f"{source}: unknown key {section}.{shown}",
                    f"valid keys of {section}: {', '.join(hints)}",
                )
            checked = _check_type(f"{section}.{key}", value, hints[key])
            if isinstance(checked, dict):  # free-form mappings merge key by key
                checked = {**getattr(target, key), **checked}
            setattr(target, key, checked)
    return cfg


def parse_set(items: list[str]) -> dict[str, Any]:
    """Turn `--set section.key=value` items into a nested mapping; values are YAML scalars.

    A longer key reaches into a mapping field: `--set model.options.depth=4`.
    """
    out: dict[str, Any] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        # `--set 'train.epochs = 2'` as `train.epochs=2`: spaces around a key or `=` are typos
        # (YAML ignores the value's trailing ones itself; a block scalar's lines keep theirs)
        name, raw = name.strip(), raw.lstrip(" \t")
        parts = name.split(".")
        if not sep or len(parts) < 2 or not all(parts):
            raise ConfigError(f"--set {_short(item, SHOWN)} is malformed",
                              "write --set section.key=value")
        node = out
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {_short(item, SHOWN)} conflicts with an earlier --set of "
                                  f"{_short(part, SHOWN)}", "set a key or its sub-keys, not both")
            node = child
        try:
            node[parts[-1]] = config_yaml.parse(raw, f"--set {_short(name, SHOWN)}") if raw else ""
        except yaml.YAMLError as exc:
            raise ConfigError(f"--set {_short(item, SHOWN)}: the value is not valid YAML: "
                              f"{config_yaml.yaml_problem(exc)}",
                              "write a YAML scalar, [list] or {mapping} with each key once "
                              "(quote a string that is none of these)") from None
    return out


def build_config(config_file: str | None, *cli: dict[str, Any]) -> JobConfig:
    """Defaults, then the YAML file, then each layer of CLI overrides in turn (`--set`, then
    the flags: each value type-checked even when a later layer replaces it); validated."""
    cfg = JobConfig()
    if config_file is not None:
        merge(cfg, config_yaml.load_yaml(config_file), f"config file {config_file}")
    for layer in cli:
        merge(cfg, layer, "command line")
    validate(cfg)
    return cfg


def _q(value: Any) -> str:
    """A user's value quoted in an error line, cut to :data:`SHOWN` characters."""
    return _short(value, SHOWN)


def _require(ok: bool, where: str, problem: str, fix: str) -> None:
    if not ok:
        raise ConfigError(f"{where}: {problem}", fix)


def validate(cfg: JobConfig) -> None:
    d, m, o, t, c = cfg.data, cfg.model, cfg.optim, cfg.train, cfg.checkpoint
    # an s3:// dataset is looked up in its store when it is fetched (trainer.data.remote)
    if not (d.dataset in DATASET_NAMES or is_import_path(d.dataset)
            or d.dataset.startswith("s3://")):
        looks_like_path = os.sep in d.dataset or bool(os.path.splitext(d.dataset)[1]) or \
            os.path.islink(d.dataset)
        why, fix = missing(d.dataset, "pass an existing file or directory")
        _require(os.path.exists(d.dataset), "data.dataset",
                 f"data path {d.dataset} {why}" if looks_like_path else
                 f"unknown dataset {_q(d.dataset)} (not a built-in, an import path or a path)",
                 fix if looks_like_path else
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
             f"unknown start method {_q(d.worker_start)}", f"use one of {', '.join(WORKER_STARTS)}")
    _require(d.format in DATA_FORMATS, "data.format", f"unknown format {_q(d.format)}",
             f"use one of {', '.join(DATA_FORMATS)}")
    _require(d.format == "auto" or not (d.dataset in DATASET_NAMES or is_import_path(d.dataset)),
             "data.format", f"{_q(d.format)} describes a data path, but data.dataset is "
             f"{_q(d.dataset)}", "leave data.format at auto, or pass a data path with --dataset")
    _require(d.image_size >= 8, "data.image_size", f"{d.image_size} < 8", "use e.g. 224")
    _require(len(d.image_mean) == 3, "data.image_mean", "needs 3 values (R, G, B)",
             "e.g. [0.485, 0.456, 0.406]")
    _require(len(d.image_std) == 3 and min(d.image_std) > 0, "data.image_std",
             "needs 3 values > 0 (R, G, B)", "e.g. [0.229, 0.224, 0.225]")
    _require(m.name in MODEL_NAMES or is_import_path(m.name), "model.name",
             f"unknown model {_q(m.name)}",
             f"use one of {', '.join(MODEL_NAMES)} or an import path package.module:callable")
    _require(t.step in STEP_NAMES or is_import_path(t.step), "train.step",
             f"unknown step {_q(t.step)}",
             f"use one of {', '.join(STEP_NAMES)} or an import path package.module:callable")
    _require(bool(m.hidden_sizes) and min(m.hidden_sizes) >= 1, "model.hidden_sizes",
             "needs at least one width, all >= 1", "e.g. [128, 64]")
    _require(len(m.cnn_channels) == 2 and min(m.cnn_channels) >= 1, "model.cnn_channels",
             "needs two channel counts >= 1", "e.g. [16, 32]")
    _require(math.isfinite(o.lr) and o.lr > 0, "optim.lr", f"{o.lr} is not a positive number",
             "use e.g. --lr 0.05")
    _require(o.name in OPTIMIZERS, "optim.name", f"unknown optimizer {_q(o.name)}",
             f"use one of {', '.join(OPTIMIZERS)}")
    _require(0.0 <= o.momentum < 1.0, "optim.momentum", "must be in [0, 1)", "use e.g. 0.9")
    _require(o.schedule in SCHEDULES, "optim.schedule", f"unknown schedule {_q(o.schedule)}",
             f"use one of {', '.join(SCHEDULES)}")
    _require(o.warmup_steps >= 0, "optim.warmup_steps", f"{o.warmup_steps} < 0",
             "use 0 (no warm-up) or more")
    _require(math.isfinite(o.min_lr) and 0 <= o.min_lr <= o.lr, "optim.min_lr",
             f"{o.min_lr} is not in [0, optim.lr]", "use e.g. 0 or lr / 10")
    _require(o.step_size >= 1, "optim.step_size", "must be >= 1", "use e.g. 1000")
    _require(math.isfinite(o.gamma) and 0 < o.gamma <= 1, "optim.gamma",
             f"{o.gamma} is not a number in (0, 1]", "use e.g. 0.1")
    _require(math.isfinite(o.grad_clip) and o.grad_clip >= 0, "optim.grad_clip",
             f"{o.grad_clip} is not a finite number >= 0",
             "use 0 (off) or a max norm such as 1.0")
    _require(len(o.betas) == 2 and all(0.0 <= b < 1.0 for b in o.betas), "optim.betas",
             f"{o.betas} is not two numbers in [0, 1)", "use e.g. [0.9, 0.999]")
    _require(math.isfinite(o.eps) and o.eps > 0, "optim.eps",
             f"{o.eps} is not a finite number > 0", "use e.g. 1e-8")
    _require(math.isfinite(o.weight_decay) and o.weight_decay >= 0, "optim.weight_decay",
             f"{o.weight_decay} is not a finite number >= 0", "use 0 or more, e.g. 0.01")
    _require(t.epochs >= 1, "train.epochs", f"{t.epochs} < 1", "use --epochs 1 or more")
    _require(0 <= t.seed < 2 ** (INT_BITS - 1), "train.seed", f"{t.seed} is outside [0, 2**63)",
             "use e.g. --seed 0")
    _require(t.max_steps >= 0, "train.max_steps", "must be >= 0", "use 0 for no limit")
    _require(t.batch_size >= 1, "train.batch_size", f"{t.batch_size} < 1",
             "use --batch-size 1 or more")
    _require(t.precision in PRECISIONS, "train.precision", f"unknown precision {_q(t.precision)}",
             f"use one of {', '.join(PRECISIONS)}")
    _require(t.grad_accum_steps >= 1, "train.grad_accum_steps", f"{t.grad_accum_steps} < 1",
             "use 1 (no accumulation) or more")
    _require(t.strategy in STRATEGIES, "train.strategy", f"unknown strategy {_q(t.strategy)}",
             f"use one of {', '.join(STRATEGIES)}")
    _require(t.sampler in SAMPLERS, "train.sampler", f"unknown sampler {_q(t.sampler)}",
             f"use one of {', '.join(SAMPLERS)}")
    _require(t.log_every >= 1, "train.log_every", "must be >= 1", "use 1 or more")
    _require(math.isfinite(t.log_seconds) and t.log_seconds >= 0, "train.log_seconds",
             f"{t.log_seconds} is not a finite number >= 0",
             "use e.g. 1, or 0 to report every train.log_every steps")
    _require(math.isfinite(t.stop_check_seconds) and t.stop_check_seconds > 0,
             "train.stop_check_seconds", f"{t.stop_check_seconds} is not a finite number > 0",
             "use e.g. 15")
    _require(t.device in DEVICES, "train.device", f"unknown device {_q(t.device)}",
             f"use one of {', '.join(DEVICES)}")
    _require(0 <= t.cpu_threads <= MAX_CPU_THREADS, "train.cpu_threads",
             f"{t.cpu_threads} is outside [0, {MAX_CPU_THREADS}]",
             "use 0 (the pod's CPU shared by its ranks) or a thread count")
    _require(c.every >= 0, "checkpoint.every", "must be >= 0", "use 0 (off)")
    _require(math.isfinite(c.every_seconds) and c.every_seconds >= 0, "checkpoint.every_seconds",
             f"{c.every_seconds} is not a finite number >= 0", "use e.g. 300, or 0 (off)")
    _require(bool(cfg.output.dir), "output.dir", "is empty (outputs never go to an unnamed "
             "directory)", "name the directory, e.g. --output-dir outputs")
    _require(c.keep >= 1, "checkpoint.keep", "must be >= 1", "keep at least one checkpoint")
    _require(0 <= c.upload_retries <= 20, "checkpoint.upload_retries",
             f"{c.upload_retries} is outside [0, 20]", "use e.g. 5 (0: no retry)")
    _require(math.isfinite(c.upload_deadline_seconds) and 0 <= c.upload_deadline_seconds <= 3600,
             "checkpoint.upload_deadline_seconds",
             f"{c.upload_deadline_seconds} is not a number in [0, 3600]",
             "use e.g. 60, under the pod's grace period")
    _require(cfg.dist.backend in BACKENDS, "dist.backend",
             f"unknown backend {_q(cfg.dist.backend)}", f"use one of {', '.join(BACKENDS)}")
    check_timeout("dist.timeout_seconds", cfg.dist.timeout_seconds, "use e.g. --timeout 600")
    hang = cfg.dist.hang_seconds
    _require(math.isfinite(hang) and 0 <= hang <= MAX_TIMEOUT_SECONDS, "dist.hang_seconds",
             f"{hang:g} is not a number of seconds in [0, {MAX_TIMEOUT_SECONDS:.0f}]",
             "use e.g. 180, or 0 to turn the hang watchdog off")
    _require(0 <= cfg.metrics.port <= 65535, "metrics.port", f"{cfg.metrics.port} is not a port",
             "use 0 (off) or 1-65535")
    _require(math.isfinite(cfg.metrics.linger_seconds) and cfg.metrics.linger_seconds >= 0,
             "metrics.linger_seconds",
             f"{cfg.metrics.linger_seconds} is not a finite number >= 0",
             "use 0 to stop serving at once")
    _require(0 <= cfg.metrics.linger_scrapes <= MAX_LINGER_SCRAPES, "metrics.linger_scrapes",
             f"{cfg.metrics.linger_scrapes} is outside [0, {MAX_LINGER_SCRAPES}]",
             "use 1 (the first scrape of the final values ends the wait) or 0 (the whole "
             "metrics.linger_seconds)")
