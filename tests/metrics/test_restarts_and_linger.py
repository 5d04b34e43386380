"""Pod restarts show in trainer_restarts_total (one `train` rank per pod, as the chart runs it),
and a completed rank keeps serving its final values until a scrape has read them, a failed one
the whole `metrics.linger_seconds`."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from tests.metrics.helpers import REPO, rank_env, scrape, value, wait_for_line
from tests.support.prometheus import free_port


def _train(tmp: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "trainer", "train", "--dataset", "digits", "--epochs", "1",
            "--checkpoint-dir", str(tmp / "ckpt"), "--checkpoint-every", "10",
            "--output-dir", str(tmp / "out"), *args]


def test_a_restarted_pod_counts_its_restart_and_stops_lingering_once_scraped(
        tmp_path: Path) -> None:
    first = subprocess.run(_train(tmp_path, "--max-steps", "20", "--metrics-port", "0"),
                           cwd=REPO, env=rank_env(), capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    port = free_port()
    proc = subprocess.Popen(
        _train(tmp_path, "--metrics-port", str(port), "--metrics-bind-address", "127.0.0.1",
               "--set", "metrics.linger_seconds=120"),
        cwd=REPO, env=rank_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        line, _ = wait_for_line(proc, "serving the final metrics on", timeout=240)
        assert "until a scrape has read them, at most 120 s" in line, line
        text = scrape(port)  # the first scrape of the final values
        assert value(text, "trainer_progress_ratio", rank="0") == 1.0
        assert (tmp_path / "out" / "summary.json").exists()
        # The second start of this rank's process in the same checkpoint directory.
        assert value(text, "trainer_restarts_total", rank="0") == 1
        assert value(text, "trainer_resumed_step", rank="0") == 20
        t0 = time.monotonic()
        proc.wait(timeout=60)  # the pod is not held for the 120 s bound
        assert time.monotonic() - t0 < 30
        assert proc.returncode == 0  # a completed run stays a success
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_diverged_rank_serves_its_final_values_the_whole_bound_though_scraped(
        tmp_path: Path) -> None:
    # A failed run's last values feed alerts (DDPTrainerLossNotFinite reads the instant
    # trainer_loss): Prometheus evaluates rules on its own schedule, so one scrape is not enough.
    bound = 6.0
    port = free_port()
    proc = subprocess.Popen(
        _train(tmp_path, "--lr", "1e30", "--set", "optim.momentum=0", "--metrics-port", str(port),
               "--metrics-bind-address", "127.0.0.1", "--set", f"metrics.linger_seconds={bound}"),
        cwd=REPO, env=rank_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        line, out = wait_for_line(proc, "serving the final metrics on", timeout=240)
        t0 = time.monotonic()
        assert f"for {bound:g} s" in line, out[-4000:]
        loss = value(scrape(port), "trainer_loss", rank="0", split="train")
        assert loss != loss or abs(loss) == float("inf")
        proc.wait(timeout=60)
        # measured from reading the line, just after the wait began: a little under the bound
        assert time.monotonic() - t0 >= bound - 1.0, "a scrape ended a failed run's linger"
        assert proc.returncode == 3
    finally:
        if proc.poll() is None:
            proc.kill()


def test_linger_scrapes_zero_serves_a_completed_run_the_whole_bound(tmp_path: Path) -> None:
    bound = 6.0
    port = free_port()
    proc = subprocess.Popen(
        _train(tmp_path, "--max-steps", "5", "--metrics-port", str(port),
               "--metrics-bind-address", "127.0.0.1", "--set", f"metrics.linger_seconds={bound}",
               "--set", "metrics.linger_scrapes=0"),
        cwd=REPO, env=rank_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        line, out = wait_for_line(proc, "serving the final metrics on", timeout=240)
        t0 = time.monotonic()
        assert f"for {bound:g} s" in line, out[-4000:]
        assert value(scrape(port), "trainer_steps_total", rank="0") == 5
        proc.wait(timeout=60)
        # measured from reading the line, just after the wait began: a little under the bound
        assert time.monotonic() - t0 >= bound - 1.0, "a scrape ended the linger"
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()

