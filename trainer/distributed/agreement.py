"""What the ranks must agree on, decided in one place.

* **Where to resume from** (:func:`agree_resume`): rank 0 chooses the newest valid checkpoint;
  every rank resumes from exactly that state. A rank that has the same file (shared storage)
  reads it; if any rank lacks it (the chart's default: one emptyDir per pod, where only rank 0
  writes), rank 0 sends the verified bytes to all.
* **When to stop, whether the loss diverged, when a timed checkpoint is due**
  (:class:`Agreement`): one reduction per check interval carries {SIGTERM seen, loss not
  finite, slowest step, rank 0's clock asks for a checkpoint}. It runs asynchronously and
  is read at the next check (so it never stalls a step), except at checkpoints (an epoch end
  that saves one included) and the last step, where it is awaited (so a diverged or preempted
  model is never saved as progress); there it also sums what a checkpoint inside an epoch
  records over ranks (the epoch's loss sums), so a save costs one barrier, not two. Check
  intervals are ``train.log_every`` steps, lengthened from the agreed slowest step to about
  ``train.log_seconds`` when steps are fast and shortened so that a request is seen within
  about ``train.stop_check_seconds`` when they are slow.
* **Which failures mean a peer is gone** (:func:`collective`): a failure inside a collective.
  NCCL, the store and the network raise typed ``torch.distributed.DistError``s; gloo reports a
  lost peer as a plain ``RuntimeError`` (torch 2.13: "Connection reset by peer" from gloo's
  pair.cc, or "Timed out waiting ... for recv"), so a RuntimeError is classified by where it
  was raised — inside a collective — never by its text.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import torch
import torch.distributed as dist

from trainer.components import checkpoint
from trainer.distributed.preemption import StopFlag
from trainer.errors import CheckpointError, RankLost, first_line
from trainer.placement import DistContext
from trainer.usercode import user_frame

log = logging.getLogger(__name__)

# Local failures that can surface inside a collective's call but are not a lost peer.
_LOCAL_FAILURES: tuple[type[BaseException], ...] = tuple(
    t for t in (getattr(torch, "OutOfMemoryError", None), getattr(torch, "AcceleratorError", None),
                NotImplementedError) if isinstance(t, type))


class Collective:
    """Turns a failure of the collective(s) inside its block into :class:`RankLost`. Reusable:
    the loop enters one instance every step (a generator-based context manager is built
    anew each time: ~1.5 us a step)."""

    __slots__ = ("what", "timeout_seconds")

    def __init__(self, what: str, timeout_seconds: float) -> None:
        self.what = what
        self.timeout_seconds = timeout_seconds

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None,
                 tb: TracebackType | None) -> Literal[False]:
        if err is None or isinstance(err, _LOCAL_FAILURES):
            return False
        if not isinstance(err, (dist.DistError, RuntimeError)):
            return False
        if not isinstance(err, dist.DistError) and user_frame(err) is not None:
            return False  # the user's model raised inside DDP's forward: not a lost peer
        raise RankLost(
            f"another rank stopped responding or died ({self.what} failed: "
            f"{first_line(err, 200)}); collectives time out after "
            f"dist.timeout_seconds={self.timeout_seconds:g}",
            "read the other ranks' logs for the first error; raise --timeout only if a step "
            "legitimately takes longer") from err


def collective(what: str, timeout_seconds: float) -> Collective:
    """``with collective("the gradient all-reduce", timeout):`` (see :class:`Collective`)."""
    return Collective(what, timeout_seconds)


# -- stop and divergence -------------------------------------------------------------------------

@dataclass(frozen=True)
class Verdict:
    """The agreed state at one check; identical on every rank."""

    stop: bool = False
    """Some rank received SIGTERM."""
    diverged_rank: int | None = None
    """The (highest) rank whose loss was not finite, or None."""
    slowest_step: float = 0.0
    """The slowest rank's mean step duration over the interval, in seconds."""
    save_due: bool = False
    """Rank 0's clock asked for a checkpoint (``checkpoint.every_seconds``)."""
    sums: tuple[float, ...] | None = None
    """The `sums` given to an awaited :meth:`Agreement.exchange`, summed over ranks."""

    def merge(self, other: Verdict) -> Verdict:
        ranks = [r for r in (self.diverged_rank, other.diverged_rank) if r is not None]
        return Verdict(self.stop or other.stop, max(ranks) if ranks else None,
                       max(self.slowest_step, other.slowest_step),
                       self.save_due or other.save_due,
                       other.sums if other.sums is not None else self.sums)


class Agreement:
    """The per-interval {stop, diverged, slowest step, save due} reduction and the check
    schedule.

    A collective when distributed: every rank calls :meth:`exchange` at the same steps, which
    :meth:`due` guarantees (its schedule depends only on agreed values).
    """

    def __init__(self, ctx: DistContext, stop: StopFlag, log_every: int,
                 check_seconds: float, timeout_seconds: float, min_seconds: float = 0.0) -> None:
        self.ctx = ctx
        self.stop = stop
        self.log_every = log_every
        self.min_seconds = min_seconds
        """Least time between checks (``train.log_seconds``), from the agreed step time."""
        self.check_seconds = check_seconds
        self.timeout_seconds = timeout_seconds
        self.every = log_every
        """Steps between checks (shortened when steps are slow)."""
        self._next = log_every
        self._inflight: tuple[torch.Tensor, Any, int] | None = None

    def due(self, step: int) -> bool:
        return step >= self._next

    def exchange(self, step: int, diverged: bool, slowest_step: float,
                 wait: bool, sums: Sequence[float] = (), save_due: bool = False) -> Verdict:
        """Share this rank's state; return the agreed verdict of the previous exchange, or
        (with `wait`) of this one too. `save_due`: rank 0's clock asks for a checkpoint (the
        other ranks give False; a MAX makes it everyone's). With `wait`, finite `sums` ride
        the same reduction and come back summed over ranks in ``Verdict.sums`` (what a
        checkpoint would otherwise reduce itself: one barrier less, ~1 ms on 2 CPU ranks)."""
        assert wait or not sums, "sums are only returned by an awaited exchange"
        local = Verdict(self.stop.requested, self.ctx.rank if diverged else None, slowest_step,
                        save_due, tuple(sums) if sums else None)
        if not self.ctx.initialized:
            verdict = local
        else:
            verdict = self._collect()
            # A MAX carries sums as per-rank slots (-inf elsewhere), added with fsum after.
            k, rank, world = len(sums), self.ctx.rank, self.ctx.world_size
            slots = [-math.inf] * (k * rank) + list(sums) + [-math.inf] * (k * (world - 1 - rank))
            flag = torch.tensor([float(local.stop), _encode(local.diverged_rank), slowest_step,
                                 float(save_due), *slots], dtype=torch.float64,
                                device=self.ctx.device)
            with collective("the stop/divergence agreement", self.timeout_seconds):
                work = dist.all_reduce(flag, op=dist.ReduceOp.MAX, async_op=True)
            self._inflight = (flag, work, k)
            if wait:
                verdict = verdict.merge(self._collect())
        self._schedule(step, verdict.slowest_step)
        return verdict

    def drain(self) -> None:
        """Complete the reduction in flight (before the process group goes away)."""
        self._collect()

    def rank0s(self, value: Any) -> Any:
        """Rank 0's `value` (picklable), on every rank: a collective when distributed."""
        if not self.ctx.initialized:
            return value
        sent = [value]
        with collective("rank 0's verdict on the last checkpoint", self.timeout_seconds):
            dist.broadcast_object_list(sent, src=0, device=_object_device(self.ctx))
        return sent[0]

    def _collect(self) -> Verdict:
        if self._inflight is None:
            return Verdict()
        flag, work, k = self._inflight
        self._inflight = None
        with collective("the stop/divergence agreement", self.timeout_seconds):
            work.wait()
        stop, code, slowest, save_due, *slots = flag.tolist()
        sums = tuple(math.fsum(slots[i::k]) for i in range(k)) if k else None
        return Verdict(bool(stop), int(code) - 1 if code > 0 else None, float(slowest),
                       bool(save_due), sums)

    def _schedule(self, step: int, slowest_step: float) -> None:
        # The reduction is read one check later, so a request waits at most two intervals.
        if slowest_step > 0 and math.isfinite(slowest_step):
            fits = int(self.check_seconds / (2.0 * slowest_step))
            least = math.ceil(self.min_seconds / slowest_step) if self.min_seconds > 0 else 0
            self.every = max(1, min(max(self.log_every, least), fits))
        self._next = step + self.every


def _encode(rank: int | None) -> float:
    return 0.0 if rank is None else float(rank + 1)


# -- resume -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Resumed:
    state: dict[str, Any]
    name: str
    """File name of the checkpoint rank 0 chose."""
    sent: bool
    """True when some rank had no copy and rank 0 sent the bytes to all."""


def agree_resume(directory: Path | None, ctx: DistContext,
                 timeout_seconds: float) -> Resumed | None:
    """The state every rank resumes from: rank 0's newest valid checkpoint, or None.

    A collective when distributed (every rank calls it once, before training).
    """
    if directory is None:
        return None
    if not ctx.initialized:
        loaded = checkpoint.load_latest(directory, set_aside=True)
        return None if loaded is None else Resumed(loaded[0], loaded[1].name, sent=False)
    with collective("choosing the checkpoint to resume from", timeout_seconds):
        return _agree_resume(directory, ctx)


def _agree_resume(directory: Path, ctx: DistContext) -> Resumed | None:
    choice: list[Any] = [None]
    payload: bytes | None = None
    if ctx.is_main:
        found = checkpoint.latest_payload(directory, set_aside=True)
        if found is not None:
            payload, path = found
            choice = [(path.name, checkpoint.digest(payload), len(payload))]
    dist.broadcast_object_list(choice, src=0, device=_object_device(ctx))
    if choice[0] is None:
        return None
    name, sha, length = choice[0]
    if payload is None:
        payload = _local_copy(directory / name, sha)
    have = torch.tensor([1 if payload is not None else 0], dtype=torch.int32, device=ctx.device)
    dist.all_reduce(have, op=dist.ReduceOp.MIN)
    received = payload is None
    sent = not int(have.item())
    if sent:
        buffer = torch.empty(length, dtype=torch.uint8, device=ctx.device)
        if ctx.is_main:
            assert payload is not None
            buffer.copy_(torch.frombuffer(bytearray(payload), dtype=torch.uint8))
        dist.broadcast(buffer, src=0)
        if received:
            payload = buffer.cpu().numpy().tobytes()
            if checkpoint.digest(payload) != sha:
                raise CheckpointError(
                    f"checkpoint {name} received from rank 0 fails its checksum",
                    "restart the job; if it repeats, check the network between the nodes")
    assert payload is not None
    return Resumed(checkpoint.deserialize(payload, name), name, sent)


def _local_copy(path: Path, sha: str) -> bytes | None:
    """This rank's own copy of the chosen checkpoint, if it has the very same file."""
    if checkpoint.stored_digest(path) != sha:
        return None
    try:
        return checkpoint.read_payload(path)
    except CheckpointError:
        return None


def _object_device(ctx: DistContext) -> torch.device | None:
    return ctx.device if ctx.backend == "nccl" else None
