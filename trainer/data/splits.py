"""The train/validation split: a seeded permutation of the indices cut in two, identical on
every rank with no communication, and never stored for large datasets.

Below :data:`~trainer.sampling.permutation.SMALL_N` samples the permutation is
``torch.randperm(n)`` seeded with ``train.seed`` (at most 512 KiB). Above it, it is the keyed
Feistel permutation the training sampler uses (under a key of its own), evaluated only at the
positions a batch asks for: a split of 2 x 10^7 samples would otherwise cost every rank 160 MB
of int64 indices before the first batch.
"""

from __future__ import annotations

import math
from typing import overload

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor

from trainer.errors import DataError
from trainer.sampling.permutation import (
    SMALL_N,
    FeistelPermutation,
    Permutation,
    TablePermutation,
)

IntArray = npt.NDArray[np.int64]

# The Feistel key is derive_key(seed, epoch, round); the training sampler uses epochs 0, 1, ...
# so the split takes an epoch value no run reaches.
_SPLIT_EPOCH = (1 << 64) - 1


class PermutedRange:
    """Positions ``[start, stop)`` of a permutation: index ``i`` is ``perm(start + i)``.

    Stands in for the int64 index array of an :class:`~trainer.data.views.IndexView` (length,
    integer and array indexing) without storing it; pickles as the permutation's key.
    """

    def __init__(self, perm: Permutation, start: int, stop: int) -> None:
        self.perm = perm
        self.start = start
        self.stop = stop

    def __len__(self) -> int:
        return self.stop - self.start

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: IntArray) -> IntArray: ...

    def __getitem__(self, index: int | IntArray) -> int | IntArray:
        pos = np.asarray(index, dtype=np.int64)
        if pos.size and (int(pos.min()) < 0 or int(pos.max()) >= len(self)):
            raise IndexError(f"index out of range for a split of {len(self)} samples")
        out = self.perm(pos.reshape(-1) + self.start).reshape(pos.shape)
        return int(out) if pos.ndim == 0 else out

    def to_array(self) -> IntArray:
        """Every index, materialised (O(len) memory: for tests and small splits)."""
        return self[np.arange(len(self), dtype=np.int64)]


def _permutation(n: int, seed: int) -> Permutation:
    if n < SMALL_N:
        return TablePermutation(n, seed, 0)  # torch.randperm(n) seeded with `seed`
    return FeistelPermutation(n, seed, _SPLIT_EPOCH)


def split(n: int, val_fraction: float, seed: int) -> tuple[PermutedRange, PermutedRange]:
    """(train, val) indices of `n` samples: the first ``floor(n * val_fraction)`` positions of
    the seeded permutation (at least one when the fraction is positive) are validation."""
    if n == 0:
        raise DataError("the dataset has no samples", "give it at least one sample")
    n_val = math.floor(n * val_fraction)
    if val_fraction > 0 and n_val == 0:
        n_val = 1
    if n - n_val < 1:
        raise DataError(f"val_fraction {val_fraction} leaves no training sample of {n}",
                        "lower --val-fraction")
    perm = _permutation(n, seed)
    return PermutedRange(perm, n_val, n), PermutedRange(perm, 0, n_val)


def split_indices(n: int, val_fraction: float, seed: int) -> tuple[Tensor, Tensor]:
    """:func:`split`, materialised as two int64 tensors."""
    train, val = split(n, val_fraction, seed)
    return torch.from_numpy(train.to_array()), torch.from_numpy(val.to_array())
