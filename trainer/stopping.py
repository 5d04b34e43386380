"""Preemption: SIGTERM asks every rank to stop at the same step boundary.

Kubernetes sends SIGTERM to each pod at slightly different moments, so a rank cannot just stop
where it is: the others would wait for it in the next all-reduce until the timeout. Each rank
only raises a local flag; the loop reduces the flags (MAX) at its regular sync points (every
log interval, checkpoint and epoch end), so all ranks see the request at the same step. The
reduction runs asynchronously and is read at the following sync point, so it never stalls a
step; a request takes effect one log interval later.
"""

from __future__ import annotations

import signal
import types
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist


class StopFlag:
    """Set by SIGTERM; agreed across ranks by :meth:`any_rank`."""

    def __init__(self) -> None:
        self.requested = False
        self._inflight: tuple[torch.Tensor, Any] | None = None
        self._previous: Callable[[int, types.FrameType | None], object] | int | None = None

    def install(self) -> None:
        self._previous = signal.signal(signal.SIGTERM, self._handle)

    def uninstall(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    def _handle(self, signum: int, frame: types.FrameType | None) -> None:
        self.requested = True

    def any_rank(self, device: torch.device, distributed: bool) -> bool:
        """True on every rank when any rank had asked to stop by the previous call.

        A collective when distributed: every rank must call it at the same steps.
        """
        if not distributed:
            return self.requested
        previous = False
        if self._inflight is not None:
            flag, work = self._inflight
            work.wait()
            previous = bool(flag.item())
        flag = torch.tensor([int(self.requested)], dtype=torch.int32, device=device)
        self._inflight = (flag, dist.all_reduce(flag, op=dist.ReduceOp.MAX, async_op=True))
        return previous

    def drain(self) -> None:
        """Complete the reduction in flight (before the process group goes away)."""
        if self._inflight is not None:
            self._inflight[1].wait()
            self._inflight = None
