"""``DistributedWeightedSampler``: weighted sampling split across ranks with no shared draw list.

torch has ``WeightedRandomSampler`` but no distributed form (pytorch#77154, #23430); the usual
workaround draws the full list on every rank and slices it. Here draw ``p`` of the epoch is a
pure function of (seed, epoch, p), so each rank computes only its own draws ``r, r+R, ...``:

* with replacement, draw ``p`` inverts the weights' CDF at a counter-based uniform
  (splitmix64 of ``p``), O(log n) per draw and O(chunk) memory;
* without replacement, the order is Efraimidis-Spirakis sampling: item ``i`` gets the key
  ``Exp(1)_i / w_i`` (again counter-based) and the draws are the items by increasing key,
  which has the law of sequential draws proportional to weight without replacement. Each rank
  computes the keys of all ``n`` items once per epoch (O(n) time and memory, the size of the
  weights array it already holds) and keeps the first draws; nothing is communicated.

Both are independent of the world size: the union over ranks is the same stream of draws.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import torch

from trainer.sampling.permutation import _GOLDEN, IntArray, derive_key, mix64
from trainer.sampling.stream import StridedSampler

_STREAM = 0x5745_4947  # "WEIG": keeps these keys apart from the shuffle cipher's round keys
_TWO_M53 = 2.0**-53


def counter_uniform(positions: IntArray, key: int) -> npt.NDArray[np.float64]:
    """Uniforms in (0, 1] for ``positions``: the splitmix64 stream of ``key`` at those indices."""
    z = mix64(positions.astype(np.uint64) * np.uint64(_GOLDEN), key)
    return ((z >> np.uint64(11)).astype(np.float64) + 1.0) * _TWO_M53


def _as_weights(weights: npt.ArrayLike | torch.Tensor) -> npt.NDArray[np.float64]:
    if isinstance(weights, torch.Tensor):
        weights = weights.detach().cpu().double().numpy()
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or w.size == 0:
        raise ValueError(
            f"weights must be a non-empty 1-D sequence, got shape {w.shape} "
            "(fix: pass one weight per dataset item)"
        )
    if not np.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
        raise ValueError(
            "weights must be finite, >= 0 and not all zero "
            "(fix: clean the weights, e.g. np.nan_to_num and clip at 0)"
        )
    return w


class DistributedWeightedSampler(StridedSampler):
    """Weighted draws of dataset indices, split across ranks like the shuffle sampler.

    ``num_samples`` is the global number of draws per epoch; each rank yields
    ``ceil(num_samples / num_replicas)``. When that rounds up, the extra draws are further
    draws of the same stream (fresh draws, or the next items of the without-replacement order),
    not repeats, so the union across ranks is a weighted sample of ``R * ceil(num_samples/R)``
    draws (at most ``R - 1`` more than asked). Without replacement, if the world needs more
    draws than there are items of non-zero weight, the order wraps (repeats) as torch pads.

    The global draw count is the attribute :attr:`draws`; :attr:`num_samples` is this rank's
    count, as for the other samplers (torch's ``WeightedRandomSampler.num_samples`` is global).

    ``set_epoch`` gives fresh draws per epoch; ``state_dict``/``load_state_dict`` resume like
    :class:`~trainer.sampling.DistributedShuffleSampler` (state: seed, epoch, position,
    ``num_samples`` = draws per epoch, ``num_weights``, ``replacement``).
    """

    wrap_padding = False
    required_identity = ("seed", "num_samples")

    def __init__(
        self,
        weights: npt.ArrayLike | torch.Tensor,
        num_samples: int,
        replacement: bool = True,
        num_replicas: int | None = None,
        rank: int | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(num_replicas, rank, drop_last=False)
        w = _as_weights(weights)
        self.num_weights = int(w.size)
        self.nonzero = int(np.count_nonzero(w))
        if num_samples < 0:
            raise ValueError(f"num_samples must be >= 0, got {num_samples}")
        if not replacement and num_samples > self.nonzero:
            raise ValueError(
                f"cannot draw {num_samples} samples without replacement from {self.nonzero} "
                "items of non-zero weight (fix: lower num_samples or use replacement=True)"
            )
        self.draws = num_samples
        self.replacement = replacement
        self.seed = seed
        self._weights = w
        self._cdf = np.cumsum(w)
        self._last_nonzero = int(np.flatnonzero(w)[-1])
        self._order: IntArray | None = None
        self._order_epoch = -1

    def _stream_size(self) -> int:
        return self.draws

    def _identity(self) -> dict[str, int]:
        return {
            "seed": self.seed,
            "num_samples": self.draws,
            "num_weights": self.num_weights,
            "replacement": int(self.replacement),
        }

    def _key(self) -> int:
        return derive_key(self.seed, self.epoch, _STREAM)

    def _draw_with_replacement(self, positions: IntArray) -> IntArray:
        u = counter_uniform(positions, self._key())
        # u is in (0, 1]: draw i covers (cdf[i-1], cdf[i]]; zero-weight items cover nothing.
        idx: IntArray = np.searchsorted(self._cdf, u * self._cdf[-1], side="left").astype(np.int64)
        return np.minimum(idx, self._last_nonzero)

    def _without_replacement_order(self) -> IntArray:
        """Items by increasing Efraimidis-Spirakis key, as many as this epoch can need."""
        needed = min(max(self._start + self.total_size, self.draws), self.nonzero)
        if self._order is None or self._order_epoch != self.epoch or self._order.size < needed:
            items = np.arange(self.num_weights, dtype=np.int64)
            exp = -np.log(counter_uniform(items, self._key()))
            # log(E / w), so a subnormal weight cannot overflow to inf and tie with zero weights.
            with np.errstate(divide="ignore"):
                keys = np.log(exp) - np.log(self._weights)
            keys[self._weights <= 0] = np.inf
            if needed < self.num_weights:
                first = np.argpartition(keys, needed - 1)[:needed]
            else:
                first = items
            self._order = first[np.argsort(keys[first], kind="stable")].astype(np.int64)
            self._order_epoch = self.epoch
        return self._order

    def _lookup(self, positions: IntArray) -> IntArray:
        if self.replacement:
            return self._draw_with_replacement(positions)
        order = self._without_replacement_order()
        return order[positions % order.size]

    def expected_frequencies(self) -> npt.NDArray[np.float64]:
        """Each item's probability per draw with replacement (the weights, normalised)."""
        freq: npt.NDArray[np.float64] = self._weights / self._cdf[-1]
        return freq

    def __repr__(self) -> str:
        return (
            f"DistributedWeightedSampler(num_weights={self.num_weights}, num_samples="
            f"{self.draws}, replacement={self.replacement}, rank={self.rank}/"
            f"{self.num_replicas}, per_rank={math.ceil(self.draws / self.num_replicas)})"
        )
