"""The built-in in-memory datasets: digits, synthetic and `.npz` files (a `.npz` is a zip
archive, which cannot be memory-mapped: store large arrays as x.npy/y.npy, see
:mod:`trainer.data.arrays`).

Each is a factory returning an :class:`InMemoryDataset` that knows its ``num_classes`` and
``sample_shape``; :mod:`trainer.data.source` resolves names to these factories exactly as it
resolves a user's import path, so built-ins and user datasets take one code path.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from trainer.data.checks import check_label_max, label_classes, unreadable
from trainer.errors import DataError


class InMemoryDataset(Dataset[tuple[Tensor, Tensor]]):
    """Features and labels as two tensors; a batch is one ``index_select`` per tensor.

    ``__getitems__`` is what the DataLoader calls with a whole batch of indices when it is
    defined: one gather per batch instead of ``batch_size`` Python ``__getitem__`` calls and a
    ``torch.stack`` (about 30x fewer interpreter round trips at batch 256).
    """

    def __init__(self, x: Tensor, y: Tensor, num_classes: int | None = None) -> None:
        assert len(x) == len(y), "features and labels differ in length"
        self.x = x
        self.y = y
        self.num_classes = num_classes
        """Classes of the labels (None: not declared)."""
        self.sample_shape = tuple(x.shape[1:])
        """Shape of one sample's features: ``(F,)`` for vectors, ``(C, H, W)`` for images."""

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        return self.x[index], self.y[index]

    takes_index_arrays = True
    """:class:`~trainer.data.views.IndexView` may pass an int64 array instead of a list."""

    def __getitems__(self, indices: list[int] | np.ndarray) -> tuple[Tensor, Tensor]:
        # via numpy: 4 us for 64 indices where torch.as_tensor(list) takes 12 us
        idx = torch.from_numpy(np.asarray(indices, dtype=np.int64))
        return self.x.index_select(0, idx), self.y.index_select(0, idx)


def synthetic(samples: int, features: int, classes: int, seed: int,
              num_classes: int = 0) -> InMemoryDataset:
    """The article's ``torch.randn`` features; labels come from a fixed random linear "teacher"
    so the task is learnable (the article's randint labels are pure noise, capping accuracy at
    1/C)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=g)
    teacher = torch.randn(features, classes, generator=g)
    return checked(x, (x @ teacher).argmax(dim=1), num_classes or classes, "dataset synthetic")


def digits(num_classes: int = 0) -> InMemoryDataset:
    """scikit-learn's 1797 8x8 digit images, bundled with it (no download)."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = torch.as_tensor(bunch.data, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
    return checked(x, torch.as_tensor(bunch.target, dtype=torch.long), num_classes,
                   "dataset digits")


def npz_file(path: Path, num_classes: int = 0) -> InMemoryDataset:
    """A ``.npz`` file with arrays ``x`` (numeric, N x ...) and ``y`` (integer labels, N)."""
    x, y = _npz(path)
    return checked(x, y, num_classes, f"dataset {path}")


def _npz(path: Path) -> tuple[Tensor, Tensor]:
    try:
        with np.load(path, allow_pickle=False) as arrays:
            missing = {"x", "y"} - set(arrays.files)
            if missing:
                raise DataError(f"{path} lacks array(s) {sorted(missing)} (has {arrays.files})",
                                "save it with np.savez(path, x=features, y=labels)")
            x_np, y_np = arrays["x"], arrays["y"]
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise unreadable(path, exc, ".npz file",
                         "re-create it with np.savez(path, x=features, y=labels)") from None
    if not np.issubdtype(x_np.dtype, np.number):
        raise DataError(f"{path}: x has dtype {x_np.dtype}, not numeric", "store x as float32")
    if y_np.ndim != 1 or not np.issubdtype(y_np.dtype, np.integer):
        raise DataError(f"{path}: y must be a 1-D integer array, got {y_np.dtype}{y_np.shape}",
                        "store y as int64 class indices of shape (N,)")
    if y_np.size:  # before the cast: a uint64 label above 2**63 would wrap to a negative one
        check_label_max(int(y_np.max()), f"dataset {path}")
    return torch.as_tensor(x_np, dtype=torch.float32), torch.as_tensor(y_np, dtype=torch.long)


def checked(x: Tensor, y: Tensor, num_classes: int, where: str) -> InMemoryDataset:
    """The dataset of `x`, `y` after :func:`check_arrays`."""
    return InMemoryDataset(x, y, check_arrays(x, y, num_classes, where))


def check_arrays(x: Tensor, y: Tensor, num_classes: int, where: str) -> int:
    """Validate shapes and labels; return the number of classes (`num_classes`, or inferred
    as max(label) + 1 when 0)."""
    if len(x) != len(y):
        raise DataError(f"{where}: {len(x)} feature rows but {len(y)} labels",
                        "give one label per sample")
    if not torch.isfinite(x).all():
        raise DataError(f"{where}: features contain NaN or Inf", "clean or impute the features")
    lo, hi = (int(y.min()), int(y.max())) if len(y) else (0, 0)
    return label_classes(lo, hi, len(y), num_classes, where)
