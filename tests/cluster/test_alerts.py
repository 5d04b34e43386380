"""Alerts of the chart's PrometheusRule firing on the real monitoring stack (prometheus-operator
loads the rule, Prometheus evaluates it on what it scraped from the ranks), caused as in
production: a learning rate that is too high, a throttled rank. Thresholds shortened through
the chart's values (metrics.prometheusRule.alerts), never the rules themselves. The stall alert
and the restart alert on a drained job fire in test_pytorchjob_failures.py, on the
interruptions made there; the restart alert at the chart's defaults fires here."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.helm import Release, release_name
from tests.cluster.jobs import (
    container_id,
    cpu_quota_file,
    restarts,
    uid,
    wait_until,
)
from tests.cluster.kube import Cluster, merged
from tests.cluster.monitoring import (
    FAST_SCRAPES,
    alerts_values,
    job_alerts,
    query,
    wait_for_alert,
    wait_for_series,
)

# SGD warmed up towards a learning rate 400 times the default, as a mistyped lr would: while
# the rate is small the loss falls (validation loss 0.16 at step 115 in a 2-rank run), then
# between lr 0.3 and 0.6 (steps 200-600) the network blows up and its loss stays at chance
# level (2.3): 1920 steps, more than half of them blown up, about 30 s here (a warm-up twice as
# long and 3240 steps took 222 s of CI with the NaN run beside it).
EXPLODING: dict[str, Any] = {
    "trainerConfig": {"optim": {"lr": 20.0, "warmup_steps": 12500}, "train": {"epochs": 160},
                      "metrics": {"linger_seconds": 0}},
    **FAST_SCRAPES}
# A learning rate of 1e6: NaN within the first log interval; the ranks stop together with
# TrainingDiverged (exit 3) and serve the NaN for metrics.linger_seconds before they leave.
# Restarts unlimited: the alert is read only after the exploding run's test, and at the chart's
# backoffLimit (3) the operator failed the job and deleted its pods before that, when that
# test was slow (a CI run: NaN served from 14:35:22, the job failed at 14:36:46, its alert
# first looked for at 14:36:42; a resolved alert is gone from the rules' alerts).
NOT_FINITE: dict[str, Any] = {"trainerConfig": {
    "optim": {"lr": 1e6}, "metrics": {"linger_seconds": 30}},
    "runPolicy": {"backoffLimit": 100}, **FAST_SCRAPES}


@pytest.fixture(scope="module")
def diverging(cluster: Cluster, chart_ref: str,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Release]]:
    """Both runs installed at once (they share the node's two cores); deleted after, the NaN
    one restarting and failing until then."""
    runs = {
        "exploding": merged(EXPLODING, alerts_values(lossExploding={
            "window": "10m", "resolution": "5s", "for": "5s"})),
        "nan": NOT_FINITE,
    }
    releases = {}
    for prefix, values in runs.items():
        release = Release(cluster, release_name(), cluster.namespace(prefix), values)
        release.install(chart_ref, tmp=tmp_path_factory.mktemp(prefix))
        releases[prefix] = release
    yield releases
    for release in releases.values():
        cluster.kubectl("delete", "namespace", release.namespace, "--wait=false")


def test_a_learning_rate_too_high_fires_the_exploding_loss_alert(
        diverging: dict[str, Release]) -> None:
    release = diverging["exploding"]
    alert = wait_for_alert(release, "DDPTrainerLossExploding", timeout=240)
    selector = f'namespace="{release.namespace}",pytorchjob="{release.job}"'
    (lowest,) = query(f'min_over_time((trainer_loss{{{selector},split="train",'
                      f'rank="{alert["labels"]["rank"]}"}} > 0)[10m:5s])')
    assert float(alert["value"]) > 4 * float(lowest["value"][1]), (alert, lowest)
    release.wait_condition("Succeeded")  # finite throughout: it blew up, it did not fail


def test_a_nan_loss_fires_the_not_finite_alert_and_the_ranks_stop(
        diverging: dict[str, Release]) -> None:
    release = diverging["nan"]
    # Restarted after each exit 3, the Master serves its NaN for 30 s per attempt; by the time
    # the exploding run's test is done its restarts may be in CrashLoopBackOff, whose delay
    # doubles up to 5 min: the wait covers one full delay and an attempt.
    # The validation split may fire too: an interval of steps can span epoch ends, whose
    # validation then runs on the diverged weights before the ranks agree to stop.
    alert = wait_for_alert(release, "DDPTrainerLossNotFinite", timeout=420,
                           labels={"split": "train"})
    assert not math.isfinite(float(alert["value"])), alert
    master = release.pod("master")
    wait_until(lambda: restarts(release, master)[1] == 3,
               "the Master exited 3 (TrainingDiverged) and was restarted")
    log = release.cluster.kubectl("logs", master, "-n", release.namespace, "--previous").stdout
    assert "error: training loss became " in log and "(fix: lower --lr" in log, log[-2000:]


def test_a_throttled_rank_fires_the_straggler_alert_for_that_rank_only(
        cluster: Cluster, chart_ref: str, tmp_path: Path) -> None:
    # The Worker's CPU quota cut from its limit (2 CPUs) to 0.2 CPU mid-run. Its step time
    # stays its peer's (the Master waits for it in the all-reduce); its throttled time per step
    # does not. Its compute per step cannot tell it on shared cores: twice the unthrottled
    # Master's was 1.9x the Worker's (docs/metrics.md), so the alert must not name the Master.
    values = merged({"trainerConfig": {"train": {"epochs": 3000},
                                       "metrics": {"linger_seconds": 0}}}, FAST_SCRAPES,
                    alerts_values(straggler={"window": "30s", "for": "10s"}))
    release = Release(cluster, release_name(), cluster.namespace("straggler"), values)
    release.install(chart_ref, tmp=tmp_path)
    try:
        container_id(release, release.pod("master"))
        quota = cpu_quota_file(release, release.pod("worker"))
        quota.write_text("20000\n")  # of the 100 ms CFS period
        wait_for_alert(release, "DDPTrainerStragglerRank", timeout=180,
                       labels={"rank": "1", "phase": "cpu_throttled"})
        # the throttled rank only; its batch wait may be named too (its in-process loading is
        # throttled with it), never the other rank's
        assert {a["labels"]["rank"] for a in job_alerts(release, "DDPTrainerStragglerRank")} \
            == {"1"}
        selector = f'namespace="{release.namespace}",pytorchjob="{release.job}"'
        step = {s["metric"]["rank"]: float(s["value"][1]) for s in query(
            f"rate(trainer_step_duration_seconds_sum{{{selector}}}[30s]) / "
            f"rate(trainer_step_duration_seconds_count{{{selector}}}[30s])")}
        per_step = {name: {s["metric"]["rank"]: float(s["value"][1]) for s in query(
            f"rate(trainer_{name}_seconds_total{{{selector}}}[30s]) / "
            f"rate(trainer_steps_total{{{selector}}}[30s])")}
            for name in ("forward", "cpu_throttled")}
        print(f"per step, rank 0/1: step {step}, compute {per_step['forward']}, "
              f"throttled {per_step['cpu_throttled']}")
        assert per_step["cpu_throttled"]["1"] > 0.1 * step["1"]
        assert per_step["cpu_throttled"]["0"] < 0.1 * step["0"]
        assert step["1"] < 1.3 * step["0"] and step["0"] < 1.3 * step["1"]
    finally:
        cluster.kubectl("delete", "namespace", release.namespace, "--wait=false")


# Issue 35: the restart alert at the chart's defaults but the scrape interval, for a Worker pod
# deleted mid-run: 1 Master + 1 Worker, 400 epochs (about a minute here), within 10 minutes.
RESTART_DEFAULTS: dict[str, Any] = {"metrics": {"podMonitor": {"interval": "2s"}},
                                    "trainerConfig": {"train": {"epochs": 400}}}


def test_a_worker_pod_deleted_mid_run_fires_the_restart_alert_at_the_chart_defaults(
        cluster: Cluster, chart_ref: str, tmp_path: Path) -> None:
    release = Release(cluster, release_name(), cluster.namespace("restart"), RESTART_DEFAULTS)
    release.install(chart_ref, tmp=tmp_path)
    try:
        # Deleted once Prometheus has seen both ranks at 0: a restart before the job's first
        # scrape shows only as a count first seen at 1, as a job resumed from an earlier run's
        # checkpoints shows (docs/metrics.md), and the operator's PodMonitor reload takes ~1 min.
        selector = f'namespace="{release.namespace}",pytorchjob="{release.job}"'
        wait_for_series(f"trainer_restarts_total{{{selector}}} == 0", 2, timeout=300)
        phase = cluster.kubectl("get", "pod", release.pod("master"), "-n", release.namespace,
                                "-o", "jsonpath={.status.phase}").stdout
        assert phase == "Running", f"the job ended before its first scrape: {phase}"
        worker = uid(release, "worker")
        cluster.kubectl("delete", "pod", release.pod("worker"), "-n", release.namespace,
                        "--wait=false")
        deleted = time.monotonic()
        # The Worker's SIGTERM stops both ranks at one step: the Master restarts in place
        # (its count 0 -> 1 on its emptyDir), the Worker's new pod starts at 0.
        wait_until(lambda: uid(release, "worker") not in (None, worker), "a new Worker pod")
        try:
            alert = wait_for_alert(release, "DDPTrainerRestarting", timeout=600)
        except AssertionError as err:  # what Prometheus scraped of the ranks' counts
            seen = query(f"max_over_time(trainer_restarts_total{{{selector}}}[1h])")
            raise AssertionError(f"{err}; restarts scraped: {seen}; Master: "
                                 f"{restarts(release, release.pod('master'))}") from None
        print(f"DDPTrainerRestarting firing {time.monotonic() - deleted:.0f} s after the "
              "Worker pod's deletion")
        assert float(alert["value"]) == 1.0, alert
        assert restarts(release, release.pod("master"))[0] == 1
    finally:
        cluster.kubectl("delete", "namespace", release.namespace, "--wait=false")
