"""Test data made at test time (numpy, Pillow, pyarrow, datasets); nothing is downloaded."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt


def arrays(root: Path, n: int = 200, shape: Sequence[int] = (6,), classes: int = 3,
           seed: int = 0, dtype: str = "float32") -> tuple[npt.NDArray, npt.NDArray]:
    """x.npy (N x shape) and y.npy (N int64) in `root`; the labels depend on the features,
    so a model can learn them."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, *shape)).astype(dtype)
    y = (x.reshape(n, -1)[:, 0] > 0).astype(np.int64) % classes
    y[::7] = rng.integers(0, classes, len(y[::7]))
    root.mkdir(parents=True, exist_ok=True)
    np.save(root / "x.npy", x)
    np.save(root / "y.npy", y)
    return x, y


def images(root: Path, classes: Sequence[str] = ("cat", "dog"), per_class: int = 12,
           seed: int = 0, size: tuple[int, int] = (40, 48)) -> list[Path]:
    """Class folders of small JPEG/PNG/WebP images whose colour tells the class apart."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    paths: list[Path] = []
    for c, name in enumerate(classes):
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            h, w = size[0] + i % 5, size[1] + i % 3
            pixels = rng.integers(0, 60, (h, w, 3), dtype=np.uint8)
            pixels[..., c % 3] += 150
            path = folder / f"{i:03d}.{('jpg', 'png', 'webp')[i % 3]}"
            Image.fromarray(pixels).save(path)
            paths.append(path)
    return paths


def table(n: int = 120, seed: int = 0, classes: int = 3) -> dict[str, npt.NDArray]:
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal(n), rng.standard_normal(n).astype("float32")
    return {"a": a, "b": b, "label": ((a > 0).astype(np.int64) + (b > 0)) % classes}


def parquet(path: Path, n: int = 120, seed: int = 0, row_group_size: int = 50) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(table(n, seed)), path, row_group_size=row_group_size)
    return path


def save_to_disk(root: Path, n: int = 120, names: Sequence[str] = ("low", "mid", "high"),
                 seed: int = 0) -> None:
    """A Hugging Face datasets save_to_disk directory with a ClassLabel label column."""
    import datasets

    features = datasets.Features({"a": datasets.Value("float64"), "b": datasets.Value("float32"),
                                  "label": datasets.ClassLabel(names=list(names))})
    datasets.Dataset.from_dict(table(n, seed), features=features).save_to_disk(str(root))
