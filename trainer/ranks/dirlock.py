"""A run holds its output and checkpoint directories: a second run given one of them while the
first still runs is refused, before it writes anything.

Two runs writing one directory interleave their checkpoints and the last to finish replaces
the other's ``summary.json`` (seen: both exited 0, the second run's files were the first's
model). The hold is a POSIX record lock (``fcntl``) on :data:`LOCK_NAME` in the directory,
taken by rank 0 only (the other ranks of the same run write there through it). The kernel drops
it when the process ends, however it ends, so a run resumed after the first died takes it
again; unlike ``flock`` it is not inherited by forked children, so a DataLoader worker still
leaving a killed rank cannot hold it against the rank restarted in its place. NFS keeps such
locks on the server, so runs on different nodes sharing a volume exclude each other too; a
filesystem without locks leaves the directory unheld (a warning), as before.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
from pathlib import Path

from trainer.errors import ConfigError

log = logging.getLogger(__name__)

LOCK_NAME = ".ddp-trainer.lock"
"""The file each held directory keeps, empty (it stays after the run; only its lock goes:
removing it would let a third run lock a new file while the second waits on the old one)."""


class Held:
    """The directories this process holds; :meth:`release` lets them go."""

    def __init__(self) -> None:
        self._fds: dict[tuple[int, int], int] = {}

    def take(self, directory: Path, what: str, fix: str) -> None:
        """Hold `directory` (named `what` in the error) or fail with one line; a directory held
        already (the output and checkpoint directories may be one) is held once."""
        # told apart before opening: closing a second descriptor of a locked file would drop
        # this process's POSIX lock on it
        key = (directory.stat().st_dev, directory.stat().st_ino)
        if key in self._fds:
            return
        try:
            fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise ConfigError(f"{what}: {directory} cannot hold its lock file {LOCK_NAME} "
                              f"({exc.strerror})", fix) from None
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                os.close(fd)
                log.warning("%s: %s cannot be locked (%s): another run given it is not "
                            "refused", what, directory, exc.strerror)
                return
            os.close(fd)
            raise ConfigError(f"{what}: {directory} is in use by another run; two "
                              "runs writing one directory replace each other's checkpoints "
                              "and summary.json", f"wait for that run to end, or {fix}") from None
        self._fds[key] = fd

    def release(self) -> None:
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()

