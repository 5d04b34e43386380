"""Shared helpers: run the real CLI in subprocesses (real torch.distributed, gloo, CPU)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 240,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m trainer ARGS` in a clean environment (no inherited RANK/WORLD_SIZE)."""
    base = {k: v for k, v in os.environ.items()
            if k not in {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}
            and not k.startswith(("PET_", "TORCHELASTIC_"))}
    base["PYTHONPATH"] = str(REPO)
    base.update(env or {})
    return subprocess.run([sys.executable, "-m", "trainer", *args], cwd=cwd or REPO, env=base,
                          capture_output=True, text=True, timeout=timeout, check=False)


def read_json(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


@pytest.fixture
def cli() -> Any:
    return run_cli
