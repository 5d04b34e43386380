"""What makes a written file durable and checkable: an fsync of a file or a folder (a rename
is durable only once its folder is synced), and a file's SHA-256 read in 1 MiB blocks.
Checkpoints (single files and sharded folders) and the exported model use them."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def fsync_path(path: Path) -> None:
    """fsync `path`, a file or a directory (opened read-only, as POSIX allows for both)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
