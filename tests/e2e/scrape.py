"""Checks of what a real Prometheus scraped from a played job, through the dashboard's own
queries (charts/ddp-trainer/files/dashboard.json, variables as Grafana substitutes them)."""

from __future__ import annotations

from typing import Any

from tests.e2e.harness.job import PlayedJob
from tests.e2e.harness.prometheus import PodMonitorPrometheus
from tests.e2e.scenario import NAMESPACE
from tests.metrics.dashboard import load, substitute, targets

SCRAPE_VALUES = {"metrics": {"podMonitor": {"interval": "1s"}}}


def dashboard_query(panel: str, job: PlayedJob, ref: str = "A") -> str:
    (target,) = [t for t in targets(load()) if t.panel == panel and t.ref == ref]
    return substitute(target.expr, {"namespace": NAMESPACE, "pytorchjob": job.name,
                                    "datasource": "prometheus", "__rate_interval": "1m"})


def series(prom: PodMonitorPrometheus, expr: str, window: tuple[float, float]
           ) -> list[dict[str, Any]]:
    """The series a Grafana time-series panel over `window` would draw."""
    return prom.query_range(expr, window[0], window[1], step="1s")


def ranks_of(rows: list[dict[str, Any]], **labels: str) -> list[str]:
    return sorted(r["metric"]["rank"] for r in rows
                  if all(r["metric"].get(k) == v for k, v in labels.items()))


def last_value(rows: list[dict[str, Any]]) -> float:
    (row,) = rows
    return float(row["values"][-1][1])


def target_labels(job: PlayedJob, prom: PodMonitorPrometheus) -> dict[str, dict[str, str]]:
    """pod -> the target labels on its series (from trainer_info, one sample per rank)."""
    rows = prom.query(f'last_over_time(trainer_info{{pytorchjob="{job.name}"}}[10m])')
    keep = ("namespace", "pod", "container", "endpoint", "job", "pytorchjob", "replica_type",
            "replica_index")
    return {r["metric"]["pod"]: {k: r["metric"].get(k, "") for k in keep} for r in rows}
