"""Every command handles any object the CRDs admit (issue 13, item 7): a PyTorchJob written by
hand without the optional `spec.runPolicy`, one the operator has not reconciled yet (no
`status`), one with fields this tool does not know, and a TrainJob with nothing but its
required `spec.runtimeRef`. kubeflow-training's typed models refused the first with
"RuntimeError: Failed to list PyTorchJobs in namespace"."""

from __future__ import annotations

from typing import Any

import pytest

from tests.jobs.cluster import FakeCluster, job, pod


def handwritten(name: str) -> dict[str, Any]:
    obj = job(name, workers=1)
    del obj["spec"]["runPolicy"]
    return obj


def unreconciled(name: str) -> dict[str, Any]:
    obj = job(name, workers=1)
    del obj["status"]
    return obj


def newer(name: str) -> dict[str, Any]:
    obj = job(name, workers=1)
    obj["spec"]["futureField"] = {"a": [1, 2]}
    obj["spec"]["pytorchReplicaSpecs"]["Worker"]["futureReplicaField"] = True
    obj["spec"]["runPolicy"]["managedBy"] = "kueue.x-k8s.io/multikueue"
    obj["status"]["futureStatus"] = "x"
    obj["status"]["conditions"][0]["futureConditionField"] = 3
    return obj


SHAPES = {"no-runpolicy": handwritten, "no-status": unreconciled, "extra-fields": newer}


@pytest.fixture
def odd(cluster: FakeCluster) -> FakeCluster:
    for name, make in SHAPES.items():
        cluster.add_job(make(name))
        cluster.add_pod(pod(name, "master", 0))
    return cluster


def test_list_shows_every_admitted_shape(ddp, odd: FakeCluster) -> None:
    result = ddp("list")
    assert result.code == 0, result.err
    rows = {line.split()[0]: line.split() for line in result.out.splitlines()[1:]}
    assert set(SHAPES) <= set(rows)
    assert rows["no-runpolicy"][1] == "Running"
    assert rows["no-status"][1] == "Pending" and rows["no-status"][3] == "0/2"
    assert rows["extra-fields"][1] == "Running"
    assert ddp("list", "-A").code == 0


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_status_and_logs_of_every_admitted_shape(ddp, odd: FakeCluster, name: str) -> None:
    result = ddp("status", name)
    assert result.code == 0, result.err
    assert f"Name:        {name}" in result.out
    assert "Suspended:   no" in result.out
    assert ddp("logs", name).code == 0


def test_wait_on_an_unreconciled_job_reports_pending(ddp, odd: FakeCluster) -> None:
    result = ddp("wait", "no-status", "--timeout", "0.3s", "--poll-interval", "0.1")
    assert result.code == 3
    assert result.out.splitlines() == ["pytorchjob/no-status Pending"]


def test_suspend_of_a_job_without_run_policy_adds_one(ddp, odd: FakeCluster) -> None:
    result = ddp("suspend", "no-runpolicy")
    assert result.code == 0, result.err
    assert odd.job("training", "no-runpolicy")["spec"]["runPolicy"] == {"suspend": True}
    assert ddp("resume", "no-runpolicy").code == 0
    assert odd.job("training", "no-runpolicy")["spec"]["runPolicy"] == {"suspend": False}


def test_a_minimal_trainjob_is_listed_and_shown(ddp2, cluster_v2: FakeCluster) -> None:
    cluster_v2.add_job({
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "metadata": {"name": "bare", "namespace": "training"},
        "spec": {"runtimeRef": {"name": "torch-distributed"}, "somethingNew": 1},
    })
    result = ddp2("list", "--kind", "trainjob")
    assert result.code == 0, result.err
    assert result.out.splitlines()[1].split()[:2] == ["bare", "Pending"]
    status = ddp2("status", "bare")
    assert status.code == 0, status.err
    assert "Runtime:     ClusterTrainingRuntime/torch-distributed" in status.out
