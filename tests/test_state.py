"""A checkpoint's contents as a typed state, the same plain dict on disk as before, and its
config read through the config version's migrations."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from trainer.errors import ConfigError
from trainer.loop.state import Progress, TrainingState, fsum

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


def _checkpoint_with(tmp_path: Path, **changes: Any) -> Path:
    """A real checkpoint of a short digits run, rewritten with `changes` (an older or newer
    release's keys; None removes a key)."""
    import trainer
    from trainer.components import checkpoint

    trainer.fit({"data": {"dataset": "digits"}, "train": {"epochs": 1, "batch_size": 64},
                 "checkpoint": {"dir": str(tmp_path / "c")}, "metrics": {"port": 0},
                 "output": {"dir": str(tmp_path / "out")}})
    (path,) = checkpoint.list_checkpoints(tmp_path / "c")
    state = {k: v for k, v in {**checkpoint.read(path), **changes}.items() if v is not None}
    (tmp_path / "old").mkdir()
    return checkpoint.save(tmp_path / "old", 1, state, keep=1)


def test_a_checkpoint_written_before_a_field_rename_evaluates_through_its_migration(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The day `train.batch_size` were renamed from `train.batch`: version-0 checkpoints carry
    # the old name, and the migration from version 0 renames it.
    import trainer
    from trainer import config
    from trainer.components import checkpoint

    def rename(old: dict[str, Any]) -> dict[str, Any]:
        train = dict(old["train"])
        train["batch_size"] = train.pop("batch")
        return {**old, "train": train}

    reference = _checkpoint_with(tmp_path)
    want = trainer.evaluate(reference, output_dir=tmp_path / "e0")["accuracy"]
    saved = config.saved_config(checkpoint.read(reference), "reference")
    old_layout = {**saved, "train": {**{k: v for k, v in saved["train"].items()
                                        if k != "batch_size"}, "batch": 64}}
    assert checkpoint.read(reference)["config_version"] == config.CONFIG_VERSION
    old = _checkpoint_with(tmp_path / "v0", config=old_layout, config_version=None)
    with pytest.raises(ConfigError, match=r"unknown key train\.batch"):
        trainer.evaluate(old, output_dir=tmp_path / "e1")
    monkeypatch.setitem(config.MIGRATIONS, 0, rename)
    assert trainer.evaluate(old, output_dir=tmp_path / "e2")["accuracy"] == want


def test_a_checkpoint_of_a_newer_config_version_is_one_line(tmp_path: Path) -> None:
    import trainer
    from trainer.config import CONFIG_VERSION

    newer = _checkpoint_with(tmp_path, config_version=CONFIG_VERSION + 1)
    with pytest.raises(ConfigError, match=f"config version {CONFIG_VERSION + 1}, this "
                                          f"ddp-trainer reads versions up to {CONFIG_VERSION}"):
        trainer.evaluate(newer, output_dir=tmp_path / "e")

