"""Pod restarts show in trainer_restarts_total (one `train` rank per pod, as the chart runs it),
and the finished rank keeps serving its final values until a scrape has read them."""

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
