"""The save policy: which steps and epoch ends are checkpointed, and who writes."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch

from trainer import checkpoint
from trainer.config import CheckpointConfig
from trainer.saving import Saver


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
