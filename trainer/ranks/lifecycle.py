"""One rank's life, shared by ``train`` and ``evaluate``: plan its place, check its input
alone, join the group, and leave it as the outcome allows once everything this rank opened is
closed (the CLI ends a rank with ``os._exit``, which runs no finalizer)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from torch import nn

from trainer.build import Workload, build_workload, preflight
from trainer.components.steps import StepFn
from trainer.config import JobConfig
from trainer.distributed import threads
from trainer.distributed.agreement import collective
from trainer.distributed.bootstrap import join, plan_context, teardown
from trainer.errors import AgreedStop, RankLost, TrainerError
from trainer.placement import DistContext
from trainer.ranks.outputs import check_output_dir
from trainer.usercode import user_frame


class Rank:
    """This rank inside :func:`rank_life`."""

    def __init__(self, cfg: JobConfig, ctx: DistContext, closing: contextlib.ExitStack) -> None:
        self.cfg, self.ctx = cfg, ctx
        self.completed = False
        """Every rank finished (or stopped at the same agreed step): the group is intact and
        is kept (see :func:`trainer.distributed.bootstrap.teardown`)."""
        self._closing = closing

    def prepare(self, *, model: nn.Module | None, dataset: Any, step: StepFn | None
                ) -> Workload:
        """Build the workload and run it on one batch of each split: bad input fails on
        every rank at once, before any rank waits for another in the rendezvous."""
        workload = build_workload(self.cfg, model=model, dataset=dataset, step=step)
        preflight(workload, self.ctx.device, self.cfg.train.batch_size)
        return workload

    def check_output_dir(self, path: str) -> None:
        check_output_dir(path, create=self.ctx.rank == 0)

    def close_at_exit(self, close: Callable[[], object]) -> None:
        """Run `close` when the rank leaves, before the group is left (last in, first run)."""
        self._closing.callback(close)

    def join(self) -> DistContext:
        with collective("joining the process group", self.cfg.dist.timeout_seconds):
            self.ctx = join(self.ctx, self.cfg.dist)
        return self.ctx


@contextlib.contextmanager
def rank_life(cfg: JobConfig) -> Iterator[Rank]:
    """The rank, planned from `cfg`; on leaving, what it registered is closed, then the group
    is left: kept after a completed run, destroyed after an error, and left to the process's
    exit when it is broken (a lost rank, the user's code raised)."""
    closing = contextlib.ExitStack()
    rank = Rank(cfg, plan_context(cfg.dist, cfg.train.device), closing)
    threads.apply(cfg.train.cpu_threads, announce=rank.ctx.rank == 0)  # before its first op
    broken = False
    try:
        with closing:
            yield rank
    except AgreedStop:
        rank.completed = True  # every rank stopped at the same agreed step, the group is intact
        raise
    except RankLost:
        broken = True
        raise
    except Exception as err:
        # The user's code raised: the group is left to the process's exit, so that the peers
        # see this rank vanish only after it has reported the cause (see trainer.usercode).
        broken = not isinstance(err, TrainerError) and user_frame(err) is not None
        raise
    finally:
        if not broken:  # tearing down a broken group can hang or abort the process
            teardown(rank.ctx, rank.completed)
