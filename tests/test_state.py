"""A checkpoint's contents as a typed state, and the same plain dict on disk as before."""

from __future__ import annotations

import math

import torch

from trainer.state import Progress, TrainingState, fsum

FIRST_RELEASE = {
    "model": {"w": torch.ones(2)}, "optimizer": {"state": {}, "param_groups": []}, "epoch": 1,
    "step": 12, "sampler": None, "epoch_loss_sum": 0.0, "epoch_loss_count": 0,
    "train_loss": 0.5, "global_batch": 32, "world_size": 2, "rng_cpu": torch.get_rng_state(),
    "config": {"train": {}},
}
"""A checkpoint written before updates, schedules, precision, objects and class names."""


def test_an_older_checkpoint_reads_with_defaults_for_the_later_keys() -> None:
    state = TrainingState.from_dict(FIRST_RELEASE)
    assert state.updates == 12 and state.schedule_total_steps == 0
    assert state.precision == {} and state.objects == {} and state.class_names == []
    assert state.rng_cuda is None and state.train_loss == 0.5


def test_the_on_disk_form_is_a_plain_dict_with_every_key_and_no_tensor_copied() -> None:
    state = TrainingState.from_dict(FIRST_RELEASE)
    saved = state.to_dict()
    assert type(saved) is dict and set(FIRST_RELEASE) <= set(saved)
    assert saved["model"]["w"] is FIRST_RELEASE["model"]["w"]  # type: ignore[index]
    assert TrainingState.from_dict(saved) == state


def test_progress_sums_exactly_and_an_epoch_starts_from_zero() -> None:
    p = Progress()
    p.add_losses([0.1] * 10)
    assert p.epoch_loss_sum == 1.0 and p.epoch_loss_count == 10
    p.next_epoch()
    assert (p.epoch, p.epoch_loss_sum, p.epoch_loss_count) == (1, 0.0, 0)
    assert fsum([math.inf, -math.inf]) == math.inf
