"""Heartbeats: each rank's watchdog publishes where its rank is and reads every other rank's.

Distributed, the board is the rendezvous store the ranks already share (the ``MASTER_ADDR:
MASTER_PORT`` TCPStore: rank 0's under a PyTorchJob, the elastic agent's under
``ddp-trainer run``), through a client connection of the watchdog's own: the process group's
client blocks for ``dist.timeout_seconds`` on a store that does not answer, and the watchdog must
keep its own short timeout. Alone, the board is this process's memory.
"""

from __future__ import annotations

import datetime
import json
import os
from dataclasses import asdict, dataclass
from typing import Protocol

STORE_TIMEOUT_SECONDS = 10.0
"""A store operation of the watchdog's that takes longer counts as the store not answering."""


@dataclass(frozen=True)
class Heartbeat:
    """One rank's record on the board, rewritten at every beat of its watchdog."""

    rank: int
    pod: str
    """The pod's (or host's) name."""
    node: str
    """The node's name where the chart gives it (``NODE_NAME``), else empty."""
    pid: int
    phase: str
    step: int
    seq: int
    """Phase changes so far: a rank whose `seq` moves is making progress."""
    beat: int
    """Beats so far: a rank whose `beat` stops moving is frozen, stopped or cut off."""
    in_phase: float
    """Seconds in the current phase, by the rank's own clock."""
    budget: float
    """Seconds of no progress after which the rank's watchdog calls the job hung."""
    where: str = ""
    """The line its main thread is at (the user's code where it is in it), once the phase is
    long."""

    def encode(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def decode(cls, data: bytes | str) -> Heartbeat:
        return cls(**json.loads(data))


def identity() -> tuple[str, str]:
    """(pod, node) of this process: the chart sets ``POD_NAME`` and ``NODE_NAME``."""
    pod = os.environ.get("POD_NAME") or os.environ.get("HOSTNAME") or os.uname().nodename
    return pod, os.environ.get("NODE_NAME", "")


class Board(Protocol):
    def publish(self, beat: Heartbeat) -> None: ...

    def read(self, world_size: int) -> dict[int, Heartbeat]: ...

    def declare(self, rank: int, line: str) -> None: ...

    def declared(self, world_size: int) -> dict[int, str]: ...

    def claim(self, name: str) -> bool:
        """Whether this caller is the first of all ranks to claim `name`."""
        ...


class LocalBoard:
    """A run of one rank: nothing to share."""

    def __init__(self) -> None:
        self._beats: dict[int, Heartbeat] = {}
        self._declared: dict[int, str] = {}
        self._claimed: set[str] = set()

    def publish(self, beat: Heartbeat) -> None:
        self._beats[beat.rank] = beat

    def read(self, world_size: int) -> dict[int, Heartbeat]:
        return dict(self._beats)

    def declare(self, rank: int, line: str) -> None:
        self._declared[rank] = line

    def declared(self, world_size: int) -> dict[int, str]:
        return dict(self._declared)

    def claim(self, name: str) -> bool:
        first = name not in self._claimed
        self._claimed.add(name)
        return first


class StoreBoard:
    """Keys ``hb/<rank>`` and ``hung/<rank>`` in the shared store, under a per-attempt prefix
    (the agent's store outlives a restart: see :func:`trainer.distributed.bootstrap.join`)."""

    def __init__(self, host: str, port: int, attempt: int,
                 timeout: float = STORE_TIMEOUT_SECONDS) -> None:
        import torch.distributed as dist

        client = dist.TCPStore(  # type: ignore[attr-defined]
            host, port, is_master=False, timeout=datetime.timedelta(seconds=timeout),
            wait_for_workers=False)
        self._store = dist.PrefixStore(  # type: ignore[attr-defined]
            f"/ddp-trainer/watchdog/attempt_{attempt}", client)

    def publish(self, beat: Heartbeat) -> None:
        self._store.set(f"hb/{beat.rank}", beat.encode())

    def _present(self, keys: list[str]) -> list[str]:
        return [k for k in keys if self._store.check([k])]

    def read(self, world_size: int) -> dict[int, Heartbeat]:
        keys = self._present([f"hb/{r}" for r in range(world_size)])
        if not keys:
            return {}
        beats = (Heartbeat.decode(v) for v in self._store.multi_get(keys))
        return {b.rank: b for b in beats}

    def declare(self, rank: int, line: str) -> None:
        self._store.set(f"hung/{rank}", line)

    def declared(self, world_size: int) -> dict[int, str]:
        keys = self._present([f"hung/{r}" for r in range(world_size)])
        values = self._store.multi_get(keys) if keys else []
        return {int(k.partition("/")[2]): v.decode("utf-8", "replace")
                for k, v in zip(keys, values, strict=True)}

    def claim(self, name: str) -> bool:
        return int(self._store.add(f"claim/{name}", 1)) == 1  # atomic in the store


def store_board() -> StoreBoard:
    """The board of a rank launched into a group (``MASTER_ADDR``/``MASTER_PORT`` are set)."""
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    return StoreBoard(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), attempt)
