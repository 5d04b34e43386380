"""A rank of ``ddp-trainer run`` dies with its launcher.

Killed with SIGKILL, the launcher cannot stop its ranks: they trained on, reparented to PID 1,
holding the GPUs and the directories. A rank asks the kernel for SIGKILL when its parent dies
(``PR_SET_PDEATHSIG``, Linux); elsewhere nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys

ENV = "DDP_TRAINER_LAUNCHER_PID"
"""The launcher's pid, set for its ranks: a rank whose parent is another process already lost
it (it died before the rank asked for the signal)."""

PR_SET_PDEATHSIG = 1


def die_with_launcher() -> None:
    """When this process is a rank of our launcher (:data:`ENV`), end it when the launcher
    ends; at once when the launcher is gone already. The variable is dropped so that a process
    this rank starts is not taken for a rank."""
    launcher = os.environ.pop(ENV, "")
    if not launcher.isdigit() or not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):  # no libc or no prctl: as before
        return
    if os.getppid() != int(launcher):  # it died before the request: no signal will come
        os._exit(128 + int(signal.SIGKILL))
