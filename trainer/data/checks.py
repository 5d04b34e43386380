"""Checks shared by every format: label ranges, finite features, bounded scans.

Checks that need the data never load it whole: labels are scanned in chunks of
:data:`LABEL_CHUNK` (labels are small next to features: 8 bytes a sample), features are
checked on an evenly spaced sample of :data:`FEATURE_SAMPLE` rows before training and then in
every batch as it is read, so a NaN deep in a 5 GB file still stops the run with its row.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from trainer.errors import DataError

LABEL_CHUNK = 1 << 20
"""Labels read per chunk when scanning them (8 MiB of int64)."""
FEATURE_SAMPLE = 4096
"""Rows whose features are checked before training (then every batch is checked as read)."""


def unreadable(path: Path, exc: Exception, what: str, fix: str) -> DataError:
    """The error for a data file that failed to load: "permission denied" with its fix when the
    user may not read it (re-creating the file would not help), else `what` it is not."""
    if isinstance(exc, PermissionError) or getattr(exc, "errno", None) == errno.EACCES or \
            (path.is_file() and not os.access(path, os.R_OK)):
        return DataError(f"{path} cannot be read: permission denied",
                         "chmod a+r it, or run as a user who can read it (ls -l shows its owner "
                         "and mode)")
    return DataError(f"{path} is not a readable {what} ({exc})", fix)


MAX_LABEL = 2**31 - 2
"""Largest class index taken: a label above it is an ID, not a class (2**63 - 1 overflowed the
model's weights; a uint64 2**64 - 1 wrapped to -1 in torch's int64)."""


def check_label_max(hi: int, where: str) -> None:
    """`hi`, the largest label (as read, before any cast to int64), is a class index."""
    if hi > MAX_LABEL:
        raise DataError(f"{where}: label {hi} is too large to be a class index (at most "
                        f"{MAX_LABEL})", "labels must be class indices 0..C-1: map them there, "
                        "e.g. numpy.unique(labels, return_inverse=True)[1]")


def label_classes(lo: int, hi: int, n: int, num_classes: int, where: str) -> int:
    """The number of classes (`num_classes`, or max label + 1 when 0) after checking that
    labels ``lo..hi`` of `n` samples are class indices."""
    if n < 2:
        raise DataError(f"{where}: needs at least 2 samples, has {n}", "add samples")
    check_label_max(hi, where)
    classes = num_classes or hi + 1
    if lo < 0 or hi >= classes:
        raise DataError(f"{where}: label {lo if lo < 0 else hi} is out of range [0, {classes})",
                        "labels must be class indices 0..C-1 (set data.num_classes to C)")
    if classes < 2:
        raise DataError(f"{where}: only one class present", "a classifier needs >= 2 classes")
    return classes


def label_range(n: int, read: Callable[[int, int], npt.NDArray[Any]]) -> tuple[int, int]:
    """(min, max) of `n` labels, reading ``read(start, stop)`` one chunk at a time."""
    lo, hi = None, None
    for start in range(0, n, LABEL_CHUNK):
        chunk = read(start, min(n, start + LABEL_CHUNK))
        c_lo, c_hi = int(chunk.min()), int(chunk.max())
        lo = c_lo if lo is None else min(lo, c_lo)
        hi = c_hi if hi is None else max(hi, c_hi)
    if lo is None or hi is None:
        raise DataError("no labels to scan", "give the dataset at least 2 samples")
    return lo, hi


def sample_rows(n: int, k: int = FEATURE_SAMPLE) -> npt.NDArray[np.int64]:
    """`k` evenly spaced row indices of `n` (all rows when n <= k), first and last included."""
    if n <= k:
        return np.arange(n, dtype=np.int64)
    return np.unique(np.linspace(0, n - 1, k).astype(np.int64))


def require_finite(x: npt.NDArray[Any], rows: npt.NDArray[np.int64] | list[int],
                   where: str) -> None:
    """Raise naming the first of `rows` (the dataset indices of `x`'s rows) that holds a NaN
    or an infinity; integer features are finite by construction."""
    if not np.issubdtype(x.dtype, np.floating):
        return
    finite = np.isfinite(x.reshape(len(x), -1)).all(axis=1)
    if not finite.all():
        row = int(np.asarray(rows)[int(np.argmin(finite))])
        raise DataError(f"{where}: sample {row} has NaN or Inf features",
                        "clean or impute the features")
