"""``BatchedSampler``: whole batches of indices for ``DataLoader(batch_sampler=...)``.

With a plain sampler the DataLoader calls ``next()`` once per index and the dataset's
``__getitem__`` once per sample (~2-5 us each in Python). Given a batch sampler and a dataset
with ``__getitems__``, it fetches a batch with one call; building the batch lists from numpy
chunks with one ``ndarray.tolist()`` per chunk makes the index side cost ~20 ns per sample.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sized
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from trainer.sampling.stream import DEFAULT_CHUNK


class BatchedSampler(Sampler[list[int]]):
    """Lists of ``batch_size`` indices from ``sampler`` (the last one shorter unless
    ``drop_last``); uses ``sampler.iter_chunks`` when it has one, else iterates it.

    ``len()`` is ``len(sampler) // batch_size`` with ``drop_last``, else rounded up, like
    torch's ``BatchSampler``. ``set_epoch`` is forwarded to the sampler when it has one.
    """

    def __init__(
        self,
        sampler: Iterable[int] | Sized,
        batch_size: int,
        drop_last: bool = False,
        chunk: int = DEFAULT_CHUNK,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = drop_last
        # Whole batches per chunk, so no batch straddles two chunks unless batch > chunk.
        self.chunk = max(batch_size, chunk - chunk % batch_size)

    def __len__(self) -> int:
        n = len(self.sampler)  # type: ignore[arg-type]
        if self.drop_last:
            return n // self.batch_size
        return (n + self.batch_size - 1) // self.batch_size

    def set_epoch(self, epoch: int) -> None:
        set_epoch = getattr(self.sampler, "set_epoch", None)
        if set_epoch is not None:
            set_epoch(epoch)

    def __iter__(self) -> Iterator[list[int]]:
        iter_chunks = getattr(self.sampler, "iter_chunks", None)
        if iter_chunks is None:
            yield from self._from_plain(self.sampler)  # type: ignore[arg-type]
            return
        bs = self.batch_size
        carry: list[int] = []
        for arr in iter_chunks(self.chunk):
            values: list[int] = np.asarray(arr).tolist()
            if carry:
                values = carry + values
            whole = len(values) - len(values) % bs
            for i in range(0, whole, bs):
                yield values[i : i + bs]
            carry = values[whole:]
        if carry and not self.drop_last:
            yield carry

    def _from_plain(self, sampler: Iterable[Any]) -> Iterator[list[int]]:
        batch: list[int] = []
        for idx in sampler:
            batch.append(int(idx))
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch
