"""Generate `trainerConfig` in charts/ddp-trainer/values.schema.json from trainer/config.py.

    .venv/bin/python tools/chart_schema.py           # rewrite the schema's trainerConfig
    .venv/bin/python tools/chart_schema.py --check   # exit 1 when it is stale

Each config field becomes its JSON type plus what its dataclass metadata declares
(``config.one_of``: an enum of the registry's names; ``config.limits``: minimum/maximum), so
that ``helm install --set trainerConfig.optim.name=adamx`` fails at install time instead of in
every pod. The rest of the schema (the chart's own values) is written by hand.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "charts" / "ddp-trainer" / "values.schema.json"
sys.path.insert(0, str(REPO))

from trainer.config import JobConfig  # noqa: E402

JSON_TYPES: dict[Any, dict[str, Any]] = {
    str: {"type": "string"},
    int: {"type": "integer"},
    float: {"type": "number"},
    bool: {"type": "boolean"},
    list[int]: {"type": "array", "items": {"type": "integer"}},
    list[str]: {"type": "array", "items": {"type": "string"}},
    list[float]: {"type": "array", "items": {"type": "number"}},
    # Free-form keyword arguments of user callables: the only place unknown keys are allowed.
    dict[str, Any]: {"type": "object", "additionalProperties": True},
}


def field_schema(annotation: Any, metadata: typing.Mapping[str, Any]) -> dict[str, Any]:
    schema = dict(JSON_TYPES[annotation])
    for key, value in metadata.items():
        # a tuple of names, or a registry's names (trainer.config.Registry)
        schema[key] = list(value) if isinstance(value, Sequence) and not isinstance(value, str) \
            else value
    return schema


def trainer_config_sections() -> dict[str, Any]:
    sections = {}
    for f in dataclasses.fields(JobConfig):
        section = f.default_factory()  # type: ignore[misc]
        hints = typing.get_type_hints(type(section))
        sections[f.name] = {
            "type": "object",
            "additionalProperties": False,
            "properties": {g.name: field_schema(hints[g.name], g.metadata)
                           for g in dataclasses.fields(section)},
            "description": f"trainer config section `{f.name}` (trainer/config.py)",
        }
    return sections


def generated() -> str:
    """The schema file's text with `trainerConfig` generated from the config."""
    schema = json.loads(SCHEMA.read_text())
    schema["properties"]["trainerConfig"]["properties"] = trainer_config_sections()
    return json.dumps(schema, indent=2) + "\n"


def main(argv: list[str]) -> int:
    text = generated()
    if "--check" in argv:
        if SCHEMA.read_text() != text:
            print(f"{SCHEMA.relative_to(REPO)} is stale: run .venv/bin/python "
                  "tools/chart_schema.py", file=sys.stderr)
            return 1
        return 0
    SCHEMA.write_text(text)
    print(f"updated trainerConfig in {SCHEMA.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
