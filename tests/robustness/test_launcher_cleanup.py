"""A launcher that fails leaves no rank behind, and a number of ranks the machine cannot run is
refused before any starts."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch
from conftest import REPO, run_cli

from tests.robustness.harness import assert_one_error_line
from trainer.errors import TrainerError
from trainer.ranks.launcher import check_nproc

# `ddp-trainer run` whose elastic agent fails to start its third rank as fork fails out of
# memory (EAGAIN): the Popen the agent calls raises after two ranks started. The two started
# ranks wait in the rendezvous for the other two.
FAILING_LAUNCHER = """
import errno, sys
import torch.distributed.elastic.multiprocessing.subprocess_handler.subprocess_handler as sh
real, started = sh.Popen, []
def popen(*args, **kwargs):
    if len(started) == 2:
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")
    started.append(real(*args, **kwargs))
    print("started rank pid", started[-1].pid, flush=True)
    return started[-1]
sh.Popen = popen
from trainer.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _marked(marker: str) -> list[int]:
    """Pids of the processes whose environment holds `marker` (the ranks inherit it)."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                environ = Path(f"/proc/{entry.name}/environ").read_bytes()
            except OSError:
                continue  # exited meanwhile
            if marker.encode() in environ.split(b"\0"):
                found.append(int(entry.name))
    return found


def test_a_launcher_failing_after_some_ranks_started_leaves_no_rank_running(
        tmp_path: Path) -> None:
    marker = f"DDP_TRAINER_TEST_MARK={uuid.uuid4().hex}"
    env = {k: v for k, v in os.environ.items()
           if k not in {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}
           and not k.startswith(("PET_", "TORCHELASTIC_"))}
    env.update(PYTHONPATH=str(REPO), DDP_TRAINER_TEST_MARK=marker.partition("=")[2])
    # --timeout 120: were a rank left behind, it would still leave the rendezvous by itself
    proc = subprocess.run(
        [sys.executable, "-c", FAILING_LAUNCHER, "run", "--nproc-per-node", "4",
         "--dataset", "synthetic", "--metrics-port", "0", "--timeout", "120",
         "--output-dir", str(tmp_path / "out")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240, check=False)
    started = [int(line.split()[-1]) for line in proc.stdout.splitlines()
               if line.startswith("started rank pid")]
    assert len(started) == 2, proc.stdout + proc.stderr
    line = assert_one_error_line(proc, 1, ("launcher failed", "Resource temporarily unavailable",
                                           "the 2 ranks it had started were stopped"))
    print(line)
    deadline = time.monotonic() + 30
    while (left := _marked(marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"ranks {left} outlived the launcher (started: {started})"


def test_more_ranks_than_the_cores_allow_are_refused_before_any_starts(tmp_path: Path) -> None:
    too_many = 4 * len(os.sched_getaffinity(0)) + 1
    common = ("--dataset", "synthetic", "--metrics-port", "0", "--output-dir",
              str(tmp_path / "out"))
    proc = run_cli("run", "--nproc-per-node", str(too_many), *common, cwd=tmp_path)
    assert_one_error_line(proc, 2, (f"--nproc-per-node {too_many}", "--oversubscribe"))
    assert not (tmp_path / "out").exists()
    proc = run_cli("run", "--nproc-per-node", "1000000", *common, cwd=tmp_path)
    assert_one_error_line(proc, 2, ("--nproc-per-node 1000000", "--oversubscribe"))


def test_on_a_gpu_node_one_rank_per_gpu_is_the_bound_unless_oversubscribed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The rule alone (this venv's torch has no CUDA): a node that shows two GPUs.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    check_nproc(2, oversubscribe=False, device="auto")
    with pytest.raises(TrainerError, match="more than the 2 GPUs here") as err:
        check_nproc(3, oversubscribe=False, device="auto")
    assert "--oversubscribe" in err.value.fix
    check_nproc(3, oversubscribe=True, device="auto")
    check_nproc(3, oversubscribe=False, device="cpu")  # CPU ranks: the per-core bound


def test_ranks_die_with_a_launcher_killed_by_sigkill(tmp_path: Path) -> None:
    # The launcher cannot stop its ranks when SIGKILL ends it: they trained on under PID 1.
    marker = f"DDP_TRAINER_TEST_MARK={uuid.uuid4().hex}"
    env = {k: v for k, v in os.environ.items()
           if k not in {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}
           and not k.startswith(("PET_", "TORCHELASTIC_"))}
    env.update(PYTHONPATH=str(REPO), DDP_TRAINER_TEST_MARK=marker.partition("=")[2])
    ckpt = tmp_path / "ckpt"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "trainer", "run", "--nproc-per-node", "2", "--dataset",
         "synthetic", "--epochs", "100000", "--metrics-port", "0", "--checkpoint-dir",
         str(ckpt), "--checkpoint-every", "1", "--output-dir", str(tmp_path / "out")],
        cwd=tmp_path, env=env, stderr=subprocess.DEVNULL)
    ranks: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while not any(ckpt.glob("ckpt-*.pt")):  # training: every rank is past its start
            assert launcher.poll() is None and time.monotonic() < deadline, "it never trained"
            time.sleep(0.05)
        ranks = [pid for pid in _marked(marker) if pid != launcher.pid]
        assert len(ranks) >= 2, ranks
        launcher.kill()
        launcher.wait()
        deadline = time.monotonic() + 30
        while (left := [pid for pid in _marked(marker) if pid in ranks]) and \
                time.monotonic() < deadline:
            time.sleep(0.1)
        assert not left, f"ranks {left} outlived their launcher"
    finally:
        launcher.kill()
        for pid in _marked(marker):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
