"""Batches as trees: any nesting of tuples, lists and mappings with tensors at the leaves.

The loop never assumes ``(x, y)``: it moves a batch to the device, counts its samples and cuts
off evaluation padding through these three functions. A leaf that is not a tensor (a string
column, a PIL image) is a :class:`~trainer.errors.DataError` naming the field, raised where the
batch is first moved, before any optimizer step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from trainer.errors import DataError


class _NotTensor(Exception):
    pass


def to_device(batch: Any, device: torch.device) -> Any:
    """`batch` with every tensor on `device` (asynchronous copies from pinned memory).

    Runs once per micro-batch, so it stays lean (~1 us for an (x, y) pair already on the
    device); the path of a bad field is only worked out when there is one.
    """
    try:
        return _move(batch, device)
    except _NotTensor:
        check_tensors(batch)
        raise AssertionError("unreachable: check_tensors found no bad leaf") from None


def _move(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, Tensor):
        return batch if batch.device == device else batch.to(device, non_blocking=True)
    if isinstance(batch, tuple):
        return tuple([_move(v, device) for v in batch])
    if isinstance(batch, list):
        return [_move(v, device) for v in batch]
    if isinstance(batch, Mapping):
        return {k: _move(v, device) for k, v in batch.items()}
    raise _NotTensor


def check_tensors(batch: Any) -> None:
    """A DataError naming the first field of `batch` that is not a tensor, if any."""
    path = _bad_path(batch, "batch")
    if path is not None:
        where, leaf = path
        raise DataError(f"{where} is a {type(leaf).__name__}, not a tensor",
                        "make the dataset return tensors (or numbers/arrays default_collate "
                        "turns into tensors) in every field; tokenize text and convert images "
                        "first")


def _bad_path(batch: Any, where: str) -> tuple[str, Any] | None:
    if isinstance(batch, Tensor):
        return None
    if isinstance(batch, (tuple, list)):
        for i, v in enumerate(batch):
            found = _bad_path(v, f"{where}[{i}]")
            if found is not None:
                return found
        return None
    if isinstance(batch, Mapping):
        for k, v in batch.items():
            found = _bad_path(v, f"{where}[{k!r}]")
            if found is not None:
                return found
        return None
    return where, batch


def first_leaf(batch: Any) -> Tensor:
    if isinstance(batch, Tensor):
        return batch
    if isinstance(batch, (tuple, list)) and batch:
        return first_leaf(batch[0])
    if isinstance(batch, Mapping) and batch:
        return first_leaf(next(iter(batch.values())))
    raise DataError("a batch has no tensor in it", "return tensors from the dataset")


def batch_len(batch: Any) -> int:
    """Samples in the batch: the first dimension of its first tensor."""
    leaf = batch[0] if type(batch) is tuple and isinstance(batch[0], Tensor) else first_leaf(batch)
    return int(leaf.shape[0]) if leaf.dim() else 1


def take(batch: Any, n: int) -> Any:
    """The first `n` samples of every tensor in the batch (drops evaluation padding)."""
    if isinstance(batch, Tensor):
        return batch[:n]
    if isinstance(batch, tuple):
        return tuple(take(v, n) for v in batch)
    if isinstance(batch, list):
        return [take(v, n) for v in batch]
    if isinstance(batch, Mapping):
        return {k: take(v, n) for k, v in batch.items()}
    return batch
