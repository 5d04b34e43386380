"""The harness's training operator: the pods, labels and env v1.9 creates for our chart's
jobs (rules in tests/e2e/harness/operator.py, from kubeflow/trainer v1.9.4)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.e2e.harness.chart import render
from tests.e2e.harness.operator import (
    OperatorError,
    pod_env,
    replica_pods,
    with_defaults,
)

RELEASE = "e2e-test"
JOB = "e2e-test-ddp-trainer"


def job(values: dict[str, Any]) -> dict[str, Any]:
    return render({"gpusPerReplica": 0, **values}, RELEASE, "ns").job


def env_of(pod_manifest: dict[str, Any]) -> dict[str, str]:
    (container,) = pod_manifest["spec"]["containers"]
    return {e["name"]: e.get("value", "") for e in container["env"] if "value" in e}


def operator_env(manifest: dict[str, Any]) -> list[str]:
    (container,) = manifest["spec"]["containers"]
    names = [e["name"] for e in container["env"]]
    return names[names.index("PYTHONUNBUFFERED"):]


def test_one_master_one_worker_get_names_ranks_and_the_master_address() -> None:
    master, worker = replica_pods(job({}))
    assert (master.name, worker.name) == (f"{JOB}-master-0", f"{JOB}-worker-0")
    assert operator_env(master.manifest) == [
        "PYTHONUNBUFFERED", "MASTER_PORT", "PET_MASTER_PORT", "MASTER_ADDR", "PET_MASTER_ADDR",
        "WORLD_SIZE", "RANK", "PET_NODE_RANK", "PET_NPROC_PER_NODE", "PET_NNODES"]
    for pod, rank in ((master, "0"), (worker, "1")):  # workers are index + 1
        env = env_of(pod.manifest)
        assert env["MASTER_ADDR"] == env["PET_MASTER_ADDR"] == f"{JOB}-master-0"
        assert env["MASTER_PORT"] == env["PET_MASTER_PORT"] == "23456"
        assert env["RANK"] == env["PET_NODE_RANK"] == rank
        assert (env["WORLD_SIZE"], env["PET_NNODES"], env["PET_NPROC_PER_NODE"]) == ("2", "2", "1")
        assert env["PYTHONUNBUFFERED"] == "1"


def test_the_operator_env_follows_the_charts_own_env() -> None:
    (container,) = replica_pods(job({}))[0].manifest["spec"]["containers"]
    names = [e["name"] for e in container["env"]]
    assert names[:4] == ["HOME", "XDG_CACHE_HOME", "POD_NAME", "POD_NAMESPACE"]


def test_world_size_is_pods_times_nproc_per_node() -> None:
    pods = replica_pods(job({"gpusPerReplica": 2, "worker": {"replicas": 2}}))
    assert [p.name.rsplit("-", 2)[1:] for p in pods] == [["master", "0"], ["worker", "0"],
                                                       ["worker", "1"]]
    for pod, rank in zip(pods, ("0", "1", "2"), strict=True):
        env = env_of(pod.manifest)
        assert (env["WORLD_SIZE"], env["PET_NNODES"], env["PET_NPROC_PER_NODE"]) == ("6", "3", "2")
        assert env["RANK"] == rank


@pytest.mark.parametrize("nproc", [None, "auto", "gpu", "cpu"])
def test_nproc_per_node_that_is_not_an_integer_counts_as_one(nproc: str | None) -> None:
    spec = copy.deepcopy(job({"worker": {"replicas": 2}}))
    spec["spec"].pop("nprocPerNode")
    if nproc is not None:
        spec["spec"]["nprocPerNode"] = nproc
    env = env_of(replica_pods(spec)[0].manifest)
    assert env["WORLD_SIZE"] == "3"
    assert env["PET_NPROC_PER_NODE"] == (nproc or "auto")  # the operator's default


def test_a_missing_pytorchjob_port_defaults_to_23456() -> None:
    spec = copy.deepcopy(job({}))
    for rspec in spec["spec"]["pytorchReplicaSpecs"].values():
        (container,) = rspec["template"]["spec"]["containers"]
        container["ports"] = [p for p in container["ports"] if p["name"] != "pytorchjob-port"]
    env = env_of(replica_pods(spec)[1].manifest)
    assert env["MASTER_PORT"] == "23456"


def test_elastic_jobs_get_the_rendezvous_and_a_node_range() -> None:
    pods = replica_pods(job({"elastic": {"enabled": True, "minNodes": 1, "maxNodes": 3},
                             "worker": {"replicas": 2}}))
    env = env_of(pods[1].manifest)
    assert env["PET_RDZV_BACKEND"] == "c10d"
    assert env["PET_RDZV_ENDPOINT"] == f"{JOB}-master-0:23456"  # the chart's rdzvHost
    assert env["PET_NNODES"] == "1:3"
    assert env["PET_MAX_RESTARTS"] == "3"
    assert env["PET_RDZV_ID"] == JOB


def test_elastic_defaults_are_the_operators() -> None:
    spec = copy.deepcopy(job({"elastic": {"enabled": True}, "worker": {"replicas": 2}}))
    policy = spec["spec"]["elasticPolicy"]
    for key in ("rdzvHost", "rdzvPort", "rdzvBackend", "minReplicas", "maxReplicas"):
        policy.pop(key)
    env = env_of(replica_pods(spec)[0].manifest)
    assert env["PET_RDZV_ENDPOINT"] == f"{JOB}-worker-0:23456"  # worker-0 and its port
    assert env["PET_RDZV_BACKEND"] == "c10d"
    assert env["PET_NNODES"] == "2:2"  # min and max default to the Worker replicas


def test_without_a_master_there_is_no_master_address_or_rank() -> None:
    spec = copy.deepcopy(job({}))
    spec["spec"]["pytorchReplicaSpecs"].pop("Master")
    env = pod_env(with_defaults(spec), "Worker", 0)
    assert [e["name"] for e in env] == ["PYTHONUNBUFFERED", "PET_NPROC_PER_NODE", "PET_NNODES"]
    (worker,) = replica_pods(spec)
    assert worker.manifest["metadata"]["labels"]["training.kubeflow.org/job-role"] == "master"


def test_elastic_without_a_worker_is_refused() -> None:
    spec = copy.deepcopy(job({"elastic": {"enabled": True}}))
    spec["spec"]["pytorchReplicaSpecs"].pop("Worker")
    spec["spec"]["elasticPolicy"].pop("rdzvPort")  # then the port is the Worker's
    with pytest.raises(OperatorError, match="Worker"):
        replica_pods(spec)


def test_pods_carry_the_operators_labels() -> None:
    master, worker = replica_pods(job({}))
    assert {k: v for k, v in worker.manifest["metadata"]["labels"].items()
            if k.startswith("training.kubeflow.org/")} == {
        "training.kubeflow.org/operator-name": "pytorchjob-controller",
        "training.kubeflow.org/job-name": JOB,
        "training.kubeflow.org/replica-type": "worker",
        "training.kubeflow.org/replica-index": "0"}
    assert master.manifest["metadata"]["labels"]["training.kubeflow.org/job-role"] == "master"
    assert "training.kubeflow.org/job-role" not in worker.manifest["metadata"]["labels"]


@pytest.mark.parametrize(("policy", "pod_policy"), [
    ("OnFailure", "OnFailure"), ("ExitCode", "Never"), ("Never", "Never")])
def test_the_replica_restart_policy_becomes_the_pods(policy: str, pod_policy: str) -> None:
    master, _ = replica_pods(job({"restartPolicy": policy}))
    assert master.restart_policy == policy
    assert master.manifest["spec"]["restartPolicy"] == pod_policy
