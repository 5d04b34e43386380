"""The train/validation split: seeded, disjoint, covering, and never stored when large."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from trainer.data.splits import PermutedRange, split, split_indices
from trainer.errors import DataError
from trainer.sampling.permutation import SMALL_N


def test_small_splits_are_the_seeded_randperm_of_earlier_versions() -> None:
    train, val = split_indices(101, 0.2, seed=3)
    perm = torch.randperm(101, generator=torch.Generator().manual_seed(3))
    assert torch.equal(val, perm[:20]) and torch.equal(train, perm[20:])


@pytest.mark.parametrize("n", [SMALL_N + 17, 300_001])
def test_large_splits_are_disjoint_covering_and_seeded(n: int) -> None:
    train, val = split(n, 0.1, seed=5)
    assert isinstance(train, PermutedRange) and len(val) == n // 10
    both = np.concatenate([train.to_array(), val.to_array()])
    assert np.array_equal(np.sort(both), np.arange(n))
    again = split(n, 0.1, seed=5)[1].to_array()
    assert np.array_equal(val.to_array(), again)
    assert not np.array_equal(val.to_array(), split(n, 0.1, seed=6)[1].to_array())


def test_a_huge_split_costs_no_memory_and_pickles_small() -> None:
    train, val = split(10**10, 0.01, seed=0)  # 80 GB of int64 if materialised
    assert len(train) == 99 * 10**8 and len(pickle.dumps(train)) < 2_000
    picked = train[np.array([0, 5, len(train) - 1])]
    assert picked.dtype == np.int64 and ((picked >= 0) & (picked < 10**10)).all()
    assert isinstance(val[3], int)
    with pytest.raises(IndexError):
        train[np.array([len(train)])]


def test_a_split_without_training_samples_is_rejected() -> None:
    with pytest.raises(DataError, match="leaves no training sample"):
        split(1, 0.5, seed=0)
    with pytest.raises(DataError, match="no samples"):
        split(0, 0.2, seed=0)
