"""Kueue (tools/cluster/kueue.py, the real controller of the pinned module) queues the chart's
PyTorchJobs on the test cluster: a ClusterQueue whose CPU and memory quota fits exactly one job
(docs/queues.md). A second job waits with no pod until the first ends; a job larger than the
quota never starts and says why; a higher-priority job preempts a lower one, which saves at an
agreed step on SIGTERM, is requeued and resumes with exactly the uninterrupted numbers."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.helm import HELM4, Release, helm, release_name
from tests.cluster.jobs import (
    FAILOVER,
    KEEP_RESULTS,
    MID_RUN,
    assert_same_as,
    finished,
    jobs,
    master_checkpoints,
    wait_for_checkpoints,
    wait_until,
)
from tests.cluster.kube import STATE, Cluster, merged

V = "kueue.x-k8s.io/v1beta2"
FLAVOR, LOW, HIGH = "test-flavor", "test-low", "test-high"
# The failover run (about 20 s of training), its epoch-end checkpoints on a claim that
# outlives the pods Kueue's suspension deletes.
RUN: dict[str, Any] = merged(KEEP_RESULTS, FAILOVER)


def _quantity(text: str) -> float:
    units = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    for suffix, scale in units.items():
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * scale
    return float(text)


def requests(cluster: Cluster, values: dict[str, Any], tmp: Path) -> dict[str, float]:
    """The CPU and memory every pod of the chart's job requests, summed, as Kueue adds them up
    (`helm template` with the tests' values)."""
    path = tmp / "values.json"
    path.write_text(json.dumps(values))
    out = helm(HELM4, "template", "x", str(Path(__file__).parents[2] / "charts" / "ddp-trainer"),
               "-f", str(STATE / "values-local.yaml"), "-f", str(path), cluster=cluster).stdout
    (job,) = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "PyTorchJob"]
    total = {"cpu": 0.0, "memory": 0.0}
    for spec in job["spec"]["pytorchReplicaSpecs"].values():
        pod = spec["template"]["spec"]
        for c in pod["containers"]:
            for key in total:
                total[key] += spec.get("replicas", 1) * _quantity(
                    str(c.get("resources", {}).get("requests", {}).get(key, "0")))
    return total


@pytest.fixture(scope="module")
def queue(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A namespace whose LocalQueue points to a ClusterQueue of exactly one job's quota, with
    preemption of lower priorities; its name."""
    namespace = cluster.namespace("kueue")
    need = requests(cluster, RUN, tmp_path_factory.mktemp("requests"))
    print(f"one job requests {need}")
    name = namespace  # cluster-scoped objects named after the test's namespace
    cluster.apply(
        {"apiVersion": V, "kind": "ResourceFlavor", "metadata": {"name": FLAVOR}},
        {"apiVersion": V, "kind": "WorkloadPriorityClass", "metadata": {"name": LOW},
         "value": 100},
        {"apiVersion": V, "kind": "WorkloadPriorityClass", "metadata": {"name": HIGH},
         "value": 1000},
        {"apiVersion": V, "kind": "ClusterQueue", "metadata": {"name": name}, "spec": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "preemption": {"withinClusterQueue": "LowerPriority"},
            "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [{
                "name": FLAVOR, "resources": [
                    {"name": "cpu", "nominalQuota": f"{round(need['cpu'] * 1000)}m"},
                    {"name": "memory", "nominalQuota": str(int(need["memory"]))}]}]}]}},
        {"apiVersion": V, "kind": "LocalQueue",
         "metadata": {"name": "team", "namespace": namespace},
         "spec": {"clusterQueue": name}})
    yield namespace
    cluster.kubectl("delete", "namespace", namespace, "--wait=false")
    cluster.kubectl("delete", "clusterqueue", name, "--wait=false", check=False)


def submit(cluster: Cluster, namespace: str, tmp: Path, *layers: dict[str, Any],
           priority: str = LOW) -> Release:
    release = Release(cluster, release_name(), namespace, merged(
        RUN, {"scheduling": {"kueue": {"queueName": "team", "priorityClass": priority}}},
        *layers))
    release.install(str(Path(__file__).parents[2] / "charts" / "ddp-trainer"), tmp=tmp)
    return release


def pods(release: Release, field: str = "name") -> list[str]:
    """The job's pods' names (or uids: the operator recreates a pod under the same name)."""
    return release.cluster.kubectl(
        "get", "pods", "-n", release.namespace, "-l",
        f"training.kubeflow.org/job-name={release.job}",
        "-o", f"jsonpath={{.items[*].metadata.{field}}}").stdout.split()


def ended(release: Release) -> bool:
    """The job's Succeeded or Failed condition is True."""
    job = release.cluster.get(release.kind, release.job, release.namespace)
    return any(c["type"] in ("Succeeded", "Failed") and c["status"] == "True"
               for c in job.get("status", {}).get("conditions", []))


def workload(release: Release) -> dict[str, Any]:
    """The Workload Kueue made for the job (owned by it)."""
    items = json.loads(release.cluster.kubectl(
        "get", "workloads.kueue.x-k8s.io", "-n", release.namespace, "-o", "json").stdout)
    for w in items["items"]:
        if any(o.get("name") == release.job for o in w["metadata"].get("ownerReferences", [])):
            return dict(w)
    return {}


def condition(release: Release, kind: str) -> dict[str, Any]:
    found = workload(release)
    return next((c for c in found.get("status", {}).get("conditions", [])
                 if c["type"] == kind), {})


def test_a_second_job_waits_without_pods_and_both_end_as_if_alone(
        cluster: Cluster, queue: str, tmp_path: Path) -> None:
    # 30 epochs: long enough to see the second wait, short for the CI's time. PyTorchJobs
    # only: Trainer v2.3.0 cannot resume the TrainJob Kueue admits (docs/queues.md).
    layer = {"trainerConfig": {"train": {"epochs": 30}}}
    first = submit(cluster, queue, tmp_path, layer)
    wait_until(lambda: condition(first, "Admitted").get("status") == "True",
               "the first job admitted")
    second = submit(cluster, queue, tmp_path, layer)
    wait_until(lambda: bool(condition(second, "QuotaReserved").get("message")),
               "the second job's Workload says why it waits")
    waiting = condition(second, "QuotaReserved")
    assert waiting["status"] == "False" and "insufficient" in waiting["message"], waiting
    status = jobs("status", second.job, "-n", queue).stdout
    assert "Queue:       team" in status and "Admission:   Pending" in status, status
    # no partial gang: not one pod of the waiting job while the first runs
    deadline = time.monotonic() + 600
    while not ended(first):
        assert pods(second) == [], pods(second)
        assert time.monotonic() < deadline, "the first job never completed"
        time.sleep(1)
    alone = finished(first)
    alone.assert_agrees()
    got = finished(second)
    assert_same_as(got, alone, resumed=False)


def test_a_job_larger_than_the_quota_never_starts_and_says_why(
        cluster: Cluster, queue: str, tmp_path: Path) -> None:
    big = submit(cluster, queue, tmp_path, {"worker": {"replicas": 2}})
    wait_until(lambda: bool(condition(big, "QuotaReserved").get("message")),
               "the Workload says why it waits")
    said = condition(big, "QuotaReserved")
    assert said["status"] == "False" and "insufficient quota" in said["message"], said
    status = jobs("status", big.job, "-n", queue).stdout
    assert said["message"][:60] in status, status
    assert pods(big) == []
    assert condition(big, "Admitted").get("status") != "True"
    helm(HELM4, "uninstall", big.name, "-n", queue, cluster=cluster)


def test_a_higher_priority_job_preempts_a_lower_one_which_resumes_exactly(
        cluster: Cluster, queue: str, tmp_path: Path) -> None:
    low = submit(cluster, queue, tmp_path)
    wait_for_checkpoints(low, MID_RUN)
    high = submit(cluster, queue, tmp_path, priority=HIGH)
    wait_until(lambda: condition(low, "Evicted").get("status") == "True", "the low job evicted")
    evicted = condition(low, "Evicted")
    assert evicted["reason"] == "Preempted", evicted
    preempted = condition(low, "Preempted")
    assert high_uid(high) in preempted.get("message", ""), preempted
    print(f"low job preempted: {evicted}")
    # the ranks got SIGTERM, agreed on a step and saved it before the pods went
    wait_until(lambda: pods(low) == [], "the low job's pods gone", timeout=180)
    saved = int(master_checkpoints(low)[-1].stem.split("-")[1])
    status = jobs("status", low.job, "-n", queue).stdout
    assert "Preempted" in status or "Evicted" in status, status
    got_high = finished(high)
    got_high.assert_agrees()
    got = finished(low)
    assert_same_as(got, got_high)  # the same values: the uninterrupted run's numbers
    redone = saved - got.summary["resumed_from_step"]
    assert redone == 0, (saved, got.summary)
    since = dt.datetime.fromisoformat(evicted["lastTransitionTime"].replace("Z", "+00:00"))
    # rank 0 read its Workload when readmitted: one preemption, exported and logged
    log = cluster.kubectl("logs", f"{low.job}-master-0", "-n", low.namespace,
                          "--timestamps").stdout
    assert "evicted 1 time(s) before (1 preempted)" in log, log[-2000:]
    queued = next(line for line in log.splitlines() if "queue: " in line)
    stepped = next(line for line in log.splitlines() if " INFO epoch " in line)
    first_step = dt.datetime.fromisoformat(stepped.split()[0].replace("Z", "+00:00"))
    print(f"{queued}\nfirst step logged after readmission: {stepped}; "
          f"{(first_step - since).total_seconds():.0f} s after the preemption")
    readmitted = condition(low, "Admitted")
    print(f"steps redone: {redone}; preempted at {since}, readmitted "
          f"{readmitted.get('lastTransitionTime')}")


def high_uid(release: Release) -> str:
    found: str = workload(release)["metadata"]["uid"]
    return found


def test_a_job_whose_pods_never_all_start_is_evicted_and_requeued(
        cluster: Cluster, queue: str, tmp_path: Path) -> None:
    # An image tag the registry does not have: admitted, its pods never Ready (ErrImagePull).
    # Kueue's waitForPodsReady (120 s, tools/cluster/kueue.py) evicts it, suspending the job:
    # its pods are deleted and its quota given back, not held by a half-started gang.
    stuck = submit(cluster, queue, tmp_path, {"image": {"tag": "no-such-tag"}})
    wait_until(lambda: condition(stuck, "Admitted").get("status") == "True", "admitted")
    wait_until(lambda: len(pods(stuck)) == 2, "its two pods created")
    first = set(pods(stuck, "uid"))
    wait_until(lambda: condition(stuck, "Evicted").get("reason") == "PodsReadyTimeout",
               "evicted for PodsReadyTimeout", timeout=300)
    # the pods of that admission deleted (a readmission after the backoff makes new ones)
    wait_until(lambda: not first & set(pods(stuck, "uid")), "its pods deleted", timeout=120)
    requeued = workload(stuck).get("status", {}).get("requeueState", {})
    assert requeued.get("count", 0) >= 1, workload(stuck).get("status")
    status = jobs("status", stuck.job, "-n", queue).stdout
    assert "PodsReadyTimeout" in status, status
    helm(HELM4, "uninstall", stuck.name, "-n", queue, cluster=cluster)
