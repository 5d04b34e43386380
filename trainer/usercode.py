"""Errors raised by the user's code (their model, dataset, step or script) while training.

Such an error on one rank is the cause of the run's failure; the other ranks only see that
rank vanish (:class:`trainer.errors.RankLost`, exit 4). The failing rank therefore names it in
one line — the rank, the exception, the user's file and line — exits with
:data:`trainer.errors.USER_CODE_EXIT`, and leaves the line in torch's elastic error file
(``TORCHELASTIC_ERROR_FILE``), where ``ddp-trainer run`` and torchrun read the cause.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import sysconfig
import time
import traceback
from pathlib import Path

from trainer import termination
from trainer.errors import USER_CODE_EXIT, first_line

_PACKAGE = str(Path(__file__).resolve().parent) + os.sep  # trainer/
_STDLIB = str(Path(sysconfig.get_paths()["stdlib"]).resolve()) + os.sep
_WORKER_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<name>\S+)',
                           re.MULTILINE)
FIX = "fix the error in your code; rerun with --debug for the full traceback"


def _torch_dir() -> str | None:
    torch = sys.modules.get("torch")
    path = getattr(torch, "__file__", None)
    return str(Path(path).resolve().parent) + os.sep if path else None


def _resolved(filename: str) -> str:
    try:
        return str(Path(filename).resolve())
    except (OSError, RuntimeError):
        return filename


def _ours(filename: str) -> bool:
    return _resolved(filename).startswith(_PACKAGE)


def _library(filename: str) -> bool:
    """torch, the standard library, or not a file (``<frozen runpy>``, ``<string>``)."""
    if filename.startswith("<"):
        return True
    path = _resolved(filename)
    torch_dir = _torch_dir()
    return path.startswith(_STDLIB) or (torch_dir is not None and path.startswith(torch_dir))


def _frames(exc: BaseException) -> list[traceback.FrameSummary]:
    """`exc`'s traceback, followed by the frames of a DataLoader worker's original traceback
    (torch re-raises a worker's exception with that traceback as text in its message)."""
    frames = list(traceback.extract_tb(exc.__traceback__))
    text = str(exc)
    if "Original Traceback" in text:
        worker = text.partition("Original Traceback")[2]
        frames += [traceback.FrameSummary(m["file"], int(m["line"]), m["name"])
                   for m in _WORKER_FRAME.finditer(worker)]
    return frames


def user_frame(exc: BaseException) -> traceback.FrameSummary | None:
    """The innermost frame of the user's code below the last frame of this package: None when
    the error arose in this package (or in torch or the standard library called by it)."""
    frames = _frames(exc)
    torch_dir = _torch_dir()
    if frames and torch_dir is not None and \
            _resolved(frames[-1].filename).startswith(torch_dir + "distributed" + os.sep):
        return None  # a collective failed (in the user's code or not): a peer is the cause
    return innermost_user(frames)


def innermost_user(frames: list[traceback.FrameSummary]) -> traceback.FrameSummary | None:
    """The innermost frame of the user's code below the last frame of this package in
    `frames` (outermost first), or None."""
    last_ours = max((i for i, f in enumerate(frames) if _ours(f.filename)), default=-1)
    called = [f for f in frames[last_ours + 1:] if not _ours(f.filename)
              and not _library(f.filename)]
    if not called:
        return None
    outside_packages = [f for f in called
                        if "site-packages" not in f.filename and "dist-packages" not in f.filename]
    return (outside_packages or called)[-1]


def innermost_outside_libraries(frames: list[traceback.FrameSummary]
                                ) -> traceback.FrameSummary | None:
    """The innermost frame of `frames` in neither torch nor the standard library: this
    package's own where no user code is on the stack (a checkpoint writer stuck in a file's
    open is at checkpoint.py's line, not pathlib's)."""
    return next((f for f in reversed(frames) if not _library(f.filename)), None)


def describe(exc: BaseException, frame: traceback.FrameSummary) -> str:
    """``user code raised ValueError: ... at model.py:12 in forward``."""
    return (f"user code raised {type(exc).__name__}: "
            f"{_message(exc)} at {frame.filename}:{frame.lineno} in {frame.name}")


def _message(exc: BaseException) -> str:
    text = str(exc)
    if "Original Traceback" in text:  # a DataLoader worker's: its last line is the error
        lines = [line for line in text.splitlines() if line.strip()]
        text = lines[-1].partition(": ")[2] if lines else ""
    return first_line(text, 200, empty="(no message)")


def report(exc: BaseException) -> int | None:
    """Print the one line of a user-code error and record it for the launcher; return the
    exit code, or None when `exc` did not come from the user's code."""
    frame = user_frame(exc)
    if frame is None:
        return None
    rank = os.environ.get("RANK")
    line = describe(exc, frame)
    record(f"rank {rank}: {line}" if rank is not None else line)
    termination.report(f"{f'[rank {rank}] ' if rank is not None else ''}error: {line} "
                       f"(fix: {FIX})")
    return USER_CODE_EXIT


def record(line: str) -> None:
    """Write `line` as torch elastic's error file, which the agent reads as the failure's
    message (torch/distributed/elastic/multiprocessing/errors: ProcessFailure)."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    with contextlib.suppress(OSError):  # the printed line still names the cause
        Path(path).write_text(json.dumps({"message": line, "timestamp": int(time.time())}),
                              encoding="utf-8")
