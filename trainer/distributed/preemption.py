"""Preemption: SIGTERM asks every rank to stop at the same step boundary.

Kubernetes sends SIGTERM to each pod at slightly different moments, so a rank cannot just stop
where it is: the others would wait for it in the next all-reduce until the timeout. Each rank
only raises a local flag here; :class:`trainer.distributed.agreement.Agreement` reduces the
flags at the loop's check points, so all ranks see the request at the same step.
"""

from __future__ import annotations

import logging
import signal
import threading
import types
from collections.abc import Callable

log = logging.getLogger(__name__)


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


def linger(seconds: float, port: int) -> None:
    """Keep serving the metrics endpoint on `port` for `seconds` (so a scraper sees the final
    values), or less if SIGTERM (or Ctrl-C) comes; nothing when `port` is 0 (not serving).

    Only from the main thread: it installs its own SIGTERM handler for the wait.
    """
    if seconds <= 0 or not port:
        return
    log.info("serving the final metrics on :%d for %g s (metrics.linger_seconds; SIGTERM or "
             "Ctrl-C ends it)", port, seconds)
    done = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: done.set())
    try:
        done.wait(seconds)
    finally:
        signal.signal(signal.SIGTERM, previous)
