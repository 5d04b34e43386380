"""The one-line error left as the container's termination message (trainer/termination.py):
written into the file the kubelet made, one message per container under `run`, nothing
written where no such file exists."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from tests.conftest import REPO, run_cli
from trainer import termination
from trainer.errors import Preempted, exit_class
from trainer.ranks.launcher import cause_line, exit_code_of
from trainer.ranks.rank_lines import print_deferred


def kubelet_file(tmp_path: Path) -> Path:
    """An empty termination message file, as the kubelet makes it before the container."""
    path = tmp_path / "termination-log"
    path.touch()
    return path


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "error: " in line]


def test_a_config_error_is_the_termination_message_exactly_as_printed(tmp_path: Path) -> None:
    path = kubelet_file(tmp_path)
    proc = run_cli("train", "--set", "train.epochs=many", "--output-dir", str(tmp_path / "o"),
                   env={termination.ENV: str(path)})
    assert proc.returncode == 2
    (line,) = error_lines(proc.stderr)
    assert path.read_text() == line + "\n"
    assert "train.epochs" in line and "(fix: " in line


def test_a_usage_error_is_the_termination_message_too(tmp_path: Path) -> None:
    path = kubelet_file(tmp_path)
    proc = run_cli("train", "--epochs", "x", env={termination.ENV: str(path)})
    assert proc.returncode == 2
    assert path.read_text() == proc.stderr


def test_no_file_is_created_where_the_kubelet_made_none(tmp_path: Path) -> None:
    path = tmp_path / "termination-log"
    proc = run_cli("train", "--set", "train.epochs=many", env={termination.ENV: str(path)})
    assert proc.returncode == 2
    assert not path.exists()


def test_run_leaves_one_message_the_cause_ranks_line(tmp_path: Path) -> None:
    path = kubelet_file(tmp_path)
    proc = run_cli("run", "--nproc-per-node", "2", "--dataset", "synthetic", "--lr", "1e30",
                   "--output-dir", str(tmp_path / "out"), "--metrics-port", "0",
                   env={termination.ENV: str(path)})
    assert proc.returncode == 3
    message = path.read_text()
    assert message.count("\n") == 1 and "loss became" in message, message
    assert message.rstrip("\n") in error_lines(proc.stderr), (message, proc.stderr)
    assert exit_class(proc.returncode) == "diverged"


def test_a_rank_killed_by_a_signal_is_named_with_its_exit(tmp_path: Path) -> None:
    # Killed (the OOM killer's SIGKILL) it left no line: the launcher names the rank and how.
    killed = ProcessFailure(local_rank=1, pid=4242, exitcode=-9,
                            error_file=str(tmp_path / "none.json"))
    err = ChildFailedError("trainer", {1: killed})
    line = cause_line(err)
    assert line.startswith("error: rank 1 was killed by SIGKILL; the run lost it (exit 4)"), line
    assert exit_code_of(err) == 4  # a lost rank, as docs/checkpoints.md says
    assert "(fix: " in line


def _recorded(tmp_path: Path, rank: int, code: int, line: str, at: float,
              monkeypatch: pytest.MonkeyPatch) -> ProcessFailure:
    """Rank `rank`'s failure as the agent reads it, after the rank recorded `line` at `at`."""
    path = tmp_path / f"error-{rank}.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    monkeypatch.setattr(termination.time, "time", lambda: at)
    termination.record(line)
    return ProcessFailure(local_rank=rank, pid=4000 + rank, exitcode=code, error_file=str(path))


@pytest.mark.parametrize("follower", [143, -15, 4])
def test_a_rank_stopped_after_another_failed_in_the_same_second_is_not_the_cause(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, follower: int) -> None:
    # Rank 1 exits 2; the agent then stops rank 0 (SIGTERM: exit 143, or -15 before its handler)
    # or rank 0 sees it vanish (4). Whole-second timestamps tie: rank 0 was reported.
    cause = "[rank 1] error: the model returns 3 logits per sample but a label is 4 (fix: x)"
    first = _recorded(tmp_path, 1, 2, cause, 1000.2, monkeypatch)
    then = _recorded(tmp_path, 0, follower, "[rank 0] error: stopped (fix: y)", 1000.7,
                     monkeypatch)
    err = ChildFailedError("trainer", {0: then, 1: first})
    assert first.timestamp == then.timestamp == 1000
    assert (exit_code_of(err), cause_line(err)) == (2, cause)


def test_of_two_ranks_failing_on_their_own_the_earlier_is_the_cause(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    late = _recorded(tmp_path, 0, 3, "[rank 0] error: late (fix: x)", 1000.9, monkeypatch)
    early = _recorded(tmp_path, 1, 2, "[rank 1] error: early (fix: y)", 1000.1, monkeypatch)
    err = ChildFailedError("trainer", {0: late, 1: early})
    assert cause_line(err) == "[rank 1] error: early (fix: y)"


def test_the_termination_message_is_cut_to_the_kubelets_4096_bytes(tmp_path: Path) -> None:
    path = kubelet_file(tmp_path)
    termination.write("é" * 3000, path)  # 6000 bytes
    assert len(path.read_bytes()) <= termination.LIMIT


def test_exit_classes_name_each_documented_exit_code() -> None:
    assert [exit_class(code) for code in (2, 3, 4, 5, 143, 203, 137, 1)] == [
        "config", "diverged", "lost peer", "user code", "preempted", "unsaved", "killed",
        "error"]
    assert exit_class(137, "OOMKilled") == "OOM-killed"


class _Writes:
    """A stderr that keeps each write call, as an unbuffered pipe passes each to write(2)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def write(self, text: str) -> int:
        self.calls.append(text)
        return len(text)

    def flush(self) -> None:
        pass


def test_the_error_line_is_one_write_so_ranks_sharing_a_pipe_never_interleave(
        monkeypatch: pytest.MonkeyPatch) -> None:
    stderr = _Writes()
    monkeypatch.setattr("sys.stderr", stderr)
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    monkeypatch.setenv(termination.ENV, "")
    termination.report("[rank 1] error: training loss became nan (fix: lower --lr)")
    assert stderr.calls == ["[rank 1] error: training loss became nan (fix: lower --lr)\n"]


def handles_sigterm(pid: int) -> bool:
    """Whether the process has a handler of its own for SIGTERM (SigCgt in /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    return False


def test_sigterm_to_the_trainer_as_pid_1_while_it_starts_ends_it_at_once_with_143(
        tmp_path: Path) -> None:
    # PID 1 of its own PID namespace, as the trainer is in its container: a signal it has no
    # handler for is ignored there, so a pod stopped in its first seconds waited out its grace
    # period. The SIGTERM goes out as soon as the first handler is in place, while torch is
    # still importing (a second or more), long before training's own handler would be.
    ckpt = tmp_path / "ckpt"
    proc = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--kill-child", sys.executable, "-m", "trainer", "train",
         "--dataset", "digits", "--epochs", "1000", "--metrics-port", "0",
         "--checkpoint-dir", str(ckpt), "--output-dir", str(tmp_path / "out")],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stderr=subprocess.PIPE,
        text=True)
    try:
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
        deadline = time.monotonic() + 60
        trainer_pid = 0
        while not (trainer_pid and handles_sigterm(trainer_pid)):
            assert time.monotonic() < deadline and proc.poll() is None, "the trainer never began"
            found = children.read_text().split() if children.exists() else []
            trainer_pid = int(found[0]) if found else 0
            time.sleep(0.002)
        os.kill(trainer_pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == Preempted.exit_code, err
    # stopped before training began: training's own handler would have checkpointed first
    assert not ckpt.exists() and "Traceback" not in err, err


def test_a_line_with_an_undecodable_byte_is_the_termination_message_escaped(
        tmp_path: Path) -> None:
    path = kubelet_file(tmp_path)
    dataset = os.fsdecode(bytes(tmp_path) + b"/data\xff.npz")
    proc = run_cli("train", "--dataset", dataset, "--output-dir", str(tmp_path / "o"),
                   env={termination.ENV: str(path)})
    assert proc.returncode == 2, proc.stderr
    (line,) = error_lines(proc.stderr)
    assert "data\\udcff.npz" in line
    assert path.read_text(encoding="utf-8") == line + "\n"
FINALIZER_SIGTERM = """
import os, signal, weakref
from trainer.distributed.preemption import stopped_while_starting

class Part:
    pass

def finalize(ref):
    # the signal lands while Python runs this callback, as during an import's garbage collection
    os.kill(os.getpid(), signal.SIGTERM)
    for _ in range(100000):
        pass

with stopped_while_starting():
    part = Part()
    ref = weakref.ref(part, finalize)
    del part
    print("went on after SIGTERM", flush=True)
"""


def test_sigterm_while_starting_inside_a_finalizer_still_ends_the_process_with_143() -> None:
    # Raised in the handler, SystemExit inside a weakref callback was printed as "Exception
    # ignored" and dropped: the run went on training.
    proc = subprocess.run([sys.executable, "-c", FINALIZER_SIGTERM], cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == Preempted.exit_code, (proc.stdout, proc.stderr)
    assert "went on" not in proc.stdout and "Exception ignored" not in proc.stderr, proc.stderr


def _run_killing_a_rank(tmp_path: Path, training: bool) -> subprocess.CompletedProcess[str]:
    """`run` of 2 ranks whose rank 1 gets SIGKILL (the OOM killer's signal), as soon as it is
    started, or once the run trains (wrote a checkpoint)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PET_", "TORCHELASTIC_", "RANK", "WORLD_SIZE", "LOCAL_RANK"))}
    ckpt = tmp_path / "ckpt"
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer", "run", "--nproc-per-node", "2", "--dataset",
         "synthetic", "--epochs", "100000", "--metrics-port", "0", "--checkpoint-dir", str(ckpt),
         "--checkpoint-every", "1", "--output-dir", str(tmp_path / "out")],
        cwd=REPO, env={**env, "PYTHONPATH": str(REPO)}, stderr=subprocess.PIPE, text=True)
    try:
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
        deadline = time.monotonic() + 120
        victim = 0
        while not victim:
            assert time.monotonic() < deadline and proc.poll() is None, "no rank started"
            for pid in children.read_text().split():
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                if b"LOCAL_RANK=1" in environ and (not training or any(ckpt.glob("ckpt-*"))):
                    victim = int(pid)
            time.sleep(0.01)
        os.kill(victim, signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    return subprocess.CompletedProcess(proc.args, proc.returncode, "", err)


@pytest.mark.parametrize("training", [True, False], ids=["training", "starting"])
def test_a_rank_killed_under_run_is_a_lost_rank_named_in_one_line(
        tmp_path: Path, training: bool) -> None:
    proc = _run_killing_a_rank(tmp_path, training)
    assert proc.returncode == 4, proc.stderr
    (line,) = [line for line in error_lines(proc.stderr) if line.startswith("error: ")]
    assert line.startswith("error: rank 1 was killed by SIGKILL") and "(fix: " in line, line
    assert "Traceback" not in proc.stderr, proc.stderr


def _deferred(tmp_path: Path, rank: int, line: str,
              monkeypatch: pytest.MonkeyPatch) -> ProcessFailure:
    """Rank `rank` failed with a bad-input `line` it left for the launcher to print."""
    path = tmp_path / f"deferred-{rank}.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    monkeypatch.setenv(termination.DEFERRED_ENV, "1")
    monkeypatch.setenv(termination.ENV, "")
    termination.report(line, deferrable=True)
    return ProcessFailure(local_rank=rank, pid=4000 + rank, exitcode=2, error_file=str(path))


def test_a_line_every_rank_agrees_on_is_printed_once_a_rank_of_its_own_keeps_its_prefix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    bad = "error: data.npz is not a readable .npz file (fix: re-create it)"
    failures = {rank: _deferred(tmp_path, rank, f"[rank {rank}] {bad}", monkeypatch)
                for rank in range(3)}
    failures[3] = _deferred(tmp_path, 3, "[rank 3] error: port 9313 is in use (fix: x)",
                            monkeypatch)
    assert capsys.readouterr().err == ""  # the ranks printed nothing
    print_deferred(ChildFailedError("trainer", failures))
    assert capsys.readouterr().err.splitlines() == [
        bad, "[rank 3] error: port 9313 is in use (fix: x)"]


def test_a_bad_input_line_under_run_is_printed_once_not_once_per_rank(tmp_path: Path) -> None:
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not an npz at all")
    proc = run_cli("run", "--nproc-per-node", "3", "--dataset", str(bad), "--metrics-port", "0",
                   "--output-dir", str(tmp_path / "out"))
    assert proc.returncode == 2, proc.stderr
    (line,) = error_lines(proc.stderr)
    assert "bad.npz is not a readable .npz" in line and "(fix: " in line, line
