"""Datasets: built-ins, files and user callables, split without copying, fetched in batches.

* :mod:`.source`: `data.dataset` -> factory -> :class:`DataSplits` (one code path for all);
* :mod:`.layout`: what a `--dataset PATH` holds (detection, cheap checks, opening);
* :mod:`.splits`: the seeded train/validation split, never materialised for large data;
* :mod:`.views`: :class:`IndexView` and :func:`fetch` (how a batch is made);
* :mod:`.memory`: the built-in in-memory datasets (digits, synthetic, .npz);
* :mod:`.arrays`, :mod:`.images` (+ :mod:`.transforms`), :mod:`.tables`: memory-mapped
  x.npy/y.npy, image class folders, CSV/Parquet/Arrow tables;
* :mod:`.checks`: validation in bounded chunks or samples.
"""

from trainer.data.memory import InMemoryDataset
from trainer.data.source import DataSplits, build_splits, resolve
from trainer.data.splits import split_indices
from trainer.data.views import EpochIndices, IndexView, fetch

__all__ = [
    "DataSplits",
    "EpochIndices",
    "InMemoryDataset",
    "IndexView",
    "build_splits",
    "fetch",
    "resolve",
    "split_indices",
]
