"""The save policy: which steps and epoch ends are checkpointed, and who writes."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch

from trainer.components import checkpoint
from trainer.config import CheckpointConfig
from trainer.loop.save_policy import Saver


def test_every_n_steps_replaces_epoch_end_saves_but_the_end_is_always_saved(
        tmp_path: Path) -> None:
    saver = Saver(CheckpointConfig(dir=str(tmp_path / "c"), every=50), is_main=True)
    assert [s for s in range(1, 201) if saver.due(s)] == [50, 100, 150, 200]
    assert not saver.at_epoch_end(23, final=False)
    assert saver.at_epoch_end(100, final=False)
    assert saver.at_epoch_end(123, final=True)
    saver.close()


def test_every_zero_saves_each_epoch_end_and_no_step(tmp_path: Path) -> None:
    saver = Saver(CheckpointConfig(dir=str(tmp_path / "c"), every=0), is_main=True)
    assert not any(saver.due(s) for s in range(1, 100))
    assert saver.at_epoch_end(23, final=False)
    saver.close()


def test_no_directory_saves_nothing_and_builds_no_state() -> None:
    saver = Saver(CheckpointConfig(dir="", every=1), is_main=True)
    assert not saver.due(1) and not saver.at_epoch_end(1, final=True)
    assert saver.save(1, lambda: (_ for _ in ()).throw(AssertionError("built"))) is None
    saver.close()


def _state(step: int) -> dict[str, Any]:
    return {"step": step, "w": torch.ones(2) * step}


def test_only_rank_0_builds_and_writes_the_state(tmp_path: Path) -> None:
    directory = tmp_path / "not" / "yet"
    other = Saver(CheckpointConfig(dir=str(directory), keep=2), is_main=False)
    assert directory.is_dir()  # created and probed on every rank, before any training
    assert other.save(7, lambda: (_ for _ in ()).throw(AssertionError("built"))) is None
    main = Saver(CheckpointConfig(dir=str(directory), keep=2), is_main=True)
    for step in (1, 2, 3):
        main.save(step, functools.partial(_state, step))
    main.wait()
    saved = checkpoint.list_checkpoints(directory)
    assert [p.name for p in saved] == ["ckpt-000000003.pt", "ckpt-000000002.pt"]
    assert checkpoint.read(saved[0])["w"].tolist() == [3.0, 3.0]
    main.close()
    other.close()


def test_the_policy_says_what_follows_each_step_and_what_final_means(tmp_path: Path) -> None:
    saver = Saver(CheckpointConfig(dir=str(tmp_path / "c"), every=50), is_main=True,
                  epochs=2, max_steps=0)
    inside = saver.after_step(50, epoch=0, ends_epoch=False)
    assert (inside.save_now, inside.saved, inside.final, inside.awaited) == (True, True, False,
                                                                             True)
    # an epoch end is saved after its validation, never as a step checkpoint
    first_end = saver.after_step(64, epoch=0, ends_epoch=True)
    assert (first_end.save_now, first_end.saved, first_end.final) == (False, False, False)
    last_end = saver.after_step(128, epoch=1, ends_epoch=True)
    assert (last_end.save_now, last_end.saved, last_end.final) == (False, True, True)
    assert not saver.epoch_end_saved(64, epoch=0) and saver.epoch_end_saved(128, epoch=1)
    assert not saver.after_step(7, epoch=0, ends_epoch=False).awaited
    saver.close()


def test_max_steps_ends_training_inside_an_epoch_even_without_checkpoints() -> None:
    saver = Saver(CheckpointConfig(dir="", every=0), is_main=True, epochs=5, max_steps=30)
    assert not saver.done(29) and saver.done(30)
    stop = saver.after_step(30, epoch=0, ends_epoch=False)
    assert stop.final and stop.awaited and not stop.saved and not stop.save_now
    saver.close()
