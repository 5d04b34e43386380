"""Shared helpers of the metrics tests: scraping, parsing, promtool."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.support.prometheus import require_binary

REPO = Path(__file__).resolve().parents[2]
FAKE_RANK = Path(__file__).with_name("fake_rank.py")


def scrape(port: int, host: str = "127.0.0.1") -> str:
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as resp:
        return str(resp.read().decode())


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """{(sample name, labels): value} of an exposition."""
    out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(text: str, name: str, **labels: str) -> float:
    """The one sample `name` whose labels include `labels` (fails if none or several)."""
    want = set(labels.items())
    hits = [v for (n, ls), v in samples(text).items() if n == name and want <= ls]
    assert len(hits) == 1, f"{name}{labels}: {len(hits)} samples in\n{text}"
    return hits[0]


def promtool_check_metrics(text: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require_binary("promtool"), "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
    )


def rank_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment of a rank or run: this checkout importable, nothing inherited that
    would make it join another job or write into another metrics directory."""
    dropped = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
               "MASTER_PORT", "DDP_TRAINER_METRICS_DIR"}  # fmt: skip
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in dropped
        and "MULTIPROC_DIR" not in k.upper()
        and not k.startswith(("PET_", "TORCHELASTIC_"))
    }
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra or {})
    return env


def run_rank(spec: dict[str, Any], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run a fake rank to completion."""
    return subprocess.run(
        [sys.executable, str(FAKE_RANK), json.dumps(spec)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def start_rank(spec: dict[str, Any], env: dict[str, str]) -> subprocess.Popen[str]:
    """Start a fake rank and wait until it has logged (it prints ``ready``)."""
    proc = subprocess.Popen(
        [sys.executable, str(FAKE_RANK), json.dumps(spec)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line == "ready", f"fake rank failed: {line}{proc.stdout.read() if line else ''}"
    return proc


def wait_for_line(proc: subprocess.Popen[str], text: str, timeout: float = 120) -> tuple[str, str]:
    """(the first line of stderr, or of stdout where stderr goes there, containing `text`,
    everything read up to it); fails on a timeout or when the process ends first. The rest of
    the stream is drained in the background."""
    stream = proc.stderr if proc.stderr is not None else proc.stdout
    assert stream is not None
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        for line in stream:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"no '{text}' within {timeout} s:\n{''.join(seen)}") from None
        assert line is not None, f"ended (rc {proc.wait()}) before '{text}':\n{''.join(seen)}"
        seen.append(line)
        if text in line:
            return line, "".join(seen)
