"""What a ``--dataset PATH`` holds, found from the files themselves (``data.format`` overrides
the guess), checked cheaply, and opened.

Detection, first match wins:

* a file: by suffix, ``.npz``, ``.csv``, ``.parquet``/``.pq``;
* ``DIR/train`` and ``DIR/val`` (or ``DIR/validation``), the first itself a layout below: the
  two splits (``data.val_fraction`` is then unused);
* ``x.npy`` or ``y.npy`` in DIR: memory-mapped arrays (``npy``);
* ``state.json``/``dataset_info.json``/``dataset_dict.json``: a ``save_to_disk`` directory
  (``arrow``);
* ``*.parquet``/``*.pq`` files in DIR: one Parquet table (``parquet``);
* sub-folders holding image files: class folders (``images``).

:func:`detect` is what the launcher runs before it starts any rank: it reads headers, schemas
and directory listings, never the data. :func:`open_layout` runs on each rank.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.config import DataConfig
from trainer.data import arrays, images, memory, tables
from trainer.data.splits import split
from trainer.data.transforms import ImageTransform
from trainer.errors import DataError, missing

VAL_DIRS = ("val", "validation")
FILE_FORMATS = {".npz": "npz", ".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}
DIR_FORMATS = ("npy", "arrow", "parquet", "images")
ARROW_MARKERS = ("state.json", "dataset_info.json", "dataset_dict.json")
_PROBE_FOLDERS = 8


@dataclass(frozen=True)
class Layout:
    format: str
    root: Path
    val: Path | None
    """The validation split's own directory (split layouts), else None."""
    description: str

    def summary(self) -> str:
        split_note = f"; validation from {self.val}" if self.val else ""
        return f"{self.root}: {self.description} (data.format {self.format}){split_note}"


def _parquet_files(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    return sorted(p for p in root.iterdir() if p.suffix in tables.PARQUET_SUFFIXES
                  and p.is_file() and not p.name.startswith("."))


def _matches(fmt: str, d: Path) -> bool:
    if fmt == "npy":
        return (d / arrays.X_FILE).exists() or (d / arrays.Y_FILE).exists()
    if fmt == "arrow":
        return any((d / m).is_file() for m in ARROW_MARKERS)
    if fmt == "parquet":
        return bool(_parquet_files(d))
    if fmt == "images":
        subdirs = sorted(p for p in d.iterdir() if p.is_dir() and not p.name.startswith("."))
        return any(images.has_images(p) for p in subdirs[:_PROBE_FOLDERS])
    return False


def _guess(d: Path) -> str | None:
    return next((f for f in DIR_FORMATS if _matches(f, d)), None)


def _inspect(fmt: str, root: Path, cfg: DataConfig, training: bool = True) -> str:
    if fmt == "npz":
        return "in-memory .npz arrays"
    if fmt == "csv":
        return tables.inspect_csv(root, cfg)
    if fmt == "parquet":
        files = _parquet_files(root)
        if not files:
            raise DataError(f"{root} holds no .parquet files", "point data.dataset at a "
                            "Parquet file or a directory of them")
        return tables.inspect_parquet(files, cfg)
    if not root.is_dir():
        raise DataError(f"data.format {fmt} needs a directory, but {root} is a file",
                        "point data.dataset at the directory, or fix data.format")
    if fmt == "npy":
        return arrays.inspect(root).describe()
    if fmt == "arrow":
        return tables.inspect_arrow(root, cfg)
    return images.inspect(root, training)


def detect(path: Path, cfg: DataConfig) -> Layout:
    """The layout at `path` (``cfg.format`` unless ``auto``), checked without reading data."""
    fmt = cfg.format
    if path.is_file():
        if fmt == "auto":
            if path.suffix.lower() not in FILE_FORMATS:
                raise DataError(f"{path}: unknown file type {path.suffix!r}",
                                f"use a {'/'.join(FILE_FORMATS)} file, or set data.format")
            fmt = FILE_FORMATS[path.suffix.lower()]
        return Layout(fmt, path, None, _inspect(fmt, path, cfg))
    if not path.is_dir():
        if path.exists():
            raise DataError(f"data path {path} is not a regular file or a directory (a device, "
                            "pipe or socket)", "pass a data file or directory")
        why, fix = missing(path, "pass an existing file or directory")
        raise DataError(f"data path {path} {why}", fix)
    train, val = path / "train", next((path / v for v in VAL_DIRS if (path / v).is_dir()), None)
    if train.is_dir() and val is not None:
        sub = _guess(train) if fmt == "auto" else (fmt if _matches(fmt, train) else None)
        if sub is not None:
            description = _inspect(sub, train, cfg)
            _inspect(sub, val, cfg, training=False)
            return Layout(sub, train, val, f"train and validation splits of {description}")
    if fmt == "auto":
        guessed = _guess(path)
        if guessed is None:
            raise DataError(f"{path} holds no dataset layout ddp-trainer knows",
                            "use x.npy + y.npy, class folders of images, a save_to_disk "
                            "directory or .parquet files (docs/data.md), or set "
                            "data.format")
        fmt = guessed
    return Layout(fmt, path, None, _inspect(fmt, path, cfg))


# -- opening, on each rank -------------------------------------------------------------------
def _table(ds: Any, cfg: DataConfig, where: str, num_classes: int) -> tables.TableDataset:
    features = tables.columns(ds.data.schema, cfg, where)
    return tables.TableDataset(tables.MappedRows(ds), features, cfg.label_column, where,
                               num_classes, tables.class_names(ds, cfg.label_column))


def _open_one(fmt: str, root: Path, cfg: DataConfig, num_classes: int) -> Any:
    if fmt == "npz":
        return memory.npz_file(root, num_classes=num_classes)
    if fmt == "csv":
        table = tables.read_csv(root)
        features = tables.columns(table.schema, cfg, str(root))
        return tables.TableDataset(tables.InMemoryRows(table), features, cfg.label_column,
                                   str(root), num_classes)
    if fmt == "npy":
        return arrays.ArrayDataset(root, num_classes)
    if fmt == "arrow":
        return _table(tables.arrow_dataset(root), cfg, str(root), num_classes)
    if fmt == "parquet":
        return _table(tables.parquet_dataset(_parquet_files(root), cfg), cfg, str(root),
                      num_classes)
    raise AssertionError(fmt)


def _transforms(cfg: DataConfig, seed: int) -> tuple[ImageTransform, ImageTransform]:
    mean, std = tuple(cfg.image_mean), tuple(cfg.image_std)
    return (ImageTransform(cfg.image_size, True, seed, mean, std),
            ImageTransform(cfg.image_size, False, seed, mean, std))


def _open_images(layout: Layout, cfg: DataConfig, seed: int) -> tuple[Any, Any]:
    """Images are always a (train, val) pair: the two splits transform differently."""
    train_tf, eval_tf = _transforms(cfg, seed)
    listing = images.list_folder(layout.root)
    if layout.val is not None:
        val_listing = images.list_folder(layout.val, list(listing.classes))
        return (images.ImageFolderDataset(listing, train_tf),
                images.ImageFolderDataset(val_listing, eval_tf))
    train_idx, val_idx = split(len(listing), cfg.val_fraction, seed)
    return (images.ImageFolderDataset(listing, train_tf, train_idx),
            images.ImageFolderDataset(listing, eval_tf, val_idx))


def open_layout(layout: Layout, cfg: DataConfig, seed: int) -> Any:
    """The dataset, or the (train, val) pair, of `layout`."""
    if layout.format == "images":
        return _open_images(layout, cfg, seed)
    train = _open_one(layout.format, layout.root, cfg, cfg.num_classes)
    if layout.val is None:
        return train
    return train, _open_one(layout.format, layout.val, cfg, cfg.num_classes or train.num_classes)


def factory(layout: Layout, cfg: DataConfig, seed: int) -> Callable[[], Any]:
    """A no-argument callable opening `layout` (what :func:`trainer.data.source.resolve`
    returns for paths)."""

    def open_dataset() -> Any:
        return open_layout(layout, cfg, seed)

    open_dataset.__name__ = f"open_{layout.format}"
    return open_dataset
