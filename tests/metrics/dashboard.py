"""Reading the Grafana dashboard: its panels' PromQL, with variables substituted."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "charts" / "ddp-trainer" / "files" / "dashboard.json"


@dataclass(frozen=True)
class Target:
    panel: str
    ref: str
    expr: str
    panel_type: str


def load() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def panels(dashboard: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    for p in dashboard["panels"]:
        yield p
        yield from p.get("panels", [])  # panels inside collapsed rows


def targets(dashboard: Mapping[str, Any]) -> list[Target]:
    return [
        Target(p["title"], t["refId"], t["expr"], p["type"])
        for p in panels(dashboard)
        for t in p.get("targets", [])
    ]


def substitute(expr: str, variables: Mapping[str, str]) -> str:
    """Replace ``$name`` / ``${name}`` the way Grafana does for single-value variables."""

    def repl(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name not in variables:
            raise KeyError(f"unknown dashboard variable ${name} in {expr!r}")
        return variables[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", repl, expr)


def label_values_as_promql(query: str) -> tuple[str, str]:
    """``label_values(selector, label)`` -> (PromQL returning one row per value, label)."""
    m = re.fullmatch(r"\s*label_values\((.+),\s*(\w+)\s*\)\s*", query)
    assert m, f"not a label_values() query: {query}"
    return f"count by ({m.group(2)}) ({m.group(1)})", m.group(2)
