"""The hang watchdog: a thread per rank that notices when no rank has made progress for its
deadline, names the culprit, and ends the rank so that the job restarts from its checkpoint.

Every beat (a tenth of ``dist.hang_seconds``, 0.5-5 s) it publishes this rank's heartbeat
(:mod:`trainer.distributed.heartbeat`) and reads every rank's. A rank makes progress when its
phase changes (:class:`trainer.distributed.phases.Beacon`); one whose heartbeat stops is
frozen, stopped or cut off. When no rank has moved for the largest deadline any rank publishes,
it prints every thread's stack (and has the DataLoader workers print theirs), leaves the
verdict (:func:`trainer.distributed.verdict.diagnose`) as the termination message, and exits
:data:`HUNG_EXIT`; the first rank to call it writes the verdict into the store, and every other
rank adopts it at its next beat, so all report the same line.

It is a Python thread: it runs while the main thread is stuck in Python code or in C code that
releases the GIL (a sleep, a blocking read, a collective's wait, a CUDA sync). C code that holds
the GIL for ever stops it too; faulthandler's C watchdog (re-armed at every beat) then prints
the stacks and ends the process after the deadline and twice the collective timeout, with
faulthandler's exit status 1.

A deadline is the larger of ``dist.hang_seconds`` and :data:`STEP_MULTIPLE` times the median
step; a long phase gets three times its expected length (a validation, a checkpoint save, from
their last run); until the process's first step (compile, DataLoader workers' start, resume)
the collective timeout is the deadline: it stays the hard limit.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

from trainer import stacks, termination
from trainer.config import DistConfig
from trainer.data.loaders import worker_pids
from trainer.distributed import hang_event
from trainer.distributed.heartbeat import (
    STORE_TIMEOUT_SECONDS,
    Board,
    Heartbeat,
    LocalBoard,
    identity,
    store_board,
)
from trainer.distributed.phases import CHECKPOINT, Beacon
from trainer.distributed.verdict import Verdict, diagnose
from trainer.errors import HUNG_AGAIN_EXIT, HUNG_EXIT, RankLost, first_line
from trainer.placement import DistContext

log = logging.getLogger(__name__)

HISTORY = ".hangs-rank-{rank}.jsonl"
"""Each rank's record of the hangs it fired on, beside the checkpoints (they outlive a
restart: the same hang again exits 6)."""
HISTORY_GLOB = HISTORY.format(rank="*")

STEP_MULTIPLE = 20.0
"""A step this many times slower than the median is no longer a slow step."""
EXPECTED_MULTIPLE = 3.0
"""A long phase may take this many times its last run."""
AGAIN = "error: hang again at the same place (not restarted: it would hang again): "
LINGER_CAP_SECONDS = 30.0
"""At most this long serving ``trainer_hung`` before exiting (``metrics.linger_seconds``)."""


class Metrics(Protocol):
    def log(self, metrics: Mapping[str, Any], step: int) -> None: ...


def beat_seconds(hang_seconds: float) -> float:
    return min(5.0, max(0.5, hang_seconds / 10.0))


class Watchdog:
    """Started after the rank joined its group; stopped when training returns."""

    def __init__(self, beacon: Beacon, board: Board, rank: int, world_size: int, *,
                 hang_seconds: float, timeout_seconds: float, metrics: Metrics,
                 history: Path | None = None, hosts_store: bool = False,
                 linger_seconds: float = 0.0, print_line: bool = True,
                 post_event: Callable[[str], object] = hang_event.post) -> None:
        self.beacon, self.board, self.rank, self.world = beacon, board, rank, world_size
        self.hang_seconds, self.timeout_seconds = hang_seconds, timeout_seconds
        self.metrics, self.history, self.hosts_store = metrics, history, hosts_store
        self.linger_seconds, self.print_line = linger_seconds, print_line
        self.post_event = post_event
        self.beat = beat_seconds(hang_seconds)
        self.silence = max(3.0 * self.beat, 5.0)
        """Seconds without a rank's heartbeat after which it counts as silent (beats come
        every `beat`; a store read takes milliseconds)."""
        self.pod, self.node = identity()
        self.fired = threading.Event()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._main = threading.main_thread().ident or 0
        self._beats = 0
        self._checks = 0  # checks done by the thread (settle waits for the next)
        start = time.monotonic()
        self._seq: dict[int, int] = {}
        self._moved = dict.fromkeys(range(world_size), start)
        self._heard = dict.fromkeys(range(world_size), start)
        self._last: dict[int, Heartbeat] = {}
        self._thread = threading.Thread(target=self._run, name="hang-watchdog", daemon=True)

    # -- the main thread's side -----------------------------------------------------------
    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=self.beat + 15.0)
        with contextlib.suppress(RuntimeError):
            faulthandler.cancel_dump_traceback_later()

    def settle(self) -> None:
        """A peer vanished: let a hang verdict (this rank's, or a peer's in the store) end the
        process rather than a "lost peer" line. One check, at once: a peer that left on a hang
        declared it in the store first. Waiting for a verdict to come (two beats, 46 s at the
        default) delayed every lost peer's exit 4 by that much: a two-node partition test
        failed its 75 s bound."""
        if self._thread.is_alive() and not self._stop.is_set():
            done = self._checks
            self._wake.set()
            deadline = time.monotonic() + STORE_TIMEOUT_SECONDS + 2.0  # a store read's bound
            while (not self.fired.is_set() and self._checks <= done
                   and time.monotonic() < deadline):
                self.fired.wait(0.05)
            if self.fired.is_set():
                threading.Event().wait()  # the watchdog exits the process

    # -- the thread ---------------------------------------------------------------------
    def budget(self) -> float:
        """Seconds of no progress after which this rank calls the job hung."""
        floor = max(self.hang_seconds, STEP_MULTIPLE * self.beacon.median_step())
        if not self.beacon.step_times:
            return max(floor, self.timeout_seconds)
        if self.beacon.expected > 0:
            return max(floor, EXPECTED_MULTIPLE * self.beacon.expected)
        return floor

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.check(time.monotonic())
            except Exception:  # noqa: BLE001 - the watchdog must never end the rank itself
                log.exception("hang watchdog: a check failed; watching goes on")
            self._checks += 1
            self._wake.wait(self.beat)
            self._wake.clear()

    def _heartbeat(self, now: float) -> Heartbeat:
        seq, phase, step, since = self.beacon.state
        in_phase = now - since
        where = ""
        if in_phase > self.beat:
            if phase is CHECKPOINT and (writer := stacks.thread_named("ckpt-writer")):
                where = stacks.where(writer, fallback=True)
            elif phase.user_code or not phase.collective:
                where = stacks.where(self._main)
        self._beats += 1
        return Heartbeat(self.rank, self.pod, self.node, os.getpid(), phase.name, step, seq,
                         self._beats, in_phase, self.budget(), where)

    def check(self, now: float) -> None:
        """One beat: publish, read, and fire when no rank has moved for the deadline."""
        own = self._heartbeat(now)
        budget = own.budget
        self._rearm(budget)
        self.metrics.log({"watch/phase": own.phase, "watch/phase_seconds": own.in_phase,
                          "watch/budget_seconds": budget}, own.step)
        try:
            self.board.publish(own)
            beats = self.board.read(self.world)
            declared = self.board.declared(self.world)
        except Exception as err:  # noqa: BLE001 - a store that does not answer is a finding
            log.debug("hang watchdog: the store did not answer: %s", err)
            beats, declared = {own.rank: own}, {}
        for rank, beat in beats.items():
            if self._seq.get(rank) != beat.seq:
                self._seq[rank], self._moved[rank] = beat.seq, now
            if rank not in self._last or self._last[rank].beat != beat.beat:
                self._heard[rank] = now
            self._last[rank] = beat
        if declared and not self.fired.is_set():
            first = declared[min(declared)]
            self.fire(Verdict(first.removeprefix("error: "), "", "adopted"), adopted=first)
            return
        stalled = now - max(self._moved.values())
        silent = {r: now - t for r, t in self._heard.items() if now - t > self.silence}
        limit = max([b.budget for r, b in self._last.items() if r not in silent] or [budget])
        if stalled > limit:
            self.fire(diagnose(self._last, silent, self.world, stalled))

    def _rearm(self, budget: float) -> None:
        """faulthandler's C thread ends the process if this thread stops beating (see the
        module's docstring)."""
        with contextlib.suppress(RuntimeError, ValueError):
            faulthandler.dump_traceback_later(budget + 2 * self.timeout_seconds, exit=True)

    # -- the verdict ----------------------------------------------------------------------
    def fire(self, verdict: Verdict, adopted: str | None = None) -> None:
        self.fired.set()
        seq, phase, step, since = self.beacon.state
        stacks.dump(f"--- hang watchdog, rank {self.rank}: {phase.text} of step {step} for "
                    f"{time.monotonic() - since:.0f} s; every thread's stack ---")
        workers = stacks.signal_workers(worker_pids())
        if workers:
            log.error("hang watchdog: DataLoader workers %s print their stacks below",
                      ", ".join(map(str, workers)))
        code = HUNG_EXIT
        line = adopted if adopted is not None else verdict.line()
        if adopted is not None and adopted.startswith(AGAIN):
            code = HUNG_AGAIN_EXIT
        elif adopted is None and self._seen_before(verdict.place):
            code = HUNG_AGAIN_EXIT
            line = line.replace("error: hang: ", AGAIN, 1)
        self._record(verdict.place)
        if self.print_line:
            sys.stderr.write(line + "\n")
        termination.write(line)
        termination.record(line)
        if self.first_to_post():
            self.post_event(line)
        with contextlib.suppress(Exception):
            self.board.declare(self.rank, line)
        self.metrics.log({"watch/hung": 1.0}, step)
        if self.hosts_store:
            self._await_peers()
        threading.Event().wait(min(self.linger_seconds, LINGER_CAP_SECONDS))
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)

    def first_to_post(self) -> bool:
        """One Event per hang: the first rank to claim it in the shared store posts it (the
        rank that built the verdict claims it before declaring it; one adopting it claims
        after). Deciding by the lowest rank posted none on the cluster when rank 1 built the
        verdict and rank 0 adopted it. Without the store: the lowest rank still beating."""
        try:
            return self.board.claim("event")
        except Exception:  # the store's host is gone: decide locally, maybe twice
            now = time.monotonic()
            alive = [r for r in self._last if now - self._heard[r] <= self.silence]
            return self.rank == min(alive, default=self.rank)

    def _await_peers(self) -> None:
        """The store lives in this process (rank 0 of a PyTorchJob): the others read the
        verdict from it, so it stays until they have (or two beats and a store timeout)."""
        deadline = time.monotonic() + 2 * self.beat + 10.0
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                alive = {r for r, t in self._heard.items() if time.monotonic() - t <= self.silence}
                if alive <= set(self.board.declared(self.world)):
                    return
            threading.Event().wait(0.2)

    def _seen_before(self, place: str) -> bool:
        """Whether any rank recorded this hang before: every rank's history, since the rank
        that builds the verdict (the others adopt it) varies from one attempt to the next."""
        if self.history is None:
            return False
        for history in self.history.parent.glob(HISTORY_GLOB):
            with contextlib.suppress(OSError, ValueError):
                lines = history.read_text(encoding="utf-8").splitlines()
                if any(json.loads(line).get("place") == place for line in lines if line):
                    return True
        return False

    def _record(self, place: str) -> None:
        if self.history is None or place == "adopted":
            return
        with contextlib.suppress(OSError), self.history.open("a", encoding="utf-8") as f:
            f.write(json.dumps({"place": place, "time": time.time()}) + "\n")



@contextlib.contextmanager
def watching(cfg: DistConfig, ctx: DistContext, beacon: Beacon, metrics: Metrics,
             checkpoint_dir: Path | None, linger_seconds: float) -> Iterator[Watchdog | None]:
    """This rank's watchdog while the block trains (None with ``dist.hang_seconds`` 0). A
    peer vanishing inside the block (:class:`RankLost`) first lets a hang verdict end the
    process (:meth:`Watchdog.settle`): the peer may have left because the job hung."""
    dog = watch(cfg, ctx, beacon, metrics, checkpoint_dir, linger_seconds)
    try:
        yield dog
    except RankLost:
        if dog is not None:
            dog.settle()
        raise
    finally:
        if dog is not None:
            dog.stop()


def watch(cfg: DistConfig, ctx: DistContext, beacon: Beacon, metrics: Metrics,
          checkpoint_dir: Path | None, linger_seconds: float) -> Watchdog | None:
    """Start this rank's watchdog (None with ``dist.hang_seconds`` 0)."""
    if cfg.hang_seconds <= 0:
        return None
    board: Board = LocalBoard()
    if ctx.initialized and "MASTER_ADDR" in os.environ:
        try:
            board = store_board()
        except Exception as err:  # noqa: BLE001 - a watchdog of its own rank only, then
            log.warning("hang watchdog: cannot reach the rendezvous store (%s); it watches this "
                        "rank alone", first_line(err, 200))
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    return Watchdog(
        beacon, board, ctx.rank, ctx.world_size, hang_seconds=cfg.hang_seconds,
        timeout_seconds=cfg.timeout_seconds, metrics=metrics,
        history=checkpoint_dir / HISTORY.format(rank=ctx.rank) if checkpoint_dir else None,
        hosts_store=ctx.initialized and ctx.rank == 0 and not agent,
        linger_seconds=linger_seconds,
        # under `ddp-trainer run` the launcher prints the verdict once, as its cause line
        print_line=not os.environ.get("TORCHELASTIC_ERROR_FILE")).start()
