"""DistributedEvalSampler: equal lengths everywhere, real items counted exactly once."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.sampling import BatchedSampler, DistributedEvalSampler


@settings(max_examples=80, deadline=None)
@given(n=st.integers(min_value=0, max_value=3000), world=st.integers(min_value=1, max_value=16))
def test_real_items_are_disjoint_cover_the_dataset_and_every_rank_has_the_same_length(
    n: int, world: int
) -> None:
    samplers = [DistributedEvalSampler(range(n), world, r) for r in range(world)]
    assert {len(s) for s in samplers} == {math.ceil(n / world)}
    real = [i for s in samplers for i in list(s)[: s.num_valid]]
    assert sorted(real) == list(range(n))
    assert sum(s.num_valid for s in samplers) == n


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(min_value=1, max_value=2000),
    world=st.integers(min_value=1, max_value=16),
    batch=st.integers(min_value=1, max_value=50),
)
def test_masked_evaluation_counts_every_sample_once_with_equal_batch_counts(
    n: int, world: int, batch: int
) -> None:
    labels = np.arange(n) % 3  # a fake "correct" flag per sample: label 0 counts as correct
    total = correct = 0
    batch_counts = set()
    for rank in range(world):
        sampler = DistributedEvalSampler(range(n), world, rank)
        batches = list(BatchedSampler(sampler, batch))
        batch_counts.add(len(batches))
        seen = 0
        for b in batches:
            mask = sampler.valid_mask(seen, seen + len(b))
            seen += len(b)
            total += int(mask.sum())
            correct += int((labels[b][mask] == 0).sum())
    assert len(batch_counts) == 1  # no rank waits in a collective the others never reach
    assert total == n
    assert correct == int((labels == 0).sum())


def test_padding_uses_loadable_indices_when_ranks_outnumber_samples() -> None:
    samplers = [DistributedEvalSampler(range(3), 8, r) for r in range(8)]
    assert [s.num_valid for s in samplers] == [1, 1, 1, 0, 0, 0, 0, 0]
    assert all(len(s) == 1 and 0 <= next(iter(s)) < 3 for s in samplers)


def test_iter_chunks_matches_iteration() -> None:
    sampler = DistributedEvalSampler(range(100_003), 7, 6)
    assert np.concatenate(list(sampler.iter_chunks(999))).tolist() == list(sampler)
