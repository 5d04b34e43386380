"""Checkpoints: atomic, checksummed, pruned; torn or corrupt files are never loaded."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO
from trainer.components import checkpoint
from trainer.errors import CheckpointError


def _state(v: float) -> dict:
    return {"w": torch.full((3,), v), "step": int(v)}


def test_roundtrip_returns_the_saved_state(tmp_path: Path) -> None:
    checkpoint.save(tmp_path, 7, _state(7), keep=3)
    state, path = checkpoint.load_latest(tmp_path)  # type: ignore[misc]
    assert path.name == "ckpt-000000007.pt" and torch.equal(state["w"], torch.full((3,), 7.0))


def test_only_the_newest_k_are_kept(tmp_path: Path) -> None:
    for step in range(1, 6):
        checkpoint.save(tmp_path, step, _state(step), keep=2)
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == [
        "ckpt-000000005.pt", "ckpt-000000004.pt"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp leftovers


@pytest.mark.parametrize("damage", ["truncate", "flip", "header"])
def test_damaged_newest_falls_back_to_previous_with_warning(
        tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture) -> None:
    checkpoint.save(tmp_path, 1, _state(1), keep=3)
    newest = checkpoint.save(tmp_path, 2, _state(2), keep=3)
    raw = newest.read_bytes()
    if damage == "truncate":
        newest.write_bytes(raw[: len(raw) // 2])
    elif damage == "flip":
        newest.write_bytes(raw[:-10] + bytes([raw[-10] ^ 0xFF]) + raw[-9:])
    else:
        newest.write_bytes(b"garbage\n" + raw)
    with caplog.at_level(logging.WARNING):
        state, path = checkpoint.load_latest(tmp_path)  # type: ignore[misc]
    assert state["step"] == 1 and path.name == "ckpt-000000001.pt"
    assert "ckpt-000000002.pt" in caplog.text


def test_no_valid_checkpoint_returns_none(tmp_path: Path) -> None:
    (tmp_path / "ckpt-000000003.pt").write_bytes(b"")
    assert checkpoint.load_latest(tmp_path) is None


def test_dir_under_a_file_is_reported_before_training(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(CheckpointError, match="not writable"):
        checkpoint.check_writable(blocker / "ckpts")


def test_failed_save_keeps_previous_checkpoint(tmp_path: Path) -> None:
    checkpoint.save(tmp_path, 1, _state(1), keep=3)
    with pytest.raises(CheckpointError, match="earlier checkpoints are kept"):
        checkpoint.save(tmp_path / "missing-subdir", 2, _state(2), keep=3)
    state, _ = checkpoint.load_latest(tmp_path)  # type: ignore[misc]
    assert state["step"] == 1


def test_background_write_saves_the_state_as_it_was_when_submitted(tmp_path: Path) -> None:
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 1}
    before = {k: v.clone() for k, v in model.state_dict().items()}
    momentum = opt.state_dict()["state"][0]["momentum_buffer"].clone()
    writer = checkpoint.AsyncWriter()
    path = writer.submit(tmp_path, 1, state, keep=3)
    with torch.no_grad():  # training goes on while the write is in flight
        for p in model.parameters():
            p.add_(100.0)
        opt.state[model.weight]["momentum_buffer"].add_(100.0)
    assert writer.wait() == path
    writer.close()
    saved = checkpoint.read(path)
    assert all(torch.equal(saved["model"][k], v) for k, v in before.items())
    assert torch.equal(saved["optimizer"]["state"][0]["momentum_buffer"], momentum)
    # The module-version metadata of a state_dict survives (load_state_dict reads it).
    assert saved["model"]._metadata == model.state_dict()._metadata


def test_background_write_failure_is_raised_by_wait_and_keeps_earlier_files(
        tmp_path: Path) -> None:
    writer = checkpoint.AsyncWriter()
    writer.submit(tmp_path, 1, _state(1), keep=3)
    writer.submit(tmp_path / "missing-subdir", 2, _state(2), keep=3)
    with pytest.raises(CheckpointError, match="earlier checkpoints are kept"):
        writer.wait()
    writer.close()
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == ["ckpt-000000001.pt"]


# In a mount namespace of its own (unshare: no root needed, the mount vanishes with it), the
# checkpoint directory is a tmpfs remounted read-only between a save and its rotation, as a
# volume that turns read-only mid-run.
READ_ONLY_DRIVER = """
import subprocess, sys
from pathlib import Path
import torch
from trainer.components import checkpoint
from trainer.errors import CheckpointError
directory = Path(sys.argv[1])
for step in (1, 2, 3):
    written = checkpoint.save(directory, step, {"w": torch.tensor([float(step)])}, keep=3)
subprocess.run(["mount", "-o", "remount,ro", str(directory)], check=True)
try:
    checkpoint.rotate(directory, 1, written)
except CheckpointError as exc:
    print(exc)
print(sorted(p.name for p in directory.iterdir()))
"""


def test_a_directory_turned_read_only_before_rotation_is_one_error_and_keeps_every_file(
        tmp_path: Path) -> None:
    directory = tmp_path / "ckpt"
    directory.mkdir()
    argv = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
            'mount -t tmpfs ddp-ro "$1" && shift && exec "$@"', "sh", str(directory),
            sys.executable, "-c", READ_ONLY_DRIVER, str(directory)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    error, files = proc.stdout.splitlines()
    assert error == (f"checkpoint dir {directory}: ckpt-000000003.pt was saved, but rotation "
                     f"could not delete {directory}/ckpt-000000002.pt (Read-only file system); "
                     "every checkpoint there is kept (fix: make --checkpoint-dir writable "
                     "again; a rerun resumes from the newest checkpoint)")
    assert files == str(["ckpt-000000001.pt", "ckpt-000000002.pt", "ckpt-000000003.pt"])
