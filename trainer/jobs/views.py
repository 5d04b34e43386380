"""Plain views of PyTorchJobs, TrainJobs and their pods.

Jobs are read from the API's plain JSON (every field optional, unknown ones ignored), pods from
the core client's V1Pod. The rest of the package renders and decides on these small dataclasses.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field, replace
from typing import Any

from trainer.errors import exit_class
from trainer.jobs.kinds import (
    LABEL_COMPLETION_INDEX,
    LABEL_INDEX,
    LABEL_RJOB,
    LABEL_TYPE,
    PYTORCHJOB,
    TRAINER_RJOB,
    TRAINJOB,
    Kind,
    kind_of,
)

GPU_RESOURCE = "nvidia.com/gpu"

# Terminal states first: a job that Failed after Running is Failed.
STATE_PRECEDENCE = ("Failed", "Succeeded", "Suspended", "Restarting", "Running", "Created")
TERMINAL = ("Succeeded", "Failed")
# A TrainJob's conditions (trainer v2.3.0 pkg/apis/trainer/v1alpha1/trainjob_types.go:58-64):
# Suspended, Complete, Failed. Complete reads as Succeeded, as for PyTorchJobs.
TRAINJOB_STATES = {"Complete": "Succeeded"}


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
class TrainerStatusView:
    """A TrainJob's ``status.trainerStatus`` (KEP-2779), as the training code reported it."""

    progress: int | None
    remaining_seconds: int | None
    metrics: tuple[tuple[str, str], ...]
    updated: dt.datetime | None


@dataclass(frozen=True)
class JobView:
    name: str
    namespace: str
    created: dt.datetime | None
    suspended: bool
    conditions: tuple[Condition, ...]
    replicas: tuple[ReplicaView, ...]
    nproc_per_node: str | None = None
    kind: str = PYTORCHJOB.name
    runtime: str = ""  # TrainJob: "ClusterTrainingRuntime/torch-distributed"
    trainer_status: TrainerStatusView | None = None
    queue: str = ""  # the kueue.x-k8s.io/queue-name label: Kueue's LocalQueue
    priority_class: str = ""  # kueue.x-k8s.io/priority-class

    @property
    def state(self) -> str:
        """The controller's state: the strongest condition whose status is True. A TrainJob
        has no Running condition: with pods active (see with_pod_counts) it is Running."""
        true = {TRAINJOB_STATES.get(c.type, c.type) for c in self.conditions
                if c.status == "True"}
        for state in STATE_PRECEDENCE:
            if state in true:
                return state
        if self.suspended:
            return "Suspended"
        if self.kind == TRAINJOB.name and self.active > 0:
            return "Running"
        return "Pending"

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
class Termination:
    """How the pod's trainer container last ended (``state.terminated``, else
    ``lastState.terminated`` of a container restarted since)."""

    exit_code: int
    reason: str  # the runtime's: Error, OOMKilled, Completed
    message: str  # the termination message: the trainer's error line, or the log's tail
    previous: bool  # from lastState: the container has restarted since

    @property
    def exit_class(self) -> str:
        return exit_class(self.exit_code, self.reason)

    @property
    def line(self) -> str:
        """The message's last non-empty line (the log's tail ends with the cause)."""
        lines = [line.strip() for line in self.message.splitlines() if line.strip()]
        return lines[-1] if lines else f"<no message> (reason {self.reason or 'unknown'})"


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
    container: str = PYTORCHJOB.container
    terminated: Termination | None = None
    # lastState.terminated, even where the container has ended again since (a hung attempt
    # before the resumed run that completed)
    last_terminated: Termination | None = None

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


def job_view(obj: dict[str, Any]) -> JobView:
    """Build a JobView from a PyTorchJob or TrainJob as the API returns it (plain JSON).

    Every field but ``metadata.name`` is optional here, as in the CRDs: a job without
    ``spec.runPolicy``, without ``status`` or with fields we do not know is shown, not refused.
    """
    if kind_of(obj) is TRAINJOB:
        return _trainjob_view(obj)
    meta = _map(obj.get("metadata"))
    spec = _map(obj.get("spec"))
    status = _map(obj.get("status"))
    statuses = _map(status.get("replicaStatuses"))
    replicas = []
    for rtype, rspec in sorted(_map(spec.get("pytorchReplicaSpecs")).items(), key=_master_first):
        rspec = _map(rspec)
        rstatus = _map(statuses.get(rtype))
        replicas.append(
            ReplicaView(
                type=str(rtype),
                replicas=_int(rspec.get("replicas"), 1),
                gpus_per_replica=_gpus(_map(_map(rspec.get("template")).get("spec"))),
                active=_int(rstatus.get("active")),
                succeeded=_int(rstatus.get("succeeded")),
                failed=_int(rstatus.get("failed")),
            )
        )
    nproc = spec.get("nprocPerNode")
    return JobView(
        name=str(meta.get("name", "")),
        namespace=str(meta.get("namespace") or ""),
        created=aware(meta.get("creationTimestamp")),
        suspended=bool(_map(spec.get("runPolicy")).get("suspend")),
        conditions=conditions_of(status),
        replicas=tuple(replicas),
        nproc_per_node=str(nproc) if nproc is not None else None,
        queue=_label(meta, "kueue.x-k8s.io/queue-name"),
        priority_class=_label(meta, "kueue.x-k8s.io/priority-class"),
    )


def _label(meta: dict[str, Any], key: str) -> str:
    return str(_map(meta.get("labels")).get(key) or "")


def _trainjob_view(obj: dict[str, Any]) -> JobView:
    meta = _map(obj.get("metadata"))
    spec = _map(obj.get("spec"))
    status = _map(obj.get("status"))
    trainer = _map(spec.get("trainer"))
    resources = _map(trainer.get("resourcesPerNode"))
    nodes = trainer.get("numNodes")
    nproc = trainer.get("numProcPerNode")
    ref = _map(spec.get("runtimeRef"))
    return JobView(
        name=str(meta.get("name", "")),
        namespace=str(meta.get("namespace") or ""),
        created=aware(meta.get("creationTimestamp")),
        suspended=bool(spec.get("suspend")),
        conditions=conditions_of(status),
        # The runtime decides the node count when the TrainJob does not (0: not known here).
        replicas=(ReplicaView(type=TRAINER_RJOB, replicas=_int(nodes),
                              gpus_per_replica=_resource_gpus(resources)),),
        nproc_per_node=str(nproc) if nproc is not None else None,
        kind=TRAINJOB.name,
        runtime=f"{ref.get('kind') or 'ClusterTrainingRuntime'}/{ref.get('name', '')}",
        trainer_status=_trainer_status(_map(status.get("trainerStatus"))),
        queue=_label(meta, "kueue.x-k8s.io/queue-name"),
        priority_class=_label(meta, "kueue.x-k8s.io/priority-class"),
    )


def _trainer_status(raw: dict[str, Any]) -> TrainerStatusView | None:
    if not raw:
        return None
    progress = raw.get("progressPercentage")
    eta = raw.get("estimatedRemainingSeconds")
    return TrainerStatusView(
        progress=_int(progress) if progress is not None else None,
        remaining_seconds=_int(eta) if eta is not None else None,
        metrics=tuple((str(m.get("name", "")), str(m.get("value", "")))
                      for m in (raw.get("metrics") or []) if isinstance(m, dict)),
        updated=aware(raw.get("lastUpdatedTime")),
    )


def conditions_of(status: dict[str, Any]) -> tuple[Condition, ...]:
    return tuple(
        Condition(
            type=str(c.get("type", "")),
            status=str(c.get("status", "")),
            reason=str(c.get("reason") or ""),
            message=str(c.get("message") or ""),
            last_transition=aware(c.get("lastTransitionTime")),
        )
        for c in (status.get("conditions") or [])
        if isinstance(c, dict)
    )


def pod_view(pod: Any, kind: Kind = PYTORCHJOB) -> PodView:
    """Build a PodView from a V1Pod of a job (labels set by the operator or by JobSet)."""
    labels = pod.metadata.labels or {}
    statuses = (pod.status.container_statuses if pod.status else None) or []
    main = next((s for s in statuses if s.name == kind.container),
                statuses[0] if statuses else None)
    waiting = main.state.waiting if main is not None and main.state is not None else None
    if kind is TRAINJOB:
        replica_type = str(labels.get(LABEL_RJOB, TRAINER_RJOB))
        index = labels.get(LABEL_COMPLETION_INDEX)
        if index is None:  # the label exists since Kubernetes 1.28; the annotation since 1.21
            index = (pod.metadata.annotations or {}).get(LABEL_COMPLETION_INDEX)
    else:
        replica_type = str(labels.get(LABEL_TYPE, "")).lower()
        index = labels.get(LABEL_INDEX)
    return PodView(
        name=str(pod.metadata.name),
        replica_type=replica_type,
        replica_index=_int(index),
        phase=str((pod.status.phase if pod.status else None) or "Unknown"),
        node=str((pod.spec.node_name if pod.spec else None) or "-"),
        restarts=int(sum(int(s.restart_count or 0) for s in statuses)),
        ready=bool(main is not None and main.ready),
        started=aware(pod.status.start_time if pod.status else None),
        waiting_reason=str(waiting.reason or "") if waiting is not None else "",
        container=kind.container,
        terminated=_termination(main),
        last_terminated=_termination(main, only_last=True),
    )


def _termination(status: Any, only_last: bool = False) -> Termination | None:
    """The container's current terminated state, else (or `only_last`) its last one (a
    V1ContainerStatus)."""
    if status is None:
        return None
    states = ((True, status.last_state),) if only_last else (
        (False, status.state), (True, status.last_state))
    for previous, state in states:
        ended = state.terminated if state is not None else None
        if ended is not None:
            return Termination(exit_code=_int(ended.exit_code), reason=str(ended.reason or ""),
                               message=str(ended.message or ""), previous=previous)
    return None


def with_pod_counts(job: JobView, pods: list[PodView]) -> JobView:
    """A TrainJob's replica counts from its pods (its status counts child Jobs, not pods)."""
    if job.kind != TRAINJOB.name:
        return job
    phases = [p.phase for p in pods]
    (node,) = job.replicas
    node = replace(node, active=sum(p in ("Running", "Pending") for p in phases),
                   succeeded=phases.count("Succeeded"), failed=phases.count("Failed"))
    return replace(job, replicas=(node,))


def rank_pods(pods: list[PodView], ranks_per_pod: int = 1) -> list[PodView]:
    """Order pods by node rank and fill in their ranks, as PET_NODE_RANK: the training
    operator gives master-0 node rank 0 and worker-i node rank i+1 (i when the job has no
    master); a TrainJob's node pods have their Job completion index."""
    has_master = any(p.replica_type == "master" for p in pods)
    ranked = []
    for pod in pods:
        if pod.replica_type == TRAINER_RJOB or pod.replica_type == "master":
            node_rank = pod.replica_index
        else:
            node_rank = pod.replica_index + (1 if has_master else 0)
        ranked.append(replace(pod, node_rank=node_rank, ranks_per_pod=ranks_per_pod))
    return sorted(ranked, key=lambda p: (p.node_rank, p.name))


def _gpus(pod_spec: dict[str, Any]) -> int:
    return sum(_resource_gpus(_map(_map(c).get("resources")))
               for c in (pod_spec.get("containers") or []))


def _resource_gpus(resources: dict[str, Any]) -> int:
    limits = _map(resources.get("limits"))
    requests = _map(resources.get("requests"))
    return _int(limits.get(GPU_RESOURCE, requests.get(GPU_RESOURCE, 0)))


def _map(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _int(value: Any, default: int = 0) -> int:
    if value is None:
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _master_first(item: tuple[str, Any]) -> tuple[int, str]:
    return (0 if str(item[0]).lower() == "master" else 1, str(item[0]))


def aware(value: Any) -> dt.datetime | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
    return None
