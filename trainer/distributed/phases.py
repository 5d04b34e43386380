"""Where this rank is: its phase of the loop and its step, for the hang watchdog
(:mod:`trainer.distributed.watchdog`).

The loop calls :meth:`Beacon.enter` at each phase change, a few times a step. It only assigns a
tuple (one attribute, so the watchdog thread never reads a torn record) and reads the monotonic
clock: no lock, no device sync; ~0.3 us a call here against a 2.9 ms step of the default model
on 2 CPU ranks (benchmarks/bench_watchdog.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Phase:
    name: str
    """The metric's label and the heartbeat's field."""
    text: str
    """How the verdict says it: "rank 1 has been <text> for 312 s"."""
    collective: bool
    """Waiting here means waiting for the other ranks (a collective, or the store)."""
    user_code: bool = False
    """The user's step (forward and loss) or dataset runs here: the verdict names its line."""


STARTING = Phase("starting", "starting (resume, first batch, first step)", True)
DATA = Phase("data", "waiting for its next batch", False, user_code=True)
STEP = Phase("step", "in user code (the step: forward and loss)", False, user_code=True)
BACKWARD = Phase("backward", "in the backward pass and its gradient all-reduce", True)
OPTIMIZER = Phase("optimizer", "in the optimizer step", False)
AGREEMENT = Phase("agreement", "in the stop/divergence agreement", True)
VALIDATION = Phase("validation", "validating", False, user_code=True)
REDUCTION = Phase("reduction", "in a reduction of the other ranks' sums", True)
CHECKPOINT = Phase("checkpoint", "saving a checkpoint", False)
DONE = Phase("done", "finished, waiting for the other ranks", True)

PHASES: tuple[Phase, ...] = (STARTING, DATA, STEP, BACKWARD, OPTIMIZER, AGREEMENT, VALIDATION,
                             REDUCTION, CHECKPOINT, DONE)
BY_NAME = {p.name: p for p in PHASES}


class Beacon:
    """This rank's phase record, written by the loop and read by the watchdog thread."""

    __slots__ = ("state", "expected", "step_times", "_next", "started")

    RING = 64
    """Step times kept for the median (the watchdog's deadline scales with it)."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.state: tuple[int, Phase, int, float] = (0, STARTING, 0, self.started)
        """(sequence number, phase, step, monotonic time it was entered)."""
        self.expected = 0.0
        """Seconds the current phase is expected to take when it is a long one (a validation,
        a save), measured from its last run; 0: an ordinary phase."""
        self.step_times: list[float] = []
        self._next = 0

    def enter(self, phase: Phase, step: int, expected: float = 0.0) -> None:
        self.expected = expected
        self.state = (self.state[0] + 1, phase, step, time.monotonic())

    def stepped(self, seconds: float) -> None:
        """One optimizer step took `seconds` (kept in a ring of the last :attr:`RING`)."""
        if len(self.step_times) < self.RING:
            self.step_times.append(seconds)
        else:
            self.step_times[self._next] = seconds
            self._next = (self._next + 1) % self.RING

    def median_step(self) -> float:
        """The median of the recent step times (0 before the first step)."""
        times = sorted(self.step_times[:])
        return times[len(times) // 2] if times else 0.0

    def in_phase(self, now: float | None = None) -> float:
        return (time.monotonic() if now is None else now) - self.state[3]
