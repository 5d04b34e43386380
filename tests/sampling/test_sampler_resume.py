"""Mid-epoch resume, on the same or another world size, trains every sample of the epoch once."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.sampling import BatchedSampler, DistributedShuffleSampler
from trainer.sampling.permutation import SMALL_N

SIZES = st.one_of(st.integers(min_value=1, max_value=2000), st.just(SMALL_N + 3))


def _train(
    n: int,
    world: int,
    batch: int,
    state: dict[str, int] | None,
    epoch: int,
    steps: int | None,
    drop_last: bool = False,
    seed: int = 3,
) -> tuple[list[list[int]], dict[str, int]]:
    """Simulate ``world`` ranks training ``steps`` batches (None: to the end of the epoch).

    Returns each rank's trained indices and the state rank 0 checkpoints, with consumed
    counted as the trainer counts it.
    """
    samplers = [
        DistributedShuffleSampler(range(n), world, r, seed=seed, drop_last=drop_last)
        for r in range(world)
    ]
    for s in samplers:
        if state is not None:
            s.load_state_dict(state)
        s.set_epoch(epoch)
    start = samplers[0].start_position
    assert all(s.start_position == start for s in samplers)
    trained: list[list[int]] = []
    done = 0
    for s in samplers:
        batches = list(BatchedSampler(s, batch))
        done = len(batches) if steps is None else min(steps, len(batches))
        trained.append([i for b in batches[:done] for i in b])
    consumed = start + done * batch * world
    return trained, samplers[0].state_dict(consumed)


@settings(max_examples=60, deadline=None)
@given(
    n=SIZES,
    worlds=st.lists(st.integers(min_value=1, max_value=16), min_size=2, max_size=4),
    batch=st.integers(min_value=1, max_value=64),
    steps=st.lists(st.integers(min_value=0, max_value=40), min_size=3, max_size=3),
    epoch=st.integers(min_value=0, max_value=9),
)
def test_resuming_across_world_sizes_trains_every_sample_exactly_once(
    n: int, worlds: list[int], batch: int, steps: list[int], epoch: int
) -> None:
    seen: Counter[int] = Counter()
    repeats = 0
    state: dict[str, int] | None = None
    for hop, world in enumerate(worlds):
        last = hop == len(worlds) - 1
        before = 0 if state is None else state["position"]
        trained, state = _train(n, world, batch, state, epoch, None if last else steps[hop])
        for rank_indices in trained:
            seen.update(rank_indices)
        extra = sum(map(len, trained)) - (state["position"] - before)
        # Repeats are torch's padding: fewer than one per rank, only in the hop that ends it.
        assert 0 <= extra < world
        assert extra == 0 or state["position"] == n
        repeats += extra
    assert set(seen) == set(range(n))
    assert sum(seen.values()) - n == repeats
    assert state is not None and state["position"] == n


@settings(max_examples=40, deadline=None)
@given(
    n=SIZES,
    old_world=st.integers(min_value=1, max_value=16),
    new_world=st.integers(min_value=1, max_value=16),
    batch=st.integers(min_value=1, max_value=32),
    steps=st.integers(min_value=0, max_value=30),
)
def test_drop_last_resume_never_repeats_and_drops_only_the_new_worlds_tail(
    n: int, old_world: int, new_world: int, batch: int, steps: int
) -> None:
    old, state = _train(n, old_world, batch, None, 0, steps, drop_last=True)
    new, final = _train(n, new_world, batch, state, 0, None, drop_last=True)
    flat = [i for r in old + new for i in r]
    assert len(flat) == len(set(flat))
    remaining = n - state["position"]
    dropped = n - len(flat)
    if state["position"] == n:  # the old world finished the epoch; its own tail was dropped
        assert new == [[] for _ in range(new_world)]
    else:
        assert dropped == remaining % new_world
    assert final["position"] == n


def test_state_dict_carries_the_contract_fields() -> None:
    s = DistributedShuffleSampler(range(1000), 4, 1, seed=9)
    s.set_epoch(2)
    assert s.state_dict(400) == {
        "seed": 9,
        "num_samples": 1000,
        "shuffle": 1,
        "epoch": 2,
        "position": 400,
        "num_replicas": 4,
    }


def test_loaded_position_applies_only_to_its_own_epoch() -> None:
    s = DistributedShuffleSampler(range(1000), 2, 0)
    s.load_state_dict({"seed": 0, "num_samples": 1000, "shuffle": 1, "epoch": 3, "position": 600})
    assert (s.epoch, s.start_position, len(s)) == (3, 600, 200)
    s.set_epoch(4)
    assert s.start_position == 0
    s.set_epoch(3)
    assert s.start_position == 600
    list(s)  # the resumed epoch completes ...
    s.set_epoch(3)
    assert s.start_position == 0  # ... so running it again starts from the beginning


def test_state_after_the_whole_iteration_says_the_epoch_is_complete() -> None:
    s = DistributedShuffleSampler(range(1001), 4, 0, drop_last=True)
    assert s.state_dict(len(s) * 4)["position"] == 1001  # the dropped tail is not owed
    padded = DistributedShuffleSampler(range(1001), 4, 0)
    assert padded.state_dict(len(padded) * 4)["position"] == 1001  # padding is clamped


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [("num_samples", 999, "num_samples=999"), ("seed", 5, "seed=5"), ("shuffle", 0, "shuffle=0")],
)
def test_loading_a_state_of_another_dataset_or_seed_raises_with_a_fix(
    field: str, value: int, message: str
) -> None:
    state = DistributedShuffleSampler(range(1000), 2, 0).state_dict(10)
    state[field] = value
    with pytest.raises(ValueError, match=rf"{message}.*fix:"):
        DistributedShuffleSampler(range(1000), 4, 0).load_state_dict(state)


def test_consumed_before_the_start_position_is_rejected() -> None:
    s = DistributedShuffleSampler(range(1000), 2, 0)
    s.load_state_dict(s.state_dict(500))
    with pytest.raises(ValueError, match="start of the epoch"):
        s.state_dict(100)


def test_position_outside_the_dataset_is_rejected() -> None:
    state = DistributedShuffleSampler(range(1000)).state_dict(0)
    state["position"] = 1001
    with pytest.raises(ValueError, match="outside"):
        DistributedShuffleSampler(range(1000)).load_state_dict(state)


def test_a_minimal_state_with_only_the_contract_fields_loads() -> None:
    s = DistributedShuffleSampler(range(100), 3, 2, seed=1)
    s.load_state_dict({"seed": 1, "epoch": 0, "position": 40, "num_samples": 100})
    assert (s.start_position, len(s)) == (40, 20)


def test_a_state_without_a_position_is_rejected() -> None:
    with pytest.raises(ValueError, match="lacks 'position'"):
        DistributedShuffleSampler(range(100)).load_state_dict(
            {"seed": 0, "epoch": 0, "num_samples": 100}
        )


def test_state_dict_without_argument_keeps_what_the_iterator_yielded_2_to_3_ranks() -> None:
    """Iterate 6,000 indices on each of 2 ranks of a 60,000-sample epoch, save the
    no-argument state, resume on 3 ranks: every sample exactly once (issue: 12,000 used to
    be trained twice)."""
    from itertools import islice

    from trainer.sampling import DistributedShuffleSampler

    n = 60_000
    seen: list[int] = []
    states = []
    for rank in range(2):
        sampler = DistributedShuffleSampler(n, num_replicas=2, rank=rank, seed=11)
        sampler.set_epoch(4)
        seen += list(islice(iter(sampler), 6000))
        states.append(sampler.state_dict())
    assert states[0]["position"] == states[1]["position"] == 12_000
    for rank in range(3):
        resumed = DistributedShuffleSampler(n, num_replicas=3, rank=rank, seed=11)
        resumed.load_state_dict(states[0])
        resumed.set_epoch(4)
        seen += list(resumed)
    assert sorted(seen) == list(range(n))  # 60,000 = 12,000 + 3 x 16,000: no padding


def test_state_dict_without_argument_counts_chunks_handed_out_by_iter_chunks() -> None:
    from trainer.sampling import DistributedShuffleSampler

    sampler = DistributedShuffleSampler(10_000, num_replicas=2, rank=1, seed=0)
    sampler.set_epoch(0)
    chunks = sampler.iter_chunks(1000)
    first = next(chunks)
    assert sampler.state_dict()["position"] == 2 * len(first)
    assert sampler.state_dict(consumed=10)["position"] == 10  # explicit wins
