"""A process that serves a fresh registry, sets its final value and lingers, as a completed rank
does: ``python lingering_endpoint.py PORT LINGER_SECONDS``. Logs like the CLI (stderr), so the
linger's "serving the final metrics" line tells that a scrape from then on carries the final
value; exits 0 when the linger ends."""

from __future__ import annotations

import logging
import sys

from prometheus_client import CollectorRegistry, Gauge

from trainer.config import MetricsConfig
from trainer.distributed.preemption import linger
from trainer.metrics.serve import serve

FINAL = 42.0


def main() -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    port, seconds = int(sys.argv[1]), float(sys.argv[2])
    registry = CollectorRegistry()
    gauge = Gauge("linger_test_value", "The value this process ends with", registry=registry)
    endpoint = serve(registry, MetricsConfig(port=port, bind_address="127.0.0.1"))
    gauge.set(FINAL)
    linger(seconds, endpoint.port, endpoint.notify_after_scrapes)
    endpoint.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
