"""One endpoint per host: every local rank's series at the launcher's (or local rank 0's)
port, with real rank processes."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from tests.metrics.helpers import (
    FAKE_RANK,
    promtool_check_metrics,
    rank_env,
    run_rank,
    samples,
    scrape,
    start_rank,
    value,
)
from tests.support.prometheus import free_port
from trainer.config import MetricsConfig
from trainer.errors import ConfigError
from trainer.metrics import ENV_DIR, NullSink, RunInfo, build_metrics, start_launcher_exporter

pytestmark = pytest.mark.slow

DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def spec(rank: int, port: int, logs: list[dict[str, object]], **extra: object) -> dict[str, object]:
    return {
        "rank": rank,
        "local_rank": rank,
        "world_size": 2,
        "local_world_size": 2,
        "port": port,
        "logs": logs,
        **extra,
    }


def scrape_two_held_ranks(
    port: int, env: dict[str, str], hold: Path, logs: list[list[dict[str, object]]]
) -> str:
    """Ranks 0 and 1 log `logs[rank]` and stay alive while the endpoint is scraped."""
    ranks = [start_rank(spec(r, port, logs[r], hold=str(hold)), env) for r in (0, 1)]
    try:
        return scrape(port)
    finally:
        hold.touch()
        for proc in ranks:
            assert proc.wait(timeout=30) == 0


def test_launcher_serves_both_local_ranks_on_one_port(tmp_path: Path) -> None:
    port = free_port()
    exporter = start_launcher_exporter(MetricsConfig(port=port, bind_address="127.0.0.1"), 2)
    try:
        assert exporter.port == port
        logs = [[{"train/loss": 1.0 + r, "train/steps": 5, "train/accuracy": 0.5}] for r in (0, 1)]
        text = scrape_two_held_ranks(port, rank_env(exporter.env), tmp_path / "release", logs)
        assert value(text, "trainer_loss", rank="0", split="train") == 1.0
        assert value(text, "trainer_loss", rank="1", split="train") == 2.0
        assert value(text, "trainer_steps_total", rank="1") == 5
        assert value(text, "trainer_info", rank="1", local_rank="1") == 1
        # No pid label leaks from multiprocess mode; series are per rank only.
        assert "pid=" not in text
        check = promtool_check_metrics(text)
        assert check.returncode == 0 and not (check.stdout + check.stderr).strip(), check
        # The values outlive the rank processes until the launcher closes.
        assert value(scrape(port), "trainer_loss", rank="1", split="train") == 2.0
    finally:
        exporter.close()
    assert not Path(exporter.env[ENV_DIR]).exists()
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))


def documented_series() -> dict[str, bool]:
    """{name: rank 0 only} of every metric in docs/metrics.md's table that a CPU rank
    outside Kubeflow Trainer v2 exports."""
    rows = re.findall(r"^\| `(trainer_\w+)` \| [^|]+ \| ([^|]+) \|", DOCS.read_text(), re.M)
    assert len(rows) > 20, rows
    return {
        name: 'rank="0"' in labels
        for name, labels in rows
        if "cuda" not in name and "trainjob" not in name
    }


def test_every_documented_series_is_served_by_the_launcher_before_the_first_log(
    tmp_path: Path,
) -> None:
    # Under `ddp-trainer run` a gauge never set() was not exported at all (multiprocess
    # mode), so four series appeared only with the first step, validation or checkpoint.
    port = free_port()
    exporter = start_launcher_exporter(MetricsConfig(port=port, bind_address="127.0.0.1"), 2)
    try:
        text = scrape_two_held_ranks(port, rank_env(exporter.env), tmp_path / "release", [[], []])
    finally:
        exporter.close()
    served = {(name, ls) for name, ls in samples(text)}
    for name, rank0_only in documented_series().items():
        for rank in ("0", "1"):
            present = any(
                (n == name or n == f"{name}_count") and ("rank", rank) in ls for n, ls in served
            )
            assert present == (rank == "0" or not rank0_only), (name, rank, text)
    assert value(text, "trainer_last_step_timestamp_seconds", rank="1") == 0
    assert value(text, "trainer_last_checkpoint_timestamp_seconds", rank="0") == 0
    assert value(text, "trainer_global_loss", rank="0", split="val") == 0


def test_restarted_rank_continues_counters_and_replaces_gauges() -> None:
    port = free_port()
    exporter = start_launcher_exporter(MetricsConfig(port=port, bind_address="127.0.0.1"), 1)
    try:
        env = rank_env(exporter.env)
        first = run_rank(
            spec(0, port, [{"run/restarts": 0}, {"train/steps": 7, "train/loss": 3.0}]), env
        )
        assert first.returncode == 0, first.stdout + first.stderr
        for restarts in (1, 2):  # the elastic agent restarts the worker group twice
            again = run_rank(
                spec(0, port, [{"run/restarts": restarts}, {"train/steps": 2, "train/loss": 0.5}]),
                env,
            )
            assert again.returncode == 0, again.stdout + again.stderr
        text = scrape(port)
    finally:
        exporter.close()
    assert value(text, "trainer_steps_total", rank="0") == 11
    assert value(text, "trainer_restarts_total", rank="0") == 2
    assert value(text, "trainer_loss", rank="0", split="train") == 0.5


def test_metrics_port_zero_turns_the_ranks_metrics_off(monkeypatch: pytest.MonkeyPatch) -> None:
    exporter = start_launcher_exporter(MetricsConfig(port=0), 2)
    assert exporter.port == 0
    for key, val in exporter.env.items():
        monkeypatch.setenv(key, val)
    # A rank whose own config asks for a port (a user script's fit()) still exports nothing.
    registry = CollectorRegistry()
    sink = build_metrics(MetricsConfig(port=free_port(), bind_address="127.0.0.1"),
                         RunInfo(rank=0, local_rank=0, world_size=2, local_world_size=2,
                                 backend="gloo", strategy="ddp", model="mlp",
                                 dataset="digits", device="cpu", version="0"),
                         registry)
    assert isinstance(sink, NullSink) and list(registry.collect()) == []
    sink.close()
    exporter.close()


def test_launcher_port_in_use_is_a_config_error_and_leaves_no_directory() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"127.0.0.1:{port} is already in use"):
            start_launcher_exporter(MetricsConfig(port=port, bind_address="127.0.0.1"), 2)


def test_rank_outside_the_launcher_reports_port_in_use_as_one_error_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_rank({**spec(0, port, []), "local_world_size": 1}, rank_env())
    assert result.returncode == 2
    assert result.stdout.strip().splitlines() == [
        f"error: metrics port 127.0.0.1:{port} is already in use (fix: stop the other "
        "process, pass another --metrics-port, or --metrics-port 0 to disable metrics)"
    ]
    assert "Traceback" not in result.stderr


def test_plain_torchrun_local_ranks_share_local_rank_0s_endpoint(tmp_path: Path) -> None:
    """Without our launcher, sibling ranks (children of one agent) still share one port."""
    port = free_port()
    hold = tmp_path / "release"
    out = tmp_path / "scrape.txt"
    # This small agent plays torchrun: it is the common parent of both local ranks.
    agent = textwrap.dedent(
        f"""
        import json, subprocess, sys, time, urllib.request, pathlib
        procs = []
        for r in (0, 1):
            spec = {{"rank": r, "local_rank": r, "world_size": 2, "local_world_size": 2,
                    "port": {port}, "logs": [{{"train/loss": 0.25 * (r + 1)}}],
                    "hold": {str(hold)!r}}}
            p = subprocess.Popen([sys.executable, {str(FAKE_RANK)!r}, json.dumps(spec)],
                                 stdout=subprocess.PIPE, text=True)
            assert p.stdout.readline().strip() == "ready"
            procs.append(p)
        text = urllib.request.urlopen("http://127.0.0.1:{port}/metrics", timeout=10).read()
        pathlib.Path({str(out)!r}).write_bytes(text)
        pathlib.Path({str(hold)!r}).touch()
        sys.exit(max(p.wait(timeout=30) for p in procs))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", agent],
        env=rank_env({"TORCHELASTIC_RUN_ID": "test-run"}),
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    text = out.read_text()
    assert value(text, "trainer_loss", rank="0", split="train") == 0.25
    assert value(text, "trainer_loss", rank="1", split="train") == 0.5
    leftovers = list(Path(tempfile.gettempdir()).glob(f"ddp-trainer-metrics-*-test-run-{port}"))
    assert leftovers == []  # local rank 0 removes the shared directory on close
