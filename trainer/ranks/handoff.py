"""How `run` hands the config it validated to its ranks: one line of YAML in their argv, read
back without re-reading the flags, the `--set` items and the config file or validating again."""

from __future__ import annotations

import dataclasses
from typing import Any

import yaml

from trainer.config import JobConfig
from trainer.config_load import merge


def _plain(value: Any) -> Any:
    """Tuples as lists, at any depth (YAML's safe dumper writes lists, not tuples)."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def config_text(cfg: JobConfig) -> str:
    """`cfg` as one line of YAML: how `run` hands the config it validated to its ranks (the
    `rank` command reads it back with :func:`config_from_text`), so the ranks neither re-read
    the flags, the `--set` items and the config file nor validate them again."""
    text: str = yaml.safe_dump(_plain(dataclasses.asdict(cfg)), default_flow_style=True,
                               width=float("inf"), sort_keys=False)
    return text.strip()


def config_from_text(text: str) -> JobConfig:
    """The config :func:`config_text` wrote: its values type-checked into the dataclasses (the
    launcher validated them)."""
    return merge(JobConfig(), yaml.safe_load(text), "the launcher's config")
