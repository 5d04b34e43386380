"""Rewrite `trainerConfig` in charts/ddp-trainer/values.schema.json from trainer/config.py.

    .venv/bin/python tests/chart/update_trainer_config_schema.py

Run it after adding, removing or retyping a field of the trainer config; the chart test
test_trainer_config_schema_lists_exactly_the_trainer_config_fields fails until then.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import typing
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SCHEMA = REPO / "charts" / "ddp-trainer" / "values.schema.json"
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


def trainer_config_sections() -> dict[str, Any]:
    sys.path.insert(0, str(REPO))
    from trainer.config import JobConfig

    sections = {}
    for f in dataclasses.fields(JobConfig):
        section = f.default_factory()  # type: ignore[misc]
        hints = typing.get_type_hints(type(section))
        sections[f.name] = {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                g.name: dict(JSON_TYPES[hints[g.name]]) for g in dataclasses.fields(section)
            },
            "description": f"trainer config section `{f.name}` (trainer/config.py)",
        }
    return sections


def main() -> None:
    schema = json.loads(SCHEMA.read_text())
    schema["properties"]["trainerConfig"]["properties"] = trainer_config_sections()
    SCHEMA.write_text(json.dumps(schema, indent=2) + "\n")
    print(f"updated trainerConfig in {SCHEMA.relative_to(REPO)}")


if __name__ == "__main__":
    main()
