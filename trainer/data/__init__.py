"""Datasets: built-ins, files and user callables, split without copying, fetched in batches.

* :mod:`.source`: `data.dataset` -> factory -> :class:`DataSplits` (one code path for all);
* :mod:`.views`: :class:`IndexView` and :func:`fetch` (how a batch is made);
* :mod:`.memory`: the built-in in-memory datasets.
"""

from trainer.data.memory import InMemoryDataset
from trainer.data.source import DataSplits, build_splits, resolve, split_indices
from trainer.data.views import IndexView, fetch

__all__ = [
    "DataSplits",
    "InMemoryDataset",
    "IndexView",
    "build_splits",
    "fetch",
    "resolve",
    "split_indices",
]
