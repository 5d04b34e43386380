"""The cluster's processes: started detached (they outlive `make cluster-up`), each with a
pid file and a log under the state folder, stopped by `down`."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from tools.cluster.layout import Paths


class ClusterError(RuntimeError):
    """The cluster could not be brought up or down; the message names what and the log."""


def wait_for(check: Callable[[], bool], timeout: float, what: str, log: Path | None = None,
             alive: Callable[[], bool] | None = None) -> None:
    """Polls `check` until it holds; fails naming `what` (and the log's tail) at `timeout`
    or as soon as `alive` says the process it waits on has exited."""
    deadline = time.monotonic() + timeout
    while not check():
        if alive is not None and not alive():
            raise ClusterError(f"{what}: the process exited{_tail(log)}")
        if time.monotonic() > deadline:
            raise ClusterError(f"{what}: not after {timeout:.0f} s{_tail(log)}")
        time.sleep(0.5)


def _tail(log: Path | None, lines: int = 15) -> str:
    if log is None or not log.exists():
        return ""
    text = log.read_text(errors="replace").splitlines()[-lines:]
    return f" (log {log}):\n" + "\n".join(text)


def pid_of(paths: Paths, name: str) -> int | None:
    """The pid of a running process we started under `name`, else None."""
    pidfile = paths.pids / f"{name}.pid"
    try:
        pid = int(pidfile.read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return None if _exited(pid) else pid


def start(paths: Paths, name: str, argv: Sequence[str],
          env: dict[str, str] | None = None) -> tuple[int, bool]:
    """(pid, started now): a process already running under `name` is reused."""
    running = pid_of(paths, name)
    if running is not None:
        return running, False
    paths.logs.mkdir(parents=True, exist_ok=True)
    paths.pids.mkdir(parents=True, exist_ok=True)
    log = paths.logs / f"{name}.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                env={**os.environ, **(env or {})})
    (paths.pids / f"{name}.pid").write_text(f"{proc.pid}\n")
    return proc.pid, True


def alive(paths: Paths, name: str) -> Callable[[], bool]:
    return lambda: pid_of(paths, name) is not None


def stop(paths: Paths, name: str, grace: float = 15) -> None:
    pid = pid_of(paths, name)
    if pid is not None:
        kill_and_wait(pid, grace)
    (paths.pids / f"{name}.pid").unlink(missing_ok=True)


def kill_and_wait(pid: int, grace: float | None) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds (None: SIGKILL only, as a power cut ends a
    process); returns once the process is gone."""
    steps = ((signal.SIGKILL, 10.0),) if grace is None else (
        (signal.SIGTERM, grace), (signal.SIGKILL, 10.0))
    for sig, wait in steps:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            if _exited(pid):
                return
            time.sleep(0.2)


def _exited(pid: int) -> bool:
    """Every thread of `pid` has exited. The leader of a Go program turns zombie while its other
    threads are still tearing down and holding the listening sockets (a restarted API server then
    failed with "bind: address already in use"; seen in CI), so one zombie thread is not enough."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return True
    for task in tasks:
        try:
            state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X"):
            return False
    return True


def pids_matching(fragment: str) -> list[int]:
    """Pids whose command line contains `fragment` (the runtime's shims, say)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if fragment in cmdline and int(proc.name) != os.getpid():
                found.append(int(proc.name))
    return found
