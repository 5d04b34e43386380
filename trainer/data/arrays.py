"""Memory-mapped arrays: a directory holding ``x.npy`` (N x ..., numeric) and ``y.npy`` (N
integer labels), optionally ``classes.txt`` (one class name a line, line i naming label i).

Both files are opened with ``numpy.load(mmap_mode="r")`` by each process that reads them
(the dataset pickles as its paths, so DataLoader workers reopen them) and never read whole:
a batch is one gather of its rows, in sorted order for locality (readahead serves runs of
neighbouring rows), returned in the sampler's order. Pages come from the page cache, shared by
every rank on the node, so a rank's own (anonymous) memory does not grow with the file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor
from torch.utils.data import Dataset

from trainer.data import checks
from trainer.errors import DataError

X_FILE, Y_FILE, CLASSES_FILE = "x.npy", "y.npy", "classes.txt"


@dataclass(frozen=True)
class ArrayHeader:
    """What the launcher checks: the arrays' shapes and dtypes (read from the .npy headers)."""

    samples: int
    sample_shape: tuple[int, ...]
    x_dtype: str
    y_dtype: str

    def describe(self) -> str:
        return (f"memory-mapped arrays {X_FILE} ({self.samples} x "
                f"{'x'.join(map(str, self.sample_shape))} {self.x_dtype}) and {Y_FILE} "
                f"({self.y_dtype})")


def _open(path: Path) -> np.memmap[Any, Any]:
    if not path.is_file():
        what = "labels (int64, shape (N,))" if path.name == Y_FILE else "features (N x ...)"
        raise DataError(f"{path} does not exist (an {X_FILE} + {Y_FILE} directory needs both)",
                        f"save the {what} with numpy.save({str(path)!r}, array)")
    try:
        # Reads the header and maps the file; no data is read.
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise checks.unreadable(path, exc, ".npy array",
                         "re-create it with numpy.save (numeric dtypes, no objects)") from None
    if not isinstance(arr, np.memmap):  # a 0-byte array or a .npz in disguise
        raise DataError(f"{path} cannot be memory-mapped", "re-create it with numpy.save")
    return arr


def inspect(root: Path) -> ArrayHeader:
    """Check the two headers against each other (cheap: no data is read)."""
    x, y = _open(root / X_FILE), _open(root / Y_FILE)
    if not np.issubdtype(x.dtype, np.number) or np.issubdtype(x.dtype, np.complexfloating):
        raise DataError(f"{root / X_FILE} has dtype {x.dtype}, not a real number type",
                        "store the features as float32 (or any integer/float type)")
    if x.ndim < 2:
        raise DataError(f"{root / X_FILE} has shape {x.shape}: one number per sample",
                        "store the features as N x F (reshape(-1, 1) for a single feature)")
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise DataError(f"{root / Y_FILE} must hold integer labels of shape (N,), has "
                        f"{y.dtype}{y.shape}",
                        "store class indices 0..C-1 as int64: numpy.save(path, "
                        "labels.astype('int64'))")
    if len(x) != len(y):
        raise DataError(f"{root}: {X_FILE} has {len(x)} samples but {Y_FILE} has {len(y)}",
                        "give exactly one label per sample")
    return ArrayHeader(len(x), tuple(int(d) for d in x.shape[1:]), str(x.dtype), str(y.dtype))


def _class_names(root: Path) -> tuple[str, ...] | None:
    path = root / CLASSES_FILE
    if not path.is_file():
        return None
    names = tuple(line.strip() for line in path.read_text(encoding="utf-8").splitlines()
                  if line.strip())
    return names or None


class ArrayDataset(Dataset[tuple[Tensor, Tensor]]):
    """``x.npy`` and ``y.npy`` of `root`, memory-mapped; features come out as float32."""

    def __init__(self, root: Path, num_classes: int = 0) -> None:
        self.root = root
        self.header = inspect(root)
        self.sample_shape = self.header.sample_shape
        self.class_names = _class_names(root)
        self._x: np.memmap[Any, Any] | None = None
        self._y: np.memmap[Any, Any] | None = None
        self.num_classes = self._check(num_classes or len(self.class_names or ()))

    def _arrays(self) -> tuple[np.memmap[Any, Any], np.memmap[Any, Any]]:
        if self._x is None or self._y is None:  # first use in this process
            self._x, self._y = _open(self.root / X_FILE), _open(self.root / Y_FILE)
        return self._x, self._y

    def __getstate__(self) -> dict[str, Any]:
        # Workers reopen the files: a pickled memmap would be a full copy of the data.
        return {**self.__dict__, "_x": None, "_y": None}

    def _check(self, num_classes: int) -> int:
        """Labels fully, in bounded chunks; features on an evenly spaced sample of rows."""
        x, y = self._arrays()
        n = len(y)
        lo, hi = checks.label_range(n, lambda a, b: np.asarray(y[a:b]))
        classes = checks.label_classes(lo, hi, n, num_classes, str(self.root / Y_FILE))
        rows = checks.sample_rows(n)
        checks.require_finite(np.asarray(x[rows]), rows, str(self.root / X_FILE))
        return classes

    def __len__(self) -> int:
        return self.header.samples

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        x, y = self.__getitems__([index])
        return x[0], y[0]

    def __getitems__(self, indices: list[int]) -> tuple[Tensor, Tensor]:
        x, y = self._arrays()
        idx = np.asarray(indices, dtype=np.int64)
        order = np.argsort(idx, kind="stable")
        xb: npt.NDArray[np.float32] = np.empty((len(idx), *self.sample_shape), np.float32)
        xb[order] = x[idx[order]]  # one sorted gather, scattered back into sampler order
        yb = np.empty(len(idx), np.int64)
        yb[order] = y[idx[order]]
        checks.require_finite(xb, idx, str(self.root / X_FILE))
        return torch.from_numpy(xb), torch.from_numpy(yb)
