"""Plain views of PyTorchJobs and their pods, built from the typed models the clients return.

The rest of the package renders and decides on these small dataclasses, never on client models,
so it can be read (and typed) without knowing kubeflow-training's model classes.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field, replace
from typing import Any

from trainer.jobs.kube import CONTAINER, LABEL_INDEX, LABEL_TYPE

GPU_RESOURCE = "nvidia.com/gpu"

# Terminal states first: a job that Failed after Running is Failed.
STATE_PRECEDENCE = ("Failed", "Succeeded", "Suspended", "Restarting", "Running", "Created")
TERMINAL = ("Succeeded", "Failed")


@dataclass(frozen=True)
class Condition:
    type: str
    status: str
    reason: str
    message: str
    last_transition: dt.datetime | None


@dataclass(frozen=True)
class ReplicaView:
    type: str  # "Master" or "Worker", as in spec.pytorchReplicaSpecs
    replicas: int
    gpus_per_replica: int
    active: int = 0
    succeeded: int = 0
    failed: int = 0


@dataclass(frozen=True)
class JobView:
    name: str
    namespace: str
    created: dt.datetime | None
    suspended: bool
    conditions: tuple[Condition, ...]
    replicas: tuple[ReplicaView, ...]
    nproc_per_node: str | None = None

    @property
    def state(self) -> str:
        """The operator's state: the strongest condition whose status is True."""
        true = {c.type for c in self.conditions if c.status == "True"}
        for state in STATE_PRECEDENCE:
            if state in true:
                return state
        return "Suspended" if self.suspended else "Pending"

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL

    @property
    def desired(self) -> int:
        return sum(r.replicas for r in self.replicas)

    @property
    def active(self) -> int:
        return sum(r.active for r in self.replicas)

    @property
    def gpus(self) -> int:
        return sum(r.replicas * r.gpus_per_replica for r in self.replicas)

    @property
    def ranks_per_pod(self) -> int:
        """Training processes per pod: spec.nprocPerNode when it is a number (the chart sets
        one), else one per GPU ("gpu"/"auto" on GPU pods), else 1."""
        if self.nproc_per_node and self.nproc_per_node.isdigit():
            return max(int(self.nproc_per_node), 1)
        return max((r.gpus_per_replica for r in self.replicas), default=0) or 1

    def condition(self, type_: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)


@dataclass(frozen=True)
class PodView:
    name: str
    replica_type: str  # lower case, as in the pod label: "master" / "worker"
    replica_index: int
    phase: str
    node: str
    restarts: int
    ready: bool
    started: dt.datetime | None = None
    waiting_reason: str = field(default="")
    # Filled in by rank_pods(): the node rank (PET_NODE_RANK) and the global training ranks
    # the pod runs, node_rank * ranks_per_pod ... + ranks_per_pod - 1.
    node_rank: int = 0
    ranks_per_pod: int = 1

    @property
    def first_rank(self) -> int:
        return self.node_rank * self.ranks_per_pod

    @property
    def ranks(self) -> range:
        return range(self.first_rank, self.first_rank + self.ranks_per_pod)

    @property
    def rank_label(self) -> str:
        """"3" for one rank per pod, "4-7" for four."""
        if self.ranks_per_pod == 1:
            return str(self.first_rank)
        return f"{self.first_rank}-{self.ranks.stop - 1}"


def job_view(job: Any) -> JobView:
    """Build a JobView from a KubeflowOrgV1PyTorchJob model."""
    meta = job.metadata
    spec = job.spec
    status = job.status
    statuses = (status.replica_statuses if status else None) or {}
    replicas = []
    for rtype, rspec in sorted((spec.pytorch_replica_specs or {}).items(), key=_master_first):
        rstatus = statuses.get(rtype)
        replicas.append(
            ReplicaView(
                type=rtype,
                replicas=int(rspec.replicas if rspec.replicas is not None else 1),
                gpus_per_replica=_gpus(rspec.template),
                active=int(getattr(rstatus, "active", 0) or 0),
                succeeded=int(getattr(rstatus, "succeeded", 0) or 0),
                failed=int(getattr(rstatus, "failed", 0) or 0),
            )
        )
    conditions = tuple(
        Condition(
            type=str(c.type),
            status=str(c.status),
            reason=str(c.reason or ""),
            message=str(c.message or ""),
            last_transition=_aware(c.last_transition_time),
        )
        for c in ((status.conditions if status else None) or [])
    )
    run_policy = spec.run_policy
    nproc = getattr(spec, "nproc_per_node", None)
    return JobView(
        name=str(meta.name),
        namespace=str(meta.namespace or ""),
        created=_aware(meta.creation_timestamp),
        suspended=bool(run_policy and run_policy.suspend),
        conditions=conditions,
        replicas=tuple(replicas),
        nproc_per_node=str(nproc) if nproc is not None else None,
    )


def pod_view(pod: Any) -> PodView:
    """Build a PodView from a V1Pod of the job (labels set by the operator)."""
    labels = pod.metadata.labels or {}
    statuses = (pod.status.container_statuses if pod.status else None) or []
    main = next((s for s in statuses if s.name == CONTAINER), statuses[0] if statuses else None)
    waiting = main.state.waiting if main is not None and main.state is not None else None
    return PodView(
        name=str(pod.metadata.name),
        replica_type=str(labels.get(LABEL_TYPE, "")).lower(),
        replica_index=int(labels.get(LABEL_INDEX, 0) or 0),
        phase=str((pod.status.phase if pod.status else None) or "Unknown"),
        node=str((pod.spec.node_name if pod.spec else None) or "-"),
        restarts=int(sum(int(s.restart_count or 0) for s in statuses)),
        ready=bool(main is not None and main.ready),
        started=_aware(pod.status.start_time if pod.status else None),
        waiting_reason=str(waiting.reason or "") if waiting is not None else "",
    )


def rank_pods(pods: list[PodView], ranks_per_pod: int = 1) -> list[PodView]:
    """Order pods by node rank and fill in their ranks: the operator gives master-0 node rank
    0 and worker-i node rank i+1 (i when the job has no master), as PET_NODE_RANK."""
    has_master = any(p.replica_type == "master" for p in pods)
    ranked = []
    for pod in pods:
        if pod.replica_type == "master":
            node_rank = pod.replica_index
        else:
            node_rank = pod.replica_index + (1 if has_master else 0)
        ranked.append(replace(pod, node_rank=node_rank, ranks_per_pod=ranks_per_pod))
    return sorted(ranked, key=lambda p: (p.node_rank, p.name))


def _gpus(template: Any) -> int:
    containers = (template.spec.containers if template and template.spec else None) or []
    total = 0
    for container in containers:
        resources = container.resources
        limits = (resources.limits if resources else None) or {}
        requests = (resources.requests if resources else None) or {}
        value = limits.get(GPU_RESOURCE, requests.get(GPU_RESOURCE, 0))
        try:
            total += int(value)
        except (TypeError, ValueError):
            continue
    return total


def _master_first(item: tuple[str, Any]) -> tuple[int, str]:
    return (0 if item[0].lower() == "master" else 1, item[0])


def _aware(value: Any) -> dt.datetime | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
    return None
