"""The limits and names that config fields declare (their dataclass metadata, which
tools/chart_schema.py writes into the chart's values schema) are the ones validate() enforces,
and the chart's schema is generated from them."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from trainer.config import JobConfig
from trainer.config_load import validate
from trainer.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


def declared() -> Iterator[tuple[str, str, str, Any]]:
    """(section, field, metadata key, value) of every declared limit or enum."""
    for section in dataclasses.fields(JobConfig):
        for f in dataclasses.fields(section.default_factory()):  # type: ignore[misc]
            for key, value in f.metadata.items():
                yield section.name, f.name, key, value


def _validated(section: str, name: str, value: Any) -> None:
    cfg = JobConfig()
    setattr(getattr(cfg, section), name, value)
    validate(cfg)


def _refused(section: str, name: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=f"^{section}\\.{name}: "):
        _validated(section, name, value)


CASES = [pytest.param(*case, id=f"{case[0]}.{case[1]}.{case[2]}") for case in declared()]


@pytest.mark.parametrize(("section", "name", "key", "bound"), CASES)
def test_validate_enforces_what_the_field_declares(section: str, name: str, key: str,
                                                   bound: Any) -> None:
    kind = type(getattr(getattr(JobConfig(), section), name))
    below = (lambda b: b - 1) if kind is int else (lambda b: b - 1e-6)
    above = (lambda b: b + 1) if kind is int else (lambda b: b + 1e-6)
    if key == "enum":
        _refused(section, name, "not-one-of-them")
        assert bound and all(isinstance(n, str) for n in bound)
    elif key == "minimum":
        _refused(section, name, below(bound))
        _validated(section, name, kind(bound))
    elif key == "maximum":
        _refused(section, name, above(bound))
        _validated(section, name, kind(bound))
    elif key == "exclusiveMinimum":
        _refused(section, name, kind(bound))
        _validated(section, name, above(bound) if kind is int else bound + 1e-3)
    elif key == "exclusiveMaximum":
        _refused(section, name, kind(bound))
        _validated(section, name, below(bound))
    elif key == "minItems":
        default = getattr(getattr(JobConfig(), section), name)
        _refused(section, name, default[:bound - 1])
        _validated(section, name, default[:bound])
    elif key == "maxItems":
        default = getattr(getattr(JobConfig(), section), name)
        _refused(section, name, default[:bound] + default[:1])
        _validated(section, name, default[:bound])
    elif key == "items":
        default = getattr(getattr(JobConfig(), section), name)
        for item_key, item_bound in bound.items():
            if item_key == "type":
                continue
            outside = {"minimum": item_bound - 1e-6, "maximum": item_bound + 1e-6,
                       "exclusiveMinimum": item_bound, "exclusiveMaximum": item_bound}[item_key]
            _refused(section, name, [outside] + default[1:])
    else:
        raise AssertionError(f"{section}.{name}: unknown metadata {key!r}")


def test_the_chart_values_schema_is_generated_from_the_config() -> None:
    sys.path.insert(0, str(REPO / "tools"))
    from chart_schema import SCHEMA, generated

    assert SCHEMA.read_text() == generated(), (
        "charts/ddp-trainer/values.schema.json is stale: run .venv/bin/python "
        "tools/chart_schema.py")
