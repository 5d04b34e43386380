"""DistributedShuffleSampler shards like torch's sampler: disjoint, covering, padded the same,
and the global batches do not depend on the world size."""

from __future__ import annotations

import time
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DistributedSampler

from trainer.sampling import BatchedSampler, DistributedShuffleSampler
from trainer.sampling.permutation import SMALL_N

SIZES = st.one_of(
    st.integers(min_value=1, max_value=3000),
    st.sampled_from([SMALL_N - 1, SMALL_N, SMALL_N + 1, 100_003]),
)


def _all_ranks(n: int, world: int, **kwargs: object) -> list[list[int]]:
    return [list(DistributedShuffleSampler(range(n), world, r, **kwargs)) for r in range(world)]


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(min_value=1, max_value=SMALL_N - 1),
    world=st.integers(min_value=1, max_value=16),
    seed=st.integers(min_value=0, max_value=2**31),
    epoch=st.integers(min_value=0, max_value=50),
    shuffle=st.booleans(),
    drop_last=st.booleans(),
)
def test_small_datasets_yield_exactly_torchs_indices(
    n: int, world: int, seed: int, epoch: int, shuffle: bool, drop_last: bool
) -> None:
    for rank in sorted({0, world - 1, world // 2}):
        ours = DistributedShuffleSampler(range(n), world, rank, shuffle, seed, drop_last)
        theirs = DistributedSampler(range(n), world, rank, shuffle, seed, drop_last)
        ours.set_epoch(epoch)
        theirs.set_epoch(epoch)
        assert list(ours) == list(theirs)
        assert len(ours) == len(theirs)


@settings(max_examples=40, deadline=None)
@given(n=SIZES, world=st.integers(min_value=1, max_value=16), seed=st.integers(0, 2**31))
def test_shards_cover_every_index_and_overlap_only_by_torchs_padding(
    n: int, world: int, seed: int
) -> None:
    shards = _all_ranks(n, world, seed=seed)
    assert len({len(s) for s in shards}) == 1  # every rank runs the same number of steps
    counts = Counter(i for s in shards for i in s)
    assert set(counts) == set(range(n))
    padding = -n % world
    assert sum(counts.values()) - n == padding


@settings(max_examples=40, deadline=None)
@given(n=SIZES, world=st.integers(min_value=1, max_value=16), seed=st.integers(0, 2**31))
def test_drop_last_shards_are_disjoint_and_drop_only_the_tail_remainder(
    n: int, world: int, seed: int
) -> None:
    shards = _all_ranks(n, world, seed=seed, drop_last=True)
    flat = [i for s in shards for i in s]
    assert len(flat) == len(set(flat)) == (n // world) * world
    assert len({len(s) for s in shards}) == 1


@settings(max_examples=25, deadline=None)
@given(
    n=SIZES,
    global_batch=st.sampled_from([12, 24, 48, 240]),
    seed=st.integers(0, 2**31),
    epoch=st.integers(0, 5),
)
def test_global_batches_are_identical_for_every_world_size_dividing_the_global_batch(
    n: int, global_batch: int, seed: int, epoch: int
) -> None:
    per_world: dict[int, list[frozenset[int]]] = {}
    for world in (w for w in (1, 2, 3, 4, 6, 8, 12, 16) if global_batch % w == 0):
        batches_per_rank = []
        for rank in range(world):
            sampler = DistributedShuffleSampler(range(n), world, rank, seed=seed)
            sampler.set_epoch(epoch)
            batches_per_rank.append(list(BatchedSampler(sampler, global_batch // world)))
        full_steps = n // global_batch  # later steps contain world-size-dependent padding
        per_world[world] = [
            frozenset(i for rank_batches in batches_per_rank for i in rank_batches[step])
            for step in range(full_steps)
        ]
    reference = per_world[1]
    assert all(batches == reference for batches in per_world.values())


def test_iter_chunks_yields_the_same_sequence_as_iter_for_any_chunk_size() -> None:
    sampler = DistributedShuffleSampler(range(200_001), num_replicas=3, rank=1, seed=4)
    expected = list(sampler)
    for chunk in (13, 4096, 65536, 10**6):
        chunks = list(sampler.iter_chunks(chunk))
        assert all(c.dtype == np.int64 and 0 < c.size <= chunk for c in chunks)
        assert np.concatenate(chunks).tolist() == expected


def test_billion_sample_dataset_gives_a_first_index_in_milliseconds() -> None:
    sampler = DistributedShuffleSampler(range(10**9), num_replicas=8, rank=0)
    start = time.perf_counter()
    first = next(iter(sampler))
    elapsed = time.perf_counter() - start
    assert 0 <= first < 10**9
    assert len(sampler) == 125_000_000
    assert elapsed < 0.05  # the target is < 10 ms; slack for a loaded CI machine


def test_defaults_are_a_world_of_one_without_a_process_group() -> None:
    sampler = DistributedShuffleSampler(range(10))
    assert (sampler.num_replicas, sampler.rank) == (1, 0)
    assert sorted(sampler) == list(range(10))


def test_plain_int_size_and_sized_dataset_are_equivalent() -> None:
    assert list(DistributedShuffleSampler(70_000, 2, 1)) == list(
        DistributedShuffleSampler(list(range(70_000)), 2, 1)
    )


@pytest.mark.parametrize(
    ("world", "rank", "message"),
    [(0, 0, "num_replicas must be >= 1"), (4, 4, "rank 4 is outside"), (2, -1, "rank -1")],
)
def test_invalid_world_arguments_name_the_problem(world: int, rank: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DistributedShuffleSampler(range(10), world, rank)


def test_empty_dataset_yields_nothing() -> None:
    sampler = DistributedShuffleSampler(range(0), 4, 2)
    assert len(sampler) == 0 and list(sampler) == []
