"""The pods the Kubeflow training operator v1.9 creates for a PyTorchJob.

Reproduced from kubeflow/trainer tag v1.9.4 (branch release-1.9, commit 4445c12a), Apache-2.0;
the file and function each rule comes from is named where it is applied:

- pkg/apis/kubeflow.org/v1/pytorch_defaults.go   SetDefaults_PyTorchJob (replicas 1, port
  ``pytorchjob-port`` 23456, ``nprocPerNode`` "auto", elastic min/max from each other)
- pkg/controller.v1/common/pod.go                createNewPod (name, labels, restart policy)
- pkg/controller.v1/common/util.go               GenGeneralName ``<job>-<type>-<index>``
- pkg/core/pod.go                                SetRestartPolicy (``ExitCode`` -> ``Never``)
- pkg/controller.v1/pytorch/envvar.go            setPodEnv, getNprocPerNodeInt, getTotalReplicas
- pkg/controller.v1/pytorch/master.go            MasterEnvVarGenerator
- pkg/controller.v1/pytorch/elastic.go           ElasticEnvVarGenerator

Not reproduced: the worker init container (``alpine:3.10`` waiting in ``nslookup`` for the
Master's name; no registry here, the harness starts the Master first instead, see
docs/e2e.md), gang scheduling, owner references.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT_CONTAINER = "pytorch"  # pytorch_types.go PyTorchJobDefaultContainerName
DEFAULT_PORT_NAME = "pytorchjob-port"  # PyTorchJobDefaultPortName
DEFAULT_PORT = 23456  # PyTorchJobDefaultPort
CONTROLLER_NAME = "pytorchjob-controller"  # pytorchjob_controller.go controllerName
# common_types.go
OPERATOR_NAME_LABEL = "training.kubeflow.org/operator-name"
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
JOB_ROLE_LABEL = "training.kubeflow.org/job-role"


class OperatorError(ValueError):
    """The job is one the operator would refuse (no port, no Worker for elastic, ...)."""


@dataclass(frozen=True)
class ReplicaPod:
    """One pod of the job as the operator creates it."""

    rtype: str  # "Master" or "Worker"
    index: int
    restart_policy: str  # the replica's: OnFailure, ExitCode, Always or Never
    manifest: dict[str, Any]  # a v1 Pod

    @property
    def name(self) -> str:
        return str(self.manifest["metadata"]["name"])


def with_defaults(job: Mapping[str, Any]) -> dict[str, Any]:
    """SetDefaults_PyTorchJob (pytorch_defaults.go) on a copy of `job`."""
    out = copy.deepcopy(dict(job))
    spec = out["spec"]
    for rspec in spec["pytorchReplicaSpecs"].values():
        rspec.setdefault("replicas", 1)
        rspec.setdefault("restartPolicy", "OnFailure")  # PyTorchJobDefaultRestartPolicy
        for container in rspec["template"]["spec"]["containers"]:
            if container["name"] != DEFAULT_CONTAINER:
                continue
            ports = container.setdefault("ports", [])
            if not any(p.get("name") == DEFAULT_PORT_NAME for p in ports):
                ports.append({"name": DEFAULT_PORT_NAME, "containerPort": DEFAULT_PORT})
    elastic = spec.get("elasticPolicy")
    if elastic is not None:  # setElasticPolicy
        lo, hi = elastic.get("minReplicas"), elastic.get("maxReplicas")
        if lo is None and hi is None:
            if "Worker" not in spec["pytorchReplicaSpecs"]:
                raise OperatorError("an elastic job needs a Worker replica spec")
            lo = hi = spec["pytorchReplicaSpecs"]["Worker"]["replicas"]
        elastic["minReplicas"] = hi if lo is None else lo
        elastic["maxReplicas"] = lo if hi is None else hi
    if elastic is None or elastic.get("nProcPerNode") is None:  # setDefaultNprocPerNode
        spec.setdefault("nprocPerNode", "auto")
    return out


def port_of(job: Mapping[str, Any], rtype: str) -> int:
    """getPortFromPyTorchJob: the `pytorch` container's port named `pytorchjob-port`."""
    if rtype not in job["spec"]["pytorchReplicaSpecs"]:
        raise OperatorError(f"the job has no {rtype} replica spec to take the port from")
    for container in job["spec"]["pytorchReplicaSpecs"][rtype]["template"]["spec"]["containers"]:
        if container["name"] == DEFAULT_CONTAINER:
            for port in container.get("ports", []):
                if port.get("name") == DEFAULT_PORT_NAME:
                    return int(port["containerPort"])
    raise OperatorError(f"{rtype}: port not found")


def nproc_per_node_int(job: Mapping[str, Any]) -> int:
    """getNprocPerNodeInt: the integer value, 1 when unset or not an integer ("auto")."""
    value = job["spec"].get("nprocPerNode")
    try:
        return int(value) if value is not None else 1
    except ValueError:
        return 1


def replica_name(job_name: str, rtype: str, index: int) -> str:
    """GenGeneralName / replicaName."""
    return f"{job_name}-{rtype.lower()}-{index}".replace("/", "-")


def pod_env(job: Mapping[str, Any], rtype: str, index: int) -> list[dict[str, str]]:
    """setPodEnv: the variables appended to every container, in the operator's order."""
    spec = job["spec"]
    replicas = spec["pytorchReplicaSpecs"]
    name = job["metadata"]["name"]
    total = sum(int(r["replicas"]) for r in replicas.values())  # getTotalReplicas
    env = [("PYTHONUNBUFFERED", "1")]
    if "Master" in replicas:
        port = str(port_of(job, "Master"))
        master = replica_name(name, "Master", 0)
        env += [("MASTER_PORT", port), ("PET_MASTER_PORT", port),
                ("MASTER_ADDR", master), ("PET_MASTER_ADDR", master)]
        rank = index + 1 if rtype == "Worker" else index
        env += [("WORLD_SIZE", str(total * nproc_per_node_int(job))), ("RANK", str(rank)),
                ("PET_NODE_RANK", str(rank))]
    if spec.get("nprocPerNode") is not None:
        env.append(("PET_NPROC_PER_NODE", str(spec["nprocPerNode"])))
    elastic = spec.get("elasticPolicy")
    if elastic is not None:
        env += elastic_env(job, elastic)
    else:
        env.append(("PET_NNODES", str(total)))
    return [{"name": k, "value": v} for k, v in env]


def elastic_env(job: Mapping[str, Any], elastic: Mapping[str, Any]) -> list[tuple[str, str]]:
    """ElasticEnvVarGenerator.Generate (elastic.go)."""
    replicas = job["spec"]["pytorchReplicaSpecs"]
    host = elastic.get("rdzvHost")
    host = f"{job['metadata']['name']}-worker-0" if host is None else host
    port = elastic.get("rdzvPort")
    port = port_of(job, "Worker") if port is None else port
    backend = elastic.get("rdzvBackend")
    env = [("PET_RDZV_ENDPOINT", f"{host}:{port}"),
           ("PET_RDZV_BACKEND", "c10d" if backend is None else str(backend))]
    if elastic.get("minReplicas") is None and elastic.get("maxReplicas") is None:
        if "Worker" not in replicas:
            raise OperatorError("cannot find the worker spec")
        env.append(("PET_NNODES", str(replicas["Worker"]["replicas"])))
    else:
        env.append(("PET_NNODES", f"{elastic['minReplicas']}:{elastic['maxReplicas']}"))
    for key, var in (("maxRestarts", "PET_MAX_RESTARTS"), ("nProcPerNode", "PET_NPROC_PER_NODE"),
                     ("rdzvId", "PET_RDZV_ID")):
        if elastic.get(key) is not None:
            env.append((var, str(elastic[key])))
    if elastic.get("rdzvConf"):
        env.append(("PET_RDZV_CONF", ",".join(f"{c['key']}={c['value']}"
                                              for c in elastic["rdzvConf"])))
    if elastic.get("standalone"):
        env.append(("PET_STANDALONE", ""))
    return env


def replica_pod(job: Mapping[str, Any], rtype: str, index: int) -> ReplicaPod:
    """createNewPod + SetClusterSpec for one replica of a defaulted job."""
    rspec = job["spec"]["pytorchReplicaSpecs"][rtype]
    template = copy.deepcopy(rspec["template"])
    metadata = template.setdefault("metadata", {})
    job_name = job["metadata"]["name"]
    metadata["name"] = replica_name(job_name, rtype, index)
    metadata["namespace"] = job["metadata"]["namespace"]
    labels = metadata.setdefault("labels", {})
    labels.update({OPERATOR_NAME_LABEL: CONTROLLER_NAME, JOB_NAME_LABEL: job_name,
                   REPLICA_TYPE_LABEL: rtype.lower(), REPLICA_INDEX_LABEL: str(index)})
    # IsMasterRole: the Master, or Worker 0 of a job without one.
    if rtype == "Master" or ("Master" not in job["spec"]["pytorchReplicaSpecs"] and index == 0):
        labels[JOB_ROLE_LABEL] = "master"
    env = pod_env(job, rtype, index)
    for container in template["spec"]["containers"]:
        container["env"] = [*container.get("env", []), *copy.deepcopy(env)]
    policy = rspec["restartPolicy"]
    template["spec"]["restartPolicy"] = "Never" if policy == "ExitCode" else policy
    manifest = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
                "spec": template["spec"]}
    return ReplicaPod(rtype, index, policy, manifest)


def replica_pods(job: Mapping[str, Any]) -> list[ReplicaPod]:
    """Every pod of the job, the Master first."""
    defaulted = with_defaults(job)
    order = sorted(defaulted["spec"]["pytorchReplicaSpecs"], key=lambda t: t != "Master")
    return [replica_pod(defaulted, rtype, i) for rtype in order
            for i in range(int(defaulted["spec"]["pytorchReplicaSpecs"][rtype]["replicas"]))]
