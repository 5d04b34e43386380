"""Distributed samplers that never materialise the epoch's index list.

* :class:`DistributedShuffleSampler`: drop-in for torch's ``DistributedSampler``; O(chunk)
  memory at any dataset size, resumable on a different world size.
* :class:`DistributedEvalSampler`: exact evaluation; equal lengths on every rank plus
  ``num_valid`` to mask the padding.
* :class:`DistributedWeightedSampler`: weighted draws, with or without replacement, each rank
  computing only its own share.
* :class:`BatchedSampler`: batches of indices for ``DataLoader(batch_sampler=...)`` and
  datasets with ``__getitems__``.

See docs/sampling.md for the design and measurements.
"""

from trainer.sampling.batch_sampler import BatchedSampler
from trainer.sampling.eval_sampler import DistributedEvalSampler
from trainer.sampling.permutation import FeistelPermutation, epoch_permutation
from trainer.sampling.shuffle import DistributedShuffleSampler
from trainer.sampling.stream import DEFAULT_CHUNK, StridedSampler
from trainer.sampling.weighted import DistributedWeightedSampler

__all__ = [
    "DEFAULT_CHUNK",
    "BatchedSampler",
    "DistributedEvalSampler",
    "DistributedShuffleSampler",
    "DistributedWeightedSampler",
    "FeistelPermutation",
    "StridedSampler",
    "epoch_permutation",
]
