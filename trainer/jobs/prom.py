"""Per-rank training metrics of one job, read from Prometheus' HTTP API (``status --prometheus``).

Series come from the trainer's exporter, relabelled by the chart's PodMonitor so every series
carries ``pytorchjob`` (the job's name, of either kind), ``job_kind`` and ``namespace``:
``trainer_loss{rank,split}``,
``trainer_accuracy_ratio{rank,split}``, the task's metrics ``trainer_metric{rank,split,name}``
and the counter ``trainer_samples_total{rank}``.
Only the standard library is used: the ``k8s`` extra stays small.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

from trainer.jobs.errors import PrometheusError
from trainer.jobs.render import table


@dataclass(frozen=True)
class RankMetrics:
    rank: str
    loss: dict[str, float] = field(default_factory=dict)  # by split: "train", "val"
    accuracy: dict[str, float] = field(default_factory=dict)
    samples_per_second: float | None = None
    named: dict[str, float] = field(default_factory=dict)
    """The task's validation metrics by name (mae, rmse, perplexity, ...)."""


@dataclass(frozen=True)
class Slowest:
    rank: str
    samples_per_second: float
    fastest: float

    @property
    def behind_ratio(self) -> float:
        return 1.0 - self.samples_per_second / self.fastest if self.fastest > 0 else 0.0


def selector(job: str, namespace: str, kind: str = "PyTorchJob") -> str:
    # PodMonitors of chart versions before TrainJob support add no job_kind: an empty
    # job_kind is a PyTorchJob.
    kind_match = 'job_kind=~"PyTorchJob|"' if kind == "PyTorchJob" else f'job_kind="{kind}"'
    return f'pytorchjob="{_escape(job)}",namespace="{_escape(namespace)}",{kind_match}'


def queries(job: str, namespace: str, window: str, kind: str = "PyTorchJob") -> dict[str, str]:
    """The PromQL we send. ``max by`` folds duplicate series of one rank (a restarted pod
    leaves its old series for up to 5 minutes) into one value."""
    sel = selector(job, namespace, kind)
    return {
        "loss": f"max by (rank, split) (trainer_loss{{{sel}}})",
        "accuracy": f"max by (rank, split) (trainer_accuracy_ratio{{{sel}}})",
        "rate": f"sum by (rank) (rate(trainer_samples_total{{{sel}}}[{window}]))",
        "named": f'max by (rank, name) (trainer_metric{{{sel},split="val"}})',
    }


def instant_query(base_url: str, promql: str, timeout: float) -> list[tuple[dict[str, str], float]]:
    """Run one instant query; return (labels, value) per series."""
    url = base_url.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - user URL
            payload = json.load(response)
    except urllib.error.HTTPError as exc:
        detail = _error_detail(exc.read())
        raise PrometheusError(
            f"Prometheus at {base_url} rejected the query {promql!r}: {exc.code} {detail}",
            "check --prometheus points at the Prometheus server itself (the URL of its web UI)",
        ) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise PrometheusError(
            f"cannot query Prometheus at {base_url}: {reason}",
            "check the URL; from outside the cluster port-forward it first, e.g. "
            "`kubectl -n monitoring port-forward svc/prometheus-operated 9090` and pass "
            "--prometheus http://127.0.0.1:9090",
        ) from None
    if payload.get("status") != "success":
        raise PrometheusError(
            f"Prometheus at {base_url} failed the query {promql!r}: {payload.get('error')}",
            "check the Prometheus server's logs",
        )
    result = []
    for series in payload.get("data", {}).get("result", []):
        value = float(series["value"][1])
        if not math.isnan(value):
            result.append((dict(series.get("metric", {})), value))
    return result


def job_metrics(base_url: str, job: str, namespace: str, kind: str = "PyTorchJob",
                window: str = "1m", timeout: float = 10.0) -> list[RankMetrics]:
    """Latest loss/accuracy per rank and split, and samples/s per rank, ordered by rank."""
    q = queries(job, namespace, window, kind)
    by_rank: dict[str, RankMetrics] = {}

    def get(rank: str) -> RankMetrics:
        return by_rank.setdefault(rank, RankMetrics(rank=rank))

    for labels, value in instant_query(base_url, q["loss"], timeout):
        get(labels.get("rank", "?")).loss[labels.get("split", "train")] = value
    for labels, value in instant_query(base_url, q["accuracy"], timeout):
        get(labels.get("rank", "?")).accuracy[labels.get("split", "train")] = value
    for labels, value in instant_query(base_url, q["named"], timeout):
        get(labels.get("rank", "?")).named[labels.get("name", "?")] = value
    rates = {labels.get("rank", "?"): value
             for labels, value in instant_query(base_url, q["rate"], timeout)}
    for rank in rates:
        get(rank)
    metrics = [
        RankMetrics(rank=m.rank, loss=m.loss, accuracy=m.accuracy,
                    samples_per_second=rates.get(m.rank), named=m.named)
        for m in by_rank.values()
    ]
    return sorted(metrics, key=lambda m: _rank_key(m.rank))


def slowest(metrics: list[RankMetrics]) -> Slowest | None:
    """The rank with the lowest throughput; None with fewer than two measured ranks."""
    measured = [m for m in metrics if m.samples_per_second is not None]
    if len(measured) < 2:
        return None
    low = min(measured, key=lambda m: (m.samples_per_second or 0.0, _rank_key(m.rank)))
    high = max(m.samples_per_second or 0.0 for m in measured)
    return Slowest(rank=low.rank, samples_per_second=low.samples_per_second or 0.0, fastest=high)


def render(metrics: list[RankMetrics], base_url: str, job: str, namespace: str,
           kind: str = "PyTorchJob") -> str:
    lines = [f"Metrics (Prometheus {base_url}):"]
    if not metrics:
        lines.append(
            f"  <no trainer_* series with {selector(job, namespace, kind)}: the job has not "
            "reported yet, or its PodMonitor is not scraped by this Prometheus>"
        )
        return "\n".join(lines)
    rows = [
        [m.rank, _fmt(m.loss.get("train")), _pct(m.accuracy.get("train")),
         _fmt(m.loss.get("val")), _pct(m.accuracy.get("val")), _fmt(m.samples_per_second, 1)]
        for m in metrics
    ]
    lines.append(
        table(["RANK", "TRAIN-LOSS", "TRAIN-ACC", "VAL-LOSS", "VAL-ACC", "SAMPLES/S"], rows,
              indent="  ")
    )
    # The task's metrics beyond accuracy (regression's mae/rmse, lm's perplexity, a custom
    # step's), one column each, of each rank's shard of the last validation.
    names = sorted({n for m in metrics for n in m.named} - {"accuracy"})
    if names:
        lines.append("Validation metrics (this rank's shard):")
        lines.append(table(["RANK", *(n.upper() for n in names)],
                           [[m.rank, *(_fmt(m.named.get(n)) for n in names)] for m in metrics],
                           indent="  "))
    slow = slowest(metrics)
    if slow is not None:
        lines.append(
            f"Slowest rank: {slow.rank} ({slow.samples_per_second:.1f} samples/s, "
            f"{slow.behind_ratio:.0%} below the fastest rank's {slow.fastest:.1f})"
        )
    return "\n".join(lines)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _rank_key(rank: str) -> tuple[int, str]:
    return (int(rank), "") if rank.isdigit() else (1 << 30, rank)


def _fmt(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _error_detail(body: bytes) -> str:
    try:
        return str(json.loads(body).get("error", ""))
    except ValueError:
        return body.decode("utf-8", errors="replace")[:200]
