"""Defaults of ``num_replicas`` / ``rank`` and input checks shared by the samplers."""

from __future__ import annotations

from collections.abc import Sized

import torch.distributed as dist


def resolve_world(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    """``(num_replicas, rank)``, defaulting to torch.distributed's group when it is initialised.

    Unlike torch's sampler, an uninitialised process group is not an error: the defaults are a
    world of one (1, 0), so the same code runs alone and under torchrun.
    """
    initialised = dist.is_available() and dist.is_initialized()
    if num_replicas is None:
        num_replicas = dist.get_world_size() if initialised else 1
    if rank is None:
        rank = dist.get_rank() if initialised else 0
    if num_replicas < 1:
        raise ValueError(
            f"num_replicas must be >= 1, got {num_replicas} (fix: pass the world size, "
            "or leave it None to take it from torch.distributed)"
        )
    if not 0 <= rank < num_replicas:
        raise ValueError(
            f"rank {rank} is outside [0, {num_replicas - 1}] (fix: pass 0 <= rank < num_replicas)"
        )
    return num_replicas, rank


def dataset_size(dataset: Sized | int) -> int:
    """``len(dataset)``; a plain int is accepted as the size itself."""
    n = dataset if isinstance(dataset, int) else len(dataset)
    if n < 0:
        raise ValueError(f"dataset size must be >= 0, got {n}")
    return n


def check_chunk(chunk: int) -> None:
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk} (fix: pass a positive chunk size)")
