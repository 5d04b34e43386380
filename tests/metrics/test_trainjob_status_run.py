"""A real `ddp-trainer run` (2 gloo ranks, digits) with the Trainer v2 controller's variables
set: rank 0 reports to the local HTTPS status server, the run ends at 100 %, and a status server
that is down or answers 500 leaves training untouched (exit 0, the same summary)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import read_json, run_cli
from tests.metrics.status_server import Pki, StatusServer, make_ca
from tests.support.prometheus import free_port

RUN = ["run", "--nproc-per-node", "2", "--dataset", "digits", "--epochs", "2",
       "--log-every", "5", "--metrics-bind-address", "127.0.0.1", "--set",
       "metrics.linger_seconds=0"]
# Timing fields differ run to run; everything else must be identical.
TIMING = {"wall_seconds", "samples_per_second"}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_ca(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("baseline")
    proc = run_cli(*RUN, "--output-dir", str(out), "--metrics-port", str(free_port()))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {k: v for k, v in read_json(out / "summary.json").items() if k not in TIMING}


@pytest.fixture
def server(pki: Pki) -> Iterator[StatusServer]:
    with StatusServer(pki) as srv:
        yield srv


def env_for(url: str, pki: Pki, tmp_path: Path) -> dict[str, str]:
    token = tmp_path / "token"
    token.write_text("token-1")
    return {"KUBEFLOW_TRAINER_SERVER_URL": url,
            "KUBEFLOW_TRAINER_SERVER_CA_CERT": str(pki.ca_cert),
            "KUBEFLOW_TRAINER_SERVER_TOKEN": str(token)}


def test_rank_0_reports_progress_that_ends_at_100(
        server: StatusServer, pki: Pki, tmp_path: Path, baseline: dict[str, Any]) -> None:
    proc = run_cli(*RUN, "--output-dir", str(tmp_path), "--metrics-port", str(free_port()),
                   env=env_for(server.url, pki, tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert server.rejected == []  # token, path and every body were accepted
    assert len(server.received) >= 2
    statuses = [r.body["trainerStatus"] for r in server.received]
    progress = [s["progressPercentage"] for s in statuses]
    assert progress == sorted(progress) and progress[-1] == 100
    gaps = [b.at - a.at for a, b in zip(server.received, server.received[1:], strict=False)]
    assert min(gaps) >= 5.0 * 0.95  # one request per 5 s at most, the final one included
    final = {m["name"]: m["value"] for m in statuses[-1]["metrics"]}
    summary = read_json(tmp_path / "summary.json")
    assert float(final["val_accuracy"]) == pytest.approx(summary["val_accuracy"])
    assert float(final["val_loss"]) == pytest.approx(summary["val_loss"], rel=1e-5)
    assert {"train_loss", "samples_per_second", "step", "epoch"} <= set(final)
    assert final["step"] == str(summary["steps"])
    assert {k: v for k, v in summary.items() if k not in TIMING} == baseline


@pytest.mark.parametrize("failure", ["server-answers-500", "server-down"])
def test_a_failing_status_server_leaves_training_untouched(
        failure: str, server: StatusServer, pki: Pki, tmp_path: Path,
        baseline: dict[str, Any]) -> None:
    url = server.url
    if failure == "server-answers-500":
        server.answer = 500
    else:
        url = f"https://127.0.0.1:{free_port()}/status"
    proc = run_cli(*RUN, "--output-dir", str(tmp_path), "--metrics-port", "0",
                   env=env_for(url, pki, tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = read_json(tmp_path / "summary.json")
    assert {k: v for k, v in summary.items() if k not in TIMING} == baseline
    warnings = [line for line in proc.stderr.splitlines() if "cannot report progress" in line]
    assert len(warnings) == 1, proc.stderr[-2000:]  # logged once, not per request
    assert server.received == []
