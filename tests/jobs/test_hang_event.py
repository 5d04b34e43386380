"""The hang watchdog's verdict as a Warning Event on the job: posted to a real HTTP API (the
in-memory emulator), with the job's uid, and shown by `jobs status` under Warnings."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import pytest

from tests.jobs.cluster import EVENTS, FakeCluster, job
from trainer.distributed import hang_event

LINE = ("error: hang: rank 1 (pod stuck-worker-0 on node n2) has been in user code (the step: "
        "forward and loss) of step 20 for 181 s, at hangstep.py:8 in step (fix: ...)")


@pytest.fixture
def in_pod(cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"DDP_TRAINER_JOB_KIND": "PyTorchJob", "DDP_TRAINER_JOB_NAME": "stuck",
                        "POD_NAMESPACE": "training", "POD_NAME": "stuck-master-0",
                        "NODE_NAME": "n1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(hang_event, "_api",
                        lambda: (cluster.url, ssl.create_default_context(), "token"))


def events(cluster: FakeCluster) -> list[dict[str, Any]]:
    return list(cluster.call(lambda: [v for k, v in cluster.k.objects.items()
                                      if k[0] == EVENTS]))


def test_the_verdict_is_a_warning_event_on_the_job_with_its_uid(
        cluster: FakeCluster, in_pod: None) -> None:
    cluster.add_job(job("stuck", workers=1, gpus=0, state="Running"))
    assert hang_event.post(LINE)
    (event,) = events(cluster)
    assert event["type"] == "Warning" and event["reason"] == "RankHung"
    assert event["message"] == LINE
    involved = event["involvedObject"]
    assert (involved["kind"], involved["name"], involved["apiVersion"]) == (
        "PyTorchJob", "stuck", "kubeflow.org/v1")
    uid = cluster.job("training", "stuck")["metadata"]["uid"]
    assert involved["uid"] == uid  # kubectl describe matches events by uid
    assert event["source"] == {"component": "ddp-trainer", "host": "n1"}


def test_jobs_status_shows_the_event_under_warnings(cluster: FakeCluster, in_pod: None,
                                                    ddp: Any) -> None:
    cluster.add_job(job("stuck", workers=1, gpus=0, state="Running"))
    assert hang_event.post(LINE)
    section = ddp("status", "stuck").out.split("Warnings:")[1]
    assert "PyTorchJob/stuck" in section and "RankHung" in section, section


def test_outside_a_pod_of_the_chart_nothing_is_posted(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    monkeypatch.delenv("DDP_TRAINER_JOB_KIND", raising=False)
    monkeypatch.setenv("DDP_TRAINER_API_ACCOUNT", str(tmp_path))
    assert hang_event.post(LINE) is False


def test_an_api_that_refuses_is_a_warning_not_an_error(
        cluster: FakeCluster, in_pod: None, caplog: pytest.LogCaptureFixture) -> None:
    # no such job: its GET fails (404), the event is posted without a uid
    assert hang_event.post(LINE)
    (event,) = events(cluster)
    assert "uid" not in event["involvedObject"]
    assert "cannot read PyTorchJob stuck for its uid" in caplog.text
