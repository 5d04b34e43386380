"""Checkpoint uploads to an unreachable store: retried with a bounded backoff; mid-run the run
goes on from the last durable checkpoint (a warning, a metric); the checkpoint that ends a run
must be durable or the run stops with exit 203; no good checkpoint is ever deleted. Against a
real S3 server (SeaweedFS, tests/support/s3.py) killed and restarted, not a mock."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli
from tests.support.s3 import SeaweedS3
from trainer.components import retry, storage
from trainer.components.retry import Backoff, retried
from trainer.config import CheckpointConfig
from trainer.errors import UNSAVED_EXIT, CheckpointUnsaved, ConfigError, StorageError, exit_class
from trainer.loop.save_policy import Saver


@pytest.fixture
def own_s3(tmp_path: Path) -> Iterator[SeaweedS3]:
    """A server of this test alone: it is killed and restarted."""
    with SeaweedS3(tmp_path / "s3") as server:
        yield server


@pytest.fixture
def s3_env(own_s3: SeaweedS3, monkeypatch: pytest.MonkeyPatch) -> SeaweedS3:
    for key, value in own_s3.env.items():
        monkeypatch.setenv(key, value)
    return own_s3


def _checkpoints(server: SeaweedS3, url: str) -> list[str]:
    root = url.removeprefix("s3://")
    return sorted(str(p).rsplit("/", 1)[-1] for p in server.filesystem().find(root)
                  if re.search(r"/ckpt-\d{9}\.pt$", str(p)))


# -- the backoff ----------------------------------------------------------------------------

def test_pauses_double_from_one_second_and_stop_at_thirty() -> None:
    assert retry.pauses(Backoff(retries=7)) == [1, 2, 4, 8, 16, 30, 30]
    assert retry.pauses(Backoff(retries=0)) == []


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_retries_stop_at_the_deadline_and_the_error_names_the_tries(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    monkeypatch.setattr(retry, "pause", clock.sleep)
    calls = []

    def failing() -> None:
        calls.append(clock.now)
        raise StorageError("checkpoint dir s3://b/c: writing x failed (boom)", "check it")

    with pytest.raises(StorageError, match=r"gave up after 5 tries in 10\.0 s") as caught:
        retried(failing, Backoff(retries=10, deadline=10), "uploading x", clock=lambda: clock.now)
    # 1, 2, 4, then only the 3 s left of the deadline (not 8): no try starts after it
    assert clock.slept == [1, 2, 4, 3] and calls == [0, 1, 3, 7, 10]
    assert caught.value.fix == "check it"


def test_a_try_that_succeeds_after_failures_returns_its_value(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retry, "pause", lambda seconds: None)
    answers: list[Exception | str] = [StorageError("down", "x"), StorageError("down", "x"), "ok"]

    def call() -> str:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert retried(call, Backoff(retries=2), "uploading x") == "ok"


def test_an_error_that_is_not_the_stores_is_raised_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retry, "pause", lambda seconds: pytest.fail("retried a ConfigError"))

    def call() -> None:
        raise ConfigError("bad", "fix")

    with pytest.raises(ConfigError):
        retried(call, Backoff(retries=5), "uploading x")


def test_the_exit_class_of_an_unsaved_final_checkpoint_is_retryable() -> None:
    assert UNSAVED_EXIT == 203 and CheckpointUnsaved("p", "f").exit_code == 203
    assert exit_class(203) == "unsaved"
    assert 128 <= UNSAVED_EXIT <= 255  # the ExitCode restart policy retries this range


# -- a real store, killed and restarted -----------------------------------------------------

def _saver(url: str, reported: list[tuple[dict[str, float], int]],
           retries: int = 1, deadline: float = 3) -> Saver:
    cfg = CheckpointConfig(dir=url, every=1, keep=2, upload_retries=retries,
                           upload_deadline_seconds=deadline)
    return Saver(cfg, is_main=True, report=lambda values, step: reported.append(
        (dict(values), step)))


def test_a_store_down_mid_run_skips_that_checkpoint_and_the_final_one_must_be_durable(
        s3_env: SeaweedS3, caplog: pytest.LogCaptureFixture) -> None:
    url = s3_env.url("down-mid-run")
    reported: list[tuple[dict[str, float], int]] = []
    saver = _saver(url, reported)
    try:
        for step in (1, 2):
            saver.save(step, lambda s=step: {"step": s})
            saver.after_step(step + 1, 0, ends_epoch=False)  # as the loop does at each step
        saver.wait()
        assert _checkpoints(s3_env, url) == ["ckpt-000000001.pt", "ckpt-000000002.pt"]

        s3_env.kill()
        with caplog.at_level(logging.WARNING, logger="trainer.loop.save_policy"):
            saver.save(3, lambda: {"step": 3})
            saver.save(4, lambda: {"step": 4})  # settles step 3's failed upload first
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1, warnings
        assert warnings[0].startswith("checkpoint of step 3 skipped, training goes on (the last "
                                      f"durable checkpoint is step 2, {url}/ckpt-000000002.pt)")
        assert "gave up after 2 tries" in warnings[0]
        assert saver.failed_saves == 1 and saver.durable_step == 2
        assert ({"checkpoint/failed_saves": 1.0}, 3) in reported

        s3_env.restart()  # the store is back before step 4's upload gave up, or after
        saver.save(5, lambda: {"step": 5})
        saver.wait()
        assert saver.durable_step == 5
        assert ({"checkpoint/durable_step": 5.0}, 5) in reported
        # keep=2: step 2 went only once step 5 was durable (4 is uploaded or skipped)
        assert _checkpoints(s3_env, url)[-1] == "ckpt-000000005.pt"
        assert "ckpt-000000002.pt" not in _checkpoints(s3_env, url)

        s3_env.kill()
        saver.save(6, lambda: {"step": 6})
        with pytest.raises(CheckpointUnsaved) as caught:
            saver.wait()
        assert caught.value.problem.startswith(
            "the checkpoint of step 6 could not be uploaded: checkpoint dir " + url)
        assert caught.value.problem.endswith(
            f"the last durable checkpoint is step 5, {url}/ckpt-000000005.pt")
        assert "AWS_ENDPOINT_URL" in caught.value.fix
    finally:
        saver.writer.close()
        storage.drop_staging(url)
    s3_env.restart()
    assert "ckpt-000000005.pt" in _checkpoints(s3_env, url)  # the durable one is kept
    assert "ckpt-000000006.pt" not in _checkpoints(s3_env, url)


def test_a_store_back_before_the_retries_run_out_loses_no_checkpoint(
        s3_env: SeaweedS3, monkeypatch: pytest.MonkeyPatch) -> None:
    url = s3_env.url("back-in-time")
    reported: list[tuple[dict[str, float], int]] = []
    saver = _saver(url, reported, retries=3, deadline=120)
    restarted = []

    def restart_during_the_first_pause(seconds: float) -> None:
        if not restarted:
            restarted.append(seconds)
            s3_env.restart()

    monkeypatch.setattr(retry, "pause", restart_during_the_first_pause)
    try:
        saver.save(1, lambda: {"step": 1})
        saver.wait()
        s3_env.kill()
        saver.save(2, lambda: {"step": 2})
        saver.wait()
    finally:
        saver.writer.close()
        storage.drop_staging(url)
    assert restarted == [1.0]  # the first try failed: the store was down
    assert saver.failed_saves == 0 and saver.durable_step == 2
    assert _checkpoints(s3_env, url) == ["ckpt-000000001.pt", "ckpt-000000002.pt"]


COMMON = ["--nproc-per-node", "2", "--dataset", "digits", "--batch-size", "16", "--metrics-port",
          "0", "--checkpoint-every", "20", "--log-every", "1",
          "--set", "checkpoint.upload_retries=1", "--set", "checkpoint.upload_deadline_seconds=2"]


def _start(server: SeaweedS3, tmp_path: Path, ckpt: str, out: str,
           *args: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "trainer", "run", *COMMON, *args, "--output-dir", out,
            "--checkpoint-dir", ckpt]
    env = {**os.environ, "PYTHONPATH": str(REPO), **server.env}
    return subprocess.Popen(argv, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)


def _kill_after_first_checkpoint(server: SeaweedS3, proc: subprocess.Popen[str],
                                 ckpt: str) -> list[str]:
    """Kill the store once a checkpoint of the run is durable there; those durable."""
    deadline = time.monotonic() + 180
    while not _checkpoints(server, ckpt):
        assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint made"
        time.sleep(0.1)
    durable = _checkpoints(server, ckpt)
    server.kill()
    return durable


def _line(stderr: str, ckpt: str) -> re.Match[str]:
    """Rank 0's verdict, the one error line every rank left with."""
    errors = {line.split("] ", 1)[1] for line in stderr.splitlines() if "] error: " in line}
    assert len(errors) == 1, stderr
    found = re.fullmatch(
        r"error: the checkpoint of step (\d+) could not be uploaded: checkpoint dir "
        + re.escape(ckpt) + r": writing ckpt-\d{9}\.pt failed \(EndpointConnectionError: .*\); "
        r"gave up after \d tr(?:y|ies) in [\d.]+ s; the last durable checkpoint is step (\d+), "
        + re.escape(ckpt) + r"/ckpt-(\d{9})\.pt \(fix: check AWS_ENDPOINT_URL.*\)",
        errors.pop())
    assert found is not None and int(found[2]) == int(found[3]), stderr
    return found


def test_a_store_down_at_the_end_of_training_exits_203_and_the_rerun_resumes_the_durable_one(
        s3_env: SeaweedS3, tmp_path: Path) -> None:
    # 2000 steps, a checkpoint every 500: 1500 steps (~8 s) after the first checkpoint even
    # before the store dies, for the listing that spots that checkpoint on a loaded machine
    # (400 steps took 2 s, and the run ended first once); then each save waits out its retry
    # (~3 s), so few saves (every 100 took a minute)
    ckpt, out = s3_env.url("end-down/ckpt"), s3_env.url("end-down/out")
    longer = ("--epochs", "100", "--max-steps", "2000", "--checkpoint-every", "500")
    proc = _start(s3_env, tmp_path, ckpt, out, *longer)
    try:
        durable = _kill_after_first_checkpoint(s3_env, proc, ckpt)
        _, stderr = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == UNSAVED_EXIT, stderr
    assert "Traceback" not in stderr
    assert "skipped, training goes on (the last durable checkpoint is step" in stderr
    verdict = _line(stderr, ckpt)
    s3_env.restart()
    # what was durable when the store died is kept (an upload under way then may have landed)
    after = _checkpoints(s3_env, ckpt)
    assert set(durable) <= set(after) and "ckpt-000002000.pt" not in after
    assert int(verdict[1]) == 2000 and f"ckpt-{int(verdict[2]):09d}.pt" == after[-1]

    rerun = run_cli("run", *COMMON, *longer, "--output-dir", out, "--checkpoint-dir", ckpt,
                    env=s3_env.env)
    assert rerun.returncode == 0, rerun.stderr
    assert f"resumed from {after[-1]}: step {int(verdict[2])}" in rerun.stderr


def test_a_sigterm_while_the_store_is_down_leaves_with_the_unsaved_line_and_keeps_the_durable(
        s3_env: SeaweedS3, tmp_path: Path) -> None:
    ckpt, out = s3_env.url("sigterm-down/ckpt"), s3_env.url("sigterm-down/out")
    proc = _start(s3_env, tmp_path, ckpt, out, "--epochs", "50")
    assert proc.stderr is not None
    seen: list[str] = []
    try:
        durable = _kill_after_first_checkpoint(s3_env, proc, ckpt)
        for line in proc.stderr:  # training goes on without its store
            seen.append(line)
            if "skipped, training goes on" in line:
                break
        proc.send_signal(signal.SIGTERM)
        stderr = "".join(seen) + proc.stderr.read()
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    # The launcher was stopped: 143, as any preemption (retried by the ExitCode policy)
    assert code == 143, stderr
    assert "Traceback" not in stderr
    verdict = _line(stderr, ckpt)
    s3_env.restart()
    after = _checkpoints(s3_env, ckpt)
    assert set(durable) <= set(after) and f"ckpt-{int(verdict[1]):09d}.pt" not in after
    assert f"ckpt-{int(verdict[2]):09d}.pt" == after[-1]
