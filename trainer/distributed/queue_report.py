"""What Kueue did to this job before this run of its pods: how long its Workload waited for
the admission it runs under, and how often it was evicted (preempted) before. Rank 0 reads it
once at start and exports it (``trainer_queue_wait_seconds``, ``trainer_queue_evictions``,
``trainer_queue_preemptions``: docs/metrics.md), so the dashboard shows a job's time queued
and preemptions beside its training.

In a pod of the chart with ``kueue.queueName`` only (``DDP_TRAINER_QUEUE``), with the API
access of the hang Event (:mod:`trainer.distributed.hang_event`) and a Role that may list
Workloads. Two calls, each bounded; a failure is a warning and no queue metrics, never an
error.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import urllib.error
import urllib.parse
from collections.abc import Mapping
from typing import Any

from trainer.distributed import hang_event
from trainer.jobs.queue import GROUP, PLURAL, VERSIONS
from trainer.jobs.views import aware, conditions_of

log = logging.getLogger(__name__)

QUEUE_ENV = "DDP_TRAINER_QUEUE"


def measures(workload: Mapping[str, Any], now: dt.datetime) -> dict[str, float]:
    """The metrics of a Workload (Kueue v0.19): the seconds from when it was last queued (made,
    or requeued after an eviction) to its admission (to `now` while it is not admitted), and
    its evictions so far, all and by preemption (``status.schedulingStats.evictions``)."""
    status = workload.get("status") if isinstance(workload.get("status"), dict) else {}
    assert isinstance(status, dict)
    conditions = {c.type: c for c in conditions_of(status)}
    admitted = conditions.get("Admitted")
    until = (admitted.last_transition if admitted is not None and admitted.status == "True"
             else None) or now
    meta = workload.get("metadata") if isinstance(workload.get("metadata"), dict) else {}
    assert isinstance(meta, dict)
    since = aware(meta.get("creationTimestamp")) or until
    requeued = conditions.get("Requeued")
    if requeued is not None and requeued.last_transition is not None \
            and since < requeued.last_transition <= until:
        since = requeued.last_transition
    stats = status.get("schedulingStats")
    found = stats.get("evictions") if isinstance(stats, dict) else None
    counts = [(str(e.get("reason", "")), int(e.get("count") or 0))
              for e in found or [] if isinstance(e, dict)]
    return {"queue/wait_seconds": max(0.0, (until - since).total_seconds()),
            "queue/evictions": float(sum(n for _, n in counts)),
            "queue/preemptions": float(sum(n for r, n in counts if r == "Preempted"))}


def read(env: Mapping[str, str] = os.environ) -> dict[str, float]:
    """This pod's job's queue metrics; none outside a queued chart job or on any failure."""
    kind, job = env.get("DDP_TRAINER_JOB_KIND", ""), env.get("DDP_TRAINER_JOB_NAME", "")
    namespace = env.get("POD_NAMESPACE", "")
    api = hang_event._api()
    if not env.get(QUEUE_ENV) or kind not in hang_event.KINDS or not job or not namespace \
            or api is None:
        return {}
    base, context, token = api
    try:
        mine = _workload(base, context, token, kind, job, namespace)
    except (OSError, urllib.error.URLError, ValueError) as err:
        log.warning("queue metrics: cannot read the Kueue Workload of %s %s (%s); no queue "
                    "metrics for this run", kind, job, err)
        return {}
    if mine is None:
        log.warning("queue metrics: %s %s names queue %s but Kueue has no Workload for it",
                    kind, job, env.get(QUEUE_ENV))
        return {}
    return measures(mine, dt.datetime.now(dt.timezone.utc))


def _workload(base: str, context: Any, token: str, kind: str, job: str, namespace: str
              ) -> dict[str, Any] | None:
    """The newest Workload in `namespace` owned by the job (as `ddp-trainer jobs` finds it)."""
    for version in VERSIONS:
        url = f"{base}/apis/{GROUP}/{version}/namespaces/{urllib.parse.quote(namespace)}/{PLURAL}"
        try:
            items = hang_event._call(url, context, token).get("items") or []
        except urllib.error.HTTPError as err:
            if err.code == 404:
                continue
            raise
        mine = [w for w in items if isinstance(w, dict) and any(
            isinstance(ref, dict) and ref.get("kind") == kind and ref.get("name") == job
            for ref in (w.get("metadata") or {}).get("ownerReferences") or [])]
        return max(mine, key=lambda w: str(w["metadata"].get("creationTimestamp") or ""),
                   default=None)
    return None
