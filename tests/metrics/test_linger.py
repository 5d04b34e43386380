"""A completed rank serves its final values until a scrape has read them, with
``metrics.linger_seconds`` as the bound for when nobody scrapes: a job does not hold its pods
(and GPUs) a whole linger after its last step."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge

from tests.metrics.helpers import REPO, rank_env, scrape, value, wait_for_line
from tests.support.prometheus import free_port
from trainer.config import MetricsConfig
from trainer.metrics.serve import serve

LINGERING = Path(__file__).with_name("lingering_endpoint.py")
LINGERS = "serving the final metrics on"


def start(port: int, seconds: float) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(LINGERING), str(port), str(seconds)], cwd=REPO,
                            env=rank_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)


def test_a_scrape_after_the_final_values_ends_the_linger_long_before_its_bound() -> None:
    port = free_port()
    proc = start(port, 60)
    try:
        line, _ = wait_for_line(proc, LINGERS)
        assert "until a scrape has read them, at most 60 s" in line, line
        assert value(scrape(port), "linger_test_value") == 42.0  # the final value, once
        proc.wait(timeout=15)  # the bound is 60 s: the scrape ended it
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_without_a_scrape_the_linger_lasts_its_bound() -> None:
    bound = 2.0
    t0 = time.monotonic()
    proc = start(free_port(), bound)
    try:
        wait_for_line(proc, LINGERS)
        proc.wait(timeout=60)
        assert proc.returncode == 0
        assert time.monotonic() - t0 >= bound  # nothing but the bound ended it
    finally:
        if proc.poll() is None:
            proc.kill()


def test_sigterm_ends_a_linger_nobody_scrapes() -> None:
    proc = start(free_port(), 120)
    try:
        wait_for_line(proc, LINGERS)
        proc.send_signal(signal.SIGTERM)  # the pod goes away: stop lingering at once
        proc.wait(timeout=20)
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_only_a_scrape_begun_after_the_request_is_noted_and_keeps_its_content_length() -> None:
    registry = CollectorRegistry()
    Gauge("linger_test_value", "A value", registry=registry).set(1)
    endpoint = serve(registry, MetricsConfig(port=free_port(), bind_address="127.0.0.1"))
    try:
        scrape(endpoint.port)  # before the request: it carried no final value
        scraped = threading.Event()
        assert endpoint.notify_after_scrapes(scraped)
        assert not scraped.is_set()
        url = f"http://127.0.0.1:{endpoint.port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = resp.read()
            assert resp.headers["Content-Length"] == str(len(body))
        assert scraped.wait(10)
    finally:
        endpoint.close()


def test_as_many_scrapes_as_asked_for_end_the_wait_and_zero_asks_for_none() -> None:
    registry = CollectorRegistry()
    Gauge("linger_test_value", "A value", registry=registry).set(1)
    endpoint = serve(registry, MetricsConfig(port=free_port(), bind_address="127.0.0.1"))
    try:
        assert not endpoint.notify_after_scrapes(threading.Event(), 0)
        scraped = threading.Event()
        assert endpoint.notify_after_scrapes(scraped, 2)
        scrape(endpoint.port)
        assert not scraped.is_set()  # one of two, whenever the server counts it
        scrape(endpoint.port)
        assert scraped.wait(10)
    finally:
        endpoint.close()

