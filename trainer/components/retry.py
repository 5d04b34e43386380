"""Uploads to object storage retried with a bounded exponential backoff.

A store that is slow or unreachable for a while (a gateway restarting, a network blip) must not
cost a checkpoint: each upload is tried again after 1, 2, 4, ... s (at most
:data:`MAX_PAUSE` s between tries), at most `retries` more times and never past `deadline`
seconds after the first try began. Only :class:`trainer.errors.StorageError` is retried: what
the store answered or could not answer; any other error is a bug or a local problem and is
raised at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from trainer.errors import StorageError

log = logging.getLogger(__name__)

T = TypeVar("T")

FIRST_PAUSE = 1.0
MAX_PAUSE = 30.0


@dataclass(frozen=True)
class Backoff:
    retries: int = 5
    """Tries after the first one."""
    deadline: float = 60.0
    """Seconds after the first try began past which no try starts (a try under way ends at
    the store's own timeouts: connect 5 s, read 30 s)."""


DEFAULT = Backoff()


def pauses(backoff: Backoff) -> list[float]:
    """The pause before each retry: 1, 2, 4, ... s, each at most :data:`MAX_PAUSE`."""
    return [min(MAX_PAUSE, FIRST_PAUSE * 2 ** i) for i in range(backoff.retries)]


def pause(seconds: float) -> None:
    """The wait between tries (a test replaces it to act on the store between them)."""
    time.sleep(seconds)


def retried(call: Callable[[], T], backoff: Backoff, what: str,
            clock: Callable[[], float] = time.monotonic) -> T:
    """`call()`, tried again on StorageError as `backoff` allows; the last error is raised
    with the number of tries in its line."""
    start = clock()
    for tries, planned in enumerate([*pauses(backoff), None], start=1):
        try:
            return call()
        except StorageError as exc:
            left = backoff.deadline - (clock() - start)
            if planned is None or left <= 0:
                raise StorageError(f"{exc.problem}; gave up after {tries} "
                                   f"{'try' if tries == 1 else 'tries'} in "
                                   f"{clock() - start:.1f} s", exc.fix) from None
            wait = min(planned, left)
            log.info("%s: try %d failed, again in %.0f s: %s", what, tries, wait, exc.problem)
            pause(wait)
    raise AssertionError("unreachable")  # the loop returns or raises
