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


def to_device(batch: Any, device: torch.device, where: str = "batch") -> Any:
    """`batch` with every tensor on `device` (asynchronous copies from pinned memory)."""
    if isinstance(batch, Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, tuple):
        return tuple(to_device(v, device, f"{where}[{i}]") for i, v in enumerate(batch))
    if isinstance(batch, list):
        return [to_device(v, device, f"{where}[{i}]") for i, v in enumerate(batch)]
    if isinstance(batch, Mapping):
        return {k: to_device(v, device, f"{where}[{k!r}]") for k, v in batch.items()}
    raise DataError(f"{where} is a {type(batch).__name__}, not a tensor",
                    "make the dataset return tensors (or numbers/arrays default_collate turns "
                    "into tensors) in every field; tokenize text and convert images first")


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
    leaf = first_leaf(batch)
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
