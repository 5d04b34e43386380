"""The PrometheusServer test helper drives a real prometheus binary."""

from __future__ import annotations

import pytest

from tests.support.prometheus import PrometheusError, PrometheusServer

pytestmark = pytest.mark.slow


def test_server_scrapes_static_target_with_extra_labels_and_stops_on_exit() -> None:
    with PrometheusServer([]) as scraped:
        target = scraped.url.removeprefix("http://")
        with PrometheusServer([target], labels={"namespace": "ns1", "pytorchjob": "j"}) as prom:
            rows = prom.wait_for('up{namespace="ns1", pytorchjob="j"} == 1', timeout=20)
            assert rows[0]["metric"]["instance"] == target
            assert prom.query("vector(2)")[0]["value"][1] == "2"
            proc = prom._proc
        assert proc is not None and proc.poll() is not None  # stopped on exit


def test_query_error_raises_with_prometheus_message() -> None:
    with PrometheusServer([]) as prom, pytest.raises(PrometheusError, match="parse error"):
        prom.query("sum(")


def test_wait_for_times_out_naming_the_expression() -> None:
    with PrometheusServer([]) as prom, pytest.raises(TimeoutError, match="does_not_exist"):
        prom.wait_for("does_not_exist", timeout=1)
