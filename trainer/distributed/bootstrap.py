"""Distributed bootstrap: one call reads the launcher's environment and joins the group.

Where each variable comes from:

======================  =====================================  ==================================
variable                torchrun / ``ddp-trainer run``         Kubeflow PyTorchJob (operator v1.9)
======================  =====================================  ==================================
``RANK``                global rank of this process            pod rank (0 = Master); with
                                                               ``nprocPerNode`` the pod runs our
                                                               launcher, which sets it per process
``WORLD_SIZE``          total processes                        total pods (x nprocPerNode)
``LOCAL_RANK``          process index on this node             not set (one process per pod)
``LOCAL_WORLD_SIZE``    processes on this node                 not set
``MASTER_ADDR/PORT``    rendezvous store of the group          the Master pod's service
``PET_*``               read by the launcher, not by ranks     set for the launcher in the pod
======================  =====================================  ==================================
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import warnings

import torch
import torch.distributed as dist

from trainer.config import DistConfig
from trainer.errors import ConfigError, first_line
from trainer.placement import DistContext

log = logging.getLogger(__name__)


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"environment variable {name}={raw!r} is not an integer",
                          f"unset {name} or set it to an integer") from None


def pick_device(device: str, local_rank: int) -> torch.device:
    if device == "cpu" or (device == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError("train.device is 'cuda' but no CUDA device is available",
                          "use --set train.device=cpu or run on a GPU node")
    count = torch.cuda.device_count()
    if local_rank >= count:
        raise ConfigError(f"LOCAL_RANK {local_rank} has no GPU (this node has {count})",
                          "set --nproc-per-node (or gpusPerReplica) to at most the GPU count")
    return torch.device("cuda", local_rank)


def plan_context(cfg: DistConfig, device: str = "auto") -> DistContext:
    """This rank's place in the job, read from the environment, before joining anything.

    Everything that can be wrong with the environment fails here, so a rank can also build
    its metrics endpoint and check its input before it blocks in the rendezvous. The CUDA
    device is selected from ``LOCAL_RANK`` *before* ``init_process_group`` so NCCL binds each
    rank to its own GPU (otherwise every rank creates a context on GPU 0).
    """
    world_size = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    local_rank = _env_int("LOCAL_RANK", 0)
    local_world_size = _env_int("LOCAL_WORLD_SIZE", 1)
    if not 0 <= rank < world_size:
        raise ConfigError(f"RANK={rank} is outside [0, WORLD_SIZE={world_size})",
                          "check the launcher's RANK and WORLD_SIZE")
    dev = pick_device(device, local_rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    backend = cfg.backend
    if backend == "auto":
        backend = "nccl" if dev.type == "cuda" else "gloo"
    if backend == "nccl" and dev.type != "cuda":
        raise ConfigError("dist.backend is 'nccl' but the device is the CPU",
                          "use --set dist.backend=gloo (or auto) on CPU")
    if world_size == 1 and "MASTER_ADDR" not in os.environ:
        return DistContext(0, 1, 0, 1, dev, backend, initialized=False)
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        if name not in os.environ:
            raise ConfigError(f"WORLD_SIZE={world_size} but {name} is not set",
                              "launch with `ddp-trainer run` or torchrun, which set it")
    return DistContext(rank, world_size, local_rank, local_world_size, dev, backend,
                       initialized=False)


def is_distributed(ctx: DistContext) -> bool:
    """Whether this rank is part of a group (joined or not yet): the launcher set MASTER_*."""
    return ctx.world_size > 1 or "MASTER_ADDR" in os.environ


def join(ctx: DistContext, cfg: DistConfig) -> DistContext:
    """Create the process group `ctx` describes (a no-op when running alone)."""
    if ctx.initialized or not is_distributed(ctx):
        return ctx
    if dist.is_initialized():
        return _reuse(ctx)
    # NCCL's async error handling turns a hung collective into an exception after the timeout
    # instead of a silent hang (torch >= 2.2 reads the TORCH_ prefixed name).
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    timeout = datetime.timedelta(seconds=cfg.timeout_seconds)
    kwargs: dict[str, object] = {}
    if ctx.backend == "nccl":
        kwargs["device_id"] = ctx.device  # eager NCCL init on the right GPU
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # The elastic agent's store outlives a restart, and torch reuses the same keys each
        # attempt: restarted ranks would read the dead ranks' addresses and fail to connect.
        # A per-attempt prefix gives every restart a clean namespace.
        attempt = _env_int("TORCHELASTIC_RESTART_COUNT", 0)
        agent_store = dist.TCPStore(  # type: ignore[attr-defined]
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), ctx.world_size,
            is_master=False, timeout=timeout)
        kwargs["store"] = dist.PrefixStore(  # type: ignore[attr-defined]
            f"/ddp-trainer/attempt_{attempt}", agent_store)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dist.init_process_group(backend=ctx.backend, rank=ctx.rank, world_size=ctx.world_size,
                                timeout=timeout, **kwargs)  # type: ignore[arg-type]
    return dataclasses.replace(ctx, initialized=True)


def _reuse(ctx: DistContext) -> DistContext:
    """The default group that is already there: a script's second trainer.fit() (the first
    keeps the group, see :func:`teardown`), or the user's own init_process_group."""
    rank, world, backend = dist.get_rank(), dist.get_world_size(), str(dist.get_backend())
    if (rank, world) != (ctx.rank, ctx.world_size) or backend != ctx.backend:
        raise ConfigError(f"the process group already joined is rank {rank} of {world} "
                          f"({backend}), but this run is rank {ctx.rank} of {ctx.world_size} "
                          f"({ctx.backend})",
                          "leave init_process_group to ddp-trainer, or destroy the group "
                          "before calling trainer.fit()")
    return dataclasses.replace(ctx, initialized=True)


def init_distributed(cfg: DistConfig, device: str = "auto") -> DistContext:
    """Join the process group described by the environment, or run alone."""
    return join(plan_context(cfg, device), cfg)


def teardown(ctx: DistContext, completed: bool = True) -> None:
    """Leave the group.

    After a completed run the ranks meet at a barrier and the group is *kept*: the CLI then
    ends the process with ``os._exit`` (see :func:`trainer.cli.main`). Gloo's teardown,
    whether from ``destroy_process_group`` or from interpreter finalization, can abort a rank
    whose peer closed its sockets first ("terminate called without an active exception",
    exit 134 after a successful run; seen in about 1 of 100 two-rank runs in CI), even after
    a barrier. After an error the group is destroyed without a barrier: the peers may be
    inside another collective, and the exit status already reports the failure. A peer gone
    before the barrier (gloo raises a RuntimeError, NCCL a DistError) does not undo a run
    whose summary and final checkpoint are written: a warning, and the run stays completed.
    """
    if ctx.initialized and dist.is_initialized():
        if completed:
            try:
                dist.barrier()
            except (dist.DistError, RuntimeError) as err:
                log.warning("a peer left before the final barrier (%s); this rank's run is "
                            "complete", first_line(err, 200))
            return
        dist.destroy_process_group()
