"""The hang watchdog's metrics (:mod:`trainer.distributed.watchdog`): each rank's phase over
time, how long it has been in it, its deadline, and whether it declared the job hung."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

PHASE_NAMES = ("starting", "data", "step", "backward", "optimizer", "agreement", "validation",
               "reduction", "checkpoint", "done")
"""The label values of ``trainer_phase`` (trainer.distributed.phases.PHASES' names)."""


class PhaseMetrics:
    def __init__(self, registry: CollectorRegistry, rank: str) -> None:
        phase = Gauge("trainer_phase", "1 for the phase this rank is in (the hang watchdog's "
                      "view, updated every beat), 0 for the others.", ["rank", "phase"],
                      registry=registry, multiprocess_mode="mostrecent")
        self.phase = {name: phase.labels(rank, name) for name in PHASE_NAMES}

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, ["rank"], registry=registry,
                         multiprocess_mode="mostrecent").labels(rank)

        self.seconds = gauge("trainer_phase_seconds",
                             "Seconds this rank has been in its current phase.")
        self.budget = gauge("trainer_hang_deadline_seconds",
                            "Seconds with no rank making progress after which this rank's "
                            "watchdog declares the job hung (dist.hang_seconds, scaled).")
        self.hung = gauge("trainer_hung", "1 once this rank's watchdog declared the job hung "
                          "(the process exits 142 right after).")
        for g in (*self.phase.values(), self.seconds, self.budget, self.hung):
            g.set(0.0)

    def handlers(self, scalar: Callable[[Any], float]) -> dict[str, Callable[[Any], None]]:
        return {"watch/phase": self._set_phase,
                "watch/phase_seconds": lambda v: self.seconds.set(scalar(v)),
                "watch/budget_seconds": lambda v: self.budget.set(scalar(v)),
                "watch/hung": lambda v: self.hung.set(scalar(v))}

    def _set_phase(self, value: Any) -> None:
        if value not in self.phase:
            raise ValueError(f"unknown phase {value!r}")
        for name, child in self.phase.items():
            child.set(1.0 if name == value else 0.0)
