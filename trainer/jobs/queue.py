"""A job's place in a Kueue queue: its LocalQueue (the job's `kueue.x-k8s.io/queue-name` label)
and the state of the Workload Kueue made for it (docs/queues.md, docs/jobs.md).

Kueue makes one Workload per queued job, owned by the job (an ownerReference to it). Its
conditions say everything a user asks while a job waits (Kueue v0.19,
apis/kueue/v1beta2/workload_types.go): QuotaReserved=False with the reason the quota does not
fit, Admitted=True once the job may run, Evicted=True with the reason it was stopped (Preempted,
PodsReadyTimeout, ...), Preempted=True with the preemptor's UID in its message, Finished=True.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from trainer.jobs.views import Condition, JobView, aware, conditions_of

GROUP = "kueue.x-k8s.io"
VERSIONS = ("v1beta2", "v1beta1")  # v1beta2 since Kueue v0.15; v1beta1 before
PLURAL = "workloads"
LABEL_QUEUE = "kueue.x-k8s.io/queue-name"
LABEL_PRIORITY = "kueue.x-k8s.io/priority-class"


@dataclass(frozen=True)
class Admission:
    """What Kueue says of a queued job: a state word and the line that explains it."""

    state: str  # Admitted, Pending, QuotaReserved, Preempted, Evicted, Finished, NoWorkload
    detail: str
    workload: str = ""
    cluster_queue: str = ""


NO_WORKLOAD = Admission(
    "NoWorkload", "Kueue has made no Workload for this job (is Kueue installed, with the "
    "integration for its kind and a LocalQueue of this name?)")


def forbidden(namespace: str) -> Admission:
    return Admission("Unknown", f"not allowed to list workloads.kueue.x-k8s.io in namespace "
                                f"{namespace!r} (ask for get/list on them: `kubectl auth can-i "
                                f"list workloads.kueue.x-k8s.io -n {namespace}`)")


def admissions(cluster: Any, jobs: list[JobView], all_namespaces: bool = False
               ) -> dict[tuple[str, str, str], tuple[Admission, dt.datetime | None]]:
    """Kueue's word on each queued job, and since when its Workload exists, by (namespace,
    name, kind): one list of Workloads, only when a job names a queue. Users allowed to read
    jobs but not Workloads get `Unknown` with the reason, not a failed command."""
    queued = [j for j in jobs if j.queue]
    if not queued:
        return {}
    workloads = read_workloads(cluster, all_namespaces)
    out: dict[tuple[str, str, str], tuple[Admission, dt.datetime | None]] = {}
    for job in queued:
        if workloads is None:
            out[(job.namespace, job.name, job.kind)] = (forbidden(job.namespace), None)
            continue
        mine = owned_by(workloads, job)
        out[(job.namespace, job.name, job.kind)] = (admission(mine), queued_since(mine))
    return out


def read_workloads(cluster: Any, all_namespaces: bool = False) -> list[dict[str, Any]] | None:
    """Every Workload in the namespace (or all), as plain JSON; none where Kueue's CRD is not
    served; None when RBAC forbids reading them. Other API errors propagate (the caller's
    `cluster.errors` names them)."""
    from kubernetes.client.exceptions import ApiException

    for version in VERSIONS:
        try:
            if all_namespaces:
                raw = cluster.custom.list_cluster_custom_object(
                    GROUP, version, PLURAL, _request_timeout=cluster.request_timeout)
            else:
                raw = cluster.custom.list_namespaced_custom_object(
                    GROUP, version, cluster.namespace, PLURAL,
                    _request_timeout=cluster.request_timeout)
        except ApiException as exc:
            if exc.status == 404:
                continue
            if exc.status == 403:
                return None
            raise
        return [dict(item) for item in raw.get("items") or []]
    return []


def owned_by(workloads: list[dict[str, Any]], job: JobView) -> dict[str, Any] | None:
    """The job's Workload: the newest one whose owner is the job (a job resubmitted under the
    same name owns a new one; the old one goes with the old job)."""
    mine = [w for w in workloads
            if _meta(w).get("namespace") == job.namespace
            and any(ref.get("kind") == job.kind and ref.get("name") == job.name
                    for ref in _meta(w).get("ownerReferences") or [] if isinstance(ref, dict))]
    if not mine:
        return None
    return max(mine, key=lambda w: str(_meta(w).get("creationTimestamp") or ""))


def admission(workload: dict[str, Any] | None) -> Admission:
    """The Workload's state, strongest first: finished, evicted (preempted: by whom), admitted,
    quota reserved (admission checks pending), else pending with Kueue's reason."""
    if workload is None:
        return NO_WORKLOAD
    status = workload.get("status") if isinstance(workload.get("status"), dict) else {}
    assert isinstance(status, dict)
    conditions = {c.type: c for c in conditions_of(status)}
    name = str(_meta(workload).get("name", ""))
    queue = str((status.get("admission") or {}).get("clusterQueue") or "")

    def true(type_: str) -> Condition | None:
        found = conditions.get(type_)
        return found if found is not None and found.status == "True" else None

    def made(state: str, detail: str) -> Admission:
        return Admission(state, detail + _evictions(status), name, queue)

    if (c := true("Finished")) is not None:
        return made("Finished", c.message or c.reason)
    if (c := true("Evicted")) is not None:
        preempted = true("Preempted")
        if c.reason == "Preempted" or preempted is not None:
            why = preempted.message if preempted is not None else c.message
            return made("Preempted", f"{why} (requeued: waits for quota again)")
        return made("Evicted", f"{c.reason}: {c.message} (requeued: waits for quota again)")
    if (c := true("Admitted")) is not None:
        return made("Admitted", f"in ClusterQueue {queue}" if queue else c.message)
    if (c := true("QuotaReserved")) is not None:
        waiting = conditions.get("Admitted")
        return made("QuotaReserved", waiting.message if waiting else c.message)
    if workload.get("spec", {}).get("active") is False:
        return made("Deactivated", "spec.active is false: Kueue will not admit it until it is "
                                   "set to true")
    reserved = conditions.get("QuotaReserved")
    if reserved is not None and (reserved.message or reserved.reason):
        return made("Pending", reserved.message or reserved.reason)
    return made("Pending", "not yet considered by Kueue")


def _evictions(status: dict[str, Any]) -> str:
    """` (evicted before: 2 x PodsReadyTimeout)`: a readmitted Workload's Evicted condition is
    gone (Kueue v0.19 keeps the history in status.schedulingStats.evictions), and a job that
    keeps being evicted should say so while it runs again."""
    stats = status.get("schedulingStats")
    found = stats.get("evictions") if isinstance(stats, dict) else None
    said = [f"{e.get('count', 0)} x {e.get('reason', '?')}" for e in found or []
            if isinstance(e, dict) and e.get("count")]
    return f" (evicted before: {', '.join(said)})" if said else ""


def queued_since(workload: dict[str, Any] | None) -> dt.datetime | None:
    """When the Workload was made: the time the job has been queued since, if it waits."""
    return aware(_meta(workload or {}).get("creationTimestamp"))


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}
