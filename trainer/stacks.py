"""Stacks of a hung rank: every thread's, printed to its log, and the line its main thread is
at, for the verdict. DataLoader workers are other processes: each registers faulthandler on
SIGUSR1 when it starts (:func:`dump_on_signal`) and prints its own when the watchdog signals it.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
import threading
import time
import traceback
from typing import TextIO

from trainer.usercode import innermost_outside_libraries, innermost_user

DUMP_SIGNAL = signal.SIGUSR1


def dump_on_signal() -> None:
    """In a DataLoader worker: print all its threads' stacks to stderr on :data:`DUMP_SIGNAL`
    (faulthandler's handler is C code: it prints even while the worker's Python is stuck)."""
    with contextlib.suppress(ValueError, OSError, RuntimeError, AttributeError):
        faulthandler.register(DUMP_SIGNAL, file=sys.stderr, all_threads=True)


def _stack(ident: int) -> list[traceback.FrameSummary]:
    frame = sys._current_frames().get(ident)
    return traceback.extract_stack(frame) if frame is not None else []


def where(ident: int, fallback: bool = False) -> str:
    """``file.py:8 in step``: the innermost line of the user's code in thread `ident`'s stack,
    else (with `fallback`) its innermost line outside torch and the standard library, else its
    innermost; empty when there is none."""
    frames = _stack(ident)
    frame = innermost_user(frames)
    if frame is None and fallback and frames:
        frame = innermost_outside_libraries(frames) or frames[-1]
    if frame is None:
        return ""
    name = os.path.relpath(frame.filename) if not frame.filename.startswith("<") else ""
    name = frame.filename if not name or name.startswith("..") else name
    return f"{name}:{frame.lineno} in {frame.name}"


def thread_named(prefix: str) -> int | None:
    """The ident of a live thread whose name starts with `prefix` (the checkpoint writer)."""
    for thread in threading.enumerate():
        if thread.name.startswith(prefix) and thread.ident is not None:
            return thread.ident
    return None


def dump(header: str, out: TextIO | None = None) -> None:
    """Every thread's Python stack but the caller's, under `header`, in one write."""
    out = out or sys.stderr
    names = {t.ident: t.name for t in threading.enumerate()}
    own = threading.get_ident()
    parts = [f"{header}\n"]
    for ident, frame in sys._current_frames().items():
        if ident == own:
            continue
        parts.append(f"Thread {names.get(ident, ident)} (most recent call last):\n")
        parts.extend(traceback.format_stack(frame))
    with contextlib.suppress(OSError, ValueError):
        out.write("".join(parts))
        out.flush()


def signal_workers(pids: list[int], within: float = 2.0) -> list[int]:
    """Ask DataLoader workers `pids` to print their stacks; those signalled. Returns once
    each has taken the signal (or after `within` seconds): a rank that left at once had its
    workers killed before a loaded machine ran them, and their stacks were lost (a CI run)."""
    signalled = []
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, DUMP_SIGNAL)
            signalled.append(pid)
    deadline = time.monotonic() + within
    while any(_pending(pid) for pid in signalled) and time.monotonic() < deadline:
        time.sleep(0.01)
    return signalled


def _pending(pid: int) -> bool:
    """DUMP_SIGNAL is still pending for `pid` (its /proc status; False where there is none)."""
    bit = 1 << (DUMP_SIGNAL - 1)
    try:
        with open(f"/proc/{pid}/status") as status:
            masks = [int(line.split()[1], 16) for line in status
                     if line.startswith(("SigPnd:", "ShdPnd:"))]
    except (OSError, ValueError, IndexError):
        return False
    return any(mask & bit for mask in masks)
