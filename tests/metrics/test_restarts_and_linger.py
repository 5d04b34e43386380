"""Pod restarts show in trainer_restarts_total (one `train` rank per pod, as the chart runs it),
and the endpoint keeps serving the final values after the run until SIGTERM ends the wait."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.error
from pathlib import Path

from tests.metrics.helpers import REPO, rank_env, scrape, value
from tests.support.prometheus import free_port


def _train(tmp: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "trainer", "train", "--dataset", "digits", "--epochs", "1",
            "--checkpoint-dir", str(tmp / "ckpt"), "--checkpoint-every", "10",
            "--output-dir", str(tmp / "out"), *args]


def test_a_restarted_pod_counts_its_restart_and_lingers_until_sigterm(tmp_path: Path) -> None:
    first = subprocess.run(_train(tmp_path, "--max-steps", "20", "--metrics-port", "0"),
                           cwd=REPO, env=rank_env(), capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    port = free_port()
    proc = subprocess.Popen(
        _train(tmp_path, "--metrics-port", str(port), "--metrics-bind-address", "127.0.0.1",
               "--set", "metrics.linger_seconds=120"),
        cwd=REPO, env=rank_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        text = ""
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()[1]
            try:
                text = scrape(port)
                if value(text, "trainer_progress_ratio", rank="0") == 1.0 and (
                        tmp_path / "out" / "summary.json").exists():
                    break
            except (urllib.error.URLError, ConnectionError, AssertionError):
                pass
            time.sleep(0.2)
        else:
            raise AssertionError("the resumed run did not finish")
        # The second start of this rank's process in the same checkpoint directory.
        assert value(text, "trainer_restarts_total", rank="0") == 1
        assert value(text, "trainer_resumed_step", rank="0") == 20
        time.sleep(1.0)
        assert proc.poll() is None, "stopped serving before metrics.linger_seconds"
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)  # the pod goes away: stop lingering at once
        _, err = proc.communicate(timeout=60)
        assert time.monotonic() - t0 < 20
        assert proc.returncode == 0, err  # a completed run stays a success
    finally:
        if proc.poll() is None:
            proc.kill()
