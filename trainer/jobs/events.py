"""The Warning events of a job and of what it owns: why a job has no pods or a pod stays
Pending. The controllers record these only as events on the object they failed to make or
place (the training operator's FailedCreatePod on the PyTorchJob, the scheduler's
FailedScheduling on a pod, the Job controller's FailedCreate on a TrainJob's child Job), which
`kubectl describe` of that one object shows and nothing else does."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainer.jobs.errors import AccessDenied, JobsError
from trainer.jobs.kinds import LABEL_JOBSET, TRAINJOB, Kind
from trainer.jobs.views import JobView, PodView, aware

if TYPE_CHECKING:
    from trainer.jobs.kube import Cluster

SHOWN = 8  # the newest; `kubectl get events` has the rest


@dataclass(frozen=True)
class EventView:
    kind: str
    name: str
    reason: str
    message: str
    count: int
    last: dt.datetime | None


def event_view(event: Any) -> EventView:
    """A core/v1 Event: old-style (count, lastTimestamp) or events.k8s.io-style (series,
    eventTime), as the scheduler writes them."""
    series = event.series
    last = (event.last_timestamp or (series.last_observed_time if series else None)
            or event.event_time or event.metadata.creation_timestamp)
    return EventView(
        kind=str(event.involved_object.kind or ""), name=str(event.involved_object.name or ""),
        reason=str(event.reason or ""), message=" ".join(str(event.message or "").split()),
        count=int(event.count or (series.count if series else 0) or 1), last=aware(last))


def job_events(cluster: Cluster, kind: Kind, job: JobView,
               pods: list[PodView]) -> list[EventView] | str:
    """The job's Warning events since it was made, newest last (at most SHOWN); or why they
    cannot be shown (RBAC, or any other failed read)."""
    owned = {(kind.name, job.name)} | {("Pod", pod.name) for pod in pods}
    try:
        if kind is TRAINJOB:
            # JobSet (named as the TrainJob) makes one Job per replicated job, labelled with it.
            from kubernetes import client

            with cluster.errors(f"list the Jobs of trainjob {job.name}", kind):
                children = client.BatchV1Api(cluster.api_client).list_namespaced_job(
                    cluster.namespace, label_selector=f"{LABEL_JOBSET}={job.name}",
                    _request_timeout=cluster.request_timeout)
            owned |= {("JobSet", job.name)} | {("Job", str(j.metadata.name))
                                               for j in children.items or [] if j.metadata}
        with cluster.errors(f"list the events of {kind.singular} {job.name}", kind):
            found = cluster.core.list_namespaced_event(
                cluster.namespace, field_selector="type=Warning",
                _request_timeout=cluster.request_timeout)
    except AccessDenied:
        return (f"not shown: not allowed to list events{' and jobs.batch' * (kind is TRAINJOB)}"
                f" in namespace {cluster.namespace!r}")
    except JobsError as exc:  # the status above is worth more than one failed read after it
        return f"not shown: {exc.problem}"
    views = [event_view(e) for e in found.items or []
             if e.type == "Warning" and (e.involved_object.kind, e.involved_object.name) in owned]
    if job.created is not None:  # a job made again under the same name: not the old one's
        views = [v for v in views if v.last is None or v.last >= job.created]
    views.sort(key=lambda v: (v.last or dt.datetime.min.replace(tzinfo=dt.timezone.utc)))
    return views[-SHOWN:]
