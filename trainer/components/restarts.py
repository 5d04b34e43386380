"""How often each rank started in a checkpoint directory: pod restarts made visible."""

from __future__ import annotations

import os
from pathlib import Path

from trainer.errors import CheckpointError


def count_start(directory: Path, rank: int) -> int:
    """Count one more start of `rank` in `directory` and return the count (1 = first).

    The count lives beside the checkpoints (``.starts-rank-<R>``, atomically replaced), so it
    survives what the checkpoints survive: a container restart on an emptyDir, a pod deletion
    on a PVC. It is how pod restarts become visible in ``trainer_restarts_total``.
    """
    path = directory / f".starts-rank-{rank:05d}"
    try:
        previous = int(path.read_text().strip() or 0)
    except (OSError, ValueError):
        previous = 0
    tmp = directory / f".{path.name}.tmp"
    try:
        tmp.write_text(f"{previous + 1}\n")
        os.replace(tmp, path)
    except OSError as exc:
        raise CheckpointError(f"cannot write {path} ({exc.strerror})",
                              "point --checkpoint-dir at a writable directory") from None
    return previous + 1
