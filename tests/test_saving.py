"""The save policy: which steps and epoch ends are checkpointed, and who writes."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import read_json, run_cli
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


def test_every_zero_and_no_timed_saves_save_each_epoch_end_and_no_step(tmp_path: Path) -> None:
    saver = Saver(CheckpointConfig(dir=str(tmp_path / "c"), every=0, every_seconds=0),
                  is_main=True)
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


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_by_default_only_time_saves_inside_training(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr("trainer.loop.save_policy.time.monotonic", clock)
    saver = Saver(CheckpointConfig(dir=str(tmp_path / "c")), is_main=True, epochs=100)
    assert saver.every_seconds == 300 and saver.every == 0
    assert not any(saver.due(s) for s in range(1, 100))
    assert not saver.after_step(64, epoch=0, ends_epoch=True).saved  # no epoch-end save
    clock.now += 299.9
    assert not saver.clock_due()
    clock.now += 0.1
    assert saver.clock_due() and not saver.clock_due()  # asked once, until the save
    saver.close()


def test_an_agreed_timed_save_happens_at_the_next_step_then_the_clock_restarts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr("trainer.loop.save_policy.time.monotonic", clock)
    saver = Saver(CheckpointConfig(dir=str(tmp_path / "c"), every_seconds=60), is_main=True,
                  epochs=100)
    clock.now += 60
    assert saver.clock_due()
    saver.agreed_due()  # what Policies does with a verdict whose save_due is set
    decision = saver.after_step(11, epoch=0, ends_epoch=False)
    assert (decision.save_now, decision.awaited) == (True, True)
    saver.save(11, functools.partial(_state, 11))
    assert not saver.due(12) and not saver.clock_due()
    clock.now += 59
    assert not saver.clock_due()
    clock.now += 1
    assert saver.clock_due()
    saver.wait()
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path / "c")] == ["ckpt-000000011.pt"]
    saver.close()


def test_an_agreed_timed_save_at_an_epoch_end_is_that_epochs_checkpoint(tmp_path: Path) -> None:
    saver = Saver(CheckpointConfig(dir=str(tmp_path / "c"), every_seconds=60), is_main=False,
                  epochs=100)
    assert not saver.clock_due()  # only rank 0's clock asks
    saver.agreed_due()
    decision = saver.after_step(64, epoch=0, ends_epoch=True)
    assert (decision.save_now, decision.saved, decision.awaited) == (False, True, True)
    assert saver.epoch_end_saved(64, epoch=0)
    saver.close()


def test_a_timed_save_agreed_after_an_epoch_ends_waits_for_the_next_step(tmp_path: Path) -> None:
    # The epoch end's exchange was not awaited: saving there would skip the ranks' check.
    saver = Saver(CheckpointConfig(dir=str(tmp_path / "c"), every_seconds=60), is_main=True,
                  epochs=100)
    assert not saver.after_step(64, epoch=0, ends_epoch=True).saved
    saver.agreed_due()
    assert not saver.epoch_end_saved(64, epoch=0)
    assert saver.after_step(65, epoch=1, ends_epoch=False).save_now
    saver.close()


def test_two_ranks_save_on_rank_0s_clock_at_the_same_steps(tmp_path: Path) -> None:
    every = 0.1
    proc = run_cli("run", "--nproc-per-node", "2", "--dataset", "synthetic", "--epochs", "40",
                   "--metrics-port", "0", "--output-dir", str(tmp_path / "out"),
                   "--checkpoint-dir", str(tmp_path / "c"), "--set", "checkpoint.keep=100000",
                   "--set", f"checkpoint.every_seconds={every}", "--set", "train.log_seconds=0",
                   "--log-every", "1", env={"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr  # a disagreement would hang or fail a collective
    summary = read_json(tmp_path / "out" / "summary.json")
    steps = sorted(int(p.stem.split("-")[1]) for p in checkpoint.list_checkpoints(tmp_path / "c"))
    assert summary["wall_seconds"] > 5 * every, summary  # time for several timed saves
    assert steps[-1] == summary["steps"]  # the final save
    # Timed saves inside training, at most one per interval of rank 0's clock (and the final).
    assert 2 <= len(steps) <= summary["wall_seconds"] / every + 2, (steps, summary)
