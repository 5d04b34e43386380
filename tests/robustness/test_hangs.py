"""A hung run names its culprit and ends, so that a restart resumes exactly (issue 43).

Whole runs of `ddp-trainer run` with 2 CPU ranks and user code from tests/fixtures/hangs.py
that blocks on one rank; the verdict is the launcher's cause line (the ranks leave it to it).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, read_json, run_cli

FIXTURES = REPO / "tests" / "fixtures"
HANG = "8"
"""dist.hang_seconds of these runs: the 2-rank digits step takes ~3 ms, so the floor rules."""
VERDICT = re.compile(r"^error: hang: .+ \(fix: .+\)$", re.MULTILINE)
AGAIN = re.compile(r"^error: hang again at the same place \(not restarted: it would hang "
                   r"again\): .+ \(fix: .+\)$", re.MULTILINE)


def hang_run(tmp_path: Path, *extra: str, env: dict[str, str] | None = None,
             restarts: int = 0, dataset: str = "digits"
             ) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    proc = run_cli(
        "run", "--nproc-per-node", "2", "--max-restarts", str(restarts), "--dataset", dataset,
        "--output-dir", str(tmp_path / "out"), "--metrics-port", "0",
        "--set", "metrics.linger_seconds=0", "--set", "dist.timeout_seconds=120",
        "--set", f"dist.hang_seconds={HANG}", *extra, cwd=tmp_path, timeout=400,
        env={"PYTHONPATH": f"{REPO}{os.pathsep}{FIXTURES}", **(env or {})})
    return proc, time.monotonic() - started


def verdict_of(proc: subprocess.CompletedProcess[str], again: bool = False) -> str:
    found = (AGAIN if again else VERDICT).findall(proc.stderr)
    assert len(found) == 1, proc.stderr[-4000:]
    return str(found[0])


def test_a_rank_stuck_in_user_code_is_named_with_its_line_and_every_rank_exits_142(
        tmp_path: Path) -> None:
    proc, seconds = hang_run(tmp_path, "--epochs", "50", "--set", "train.step=hangs:step")
    line = verdict_of(proc)
    assert proc.returncode == 142, proc.stderr[-3000:]
    assert "rank 1 (pod " in line and "in user code" in line, line
    assert "hangs.py:" in line and "in _block" in line, line
    assert "rank 0 waits for it in the backward pass" in line, line
    # every rank printed every thread's stack
    assert "--- hang watchdog, rank 0:" in proc.stderr and \
        "--- hang watchdog, rank 1:" in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert seconds < float(HANG) + 60 + 60, seconds  # deadline + 60 s, + start-up


def test_a_dataset_item_that_never_comes_back_names_the_data_wait_and_dumps_the_workers(
        tmp_path: Path) -> None:
    # the 400th item of a worker: past the first step, whose deadline is the collective timeout
    proc, _ = hang_run(tmp_path, "--epochs", "50", "--set", "data.num_workers=1",
                       dataset="hangs:blocking_dataset", env={"HANG_AT": "400"})
    line = verdict_of(proc)
    assert proc.returncode == 142, proc.stderr[-3000:]
    assert "rank 1 (pod " in line and "waiting for its next batch" in line, line
    assert "DataLoader workers" in line, line
    # the worker's own stack (faulthandler, signalled by the watchdog) shows the dataset's line
    assert re.search(r'File ".*hangs\.py", line \d+ in __getitem__', proc.stderr), \
        proc.stderr[-4000:]


def test_a_collective_called_by_one_rank_only_is_named_at_its_line(tmp_path: Path) -> None:
    proc, _ = hang_run(tmp_path, "--epochs", "50", "--set", "train.step=hangs:desync_step")
    line = verdict_of(proc)
    assert proc.returncode == 142, proc.stderr[-3000:]
    assert "rank 1 (pod " in line and "in user code" in line, line
    assert "hangs.py:" in line and "in desync_step" in line, line


def test_a_first_step_slower_than_the_deadline_is_not_a_hang(tmp_path: Path) -> None:
    """Until its first step a rank compiles, starts workers, resumes: the collective timeout
    is its deadline, not dist.hang_seconds (the step sleeps 2x the deadline once)."""
    proc, _ = hang_run(tmp_path, "--epochs", "1", "--set", "train.step=hangs:slow_first_step",
                       "--set", f"dist.hang_seconds={float(HANG) / 2}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "hang" not in proc.stderr


def _uninterrupted(tmp_path: Path) -> dict[str, object]:
    proc = run_cli("run", "--nproc-per-node", "2", "--dataset", "digits", "--epochs", "3",
                   "--output-dir", str(tmp_path / "plain"), "--metrics-port", "0",
                   "--set", "metrics.linger_seconds=0", "--set", "train.step=hangs:step",
                   "--set", "dist.hang_seconds=0", cwd=tmp_path, timeout=300,
                   env={"PYTHONPATH": f"{REPO}{os.pathsep}{FIXTURES}", "HANG_RANK": "-1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return read_json(tmp_path / "plain" / "summary.json")


def test_a_hung_run_restarts_from_its_checkpoint_and_ends_exactly_as_uninterrupted(
        tmp_path: Path) -> None:
    expected = _uninterrupted(tmp_path)
    proc, _ = hang_run(tmp_path, "--epochs", "3", "--set", "train.step=hangs:step",
                       "--checkpoint-dir", str(tmp_path / "ckpt"),
                       "--set", "checkpoint.every=10", restarts=1,
                       env={"HANG_ONCE": str(tmp_path / "hung-once"), "HANG_AT": "40"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "hung-once").exists()  # it did hang once
    assert "--- hang watchdog, rank 1:" in proc.stderr
    got = read_json(tmp_path / "out" / "summary.json")
    for key in ("train_loss", "val_accuracy", "val_loss", "val_correct", "steps"):
        assert got[key] == expected[key], (key, got[key], expected[key])
    assert got["resumed_from_step"] is not None and got["resumed_from_step"] > 0


def test_a_hang_at_the_same_place_again_is_not_restarted_for_ever(tmp_path: Path) -> None:
    """Its second time, the same rank, phase, step and line: exit 6 (permanent for the
    operator's ExitCode policy), and the line says so."""
    proc, _ = hang_run(tmp_path, "--epochs", "3", "--checkpoint-dir", str(tmp_path / "ckpt"),
                       "--set", "checkpoint.every=5", restarts=1,
                       dataset="hangs:blocking_dataset", env={"HANG_ITEM": "300"})
    assert proc.returncode == 6, proc.stderr[-3000:]
    line = verdict_of(proc, again=True)
    assert "hangs.py:" in line and "waiting for its next batch" in line, line
    histories = [p.read_text().splitlines() for p in (tmp_path / "ckpt").glob(".hangs-rank-*")]
    places = [json.loads(entry)["place"] for history in histories for entry in history]
    assert len(places) >= 2 and len(set(places)) < len(places), places


def test_a_checkpoint_write_that_blocks_names_rank_0_saving_and_the_writers_line(
        tmp_path: Path) -> None:
    """A FIFO where rank 0's writer will find the file of step 600 (a blocking open, as on a
    hung network volume): the writer thread blocks reading it, the next save waits for it."""
    ckpt = tmp_path / "ckpt"
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer", "run", "--nproc-per-node", "2", "--dataset", "digits",
         "--epochs", "60", "--output-dir", str(tmp_path / "out"), "--metrics-port", "0",
         "--checkpoint-dir", str(ckpt), "--set", "checkpoint.every=200",
         "--set", "checkpoint.every_seconds=0", "--set", "metrics.linger_seconds=0",
         "--set", "dist.timeout_seconds=120", "--set", f"dist.hang_seconds={HANG}"],
        cwd=tmp_path, env=_env(), stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        while not (ckpt / "ckpt-000000200.pt").exists():
            assert time.monotonic() < deadline and proc.poll() is None, "no first checkpoint"
            time.sleep(0.05)
        os.mkfifo(ckpt / "ckpt-000000600.pt")
        _, err = proc.communicate(timeout=float(HANG) + 180)
    finally:
        proc.kill()
    line = VERDICT.findall(err)
    assert proc.returncode == 142 and line, err[-3000:]
    assert line[0].startswith("error: hang: rank 0 (pod ") and "saving a checkpoint" in line[0] \
        and "checkpoint.py:" in line[0] and "check the checkpoint storage" in line[0], line[0]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_"))}
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{FIXTURES}"
    return env


@pytest.mark.skipif(sys.platform != "linux", reason="the rank's children are read from /proc")
def test_a_frozen_rank_is_named_as_silent(tmp_path: Path) -> None:
    """SIGSTOP freezes rank 1 whole (its watchdog too): rank 0 names it as silent."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer", "run", "--nproc-per-node", "2", "--dataset", "digits",
         "--epochs", "200", "--output-dir", str(tmp_path / "out"), "--metrics-port", "0",
         "--set", "metrics.linger_seconds=0", "--set", "dist.timeout_seconds=120",
         "--set", f"dist.hang_seconds={HANG}"],
        cwd=tmp_path, env=_env(), stderr=subprocess.PIPE, text=True)
    try:
        rank1 = _wait_for_rank(proc.pid, 1, tmp_path)
        os.kill(rank1, signal.SIGSTOP)
        _, err = proc.communicate(timeout=float(HANG) + 120)
    finally:
        proc.kill()
    line = VERDICT.findall(err)
    assert proc.returncode == 142 and line, err[-3000:]
    assert "rank 1" in line[0] and "has sent no heartbeat" in line[0], line[0]


def _wait_for_rank(launcher: int, rank: int, tmp_path: Path) -> int:
    """The pid of `launcher`'s rank `rank` once the ranks train (rank 0 logged a step)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for child in _descendants(launcher):
            try:
                environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            steps = tmp_path / "out" / "steps.jsonl"
            if f"RANK={rank}".encode() in environ and steps.exists() and steps.stat().st_size:
                return child
        time.sleep(0.2)
    raise AssertionError("rank never started")


def _descendants(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True,
                         check=False).stdout.split()
    found = [int(p) for p in out]
    return found + [d for p in found for d in _descendants(p)]
