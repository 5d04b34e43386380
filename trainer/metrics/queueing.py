"""What Kueue did to the job before this run, exported by rank 0 (read once at start by
:mod:`trainer.distributed.queue_report`; 0 for a job no queue holds): the time it waited for its
admission, and its evictions and preemptions so far."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Gauge


class QueueMetrics:
    def __init__(self, registry: CollectorRegistry, rank: str) -> None:
        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, ["rank"], registry=registry,
                         multiprocess_mode="mostrecent").labels(rank)

        self.wait = gauge("trainer_queue_wait_seconds",
                          "Seconds the job's Kueue Workload waited for the admission this run "
                          "started under, since it was made or requeued after an eviction "
                          "(rank 0 only; 0 unqueued).")
        self.evictions = gauge("trainer_queue_evictions",
                               "Times Kueue evicted the job before this run, any reason "
                               "(rank 0 only).")
        self.preemptions = gauge("trainer_queue_preemptions",
                                 "Times Kueue evicted the job before this run to admit a "
                                 "higher-priority one (rank 0 only).")
        for g in (self.wait, self.evictions, self.preemptions):
            g.set(0.0)  # multiprocess mode exports a gauge only once set

    def handlers(self, scalar: Callable[[Any], float]) -> dict[str, Callable[[Any], None]]:
        return {"queue/wait_seconds": lambda v: self.wait.set(scalar(v)),
                "queue/evictions": lambda v: self.evictions.set(scalar(v)),
                "queue/preemptions": lambda v: self.preemptions.set(scalar(v))}
