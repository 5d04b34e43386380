"""SIGTERM's one line says what was kept: where the checkpoint is, or that nothing is."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from tests.robustness.harness import assert_one_error_line, assert_unchanged, snapshot


def _train_then_sigterm(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}}
    env["PYTHONPATH"] = str(REPO)
    argv = [sys.executable, "-m", "trainer", "train", "--dataset", "synthetic", "--epochs",
            "100000", "--log-every", "1", "--metrics-port", "0", "--output-dir",
            str(tmp_path / "out"), *extra]
    proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    seen: list[str] = []
    for line in proc.stderr:  # training has started once a step is reported
        seen.append(line)
        if " step " in line:
            break
    proc.send_signal(signal.SIGTERM)
    rest = proc.stderr.read()
    code = proc.wait(timeout=120)
    return subprocess.CompletedProcess(argv, code, "", "".join(seen) + rest)


@pytest.mark.parametrize("checkpointing", [False, True], ids=["no-checkpoint-dir", "ckpt-dir"])
def test_sigterm_says_what_was_kept(tmp_path: Path, checkpointing: bool) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "summary.json").write_text('{"earlier": true}\n')
    before = snapshot(tmp_path / "out")
    extra = ("--checkpoint-dir", str(tmp_path / "ckpt")) if checkpointing else ()
    proc = _train_then_sigterm(tmp_path, *extra)
    needles = (("progress kept in checkpoint", "ckpt-") if checkpointing else
               ("progress is not kept", "--checkpoint-dir", "step 0"))
    assert_one_error_line(proc, 143, needles)
    assert_unchanged(before)  # summary.json is replaced only by a finished run
