"""The epoch permutation: a bijection of ``range(n)`` evaluated at any position, never stored.

``torch.utils.data.distributed.DistributedSampler`` builds ``randperm(n).tolist()`` on every rank
every epoch: at n = 10^8 that is 800 MB of int64 plus ~3.6 GB of Python ints and ~13 s before the
first batch. Here position ``p`` of the permuted order is ``E(p)`` where ``E`` is a keyed Feistel
network on ``k = ceil(log2 n)`` bits with cycle walking (re-encrypt until the value falls below
``n``; the domain ``2^k < 2n`` so the expected number of passes is below 2). Rounds run on numpy
uint64 arrays, so a chunk of 65,536 positions costs a few milliseconds and memory stays
``O(chunk)`` whatever ``n`` is.

Below :data:`SMALL_N` the cipher is not used: a Feistel network on few bits reaches only a
sliver of the ``n!`` permutations (with two equal halves it can only produce even permutations),
so small domains use ``torch.randperm`` seeded exactly as torch's sampler seeds it
(``seed + epoch``), which makes our order identical to torch's there. Its cost is at most 512 KiB.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import numpy.typing as npt
import torch

IntArray = npt.NDArray[np.int64]

SMALL_N = 1 << 16
"""Domains below this size use a materialised ``torch.randperm`` (uniform, at most 512 KiB)."""

ROUNDS = 6
"""Feistel rounds. Luby-Rackoff needs 4 for a pseudorandom permutation with ideal round
functions; 6 leaves margin for our cheap hash at a cost of ~1.5x the 4-round time."""

_MASK64 = (1 << 64) - 1
# splitmix64 / murmur3 fmix64 constants (Steele et al. 2014; Appleby, MurmurHash3).
_GOLDEN = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB


def splitmix64(x: int) -> int:
    """One splitmix64 output for the 64-bit state ``x`` (plain Python ints, for key derivation)."""
    z = (x + _GOLDEN) & _MASK64
    z = ((z ^ (z >> 30)) * _MIX1) & _MASK64
    z = ((z ^ (z >> 27)) * _MIX2) & _MASK64
    return z ^ (z >> 31)


def mix64(values: npt.NDArray[np.uint64], key: int) -> npt.NDArray[np.uint64]:
    """splitmix64's finaliser of ``values + key`` on a uint64 array (wrapping arithmetic).

    Every output bit depends on every input bit (full avalanche), which is what both the
    Feistel round function and the counter-based random numbers of the weighted sampler need.
    """
    z = values + np.uint64(key)
    z ^= z >> np.uint64(30)
    z *= np.uint64(_MIX1)
    z ^= z >> np.uint64(27)
    z *= np.uint64(_MIX2)
    z ^= z >> np.uint64(31)
    return z


def derive_key(seed: int, epoch: int, stream: int) -> int:
    """A 64-bit key for (seed, epoch, stream), independent across any change of the three."""
    k = splitmix64(seed & _MASK64)
    k = splitmix64(k ^ (epoch & _MASK64))
    return splitmix64(k ^ (stream & _MASK64))


class Permutation(Protocol):
    """A bijection of ``range(size)``; ``perm(positions)`` maps an int64 array elementwise."""

    size: int

    def __call__(self, positions: IntArray) -> IntArray: ...


class IdentityPermutation:
    """The order ``0, 1, ..., n-1`` (``shuffle=False``)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, positions: IntArray) -> IntArray:
        return np.asarray(positions, dtype=np.int64)


class TablePermutation:
    """A materialised ``torch.randperm`` for small domains, identical to torch's sampler's."""

    def __init__(self, size: int, seed: int, epoch: int) -> None:
        self.size = size
        g = torch.Generator()
        g.manual_seed(seed + epoch)  # the seeding of torch.utils.data.DistributedSampler
        self._table: IntArray = torch.randperm(size, generator=g).numpy().astype(np.int64)

    def __call__(self, positions: IntArray) -> IntArray:
        return self._table[positions]


class FeistelPermutation:
    """A keyed bijection of ``range(size)``: a Feistel network on ``k`` bits plus cycle walking.

    The ``k``-bit block is split into halves of ``k // 2`` and ``k - k // 2`` bits; each round
    maps ``(L, R)`` to ``(R, L xor F_i(R))`` with ``F_i`` a keyed 64-bit mixer truncated to the
    width of ``L``, so the half widths alternate and each round is invertible whatever ``k`` is.
    """

    def __init__(self, size: int, seed: int, epoch: int, rounds: int = ROUNDS) -> None:
        if size < 1:
            raise ValueError(f"a permutation needs size >= 1, got {size}")
        self.size = size
        self._bits = max(2, (size - 1).bit_length())
        self._keys = [derive_key(seed, epoch, i) for i in range(rounds)]

    def _encrypt(self, x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
        left_bits = self._bits // 2
        right_bits = self._bits - left_bits
        left = x >> np.uint64(right_bits)
        right = x & np.uint64((1 << right_bits) - 1)
        for key in self._keys:
            f = mix64(right, key) & np.uint64((1 << left_bits) - 1)
            left ^= f
            left, right = right, left
            left_bits, right_bits = right_bits, left_bits
        return (left << np.uint64(right_bits)) | right

    def __call__(self, positions: IntArray) -> IntArray:
        out = self._encrypt(np.asarray(positions, dtype=np.uint64))
        # Cycle walking: a value >= size is encrypted again until it lands in range; the walk
        # stays on the cycle of the block cipher, so the restriction to range(size) is a bijection.
        outside = np.flatnonzero(out >= np.uint64(self.size))
        while outside.size:
            walked = self._encrypt(out[outside])
            out[outside] = walked
            outside = outside[walked >= np.uint64(self.size)]
        return out.astype(np.int64)


def epoch_permutation(size: int, seed: int, epoch: int, shuffle: bool = True) -> Permutation:
    """The permuted order of ``range(size)`` for (seed, epoch): identity, table or cipher."""
    if not shuffle or size <= 1:
        return IdentityPermutation(size)
    if size < SMALL_N:
        return TablePermutation(size, seed, epoch)
    return FeistelPermutation(size, seed, epoch)
