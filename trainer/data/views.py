"""Batches from any map-style dataset, and index views that split one without copying it.

The DataLoader is always handed an :class:`IndexView`, whose ``__getitems__`` returns a whole
collated batch, so the loader's own collate is a pass-through and one rule decides how a
batch is made (:func:`fetch`):

* the dataset has ``__getitems__``: it is called once with the batch's indices. A ``list``
  result is a list of samples (torch's convention, e.g. Hugging Face ``datasets``) and is
  collated with ``default_collate``; anything else is taken as the collated batch (our
  in-memory datasets return ``(x, y)`` from one gather, ~30x fewer interpreter round trips
  than per-sample fetch at batch 256);
* otherwise ``dataset[i]`` per index, collated with ``default_collate``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from torch.utils.data import Dataset, IterableDataset
from torch.utils.data._utils.collate import default_collate

from trainer.errors import DataError


def fetch(dataset: Any, indices: list[int]) -> Any:
    """The collated batch of `dataset` at `indices` (see the module docstring)."""
    getitems = getattr(dataset, "__getitems__", None)
    if getitems is not None:
        batch = getitems(indices)
        return default_collate(batch) if isinstance(batch, list) else batch  # type: ignore[no-untyped-call]
    return default_collate([dataset[i] for i in indices])  # type: ignore[no-untyped-call]


def is_map_style(obj: Any) -> bool:
    """Random access by index and a length: what the distributed samplers need."""
    if isinstance(obj, Dataset):
        return not isinstance(obj, IterableDataset)
    # Not torch's class but the same protocol (e.g. Hugging Face datasets.Dataset); a dict or
    # a string has it too but is no dataset.
    return (hasattr(obj, "__getitem__") and hasattr(obj, "__len__")
            and not isinstance(obj, (Mapping, str, bytes)))


class IndexView(Dataset[Any]):
    """Rows `indices` of `base` (all rows when None), in that order; nothing is copied.

    Pickles as the base plus an int64 array, so DataLoader workers get it cheaply.
    """

    def __init__(self, base: Any, indices: npt.NDArray[np.int64] | None = None) -> None:
        self.base = base
        self.indices = indices

    def __len__(self) -> int:
        return len(self.base) if self.indices is None else len(self.indices)

    def __getitem__(self, index: int) -> Any:
        return self.base[index if self.indices is None else int(self.indices[index])]

    def batch(self, indices: list[int]) -> Any:
        """The collated batch at `indices` of this view."""
        if self.indices is not None:
            indices = self.indices[np.asarray(indices, dtype=np.int64)].tolist()
        return fetch(self.base, indices)

    # What the DataLoader calls; the result is final (the loader's collate passes it through).
    __getitems__ = batch


def first_sample_shape(dataset: Any) -> tuple[int, ...] | None:
    """Shape of the inputs of sample 0 when samples are ``(tensor, label)`` pairs."""
    if len(dataset) == 0:
        return None
    sample = dataset[0]
    if isinstance(sample, Sequence) and len(sample) == 2 and hasattr(sample[0], "shape"):
        return tuple(int(d) for d in sample[0].shape)
    return None


def require_map_style(obj: Any, where: str) -> None:
    if isinstance(obj, IterableDataset):
        raise DataError(f"{where} is an IterableDataset; the distributed samplers need random "
                        "access", "return a map-style Dataset (__getitem__ and __len__)")
    if not is_map_style(obj):
        raise DataError(f"{where} is a {type(obj).__name__}, not a Dataset",
                        "return a map-style torch Dataset (__getitem__ and __len__) or a "
                        "(train, val) pair of them")
