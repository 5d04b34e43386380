"""BatchedSampler delivers the sampler's exact sequence as batches through a real DataLoader."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, SequentialSampler

from trainer.sampling import (
    BatchedSampler,
    DistributedEvalSampler,
    DistributedShuffleSampler,
    DistributedWeightedSampler,
)


class _Rows:
    """The minimal in-memory dataset of the contract: one fancy-index per batch."""

    def __init__(self, n: int) -> None:
        self.x = torch.arange(n, dtype=torch.float32).unsqueeze(1)
        self.y = torch.arange(n)

    def __len__(self) -> int:
        return len(self.y)

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.as_tensor(indices)
        return self.x[idx], self.y[idx]


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(min_value=0, max_value=2000),
    batch=st.integers(min_value=1, max_value=300),
    chunk=st.integers(min_value=1, max_value=500),
    drop_last=st.booleans(),
)
def test_batches_concatenate_to_the_sampler_sequence_with_torchs_lengths(
    n: int, batch: int, chunk: int, drop_last: bool
) -> None:
    sampler = DistributedShuffleSampler(range(n), 3, 1, seed=2)
    batches = list(BatchedSampler(sampler, batch, drop_last=drop_last, chunk=chunk))
    expected = list(sampler)
    assert len(batches) == len(BatchedSampler(sampler, batch, drop_last=drop_last))
    assert all(len(b) == batch for b in batches[:-1] if b)
    whole = len(expected) - (len(expected) % batch if drop_last else 0)
    assert [i for b in batches for i in b] == expected[:whole]
    assert all(type(i) is int for b in batches for i in b)


@pytest.mark.parametrize(
    "sampler",
    [
        DistributedShuffleSampler(range(1000), 2, 1),
        DistributedEvalSampler(range(1000), 3, 2),
        DistributedWeightedSampler(torch.ones(1000), 700, num_replicas=2, rank=0),
        SequentialSampler(range(1000)),
        list(range(999, -1, -3)),
    ],
    ids=["shuffle", "eval", "weighted", "torch-sequential", "plain-list"],
)
def test_dataloader_with_getitems_yields_the_sampled_rows_in_order(sampler: object) -> None:
    batched = BatchedSampler(sampler, 64)  # type: ignore[arg-type]
    expected = [i for b in batched for i in b]
    loader = DataLoader(_Rows(1000), batch_sampler=batched, collate_fn=lambda b: b)
    got = [int(v) for _, y in loader for v in y]
    assert got == expected
    assert len(loader) == len(batched) == -(-len(expected) // 64)


def test_set_epoch_is_forwarded_to_the_sampler() -> None:
    sampler = DistributedShuffleSampler(range(100))
    BatchedSampler(sampler, 8).set_epoch(5)
    assert sampler.epoch == 5


def test_batch_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        BatchedSampler(DistributedShuffleSampler(range(10)), 0)
