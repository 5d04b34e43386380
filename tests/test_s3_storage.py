"""checkpoint.dir and output.dir in S3 (``s3://bucket/prefix``), against a real S3 server:
SeaweedFS built from its Go module (tests/support/s3.py), not a mock."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, free_port, read_json, run_cli

COMMON = ["--dataset", "digits", "--batch-size", "16", "--epochs", "2", "--metrics-port", "0",
          "--checkpoint-every", "5"]


def _objects(fs: Any, url: str) -> list[str]:
    root = url.removeprefix("s3://")
    return sorted(str(p).removeprefix(root + "/") for p in fs.find(root))


def test_a_two_rank_run_checkpointed_in_s3_resumes_there_as_an_uninterrupted_run(
        s3_server: Any, tmp_path: Path) -> None:
    env = s3_server.env
    full = run_cli("run", "--nproc-per-node", "2", *COMMON, "--output-dir",
                   str(tmp_path / "full"), "--checkpoint-dir", str(tmp_path / "c-full"))
    assert full.returncode == 0, full.stderr
    ckpt, out = s3_server.url("resume/ckpt"), s3_server.url("resume/out")
    first = run_cli("run", "--nproc-per-node", "2", *COMMON, "--max-steps", "17",
                    "--output-dir", out, "--checkpoint-dir", ckpt, env=env)
    assert first.returncode == 0, first.stderr
    fs = s3_server.filesystem()
    saved = [n for n in _objects(fs, ckpt) if n.startswith("ckpt-")]
    # every 5 steps and the last: 5, 10, 15, 17; the default keep (3) deleted step 5's
    assert saved == ["ckpt-000000010.pt", "ckpt-000000015.pt", "ckpt-000000017.pt"]
    assert json.loads(fs.cat_file(out.removeprefix("s3://") + "/summary.json"))["steps"] == 17

    second = run_cli("run", "--nproc-per-node", "2", *COMMON, "--output-dir", out,
                     "--checkpoint-dir", ckpt, env=env)
    assert second.returncode == 0, second.stderr
    assert "resumed from ckpt-000000017.pt: step 17" in second.stderr
    resumed = json.loads(fs.cat_file(out.removeprefix("s3://") + "/summary.json"))
    uninterrupted = read_json(tmp_path / "full" / "summary.json")
    assert resumed["resumed_from_step"] == 17
    assert resumed["steps"] == uninterrupted["steps"]
    assert resumed["val_accuracy"] == uninterrupted["val_accuracy"]
    assert resumed["train_loss"] == pytest.approx(uninterrupted["train_loss"], rel=1e-12)
    # the step log of both attempts, appended in the store; the exported model beside it
    steps = [json.loads(line)["step"] for line in
             fs.cat_file(out.removeprefix("s3://") + "/steps.jsonl").decode().splitlines()]
    assert steps[0] == 1 and steps[-1] == uninterrupted["steps"] and 17 in steps
    names = _objects(fs, out)
    assert "model/model.safetensors" in names and "model/ddp-trainer.json" in names
    assert f"-> {out}/summary.json" in second.stderr


def test_a_newer_corrupt_checkpoint_in_s3_is_moved_aside_and_the_older_one_resumed(
        s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from trainer.components import checkpoint, storage

    for key, value in s3_server.env.items():
        monkeypatch.setenv(key, value)
    url = s3_server.url("corrupt-case")
    fs = s3_server.filesystem()
    root = url.removeprefix("s3://")
    good = checkpoint.serialize({"step": 4})
    header = b"%s %s %d\n" % (checkpoint.MAGIC, checkpoint.digest(good).encode(), len(good))
    fs.pipe_file(f"{root}/ckpt-000000004.pt", header + good)
    fs.pipe_file(f"{root}/ckpt-000000008.pt", header + good[:-10])  # torn: shorter than said
    storage.pull_latest(url, checkpoint.problem_of_bytes)
    local = storage.local_dir(url)
    try:
        assert [p.name for p in checkpoint.list_checkpoints(local)] == ["ckpt-000000004.pt"]
        assert checkpoint.read(local / "ckpt-000000004.pt") == {"step": 4}
        assert _objects(fs, url) == ["ckpt-000000004.pt", "corrupt/ckpt-000000008.pt"]
    finally:
        storage.drop_staging(url)


def test_an_unreachable_s3_endpoint_is_one_line_and_exit_2(tmp_path: Path) -> None:
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}", "AWS_ACCESS_KEY_ID": "x",
           "AWS_SECRET_ACCESS_KEY": "y", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_EC2_METADATA_DISABLED": "true"}
    proc = run_cli("run", "--nproc-per-node", "2", "--dataset", "digits", "--epochs", "1",
                   "--metrics-port", "0", "--output-dir", "s3://nowhere/out",
                   "--checkpoint-dir", "s3://nowhere/ckpt", env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    assert errors[0].startswith("error: output.dir s3://nowhere/out: writing .probe-")
    assert "(fix: check AWS_ENDPOINT_URL" in errors[0]


def test_wrong_s3_credentials_are_one_line_and_exit_2(s3_server: Any) -> None:
    env = {**s3_server.env, "AWS_SECRET_ACCESS_KEY": "not-the-secret"}
    proc = run_cli("run", "--dataset", "digits", "--epochs", "1", "--metrics-port", "0",
                   "--output-dir", s3_server.url("denied/out"), env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "AWS_ACCESS_KEY_ID" in errors[0], proc.stderr


@pytest.mark.parametrize("args", [["export", "--checkpoint", "s3://b/ckpt", "--out", "model"],
                                  ["export", "--checkpoint", "ckpt", "--out", "s3://b/model"],
                                  ["evaluate", "--checkpoint", "s3://b/ckpt"]])
def test_an_s3_path_where_only_local_ones_work_is_one_line_and_exit_2(
        args: list[str], tmp_path: Path) -> None:
    proc = run_cli(*args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("error:") == 1 and "Traceback" not in proc.stderr
    assert "s3:// is supported only by checkpoint.dir, output.dir and data.dataset" in \
        proc.stderr
    assert list(tmp_path.iterdir()) == []  # nothing written (no local folder named s3:)


def test_a_failed_final_upload_is_raised_by_the_wait_and_keeps_the_checkpoints_in_the_store(
        s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from trainer.components import storage
    from trainer.config import CheckpointConfig
    from trainer.errors import CheckpointUnsaved
    from trainer.loop.save_policy import Saver

    for key, value in s3_server.env.items():
        monkeypatch.setenv(key, value)
    url = s3_server.url("failing-upload")
    saver = Saver(CheckpointConfig(dir=url, every=1, keep=3, upload_retries=0), is_main=True)
    try:
        saver.save(1, lambda: {"step": 1})
        saver.wait()
        # the store turns the writes down from now on: the key was revoked
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "revoked")
        remote = storage.store(url, "checkpoint dir")
        monkeypatch.setattr(remote, "fs", storage.Store(url, "checkpoint dir").fs)
        saver.save(2, lambda: {"step": 2})
        with pytest.raises(CheckpointUnsaved, match=r"writing ckpt-000000002.pt failed"):
            saver.wait()
    finally:
        saver.writer.close()
        storage.drop_staging(url)
    assert _objects(s3_server.filesystem(), url) == ["ckpt-000000001.pt"]


def test_a_sigterm_mid_run_keeps_its_checkpoint_in_s3_and_the_rerun_resumes_there_exactly(
        s3_server: Any, tmp_path: Path) -> None:
    common = ["--nproc-per-node", "2", "--dataset", "digits", "--batch-size", "16", "--epochs",
              "8", "--metrics-port", "0", "--checkpoint-every", "40", "--log-every", "1"]
    full = run_cli("run", *common, "--output-dir", str(tmp_path / "full"))
    assert full.returncode == 0, full.stderr
    ckpt, out = s3_server.url("sigterm/ckpt"), s3_server.url("sigterm/out")
    argv = [sys.executable, "-m", "trainer", "run", *common, "--output-dir", out,
            "--checkpoint-dir", ckpt]
    env = {**os.environ, "PYTHONPATH": str(REPO), **s3_server.env}
    proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    seen: list[str] = []
    for line in proc.stderr:  # stopped once training is under way
        seen.append(line)
        if " step " in line:
            break
    proc.send_signal(signal.SIGTERM)
    stderr = "".join(seen) + proc.stderr.read()
    assert proc.wait(timeout=120) == 143, stderr
    stopped = re.search(r"stopped by SIGTERM at step (\d+); progress kept in checkpoint "
                        + re.escape(ckpt) + r"/ckpt-(\d{9})\.pt", stderr)
    assert stopped is not None and int(stopped[1]) == int(stopped[2]), stderr
    step = int(stopped[1])
    fs = s3_server.filesystem()
    assert f"ckpt-{step:09d}.pt" in _objects(fs, ckpt)

    rerun = run_cli("run", *common, "--output-dir", out, "--checkpoint-dir", ckpt,
                    env=s3_server.env)
    assert rerun.returncode == 0, rerun.stderr
    assert f"resumed from ckpt-{step:09d}.pt: step {step}" in rerun.stderr
    resumed = json.loads(fs.cat_file(out.removeprefix("s3://") + "/summary.json"))
    uninterrupted = read_json(tmp_path / "full" / "summary.json")
    assert resumed["resumed_from_step"] == step
    assert resumed["steps"] == uninterrupted["steps"]
    assert resumed["val_accuracy"] == uninterrupted["val_accuracy"]
    assert resumed["train_loss"] == pytest.approx(uninterrupted["train_loss"], rel=1e-12)


def test_the_s3_server_fixture_fails_with_the_build_error_when_weed_does_not_build(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tools.s3server
    from tests.support.s3 import S3ServerUnavailable, SeaweedS3

    def broken() -> Path:
        raise tools.s3server.BuildError("go build ... failed:\nno Go module proxy here")

    monkeypatch.setattr(tools.s3server, "weed", broken)
    with pytest.raises(S3ServerUnavailable, match=r"(?s)did not build: go build .* proxy here"):
        SeaweedS3(tmp_path).start()
