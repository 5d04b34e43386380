"""A checkpoint taken by 3 real gloo ranks resumes on 2 ranks: every sample trained once."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("gloo_resume_worker.py")
REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_world(world: int, out: Path, state_in: Path | None, **args: int) -> dict[str, object]:
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    flags = [f"--{k}={v}" for k, v in args.items()]
    flags += [f"--world={world}", f"--port={port}", f"--out={out}"]
    flags += [f"--state-in={state_in}"] if state_in else []
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), f"--rank={r}", *flags],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(world)
    ]
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=180)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)
    result: dict[str, object] = json.loads(out.read_text())
    return result


def test_resume_from_three_gloo_ranks_on_two_trains_every_sample_exactly_once(
    tmp_path: Path,
) -> None:
    n, batch, epoch = 65_541, 256, 2  # above 2^16: the Feistel order, not randperm
    first = _run_world(3, tmp_path / "a.json", None, n=n, batch=batch, steps=20, epoch=epoch)
    state = first["state"]
    assert isinstance(state, dict)
    assert (state["epoch"], state["position"], state["num_replicas"]) == (epoch, 20 * 256 * 3, 3)
    second = _run_world(
        2, tmp_path / "b.json", tmp_path / "a.json", n=n, batch=batch, steps=-1, epoch=epoch
    )
    assert isinstance(second["state"], dict) and second["state"]["position"] == n
    seen: Counter[int] = Counter()
    for run in (first, second):
        for rank_indices in run["trained"]:  # type: ignore[attr-defined]
            seen.update(rank_indices)
    assert set(seen) == set(range(n))
    remaining = n - 20 * 256 * 3
    assert sum(seen.values()) - n == -remaining % 2  # only the new world's torch-style padding
