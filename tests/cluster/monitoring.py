"""What the tests check on the real monitoring stack (tools/cluster/prometheus_stack.py):
prometheus-operator v0.93.0 turns the chart's PodMonitor into Prometheus' scrape configuration
and Prometheus discovers the ranks' pods through the API server. Used by the default PyTorchJob
and TrainJob tests on their own jobs: every rank scraped with the labels the dashboard selects
on, every dashboard query answering, the final values scraped before the pods end and equal to
the job's summary. Assertions on the Prometheus HTTP API, waiting on its answers."""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from typing import Any

from tests.cluster.helm import Release
from tests.cluster.kube import REPO, STATE

DASHBOARD_LABELS = ("namespace", "pod", "job_kind", "pytorchjob", "rank")


def prometheus() -> str:
    return (STATE / "prometheus-url").read_text().strip()


def api(path: str, attempts: int = 3) -> Any:
    """A Prometheus HTTP API answer's data. A read that times out is tried again: on 2 busy
    cores the server sometimes takes longer than a client's 20 s (seen once in a CI run)."""
    for attempt in range(attempts):
        try:
            with urllib.request.urlopen(f"{prometheus()}{path}", timeout=20) as answer:
                body = json.load(answer)
            break
        except TimeoutError:
            if attempt == attempts - 1:
                raise
    assert body["status"] == "success", body
    return body["data"]


def query(promql: str) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = api("/api/v1/query?" + urllib.parse.urlencode(
        {"query": promql}))["result"]
    return result


def wait_for_series(promql: str, count: int, timeout: float = 300) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    found: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        found = query(promql)
        if len(found) >= count:
            return found
        time.sleep(1)
    targets = json.dumps(api("/api/v1/targets"))
    raise AssertionError(f"{promql}: {len(found)} series after {timeout} s, want {count}; "
                         f"targets: {targets[-3000:]}")


DASHBOARD = REPO / "charts" / "ddp-trainer" / "files" / "dashboard.json"
# Panels that are empty in these runs, and why.
EMPTY_HERE = {"CUDA memory per rank": "the node has no GPU: the CUDA gauges are not exported"}
# Grafana's $__rate_interval for a 5 s scrape interval is at least 4 scrapes; 30 s holds six.
RATE_INTERVAL = "30s"


def label_values(label: str, match: str) -> list[str]:
    values: list[str] = api(f"/api/v1/label/{label}/values?"
                            + urllib.parse.urlencode({"match[]": match}))
    return values


def assert_dashboard_has_data(namespace: str, job: str) -> None:
    """Every panel's queries, with the variables Grafana would pick, return series (or the
    panel is in EMPTY_HERE)."""
    board = json.loads(DASHBOARD.read_text())
    # The variables' own queries offer this job.
    assert namespace in label_values("namespace", "trainer_info")
    assert job in label_values("pytorchjob", f'trainer_info{{namespace="{namespace}"}}')
    empty = {}
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            expr = (target["expr"].replace("$namespace", namespace).replace("$pytorchjob", job)
                    .replace("$__rate_interval", RATE_INTERVAL))
            if not query(expr):
                empty[panel["title"]] = expr
    assert set(empty) == set(EMPTY_HERE), empty


def assert_scraped_while_running(release: Release) -> str:
    """While the job runs (or lingers): both ranks' series, discovered through the API server,
    with the dashboard's labels; then every dashboard panel has data. Returns the selector."""
    ns, kind = release.namespace, "TrainJob" if release.kind == "trainjob" else "PyTorchJob"
    selector = f'namespace="{ns}",pytorchjob="{release.job}"'
    series = wait_for_series(f"trainer_world_size{{{selector}}}", 2)
    assert sorted(s["metric"]["rank"] for s in series) == ["0", "1"]
    for s in series:
        labels = s["metric"]
        assert all(labels.get(key) for key in DASHBOARD_LABELS), labels
        assert labels["job_kind"] == kind and labels["namespace"] == ns
        assert float(s["value"][1]) == 2.0
    # The dashboard, once there has been a validation and a checkpoint (the first epoch's end)
    # and a rate window of scrapes; the pods serve on for metrics.linger_seconds after training
    # (the callers set metrics.linger_scrapes 0: not only until the first scrape of the end).
    wait_for_series(f"trainer_last_checkpoint_timestamp_seconds{{{selector}}} > 0", 1)
    wait_for_series(f"rate(trainer_samples_total{{{selector}}}[{RATE_INTERVAL}])", 2)
    assert_dashboard_has_data(ns, release.job)
    return selector


def assert_final_values_scraped(selector: str, summary: dict[str, Any]) -> None:
    """After the job: the last step and the exact final val_accuracy were scraped before the
    pods ended, equal to summary.json."""
    window = f"[{10 * 60}s]"
    (steps,) = query(f'last_over_time(trainer_steps_total{{{selector},rank="0"}}{window})')
    assert int(float(steps["value"][1])) == summary["steps"]
    accuracy = query(f'last_over_time(trainer_global_accuracy_ratio{{{selector},'
                     f'split="val",rank="0"}}{window})')
    assert [float(a["value"][1]) for a in accuracy] == [summary["val_accuracy"]], accuracy


# The chart's PodMonitor scrapes every 15 s; the alert tests' runs last about a minute.
FAST_SCRAPES: dict[str, Any] = {"metrics": {"podMonitor": {"interval": "5s"}}}


def alerts_values(**by_alert: dict[str, Any]) -> dict[str, Any]:
    """Chart values for short alert thresholds (metrics.prometheusRule.alerts)."""
    return {"metrics": {"prometheusRule": {"alerts": by_alert}}}


def job_alerts(release: Release, alert: str) -> list[dict[str, Any]]:
    """`alert`'s alerts for the release's job, from the rules of the release's own
    PrometheusRule (prometheus-operator names the rule file `<namespace>-<name>-<uid>.yaml`):
    every release of the chart loads the rules for all jobs, with its own thresholds."""
    groups = api("/api/v1/rules?type=alert")["groups"]
    own = f"{release.namespace}-{release.job}-"
    return [a for g in groups if g["file"].rsplit("/", 1)[-1].startswith(own)
            for rule in g["rules"] if rule["name"] == alert
            for a in rule["alerts"]
            if a["labels"].get("namespace") == release.namespace
            and a["labels"].get("pytorchjob") == release.job]


def wait_for_alert(release: Release, alert: str, state: str = "firing",
                   timeout: float = 120, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """The first of the job's `alert` alerts in `state` (pending, firing) that has `labels`
    (Prometheus lists a rule's alerts in no set order: one per split, rank, ...)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [a for a in job_alerts(release, alert) if a["state"] == state
                 and all(a["labels"].get(k) == v for k, v in (labels or {}).items())]
        if found:
            return found[0]
        time.sleep(1)
    files = sorted({g["file"] for g in api("/api/v1/rules?type=alert")["groups"]})
    raise AssertionError(f"{alert} not {state} for {release.namespace}/{release.job} after "
                         f"{timeout} s; its alerts: {job_alerts(release, alert)}; rule files: "
                         f"{files}")
