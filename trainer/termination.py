"""The one-line error where users look: printed on stderr, and left as the container's
termination message, which ``kubectl describe pod`` and ``ddp-trainer jobs status`` show.

The kubelet creates the file at the container's ``terminationMessagePath`` (default
``/dev/termination-log``) before the container starts and reads at most 4096 bytes of it after
the container ends (Kubernetes docs, "Determine the Reason for Pod Failure"). The line is
written only into a file that already exists: nothing is created outside a container.
Under ``ddp-trainer run`` the launcher writes the message, the cause rank's line (see
:func:`trainer.ranks.launcher.launch`); its ranks leave their lines in torch elastic's error file
instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path

ENV = "DDP_TRAINER_TERMINATION_LOG"
"""The termination message file; empty: write none (the launcher's ranks)."""
DEFAULT = "/dev/termination-log"
LIMIT = 4096
"""Bytes the kubelet reads of the file."""
LINE_KEY = "line"
"""The printed line, beside the message in torch elastic's error file."""
DEFERRED_ENV = "DDP_TRAINER_LAUNCHER_PRINTS"
"""Set by the launcher for its ranks: a bad-input line goes only into the error file, and the
launcher prints it once for all the ranks that agree (8 copies on an 8-GPU pod were noise)."""
PRINTED_KEY = "printed"
"""False beside a line the rank left for the launcher to print."""
TIME_KEY = "time"
"""When the line was recorded, in seconds with a fraction: torch elastic's own timestamp is whole
seconds, too coarse to tell which of two ranks failed first."""


def report(line: str, deferrable: bool = False) -> None:
    """Print `line` on stderr and leave it where Kubernetes and the launcher read it; a
    `deferrable` line (bad input, the same on every rank) only the launcher prints, when it
    asked for that (:data:`DEFERRED_ENV`)."""
    if deferrable and os.environ.get(DEFERRED_ENV) and os.environ.get("TORCHELASTIC_ERROR_FILE"):
        record(line, printed=False)
        return
    # One write of the line and its newline: print() makes two, and with PYTHONUNBUFFERED (the
    # image, the operators) each is a write(2) of its own, so the lines of ranks that share a
    # pipe came out as "[rank 0] error: ...[rank 1] error: ...\n\n" (seen in a loaded CI run).
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
    write(line)
    record(line)


def target() -> Path | None:
    """The termination message file this process writes, if any: it exists (in a container)."""
    name = os.environ.get(ENV, DEFAULT)
    return Path(name) if name and Path(name).is_file() else None


def write(line: str, path: Path | None = None) -> None:
    """`line` as the container's termination message, into `path` (default: :func:`target`)."""
    path = path or target()
    if path is None:
        return
    # A path's undecodable byte is a lone surrogate here (\udcff), which UTF-8 refuses: written as
    # the `\udcff` escape, as stderr shows it.
    data = line.encode("utf-8", "backslashreplace")[:LIMIT - 1].decode("utf-8", "ignore")
    with contextlib.suppress(OSError):  # read-only or gone: the printed line still tells
        path.write_text(data + "\n", encoding="utf-8")


def record(line: str, printed: bool = True) -> None:
    """`line` into torch elastic's error file (``TORCHELASTIC_ERROR_FILE``, set by the agent
    for each rank), kept beside a message already there: the launcher reads it as the rank's
    failure (:attr:`ProcessFailure.error_file_data`)."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    data: dict[str, object] = {}
    with contextlib.suppress(OSError, ValueError):
        found = json.loads(Path(path).read_text(encoding="utf-8"))
        data = found if isinstance(found, dict) else {}
    now = time.time()
    data.setdefault("message", line)
    data.setdefault("timestamp", int(now))
    data[LINE_KEY] = line
    data[TIME_KEY] = now
    data[PRINTED_KEY] = printed
    with contextlib.suppress(OSError):
        Path(path).write_text(json.dumps(data), encoding="utf-8")


def time_of(error_file_data: object) -> float | None:
    """When a rank recorded its line (see :func:`record`), or None."""
    if isinstance(error_file_data, dict) and isinstance(error_file_data.get(TIME_KEY), float):
        return float(error_file_data[TIME_KEY])
    return None


def line_of(error_file_data: object) -> str | None:
    """The line a rank recorded (see :func:`record`), or None."""
    if isinstance(error_file_data, dict) and isinstance(error_file_data.get(LINE_KEY), str):
        return str(error_file_data[LINE_KEY])
    return None


def unprinted_of(error_file_data: object) -> str | None:
    """The line a rank recorded and left for the launcher to print (see :func:`report`)."""
    if isinstance(error_file_data, dict) and error_file_data.get(PRINTED_KEY) is False:
        return line_of(error_file_data)
    return None
