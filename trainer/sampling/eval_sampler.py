"""``DistributedEvalSampler``: exact distributed evaluation without hangs.

torch's sampler pads every rank to the same length by repeating samples, so the padded ones are
counted twice; dropping the padding instead gives ranks different batch counts, and a collective
in the evaluation loop (``all_reduce`` of the metrics, DDP's forward sync) then hangs. Here every
rank runs the same number of items and says which of them are real: positions of its stream at
or past :attr:`DistributedEvalSampler.num_valid` are padding, to be masked out of the counts.
"""

from __future__ import annotations

import math
from collections.abc import Sized

import numpy as np
import numpy.typing as npt

from trainer.sampling.permutation import IntArray
from trainer.sampling.stream import StridedSampler
from trainer.sampling.world import dataset_size


class DistributedEvalSampler(StridedSampler):
    """Rank ``r`` of ``R`` takes indices ``r, r+R, r+2R, ... < n`` in order, then pads.

    ``len(sampler) == ceil(n / R)`` on every rank; the first :attr:`num_valid` items of this
    rank's stream are real, the rest are padding (index ``p % n`` at global position ``p``, the
    same index torch's unshuffled sampler would use, so the dataset can always load it). Real
    items across ranks are disjoint and cover ``range(n)``; with ``n < R`` some ranks have
    ``num_valid == 0`` but still run the same number of batches as the others.
    """

    def __init__(
        self,
        dataset: Sized | int,
        num_replicas: int | None = None,
        rank: int | None = None,
    ) -> None:
        super().__init__(num_replicas, rank, drop_last=False)
        self.dataset_size = dataset_size(dataset)

    @property
    def num_valid(self) -> int:
        """This rank's count of real items; stream positions ``>= num_valid`` are padding."""
        return max(0, math.ceil((self.dataset_size - self.rank) / self.num_replicas))

    def valid_mask(self, start: int, stop: int) -> npt.NDArray[np.bool_]:
        """Booleans for this rank's stream positions ``[start, stop)``: True for real items."""
        return np.arange(start, stop) < self.num_valid

    def _stream_size(self) -> int:
        return self.dataset_size

    def _identity(self) -> dict[str, int]:
        return {"num_samples": self.dataset_size}

    def _lookup(self, positions: IntArray) -> IntArray:
        return positions
