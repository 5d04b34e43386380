"""The chart rendered by the real Helm binary (``make tools`` puts it in .tools/bin)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from tests.image.dockerfile import REPO

CHART = REPO / "charts" / "ddp-trainer"


class ChartError(RuntimeError):
    """helm is missing or refused the values."""


def helm_binary() -> str:
    local = REPO / ".tools" / "bin" / "helm"
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    found = shutil.which("helm")
    if not found:
        raise ChartError("helm not found in .tools/bin or on PATH (fix: run `make tools`)")
    return found


@dataclass(frozen=True)
class Rendered:
    """The objects `helm template` printed."""

    objects: list[dict[str, Any]]

    def all(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o.get("kind") == kind]

    def one(self, kind: str) -> dict[str, Any]:
        found = self.all(kind)
        if len(found) != 1:
            raise ChartError(f"expected one {kind} in the rendered chart, found {len(found)}")
        return found[0]

    @property
    def job(self) -> dict[str, Any]:
        return self.one("PyTorchJob")


def render(values: Mapping[str, Any], release: str, namespace: str) -> Rendered:
    """``helm template <release> charts/ddp-trainer -n <namespace> -f <values>``."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="e2e-values-") as f:
        yaml.safe_dump(dict(values), f)
        f.flush()
        proc = subprocess.run(
            [helm_binary(), "template", release, str(CHART), "--namespace", namespace,
             "-f", f.name], capture_output=True, text=True, timeout=120, check=False)
    if proc.returncode != 0:
        raise ChartError(f"helm template failed: {proc.stderr.strip()}")
    return Rendered([d for d in yaml.safe_load_all(proc.stdout) if d])


def merge_values(*layers: Mapping[str, Any]) -> dict[str, Any]:
    """Deep merge of value layers, later ones winning (as repeated ``-f`` files do)."""
    out: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if isinstance(value, Mapping) and isinstance(out.get(key), dict):
                out[key] = merge_values(out[key], value)
            else:
                out[key] = dict(value) if isinstance(value, Mapping) else value
    return out
