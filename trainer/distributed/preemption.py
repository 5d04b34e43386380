"""Preemption: SIGTERM asks every rank to stop at the same step boundary.

Kubernetes sends SIGTERM to each pod at slightly different moments, so a rank cannot just stop
where it is: the others would wait for it in the next all-reduce until the timeout. Each rank
only raises a local flag here; :class:`trainer.distributed.agreement.Agreement` reduces the
flags at the loop's check points, so all ranks see the request at the same step.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import types
from collections.abc import Callable, Iterator
from typing import NoReturn

from trainer.errors import Preempted

log = logging.getLogger(__name__)


@contextlib.contextmanager
def stopped_while_starting() -> Iterator[None]:
    """Until a handler of its own replaces this one (StopFlag in training, torch elastic's agent
    in `run`), SIGTERM ends the process with 143, as preempted; the previous handler is back
    afterwards. Only in the main thread (elsewhere it does nothing).

    The trainer is PID 1 of its container, and PID 1 ignores a signal it has no handler for: a
    pod stopped while torch still imported (a suspend, an eviction or a preemption in its first
    seconds) waited out its whole grace period, the chart's 120 s, holding its GPUs (seen on
    the test cluster).

    The handler ends the process itself instead of raising: an exception raised while Python
    runs a callback (a weakref finalizer during an import) is printed as "Exception ignored"
    and dropped, and such a lost SIGTERM let a run train 6 more minutes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: types.FrameType | None) -> NoReturn:
        # nothing is written yet that a finalizer would have to close: end here, at once
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(Preempted.exit_code)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class StopFlag:
    """Set by SIGTERM; agreed across ranks by :class:`trainer.distributed.agreement.Agreement`."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: Callable[[int, types.FrameType | None], object] | int | None = None

    def install(self) -> None:
        self._previous = signal.signal(signal.SIGTERM, self._handle)

    def uninstall(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    def _handle(self, signum: int, frame: types.FrameType | None) -> None:
        self.requested = True


def linger(seconds: float, port: int,
           notify_after_scrapes: Callable[[threading.Event, int], bool] | None = None,
           scrapes: int = 1) -> None:
    """Keep serving the metrics endpoint on `port` so that a scraper sees the final values:
    until `scrapes` scrapes have carried them (`notify_after_scrapes`, the endpoint's: it sets
    the event it is given once that many scrapes begun after the call have been sent, and says
    whether it will), SIGTERM (or Ctrl-C) comes, or at most `seconds`; nothing when `port` is
    0. `scrapes` 0, or no `notify_after_scrapes`: the whole `seconds`.

    A job's pods, and their GPUs, are held while it lingers: after a completed run one scrape
    is enough, the bound is for when nobody scrapes (monitoring off, a local run). A failed
    run's callers pass no `notify_after_scrapes`: its values feed alerts, which Prometheus
    evaluates on its own schedule while they are served.
    Only from the main thread: it installs its own SIGTERM handler for the wait.
    """
    if seconds <= 0 or not port:
        return
    done = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: done.set())
    try:
        # before the line below, so that a scrape made once it is printed counts
        if notify_after_scrapes is not None and notify_after_scrapes(done, scrapes):
            log.info("serving the final metrics on :%d until %s read them, at most %g s "
                     "(metrics.linger_seconds; SIGTERM or Ctrl-C ends it)", port,
                     "a scrape has" if scrapes == 1 else f"{scrapes} scrapes have", seconds)
        else:
            log.info("serving the final metrics on :%d for %g s (metrics.linger_seconds; "
                     "SIGTERM or Ctrl-C ends it)", port, seconds)
        done.wait(seconds)
    finally:
        signal.signal(signal.SIGTERM, previous)
