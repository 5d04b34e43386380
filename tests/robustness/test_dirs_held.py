"""A run holds its output and checkpoint directories: a second run given them while the first
runs is refused in one line before it writes anything, and a run resumed after the first died
takes them again (trainer/ranks/dirlock.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO, run_cli

from tests.robustness.harness import assert_one_error_line

SMALL = ("--dataset", "synthetic", "--set", "data.synthetic_samples=60", "--batch-size", "16",
         "--metrics-port", "0")


@pytest.fixture
def first_run(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path, Path]]:
    """A `train` run that is training (it wrote a checkpoint) and goes on for a long while."""
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    proc = subprocess.Popen([sys.executable, "-m", "trainer", "train", *SMALL, "--epochs",
                             "100000", "--checkpoint-every", "1", "--output-dir", str(out),
                             "--checkpoint-dir", str(ckpt)],
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                            stderr=subprocess.DEVNULL, text=True)
    try:
        deadline = time.monotonic() + 120
        while not any(ckpt.glob("ckpt-*.pt")):
            assert proc.poll() is None and time.monotonic() < deadline, "it never trained"
            time.sleep(0.05)
        yield proc, out, ckpt
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("command", ["train", "run"])
def test_a_second_run_given_the_same_directories_is_refused_in_one_line(
        first_run: tuple[subprocess.Popen[str], Path, Path], tmp_path: Path,
        command: str) -> None:
    proc, out, ckpt = first_run
    extra = ("--nproc-per-node", "2") if command == "run" else ()
    second = run_cli(command, *extra, *SMALL, "--epochs", "1", "--output-dir", str(out),
                     "--checkpoint-dir", str(ckpt))
    assert_one_error_line(second, 2, ("is in use by another run", "--output-dir"))
    assert proc.poll() is None  # the first goes on


def test_a_run_resumed_after_the_first_was_killed_takes_its_directories(
        first_run: tuple[subprocess.Popen[str], Path, Path]) -> None:
    proc, out, ckpt = first_run
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    resumed = run_cli("train", *SMALL, "--epochs", "1", "--output-dir", str(out),
                      "--checkpoint-dir", str(ckpt), "--max-steps", "1000000")
    assert resumed.returncode == 0, resumed.stderr
    assert "resum" in resumed.stderr.lower(), resumed.stderr
    assert (out / "summary.json").is_file()


HOLD_AND_FORK = """
import os, sys, time
from pathlib import Path
from trainer.ranks.dirlock import Held
Held().take(Path(sys.argv[1]), "output.dir", "x")
child = os.fork()
if child == 0:  # a DataLoader worker of the rank, still leaving when the rank is gone
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    time.sleep(60)
    os._exit(0)
print("held", child, flush=True)
os._exit(9)  # the rank, killed
"""


def test_a_forked_child_of_a_dead_holder_does_not_keep_the_directory(tmp_path: Path) -> None:
    # A restarted rank 0 (--max-restarts) must take the directory while a DataLoader worker of
    # the rank it replaces still exits: an flock, shared with forked children, refused it.
    from trainer.ranks.dirlock import Held

    proc = subprocess.run([sys.executable, "-c", HOLD_AND_FORK, str(tmp_path)], cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                          text=True, timeout=60, check=False)
    word, child = proc.stdout.split()
    assert word == "held", proc.stderr
    held = Held()
    try:
        assert Path(f"/proc/{child}").exists()  # the child lives on
        held.take(tmp_path, "output.dir", "x")
    finally:
        held.release()
        os.kill(int(child), signal.SIGKILL)
