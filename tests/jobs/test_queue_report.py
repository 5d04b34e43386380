"""Rank 0's queue metrics: the job's time queued and its evictions, read from its Kueue Workload
through a real HTTP API (the in-memory emulator), as Kueue v0.19 writes Workloads."""

from __future__ import annotations

import datetime as dt
import ssl

import pytest

from tests.jobs.cluster import T0, FakeCluster, condition, job, stamp
from tests.jobs.test_queues import WORKLOADS, at, queued, serve_workloads, workload
from trainer.distributed import hang_event, queue_report


@pytest.fixture
def in_pod(cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"DDP_TRAINER_JOB_KIND": "PyTorchJob", "DDP_TRAINER_JOB_NAME": "low",
                        "POD_NAMESPACE": "training", "DDP_TRAINER_QUEUE": "team-a"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(hang_event, "_api",
                        lambda: (cluster.url, ssl.create_default_context(), "token"))
    serve_workloads(cluster)


def readmitted(cluster: FakeCluster) -> None:
    """Admitted a minute after it was made, preempted at 5 min, requeued at 6, readmitted at
    9: the Workload Kueue v0.19 leaves, its eviction history in schedulingStats."""
    low = queued(job("low", workers=1, gpus=0))
    cluster.add_job(low)
    made = workload(low, [
        condition("QuotaReserved", "QuotaReserved", "Quota reserved in ClusterQueue cq", at(9)),
        condition("Admitted", "Admitted", "The workload is admitted", at(9)),
        condition("Evicted", "Preempted", "Preempted to accommodate a workload", at(5),
                  status="False"),
        condition("Requeued", "Preempted", "Preempted to accommodate a workload", at(6))],
        cluster_queue="cq")
    made["status"]["schedulingStats"] = {"evictions": [
        {"reason": "Preempted", "underlyingCause": "", "count": 1},
        {"reason": "PodsReadyTimeout", "underlyingCause": "", "count": 2}]}
    cluster.add(WORKLOADS, made)


def test_a_readmitted_job_reports_its_wait_since_requeued_and_its_evictions(
        cluster: FakeCluster, in_pod: None) -> None:
    readmitted(cluster)
    assert queue_report.read() == {"queue/wait_seconds": 180.0, "queue/evictions": 3.0,
                                   "queue/preemptions": 1.0}


def test_a_first_admission_waited_since_the_workload_was_made() -> None:
    owner = queued(job("first", workers=1, gpus=0))
    made = workload(owner, [condition("Admitted", "Admitted", "admitted", at(2))])
    assert made["metadata"]["creationTimestamp"] == stamp(T0)
    assert queue_report.measures(made, at(30)) == {
        "queue/wait_seconds": 120.0, "queue/evictions": 0.0, "queue/preemptions": 0.0}


def test_a_workload_not_admitted_yet_counts_its_wait_until_now() -> None:
    owner = queued(job("waiting", workers=1, gpus=0))
    made = workload(owner, [condition("QuotaReserved", "Pending", "no quota", at(1),
                                      status="False")])
    now = T0 + dt.timedelta(seconds=42)
    assert queue_report.measures(made, now)["queue/wait_seconds"] == 42.0


def test_no_queue_no_metrics_and_no_api_call(cluster: FakeCluster, in_pod: None,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DDP_TRAINER_QUEUE")
    monkeypatch.setattr(hang_event, "_call", lambda *a: pytest.fail("an API call"))
    assert queue_report.read() == {}


def test_a_job_without_a_workload_is_a_warning_and_no_metrics(
        cluster: FakeCluster, in_pod: None, caplog: pytest.LogCaptureFixture) -> None:
    cluster.add_job(queued(job("low", workers=1, gpus=0)))
    assert queue_report.read() == {}
    assert "names queue team-a but Kueue has no Workload for it" in caplog.text


def test_an_api_that_refuses_is_a_warning_not_an_error(
        in_pod: None, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(hang_event, "_api",
                        lambda: ("https://127.0.0.1:9", ssl.create_default_context(), "t"))
    assert queue_report.read() == {}
    assert "cannot read the Kueue Workload of PyTorchJob low" in caplog.text
