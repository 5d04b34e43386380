"""`status --prometheus`: per-rank metrics and the slowest rank, from a real Prometheus that
scrapes a real prometheus_client endpoint shaped like the trainer's (after PodMonitor
relabelling: every series carries pytorchjob and namespace)."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from tests.support.prometheus import PrometheusServer, free_port

# rank -> (train loss, train accuracy, val loss, val accuracy, samples per second)
RANKS = {"0": (0.52, 0.84, 0.61, 0.80, 1000.0),
         "1": (0.55, 0.83, 0.60, 0.81, 400.0),
         "2": (0.50, 0.86, 0.62, 0.79, 1000.0)}
TRAINJOB_RANKS = {"0": (0.31, 0.90, 0.35, 0.88, 500.0),
                  "5": (0.33, 0.89, 0.34, 0.87, 250.0)}


@dataclass
class Exporter:
    address: str
    stop: threading.Event


@pytest.fixture(scope="module")
def exporter() -> Iterator[Exporter]:
    registry = CollectorRegistry()
    # job_kind "" is a series scraped by a PodMonitor from before job_kind (a PyTorchJob's).
    labels = ["rank", "split", "pytorchjob", "namespace", "job_kind"]
    loss = Gauge("trainer_loss", "loss", labels, registry=registry)
    accuracy = Gauge("trainer_accuracy_ratio", "accuracy", labels, registry=registry)
    samples = Counter("trainer_samples", "samples",
                      ["rank", "pytorchjob", "namespace", "job_kind"], registry=registry)
    for rank, (tl, ta, vl, va, _) in RANKS.items():
        loss.labels(rank, "train", "mnist", "training", "").set(tl)
        accuracy.labels(rank, "train", "mnist", "training", "").set(ta)
        loss.labels(rank, "val", "mnist", "training", "").set(vl)
        accuracy.labels(rank, "val", "mnist", "training", "").set(va)
    # Same names, another job, namespace or kind: must not leak into mnist's table.
    loss.labels("0", "train", "other", "training", "").set(9.0)
    loss.labels("5", "train", "mnist", "elsewhere", "").set(9.0)
    loss.labels("3", "train", "mnist", "training", "TrainJob").set(9.0)
    # The TrainJob "llm" (4 ranks per node in cluster_v2: ranks 0-7), and a PyTorchJob "llm".
    for rank, (tl, ta, vl, va, _) in TRAINJOB_RANKS.items():
        loss.labels(rank, "train", "llm", "training", "TrainJob").set(tl)
        accuracy.labels(rank, "train", "llm", "training", "TrainJob").set(ta)
        loss.labels(rank, "val", "llm", "training", "TrainJob").set(vl)
        accuracy.labels(rank, "val", "llm", "training", "TrainJob").set(va)
    loss.labels("0", "train", "llm", "training", "PyTorchJob").set(9.0)
    # The task's named metrics (an lm's), per rank, as the exporter publishes them.
    named = Gauge("trainer_metric", "named", ["rank", "split", "name", "pytorchjob",
                                              "namespace", "job_kind"], registry=registry)
    for rank, perplexity in (("0", 11.25), ("5", 12.5)):
        named.labels(rank, "val", "perplexity", "llm", "training", "TrainJob").set(perplexity)
        named.labels(rank, "val", "token_accuracy", "llm", "training", "TrainJob").set(0.125)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    stop = threading.Event()

    def train() -> None:  # counters grow at each rank's throughput
        while not stop.wait(0.05):
            for rank, values in RANKS.items():
                samples.labels(rank, "mnist", "training", "").inc(values[4] * 0.05)
            for rank, values in TRAINJOB_RANKS.items():
                samples.labels(rank, "llm", "training", "TrainJob").inc(values[4] * 0.05)
            samples.labels("0", "other", "training", "").inc(1.0)

    worker = threading.Thread(target=train, daemon=True)
    worker.start()
    yield Exporter(f"127.0.0.1:{port}", stop)
    stop.set()
    worker.join(5)
    server.shutdown()
    thread.join(5)


@pytest.fixture(scope="module")
def prometheus(exporter: Exporter) -> Iterator[PrometheusServer]:
    with PrometheusServer([exporter.address], scrape_interval="1s") as prom:
        # rate() over 5s is steady once the window holds 5 scrapes of every rank's counter
        # (with fewer, Prometheus' extrapolation underestimates a series that just began).
        deadline = time.monotonic() + 60
        ready = 'count_over_time(trainer_samples_total{pytorchjob="mnist"}[5s]) >= 5'
        while len(prom.query(ready)) < 3:
            assert time.monotonic() < deadline, prom.log_tail()
            time.sleep(0.5)
        yield prom


def test_status_shows_each_ranks_latest_metrics_and_the_slowest_rank(
        ddp, prometheus: PrometheusServer) -> None:
    result = ddp("status", "mnist", "--prometheus", prometheus.url, "--rate-window", "5s")
    assert result.code == 0, result.err
    section = result.out.split(f"Metrics (Prometheus {prometheus.url}):")[1]
    rows = {line.split()[0]: line.split() for line in section.splitlines()[2:5]}
    assert set(rows) == {"0", "1", "2"}  # not rank 5 of the other namespace
    for rank, (tl, ta, vl, va, rate) in RANKS.items():
        _, train_loss, train_acc, val_loss, val_acc, samples = rows[rank]
        assert float(train_loss) == pytest.approx(tl)
        assert train_acc == f"{ta:.1%}"
        assert float(val_loss) == pytest.approx(vl)
        assert val_acc == f"{va:.1%}"
        assert float(samples) == pytest.approx(rate, rel=0.3)
    slowest = re.search(r"Slowest rank: (\d+) \(([\d.]+) samples/s, (\d+)% below", section)
    assert slowest is not None, section
    assert slowest.group(1) == "1"
    assert int(slowest.group(3)) == pytest.approx(60, abs=15)
    assert "9.0000" not in section  # the other job's loss


def test_status_of_a_job_without_series_says_why_there_are_none(
        ddp, prometheus: PrometheusServer) -> None:
    result = ddp("status", "done", "--prometheus", prometheus.url)
    assert result.code == 0, result.err
    assert 'no trainer_* series with pytorchjob="done",namespace="training"' in result.out


def test_status_with_an_unreachable_prometheus_prints_the_job_then_one_error(
        ddp, closed_port_url: str) -> None:
    result = ddp("status", "mnist", "--prometheus", closed_port_url)
    assert result.code == 2
    assert "State:       Running" in result.out  # the Kubernetes part is still shown
    lines = result.err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"error: cannot query Prometheus at {closed_port_url}")
    assert "port-forward" in lines[0]


def test_status_of_a_trainjob_shows_its_ranks_only(
        ddp2, prometheus: PrometheusServer) -> None:
    result = ddp2("status", "llm", "--prometheus", prometheus.url, "--rate-window", "5s")
    assert result.code == 0, result.err
    assert "Progress:    42%" in result.out  # the Kubernetes part, trainerStatus included
    section = result.out.split(f"Metrics (Prometheus {prometheus.url}):")[1]
    rows = {line.split()[0]: line.split() for line in section.splitlines()[2:4]}
    assert set(rows) == {"0", "5"}
    assert float(rows["0"][1]) == pytest.approx(0.31)
    assert float(rows["5"][5]) == pytest.approx(250.0, rel=0.3)
    assert "9.0000" not in section  # the PyTorchJob of the same name
    assert "Slowest rank: 5" in section
    named = section.split("Validation metrics (this rank's shard):")[1].splitlines()
    assert named[1].split() == ["RANK", "PERPLEXITY", "TOKEN_ACCURACY"]
    assert named[2].split() == ["0", "11.2500", "0.1250"]
    assert named[3].split() == ["5", "12.5000", "0.1250"]


def test_status_of_a_classification_job_adds_no_metrics_table(
        ddp, prometheus: PrometheusServer) -> None:
    result = ddp("status", "mnist", "--prometheus", prometheus.url, "--rate-window", "5s")
    assert result.code == 0, result.err
    assert "Validation metrics" not in result.out
