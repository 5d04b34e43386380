"""A real 2-rank `ddp-trainer run` scraped by a real Prometheus.

Asserts through Prometheus' HTTP API that both ranks are served on the one port, that every
dashboard query evaluates (core panels with data) and that the alert rules evaluate
against live data; `promtool check metrics` runs on a live scrape.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
from pathlib import Path

import pytest
import yaml

from tests.metrics.dashboard import label_values_as_promql, load, substitute, targets
from tests.metrics.helpers import (
    REPO,
    promtool_check_metrics,
    rank_env,
    scrape,
    value,
    wait_for_line,
)
from tests.metrics.test_alerts import ALERTS
from tests.support.prometheus import PrometheusServer, free_port
from trainer.components import checkpoint

pytestmark = pytest.mark.slow

# Target labels a PodMonitor would attach (CONTRACTS.md "Image and chart").
POD_LABELS = {
    "namespace": "it-ns",
    "pytorchjob": "digits-it",
    "replica_type": "master",
    "replica_index": "0",
}
VARIABLES = {
    "datasource": "prometheus",
    "namespace": POD_LABELS["namespace"],
    "pytorchjob": POD_LABELS["pytorchjob"],
    "__rate_interval": "10s",
}
# Panels that legitimately have no data on this run (CPU only).
MAY_BE_EMPTY = {"CUDA memory per rank"}


def start_run(port: int, tmp: Path, *extra: str, linger: float = 0) -> subprocess.Popen[str]:
    # `python -m trainer` is the `ddp-trainer` console script, run from this checkout.
    cmd = [
        sys.executable, "-m", "trainer", "run",
        "--nproc-per-node", "2",
        "--metrics-port", str(port),
        "--metrics-bind-address", "127.0.0.1",
        "--dataset", "digits",
        "--epochs", "80",
        "--batch-size", "16",
        "--log-every", "5",
        "--output-dir", str(tmp / "out"),
        "--checkpoint-dir", str(tmp / "ckpt"),
        "--set", "checkpoint.every_seconds=0",  # epoch-end checkpoints: one is seen mid-run
        "--set", f"metrics.linger_seconds={linger}", *extra,
    ]  # fmt: skip
    return subprocess.Popen(
        cmd, cwd=REPO, env=rank_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def live_scrape(port: int, proc: subprocess.Popen[str], timeout: float = 120) -> str:
    """The endpoint's text once both ranks have logged a training interval."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            raise AssertionError(f"the run ended before both ranks were scraped:\n{out[-4000:]}")
        try:
            text = scrape(port)
            if (
                all(value(text, "trainer_steps_total", rank=r) > 0 for r in ("0", "1"))
                and 'rank="1"' in text
            ):
                return text
        except (urllib.error.URLError, ConnectionError, AssertionError):
            pass
        time.sleep(0.2)
    raise TimeoutError(f"no series of both ranks at :{port}/metrics after {timeout}s")


def test_two_rank_run_serves_both_ranks_and_every_dashboard_query_evaluates(
    tmp_path: Path,
) -> None:
    port = free_port()
    with PrometheusServer(
        [f"127.0.0.1:{port}"], rule_files=[ALERTS], scrape_interval="1s", labels=POD_LABELS
    ) as prom:
        # Runs until stopped below: a fixed length raced the 20 s rate() window on a fast
        # host (digits x 80 epochs ended in ~15 s on a 2026-12 Xeon).
        proc = start_run(port, tmp_path, "--epochs", "100000")
        try:
            text = live_scrape(port, proc)
            check = promtool_check_metrics(text)
            assert check.returncode == 0, check.stdout + check.stderr
            assert not (check.stdout + check.stderr).strip(), check.stdout + check.stderr

            for rank in ("0", "1"):
                for metric in ("trainer_loss", "trainer_accuracy_ratio"):
                    rows = prom.wait_for(f'{metric}{{rank="{rank}", split="train"}} > 0', 60)
                    assert rows[0]["metric"]["pytorchjob"] == "digits-it"
            # A validation has run and a few seconds of samples exist for rate().
            prom.wait_for('trainer_global_accuracy_ratio{split="val"} > 0', 60)
            prom.wait_for("trainer_last_checkpoint_timestamp_seconds > 0", 60)
            prom.wait_for("count_over_time(trainer_steps_total[20s]) >= 6", 60)
            at = time.time()
            assert proc.poll() is None, "the run ended too early for rate() windows"

            dashboard = load()
            for var in dashboard["templating"]["list"]:
                if var["type"] != "query":
                    continue
                promql, label = label_values_as_promql(substitute(var["definition"], VARIABLES))
                found = {row["metric"][label] for row in prom.query(promql, at)}
                assert VARIABLES[var["name"]] in found, (var["name"], found)

            empty = []
            for t in targets(dashboard):
                rows = prom.query(substitute(t.expr, VARIABLES), at)  # raises on a bad query
                if not rows and t.panel not in MAY_BE_EMPTY:
                    empty.append(f"{t.panel} [{t.ref}]: {t.expr}")
            assert not empty, "dashboard queries without data:\n" + "\n".join(empty)

            world = prom.query(
                substitute('max(trainer_world_size{pytorchjob="$pytorchjob"})', VARIABLES), at
            )
            assert float(world[0]["value"][1]) == 2

            groups = prom.api("rules")["groups"]
            rules = [r for g in groups for r in g["rules"]]
            declared = [r["alert"] for g in yaml.safe_load(ALERTS.read_text())["groups"]
                        for r in g["rules"]]
            assert sorted(r["name"] for r in rules) == sorted(declared)  # every rule loaded
            assert all(r["health"] == "ok" for r in rules), [
                (r["name"], r.get("lastError")) for r in rules
            ]
            assert prom.alerts() == []  # a healthy run fires nothing
        finally:
            proc.send_signal(signal.SIGTERM)  # as an eviction would: checkpoint, then exit 143
            out = _finish(proc, 180)
        assert proc.returncode == 143, out[-4000:]
    saved = checkpoint.load_latest(tmp_path / "ckpt")
    assert saved is not None and saved[0]["world_size"] == 2
    assert not any(
        k.startswith(("PROMETHEUS_MULTIPROC", "DDP_TRAINER_METRICS")) for k in os.environ
    )


def test_run_with_the_metrics_port_taken_fails_with_one_error_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "trainer", "run", "--nproc-per-node", "2",
             "--metrics-port", str(port), "--metrics-bind-address", "127.0.0.1",
             "--dataset", "digits", "--epochs", "1", "--output-dir", str(tmp_path)],
            cwd=REPO, env=rank_env(), capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: metrics port 127.0.0.1:{port} is already in use (fix: stop the other "
        "process, pass another --metrics-port, or --metrics-port 0 to disable metrics)"
    ]
    assert not (tmp_path / "summary.json").exists()


def test_plain_torchrun_serves_both_local_ranks_on_one_port(tmp_path: Path) -> None:
    """`ddp-trainer train` under torchrun (no launcher of ours): local rank 0 serves all."""
    port = free_port()
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        "-m", "trainer", "train",
        "--metrics-port", str(port), "--metrics-bind-address", "127.0.0.1",
        "--dataset", "digits", "--epochs", "60", "--batch-size", "16", "--log-every", "5",
        "--output-dir", str(tmp_path / "out"), "--set", "metrics.linger_seconds=0",
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=rank_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        text = live_scrape(port, proc)
    finally:
        out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-4000:]
    for rank in ("0", "1"):
        assert value(text, "trainer_info", rank=rank, local_rank=rank) == 1
    assert "pid=" not in text


def _finish(proc: subprocess.Popen[str], timeout: float = 300) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out


def test_final_values_reach_prometheus_whose_scrape_ends_the_linger(tmp_path: Path) -> None:
    port = free_port()
    with PrometheusServer([f"127.0.0.1:{port}"], scrape_interval="1s", labels=POD_LABELS) as prom:
        proc = start_run(port, tmp_path, "--epochs", "3", linger=60)
        try:
            line, out = wait_for_line(proc, "serving the final metrics on", timeout=300)
            assert "until a scrape has read them, at most 60 s" in line, out[-4000:]
            proc.wait(timeout=30)  # a scrape every second, not the 60 s bound, ended it
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 0, out[-4000:]
        summary = json.loads((tmp_path / "out" / "summary.json").read_text())
        # The last samples Prometheus stored (the endpoint is gone by now, so an instant query
        # would see the staleness markers): the launcher kept serving the final values.
        rows = prom.query('last_over_time(trainer_global_accuracy_ratio{split="val"}[5m])')
        assert rows and float(rows[0]["value"][1]) == summary["val_accuracy"], rows
        for rank in ("0", "1"):
            steps = prom.query(f'last_over_time(trainer_steps_total{{rank="{rank}"}}[5m])')
            assert float(steps[0]["value"][1]) == summary["steps"], steps


def test_a_diverged_loss_reaches_prometheus_before_the_job_stops(tmp_path: Path) -> None:
    port = free_port()
    with PrometheusServer([f"127.0.0.1:{port}"], rule_files=[ALERTS], scrape_interval="1s",
                          labels=POD_LABELS) as prom:
        proc = start_run(port, tmp_path, "--lr", "1e30", "--set", "optim.momentum=0",
                         linger=4)
        out = _finish(proc)
        assert proc.returncode == 3, out[-4000:]
        assert out.count("error: training loss became") == 2, out[-4000:]  # both ranks
        # a failed run's values feed alerts: served the whole bound, however soon scraped
        assert f"serving the final metrics on :{port} for 4 s" in out, out[-4000:]
        last = 'last_over_time(trainer_loss{split="train"}[5m])'
        rows = prom.query(f"({last} != {last}) or (abs({last}) == Inf)")  # the alert's test
        assert {r["metric"]["rank"] for r in rows} == {"0", "1"}, rows
