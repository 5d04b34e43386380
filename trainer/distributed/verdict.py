"""The hang's verdict: one line, built from the heartbeats, that names the culprit.

The culprit of a hang is, in this order: a rank that stopped beating (frozen, stopped, cut
off: its watchdog is silent too); else a rank outside any collective (the user's step, a data
fetch, a checkpoint write) while the others wait in one for it; else, when the ranks wait in
different collectives or at different steps, the desync (which rank is where); else every rank
waits in the same collective, which never completes (a wedged device or network).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from trainer.distributed.heartbeat import Heartbeat
from trainer.distributed.phases import BY_NAME, CHECKPOINT, DATA, Phase


@dataclass(frozen=True)
class Verdict:
    problem: str
    fix: str
    place: str
    """What identifies the hang's place across restarts (rank, phase, step, line)."""

    def line(self) -> str:
        return f"error: {self.problem} (fix: {self.fix})"


def _phase(beat: Heartbeat) -> Phase:
    return BY_NAME.get(beat.phase, BY_NAME["starting"])


def _who(beat: Heartbeat) -> str:
    on = f" on node {beat.node}" if beat.node else ""
    return f"rank {beat.rank} (pod {beat.pod}{on})"


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else \
        "ranks " + ", ".join(str(r) for r in sorted(ranks))


def _waiting(beats: list[Heartbeat]) -> str:
    """``ranks 0, 2 wait for it in the backward pass ... of step 20; rank 3 ...``."""
    groups: dict[tuple[str, int], list[int]] = {}
    for b in beats:
        groups.setdefault((b.phase, b.step), []).append(b.rank)
    parts = []
    for (phase, step), ranks in sorted(groups.items(), key=lambda g: min(g[1])):
        verb = "waits" if len(ranks) == 1 else "wait"
        text = BY_NAME.get(phase, BY_NAME["starting"]).text
        text = text if text.startswith("in ") else f"while {text}"
        parts.append(f"{_ranks(ranks)} {verb} for it {text} of step {step}")
    return "; ".join(parts)


def _fix_for(phase: Phase, where: str) -> str:
    if phase is DATA:
        return ("find why the dataset or its source blocks (the stacks of that rank and of its "
                "DataLoader workers are in its log); the job restarts from its last checkpoint")
    if phase is CHECKPOINT:
        return ("check the checkpoint storage (full, read-only or unreachable; the writer's "
                "stack is in that rank's log); the job restarts from its last checkpoint")
    at = f" at {where}" if where else ""
    return (f"find why the code{at} blocks (all threads' stacks are in that rank's log); the job "
            "restarts from its last checkpoint")


def diagnose(beats: Mapping[int, Heartbeat], silent: Mapping[int, float], world_size: int,
             stalled: float) -> Verdict:
    """The verdict after `stalled` seconds with no rank making progress; `silent`: the ranks
    whose heartbeat stopped, with seconds since their last one (a rank never heard from has no
    entry in `beats`)."""
    alive = [b for r, b in sorted(beats.items()) if r not in silent]
    if silent:
        parts = []
        for rank, quiet in sorted(silent.items()):
            last = beats.get(rank)
            who = _who(last) if last else f"rank {rank}"
            seen = (f"; last seen {_phase(last).text} of step {last.step}" if last
                    else "; never heard from")
            parts.append(f"{who} has sent no heartbeat for {quiet:.0f} s (frozen, stopped or "
                         f"cut off from the others{seen})")
        waiting = _waiting(alive)
        problem = "hang: " + "; ".join(parts) + (f"; {waiting}" if waiting else "")
        return Verdict(problem, "check that pod and its node (kubectl describe pod, its log, "
                       "the node's conditions); the job restarts from its last checkpoint",
                       f"silent {sorted(silent)}")
    stuck = [b for b in alive if not _phase(b).collective]
    if stuck:
        culprit = max(stuck, key=lambda b: b.in_phase)
        phase = _phase(culprit)
        at = f", at {culprit.where}" if culprit.where else ""
        others = [b for b in alive if b.rank != culprit.rank]
        also = [b for b in others if not _phase(b).collective]
        waiting = _waiting([b for b in others if _phase(b).collective])
        text = (f"hang: {_who(culprit)} has been {phase.text} of step {culprit.step} for "
                f"{culprit.in_phase:.0f} s{at}")
        if also:
            text += "; " + "; ".join(f"{_who(b)} is {_phase(b).text}"
                                     f"{f' at {b.where}' if b.where else ''}" for b in also)
        if waiting:
            text += f"; {waiting}"
        return Verdict(text, _fix_for(phase, culprit.where),
                       f"rank {culprit.rank} {phase.name} step {culprit.step} {culprit.where}")
    places = {(b.phase, b.step) for b in alive}
    if len(places) > 1:
        where = "; ".join(f"rank {b.rank} {_phase(b).text.removeprefix('in ')} of step {b.step}"
                          for b in alive)
        return Verdict(f"hang: the ranks wait in different collectives for {stalled:.0f} s "
                       f"(a desync): {where}",
                       "make every rank call the same collectives in the same order (a "
                       "collective inside a rank-dependent branch, or a rank that skipped one)",
                       f"desync {sorted(places)}")
    if not alive:
        return Verdict(f"hang: no rank has made progress for {stalled:.0f} s and no heartbeat "
                       "was read", "check the pods' logs; the job restarts from its last "
                       "checkpoint", "unknown")
    phase, step = _phase(alive[0]), alive[0].step
    return Verdict(f"hang: all {len(alive)} ranks have been {phase.text} of step {step} for "
                   f"{stalled:.0f} s: the collective never completes",
                   "check the network between the nodes and the devices (a wedged GPU or NCCL "
                   "communicator); the job restarts from its last checkpoint",
                   f"all {phase.name} step {step}")
