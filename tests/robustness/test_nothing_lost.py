"""Nothing is ever lost: checkpoints rotate by validity, bad ones are moved aside, a checkpoint
of another configuration is refused in one line, outputs go only where the user said and
survive a run that fails before its first step; steps.jsonl belongs to one run."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO, run_cli

from tests.robustness.harness import assert_one_error_line, assert_unchanged, snapshot
from trainer.components import checkpoint
from trainer.ranks.dirlock import LOCK_NAME

TINY = ("train", "--dataset", "synthetic", "--set", "data.synthetic_samples=60",
        "--batch-size", "16", "--metrics-port", "0")
"""A run of 3 steps an epoch (48 training samples / 16)."""


def _state(v: float) -> dict[str, object]:
    return {"w": torch.full((3,), v), "step": int(v)}


def _names(directory: Path) -> list[str]:
    return [p.name for p in checkpoint.list_checkpoints(directory)]


def _steps(path: Path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


# -- rotation and quarantine (the checkpoint module alone) -------------------------------------

def test_rotation_keeps_the_newest_valid_and_moves_a_corrupt_newer_name_aside(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    good = checkpoint.save(tmp_path, 45, _state(45), keep=3)
    junk = tmp_path / "ckpt-000099999.pt"
    junk.write_bytes(b"\x00random bytes\xff" * 100)
    junk_bytes = junk.read_bytes()
    with caplog.at_level(logging.WARNING):
        checkpoint.save(tmp_path, 90, _state(90), keep=2)
    assert _names(tmp_path) == ["ckpt-000000090.pt", good.name]  # both valid ones kept
    assert (tmp_path / "corrupt" / junk.name).read_bytes() == junk_bytes
    assert "moved bad checkpoint ckpt-000099999.pt aside" in caplog.text


def test_rotation_with_keep_1_never_leaves_no_valid_checkpoint(tmp_path: Path) -> None:
    checkpoint.save(tmp_path, 45, _state(45), keep=1)
    (tmp_path / "ckpt-000099999.pt").write_bytes(b"garbage")
    checkpoint.save(tmp_path, 90, _state(90), keep=1)
    assert _names(tmp_path) == ["ckpt-000000090.pt"]
    state, _ = checkpoint.load_latest(tmp_path)  # type: ignore[misc]
    assert state["step"] == 90
    assert (tmp_path / "corrupt" / "ckpt-000099999.pt").read_bytes() == b"garbage"


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_corrupt_file_of_the_same_step_is_moved_aside_not_overwritten(
        tmp_path: Path, damage: str) -> None:
    newest = checkpoint.save(tmp_path, 2, _state(2), keep=3)
    raw = newest.read_bytes()
    bad = raw[: len(raw) // 2] if damage == "truncate" else raw[:-5] + b"XXXXX"
    newest.write_bytes(bad)
    checkpoint.save(tmp_path, 2, _state(2), keep=3)
    assert checkpoint.read(newest)["step"] == 2
    assert (tmp_path / "corrupt" / newest.name).read_bytes() == bad


def test_resume_sets_corrupt_newer_checkpoints_aside(tmp_path: Path) -> None:
    checkpoint.save(tmp_path, 1, _state(1), keep=3)
    bad = tmp_path / "ckpt-000000002.pt"
    bad.write_bytes(b"torn")
    state, path = checkpoint.load_latest(tmp_path, set_aside=True)  # type: ignore[misc]
    assert state["step"] == 1 and not bad.exists()
    assert (tmp_path / "corrupt" / bad.name).read_bytes() == b"torn"
    again = tmp_path / "ckpt-000000002.pt"
    again.write_bytes(b"torn again")  # a second one of the same name keeps the first
    checkpoint.load_latest(tmp_path, set_aside=True)
    assert (tmp_path / "corrupt" / "ckpt-000000002.pt.1").read_bytes() == b"torn again"


# -- whole runs ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint directory and outputs of one finished 1-epoch run (3 steps)."""
    root = tmp_path_factory.mktemp("trained")
    (root / "out").mkdir()
    (root / "out" / "steps.jsonl").write_text('{"step": 99, "epoch": 9, "loss": 1.0}\n')
    proc = run_cli(*TINY, "--epochs", "1", "--checkpoint-dir", str(root / "ckpt"),
                   "--output-dir", str(root / "out"))
    assert proc.returncode == 0, proc.stderr
    return root


def _copy(trained: Path, tmp_path: Path) -> Path:
    shutil.copytree(trained, tmp_path / "run")
    return tmp_path / "run"


def test_a_fresh_start_moves_the_previous_steps_jsonl_aside(
        trained: Path, tmp_path: Path) -> None:
    assert _steps(trained / "out" / "steps.jsonl") == [1, 2, 3]
    assert _steps(trained / "out" / "steps.1.jsonl") == [99]  # the earlier run's line is kept
    run = _copy(trained, tmp_path)
    proc = run_cli(*TINY, "--epochs", "1", "--output-dir", str(run / "out"))  # fresh again
    assert proc.returncode == 0, proc.stderr
    assert _steps(run / "out" / "steps.2.jsonl") == [1, 2, 3]
    assert _steps(run / "out" / "steps.1.jsonl") == [99]


def test_a_fresh_run_failing_after_its_first_step_keeps_the_previous_steps(
        trained: Path, tmp_path: Path) -> None:
    run = _copy(trained, tmp_path)
    before = (run / "out" / "steps.jsonl").read_bytes()
    # lr 1e30 makes the loss inf within a few steps: exit 3 after steps were logged
    proc = run_cli(*TINY, "--epochs", "3", "--lr", "1e30", "--set", "train.log_every=1",
                   "--set", "train.log_seconds=0", "--output-dir", str(run / "out"))
    assert proc.returncode == 3, proc.stderr
    assert (run / "out" / "steps.2.jsonl").read_bytes() == before
    assert json.loads((run / "out" / "summary.json").read_text())["steps"] == 3  # the earlier


def test_a_resume_appends_to_steps_jsonl_and_keeps_a_valid_checkpoint(
        trained: Path, tmp_path: Path) -> None:
    run = _copy(trained, tmp_path)
    junk = run / "ckpt" / "ckpt-000099999.pt"
    junk.write_bytes(b"random bytes, not a checkpoint")
    proc = run_cli(*TINY, "--epochs", "2", "--set", "checkpoint.keep=1", "--checkpoint-dir",
                   str(run / "ckpt"), "--output-dir", str(run / "out"))
    assert proc.returncode == 0, proc.stderr
    assert _names(run / "ckpt") == ["ckpt-000000006.pt"]
    assert checkpoint.read(run / "ckpt" / "ckpt-000000006.pt")["step"] == 6
    assert (run / "ckpt" / "corrupt" / junk.name).read_bytes() == b"random bytes, not a checkpoint"
    assert "moved bad checkpoint ckpt-000099999.pt aside" in proc.stderr
    assert _steps(run / "out" / "steps.jsonl") == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize(("change", "needles"), [
    (("--set", "model.hidden_sizes=[32]"), ("model.hidden_sizes: [128, 64] -> [32]",)),
    (("--set", "optim.name=adam"), ("optim.name: 'sgd' -> 'adam'",)),
    (("--model", "mymodel", "--set", "model.hidden_sizes=[16]"), ("model.name",)),
], ids=["hidden_sizes", "optimizer", "model"])
def test_resuming_another_configuration_is_one_line_and_loses_nothing(
        trained: Path, tmp_path: Path, change: tuple[str, ...], needles: tuple[str, ...]) -> None:
    run = _copy(trained, tmp_path)
    before = snapshot(run)
    proc = run_cli(*TINY, "--epochs", "2", *change, "--checkpoint-dir", str(run / "ckpt"),
                   "--output-dir", str(run / "out"))
    line = assert_one_error_line(proc, 2, ("ckpt-000000003.pt", "another --checkpoint-dir",
                                           *needles))
    assert "Traceback" not in line
    assert_unchanged(before)


def test_a_run_failing_before_its_first_step_leaves_earlier_outputs(
        trained: Path, tmp_path: Path) -> None:
    run = _copy(trained, tmp_path)
    bad = run / "bad.npz"
    bad.write_bytes(b"not an npz")
    before = snapshot(run)
    proc = run_cli(*TINY[:-2], "--dataset", str(bad), "--metrics-port", "0", "--output-dir",
                   str(run / "out"))
    assert_one_error_line(proc, 2, ("bad.npz",))
    assert_unchanged(before)


def test_an_empty_output_dir_is_an_error_not_the_current_directory(tmp_path: Path) -> None:
    (tmp_path / "summary.json").write_text('{"earlier": true}\n')
    before = snapshot(tmp_path)
    proc = run_cli(*TINY, "--epochs", "1", "--output-dir", "", cwd=tmp_path)
    assert_one_error_line(proc, 2, ("output.dir", "--output-dir"))
    assert_unchanged(before)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


# Inside a mount namespace of its own (unshare: no root needed, the mount vanishes with it), a
# 12 KiB tmpfs holds the output directory: three 4 KiB pages, taken by the earlier run's
# summary.json and steps.jsonl and by this run's steps.jsonl, so the disk is full when
# summary.json is due, as a real disk that fills up during a run. The driver runs the CLI and
# reports what the directory holds afterwards.
FULL_DISK_DRIVER = """
import json, subprocess, sys
from pathlib import Path
out = Path(sys.argv[1])
(out / "summary.json").write_text('{"earlier": true}\\n')
(out / "steps.jsonl").write_text('{"step": 99, "epoch": 9, "loss": 1.0}\\n')
proc = subprocess.run([sys.executable, "-m", "trainer", *sys.argv[2:]], capture_output=True,
                      text=True, check=False)
files = {p.name: p.read_text() for p in sorted(out.iterdir())}
print(json.dumps({"code": proc.returncode, "stderr": proc.stderr, "files": files}))
"""


def test_a_disk_full_when_the_summary_is_due_is_one_line_and_keeps_what_was_written(
        tmp_path: Path) -> None:
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    out.mkdir()
    argv = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
            'mount -t tmpfs -o size=12k ddp-full "$1" && shift && exec "$@"', "sh", str(out),
            sys.executable, "-c", FULL_DISK_DRIVER, str(out), *TINY, "--epochs", "1",
            "--checkpoint-dir", str(ckpt), "--output-dir", str(out)]
    driver = subprocess.run(argv, capture_output=True, text=True, timeout=240, check=False,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=tmp_path)
    assert driver.returncode == 0, driver.stderr
    result = json.loads(driver.stdout)
    proc = subprocess.CompletedProcess(argv, result["code"], "", result["stderr"])
    assert_one_error_line(proc, 2, ("summary.json", "No space left on device", "df -h"),
                          warnings=1)
    assert '"val_accuracy"' in result["stderr"]  # the summary's values, in the WARNING line
    files = result["files"]
    assert sorted(set(files) - {LOCK_NAME}) == ["steps.1.jsonl", "steps.jsonl",
                                                  "summary.json"], files  # no .tmp
    assert files["summary.json"] == '{"earlier": true}\n'
    assert [json.loads(line)["step"] for line in files["steps.jsonl"].splitlines()] == [1, 2, 3]
    assert _names(ckpt) == ["ckpt-000000003.pt"]  # the final checkpoint, on the other disk


def test_a_disk_full_at_the_first_steps_line_is_one_line_and_keeps_the_run_before(
        tmp_path: Path) -> None:
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    out.mkdir()
    # An 8 KiB tmpfs, full with the earlier run's steps.jsonl: moving it aside takes no space,
    # the new file's first line finds none.
    earlier = '{"step": 99, "epoch": 9, "loss": 1.0}\n' * 215 + "\n" * 22
    assert len(earlier) == 8192
    driver = FULL_DISK_DRIVER.replace(
        """(out / "summary.json").write_text('{"earlier": true}\\n')\n""", "").replace(
        """'{"step": 99, "epoch": 9, "loss": 1.0}\\n'""", repr(earlier))
    assert "summary" not in driver and "* 215" not in driver
    argv = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
            'mount -t tmpfs -o size=8k ddp-full "$1" && shift && exec "$@"', "sh", str(out),
            sys.executable, "-c", driver, str(out), *TINY, "--epochs", "1",
            "--checkpoint-dir", str(ckpt), "--output-dir", str(out)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=240, check=False,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert_one_error_line(subprocess.CompletedProcess(argv, result["code"], "", result["stderr"]),
                          2, ("steps.jsonl", "No space left on device", "df -h"), warnings=1)
    assert '{"step": 1, "epoch": 0, "loss": ' in result["stderr"]  # in the WARNING line
    result["files"].pop(LOCK_NAME)  # the run's directory hold (trainer/ranks/dirlock.py)
    assert result["files"] == {"steps.1.jsonl": earlier, "steps.jsonl": ""}
