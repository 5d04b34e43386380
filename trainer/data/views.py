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

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, overload

import numpy as np
import numpy.typing as npt
from torch.utils.data import Dataset, IterableDataset
from torch.utils.data._utils.collate import default_collate

from trainer.errors import DataError


class EpochIndices(list[int]):
    """A training batch's indices tagged with the epoch they were drawn for.

    The training loader hands these to the dataset (plain lists everywhere else) so that
    augmentation can derive its randomness from (seed, epoch, index): the same for a sample
    whatever the number of DataLoader workers, and again after a resume.
    """

    def __init__(self, indices: Iterable[int], epoch: int) -> None:
        super().__init__(indices)
        self.epoch = epoch


def epoch_of(indices: Sequence[int]) -> int | None:
    """The epoch a batch of indices was drawn for (None: not a training batch)."""
    return indices.epoch if isinstance(indices, EpochIndices) else None


class Indices(Protocol):
    """What an :class:`IndexView` needs of its index map: an int64 array, or a lazy one
    (:class:`trainer.data.splits.PermutedRange`)."""

    def __len__(self) -> int: ...
    @overload
    def __getitem__(self, index: int) -> Any: ...
    @overload
    def __getitem__(self, index: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]: ...


def fetch(dataset: Any, indices: Any) -> Any:
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

    Pickles as the base plus its index map, so DataLoader workers get it cheaply. The epoch
    tag of an :class:`EpochIndices` batch is kept when its indices are mapped to the base's.
    """

    def __init__(self, base: Any, indices: Indices | None = None) -> None:
        self.base = base
        self.indices = indices

    def __len__(self) -> int:
        return len(self.base) if self.indices is None else len(self.indices)

    def __getitem__(self, index: int) -> Any:
        return self.base[index if self.indices is None else int(self.indices[index])]

    def batch(self, indices: list[int]) -> Any:
        """The collated batch at `indices` of this view."""
        if self.indices is None:
            return fetch(self.base, indices)
        mapped = self.indices[np.asarray(indices, dtype=np.int64)]
        # Datasets that say so take the int64 array as it is (no list round trip).
        if getattr(self.base, "takes_index_arrays", False):
            return fetch(self.base, mapped)
        epoch = epoch_of(indices)
        listed = mapped.tolist()
        return fetch(self.base, listed if epoch is None else EpochIndices(listed, epoch))

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
