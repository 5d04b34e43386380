"""`jobs list` and `jobs status` show a queued job's Kueue queue and what Kueue says of it: the
state of the Workload the job owns (admitted, pending and why, preempted by whom, evicted and
why), read from workloads.kueue.x-k8s.io as Kueue v0.19 writes them (docs/queues.md)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import kmock
import pytest

from tests.jobs.cluster import T0, FakeCluster, condition, job, stamp, trainjob

WORKLOADS = kmock.resource("kueue.x-k8s.io/v1beta2/workloads")
PENDING = ("couldn't assign flavors to pod set master: insufficient unused quota for cpu in "
           "flavor default-flavor, 3 more needed")
PREEMPTED = ("Preempted to accommodate a workload (UID: 5c1f, JobUID: uid-urgent) due to "
             "prioritization in the ClusterQueue")


def serve_workloads(cluster: FakeCluster) -> None:
    """Kueue's Workload CRD, as `kubectl apply` of its release would add it."""
    cluster.call(lambda: cluster.k.resources.__setitem__(
        "kueue.x-k8s.io/v1beta2/workloads", kmock.ResourceInfo(
            kind="Workload", singular="workload", namespaced=True, verbs={"get", "list"},
            subresources={"status"})))


def queued(obj: dict[str, Any], queue: str = "team-a", priority: str = "") -> dict[str, Any]:
    labels = obj["metadata"].setdefault("labels", {})
    labels["kueue.x-k8s.io/queue-name"] = queue
    if priority:
        labels["kueue.x-k8s.io/priority-class"] = priority
    return obj


def workload(owner: dict[str, Any], conditions: list[dict[str, str]],
             cluster_queue: str = "") -> dict[str, Any]:
    meta = owner["metadata"]
    status: dict[str, Any] = {"conditions": conditions}
    if cluster_queue:
        status["admission"] = {"clusterQueue": cluster_queue, "podSetAssignments": []}
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
        "metadata": {"name": f"{owner['kind'].lower()}-{meta['name']}-3f2a1",
                     "namespace": meta["namespace"], "creationTimestamp": stamp(T0),
                     "labels": {"kueue.x-k8s.io/job-uid": meta["uid"]},
                     "ownerReferences": [{"apiVersion": owner["apiVersion"],
                                          "kind": owner["kind"], "name": meta["name"],
                                          "uid": meta["uid"], "controller": True}]},
        "spec": {"queueName": meta["labels"]["kueue.x-k8s.io/queue-name"], "active": True},
        "status": status,
    }


def at(minutes: int) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minutes)


def seed_queues(cluster: FakeCluster) -> None:
    """In "training", beside the unqueued seed jobs: running (admitted), waiting (no quota),
    preempted (by urgent), stalled (evicted by waitForPodsReady), orphan (no Workload yet)."""
    serve_workloads(cluster)
    running = queued(job("running", workers=1, gpus=0), priority="training-high")
    cluster.add_job(running)
    cluster.add(WORKLOADS, workload(running, [
        condition("QuotaReserved", "QuotaReserved", "Quota reserved in ClusterQueue team-a-cpu",
                  at(1)),
        condition("Admitted", "Admitted", "The workload is admitted", at(1))],
        cluster_queue="team-a-cpu"))
    waiting = queued(job("waiting", workers=1, gpus=0, state="Suspended", suspend=True))
    cluster.add_job(waiting)
    cluster.add(WORKLOADS, workload(waiting, [
        condition("QuotaReserved", "Pending", PENDING, at(2), status="False")]))
    preempted = queued(job("preempted", workers=1, gpus=0, state="Suspended", suspend=True),
                       priority="training-low")
    cluster.add_job(preempted)
    cluster.add(WORKLOADS, workload(preempted, [
        condition("QuotaReserved", "Pending", PENDING, at(5), status="False"),
        condition("Admitted", "NoReservation", "The workload has no reservation", at(5),
                  status="False"),
        condition("Evicted", "Preempted", PREEMPTED, at(5)),
        condition("Preempted", "InClusterQueue", PREEMPTED, at(5))]))
    stalled = queued(trainjob("stalled", nodes=2, gpus=0))
    cluster.add_job(stalled)
    cluster.add(WORKLOADS, workload(stalled, [
        condition("Evicted", "PodsReadyTimeout",
                  "Exceeded the PodsReady timeout default/stalled", at(4))]))
    cluster.add_job(queued(job("orphan", workers=1, gpus=0, state="Suspended", suspend=True)))


@pytest.fixture
def queues(cluster_v2: FakeCluster, ddp2: Callable[..., Any]) -> Callable[..., Any]:
    seed_queues(cluster_v2)
    return ddp2


def test_list_shows_each_queued_jobs_queue_and_admission(queues: Callable[..., Any]) -> None:
    result = queues("list")
    assert result.code == 0, result.err
    rows = [line.split() for line in result.out.splitlines()]
    assert rows[0][-2:] == ["QUEUE", "ADMISSION"]
    by_name = {row[0]: row[-2:] for row in rows[1:]}
    assert by_name["running"] == ["team-a", "Admitted"]
    assert by_name["waiting"] == ["team-a", "Pending"]
    assert by_name["preempted"] == ["team-a", "Preempted"]
    assert by_name["stalled"] == ["team-a", "Evicted"]
    assert by_name["orphan"] == ["team-a", "NoWorkload"]
    assert by_name["mnist"] == ["-", "-"]  # not queued


def test_list_without_a_queued_job_has_no_queue_columns(ddp: Callable[..., Any]) -> None:
    result = ddp("list")
    assert result.code == 0, result.err
    assert "QUEUE" not in result.out and "ADMISSION" not in result.out


def test_status_of_a_waiting_job_says_why_it_waits(queues: Callable[..., Any]) -> None:
    result = queues("status", "waiting")
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert "Queue:       team-a" in lines
    admission = next(line for line in lines if line.startswith("Admission:"))
    assert admission.startswith("Admission:   Pending for ")
    assert admission.endswith(f": {PENDING}")
    assert ("Workload:    pytorchjob-waiting-3f2a1 (kubectl describe workload "
            "pytorchjob-waiting-3f2a1 -n training)") in lines


def test_status_of_a_preempted_job_names_the_preemptor(queues: Callable[..., Any]) -> None:
    result = queues("status", "preempted")
    assert result.code == 0, result.err
    assert "Queue:       team-a (priority class training-low)" in result.out
    assert "Preempted for " in result.out
    assert f"{PREEMPTED} (requeued: waits for quota again)" in result.out


def test_status_of_an_admitted_job_names_its_cluster_queue(queues: Callable[..., Any]) -> None:
    result = queues("status", "running")
    assert result.code == 0, result.err
    assert "Queue:       team-a (priority class training-high)" in result.out
    assert "Admission:   Admitted: in ClusterQueue team-a-cpu" in result.out


def test_status_of_a_trainjob_evicted_by_wait_for_pods_ready_says_so(
        queues: Callable[..., Any]) -> None:
    result = queues("status", "stalled")
    assert result.code == 0, result.err
    assert ("PodsReadyTimeout: Exceeded the PodsReady timeout default/stalled (requeued: "
            "waits for quota again)") in result.out


def test_a_readmitted_job_says_how_often_it_was_evicted(queues: Callable[..., Any],
                                                        cluster_v2: FakeCluster) -> None:
    # Kueue v0.19 clears Evicted when it readmits a Workload; the count stays in its stats
    again = queued(job("again", workers=1, gpus=0))
    cluster_v2.add_job(again)
    readmitted = workload(again, [condition("Admitted", "Admitted", "The workload is admitted",
                                            at(6))], cluster_queue="team-a-cpu")
    readmitted["status"]["schedulingStats"] = {"evictions": [
        {"count": 2, "reason": "PodsReadyTimeout", "underlyingCause": "WaitForStart"}]}
    cluster_v2.add(WORKLOADS, readmitted)
    result = queues("status", "again")
    assert result.code == 0, result.err
    assert ("Admission:   Admitted: in ClusterQueue team-a-cpu (evicted before: 2 x "
            "PodsReadyTimeout)") in result.out, result.out


def test_a_queued_job_without_a_workload_points_at_kueue(queues: Callable[..., Any]) -> None:
    result = queues("status", "orphan")
    assert result.code == 0, result.err
    assert "Admission:   NoWorkload: Kueue has made no Workload for this job" in result.out


def test_a_cluster_without_kueue_shows_no_workload(cluster_v2: FakeCluster,
                                                   ddp2: Callable[..., Any]) -> None:
    cluster_v2.add_job(queued(job("lonely", workers=1, gpus=0, state="Suspended",
                                  suspend=True)))
    result = ddp2("list")
    assert result.code == 0, result.err
    assert [
        row.split()[0:1] + row.split()[-2:] for row in result.out.splitlines()
        if row.startswith("lonely")][0] == ["lonely", "team-a", "NoWorkload"]


def test_an_unqueued_jobs_status_has_no_queue_lines(queues: Callable[..., Any]) -> None:
    result = queues("status", "mnist")
    assert result.code == 0, result.err
    assert "Queue:" not in result.out and "Admission:" not in result.out


def test_workloads_rbac_forbids_reading_says_so_and_lists_the_jobs(
        queues: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from kubernetes.client import CustomObjectsApi
    from kubernetes.client.exceptions import ApiException

    listed = CustomObjectsApi.list_namespaced_custom_object

    def forbidding(self: Any, group: str, version: str, namespace: str, plural: str,
                   **kwargs: Any) -> Any:
        if plural == "workloads":
            raise ApiException(status=403, reason="Forbidden")
        return listed(self, group, version, namespace, plural, **kwargs)

    monkeypatch.setattr(CustomObjectsApi, "list_namespaced_custom_object", forbidding)
    result = queues("status", "waiting")
    assert result.code == 0, result.err
    assert ("Admission:   Unknown: not allowed to list workloads.kueue.x-k8s.io in namespace "
            "'training'") in result.out
    listing = queues("list")
    assert listing.code == 0, listing.err
    assert "Unknown" in listing.out
