"""DistributedWeightedSampler: the union over ranks has the requested distribution."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from trainer.sampling import BatchedSampler, DistributedWeightedSampler


def _union(weights: list[float], draws: int, world: int, **kwargs: object) -> list[int]:
    return [
        i
        for r in range(world)
        for i in DistributedWeightedSampler(weights, draws, num_replicas=world, rank=r, **kwargs)
    ]


def test_frequencies_with_replacement_match_the_weights_chi_square() -> None:
    weights = [1.0, 2.0, 3.0, 0.0, 4.0, 0.5]
    draws = 120_000
    counts = np.bincount(_union(weights, draws, world=3, seed=1), minlength=len(weights))
    assert counts[3] == 0  # zero weight is never drawn
    p = np.array(weights) / sum(weights)
    mask = p > 0
    expected = p[mask] * counts.sum()
    chi2 = float(((counts[mask] - expected) ** 2 / expected).sum())
    assert chi2 < 20.52  # 4 degrees of freedom, p = 0.0004


@settings(max_examples=25, deadline=None)
@given(
    weights=st.lists(st.floats(min_value=0, max_value=100), min_size=1, max_size=50).filter(
        lambda w: sum(w) > 0
    ),
    draws=st.integers(min_value=0, max_value=300),
    world=st.sampled_from([2, 3, 4, 6]),
    replacement=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_the_stream_of_draws_is_the_same_for_every_world_size(
    weights: list[float], draws: int, world: int, replacement: bool, seed: int
) -> None:
    if not replacement:
        draws = min(draws, sum(w > 0 for w in weights))
    single = list(DistributedWeightedSampler(weights, draws, replacement, 1, 0, seed))
    per_rank = [
        list(DistributedWeightedSampler(weights, draws, replacement, world, r, seed))
        for r in range(world)
    ]
    assert {len(r) for r in per_rank} == {math.ceil(draws / world)}
    interleaved = [x for row in itertools.zip_longest(*per_rank) for x in row if x is not None]
    assert interleaved[:draws] == single  # rank r holds draws r, r+R, ... of the same stream
    assert all(weights[i] > 0 for i in interleaved)


@settings(max_examples=25, deadline=None)
@given(
    weights=st.lists(st.floats(min_value=0, max_value=10), min_size=1, max_size=200),
    world=st.integers(min_value=1, max_value=8),
    seed=st.integers(0, 2**31),
)
def test_without_replacement_never_repeats_across_ranks(
    weights: list[float], world: int, seed: int
) -> None:
    draws = sum(w > 0 for w in weights) // world * world  # rounding up then needs no repeats
    assume(draws > 0)
    union = _union(weights, draws, world, replacement=False, seed=seed)
    assert len(union) == len(set(union)) == math.ceil(draws / world) * world
    assert all(weights[i] > 0 for i in union)


def _inclusion_probabilities(weights: list[float], k: int) -> list[float]:
    """Exact P(item in sample) for k sequential weighted draws without replacement."""
    probs = [0.0] * len(weights)
    for order in itertools.permutations(range(len(weights)), k):
        p, left = 1.0, sum(weights)
        for i in order:
            p *= weights[i] / left
            left -= weights[i]
        for i in order:
            probs[i] += p
    return probs


def test_without_replacement_inclusion_follows_sequential_weighted_draws() -> None:
    weights, k, epochs = [1.0, 2.0, 3.0, 4.0, 10.0], 2, 6000
    sampler = DistributedWeightedSampler(weights, k, replacement=False, num_replicas=2, rank=0)
    other = DistributedWeightedSampler(weights, k, replacement=False, num_replicas=2, rank=1)
    counts: Counter[int] = Counter()
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        other.set_epoch(epoch)
        counts.update(list(sampler) + list(other))
    exact = _inclusion_probabilities(weights, k)
    for i, p in enumerate(exact):
        sigma = math.sqrt(p * (1 - p) / epochs)
        assert abs(counts[i] / epochs - p) < 5 * sigma, (i, counts[i] / epochs, p)


def test_without_replacement_at_a_million_items_is_distinct_and_favours_heavy_items() -> None:
    n = 1_000_000
    weights = torch.rand(n, generator=torch.Generator().manual_seed(0)) ** 4
    sampler = DistributedWeightedSampler(weights, n // 2, replacement=False, num_replicas=4)
    drawn = np.concatenate(list(sampler.iter_chunks()))
    assert drawn.size == len(set(drawn.tolist())) == n // 8
    # Heavier items are drawn first: the mean weight of drawn items exceeds the overall mean.
    assert weights.numpy()[drawn].mean() > 1.5 * float(weights.mean())


def test_epochs_give_fresh_draws_and_resume_continues_the_stream() -> None:
    a = DistributedWeightedSampler([1.0] * 1000, 500, num_replicas=2, rank=0)
    first = list(a)
    a.set_epoch(1)
    assert list(a) != first
    b = DistributedWeightedSampler([1.0] * 1000, 500, num_replicas=5, rank=0)
    b.load_state_dict(a.state_dict(100))
    assert (b.epoch, b.start_position, len(b)) == (1, 100, 80)


@pytest.mark.parametrize(
    ("weights", "draws", "replacement", "message"),
    [
        ([], 1, True, "non-empty 1-D"),
        ([1.0, float("nan")], 1, True, "finite"),
        ([0.0, 0.0], 1, True, "not all zero"),
        ([1.0, -1.0], 1, True, ">= 0"),
        ([1.0, 0.0, 2.0], 3, False, "cannot draw 3 samples without replacement from 2"),
    ],
)
def test_invalid_weights_name_the_problem(
    weights: list[float], draws: int, replacement: bool, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        DistributedWeightedSampler(weights, draws, replacement)


def test_batched_delivery_of_weighted_draws_matches_iteration() -> None:
    sampler = DistributedWeightedSampler(np.ones(50), 1000, num_replicas=3, rank=2, seed=4)
    assert [i for b in BatchedSampler(sampler, 64) for i in b] == list(sampler)
