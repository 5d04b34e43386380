"""Where a run's outputs go (``output.dir``): checked before training, written atomically.

Outputs go only to the directory the user named (or the documented default ``outputs``); an
unusable one (a file, under ``/proc``, read-only) fails before the first step with one line,
not after training when ``summary.json`` is due.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from trainer.components import storage
from trainer.errors import LOOP, ConfigError, OutputError, missing

log = logging.getLogger(__name__)


def check_output_dir(directory: str, create: bool) -> None:
    """Fail now when outputs cannot be written to `directory`. `create` (the writing rank):
    create it and probe a file; otherwise only check that no existing part of the path is a
    file (nothing is created)."""
    where = "output.dir"
    fix = "point --output-dir at a writable directory"
    if not directory:
        raise ConfigError(f"{where} is empty", "name the directory, e.g. --output-dir outputs")
    if storage.is_remote(directory):
        if create:
            storage.check(directory, where)
        return
    path = Path(directory)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{where}: {directory} is not a directory", fix)
    why, loop_fix = missing(path, fix)
    if why == LOOP:  # mkdir would say "File exists"
        raise ConfigError(f"{where}: {directory} {why}", loop_fix)
    if not create:
        return
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".probe-"):
            pass
    except OSError as exc:
        raise ConfigError(f"{where}: {directory} is not writable ({exc.strerror})", fix) from None


def write_json(directory: str, name: str, payload: dict[str, Any]) -> Path:
    """Write `payload` atomically so a reader never sees half a file. When it cannot be written
    (a disk that filled up during the run) the earlier file stays, no temporary file is left,
    and the payload goes to the log as one line so that its values are not lost."""
    out = Path(directory)
    tmp = out / f".{name}.tmp"
    try:
        out.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, out / name)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        log.warning("%s not written; its content: %s", name, json.dumps(payload, sort_keys=True))
        raise OutputError(f"output.dir: {name} could not be written to {directory} "
                          f"({exc.strerror}); what the run wrote before is kept",
                          f"free space there (df -h {directory}) or pass another --output-dir; "
                          f"the values of {name} are in the WARNING line above") from None
    return out / name
