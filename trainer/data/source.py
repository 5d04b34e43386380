"""From `data.dataset` to the train/validation splits every rank trains on.

A name resolves to a factory — a built-in (``digits``, ``synthetic``), a file path, or a user
callable ``package.module:callable`` called with ``data.options`` — and the factory returns a
map-style Dataset or a ``(train, val)`` pair. A single dataset is split by a seeded
permutation of its indices (the seed article's ``SubsetRandomSampler`` idea made
distributed): identical on every rank with no communication, and nothing is copied.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from trainer import plugins
from trainer.config import DATASET_NAMES, DataConfig
from trainer.data import memory
from trainer.data.views import IndexView, first_sample_shape, require_map_style
from trainer.errors import DataError

FILE_SUFFIXES = (".npz", ".csv")


@dataclass
class DataSplits:
    train: IndexView
    val: IndexView
    num_classes: int | None
    """Classes, from ``data.num_classes`` or the dataset's ``num_classes`` (None: unknown)."""
    sample_shape: tuple[int, ...] | None
    """Shape of one sample's inputs (the dataset's ``sample_shape`` or sample 0's)."""
    name: str
    """Short dataset name for logs and metrics (file stem for files)."""
    class_names: tuple[str, ...] | None = None
    """Names of the classes, index i naming label i (the dataset's ``classes`` or
    ``class_names``); kept in checkpoints and in summary.json."""


def _builtins(cfg: DataConfig, seed: int) -> dict[str, Callable[..., Any]]:
    return {
        "digits": functools.partial(memory.digits, num_classes=cfg.num_classes),
        "synthetic": functools.partial(
            memory.synthetic, samples=cfg.synthetic_samples, features=cfg.synthetic_features,
            classes=cfg.synthetic_classes, seed=seed, num_classes=cfg.num_classes),
    }


def _file_factory(cfg: DataConfig) -> Callable[..., Any]:
    path = Path(cfg.dataset)
    if path.suffix not in FILE_SUFFIXES:
        raise DataError(f"data.dataset: {cfg.dataset!r} is neither a built-in, a known file "
                        "type nor an import path",
                        f"use one of {', '.join(DATASET_NAMES)}, a .npz/.csv path or "
                        "package.module:callable")
    if not path.is_file():
        raise DataError(f"data file {path} does not exist", "pass an existing .npz or .csv path")
    if path.suffix == ".npz":
        return functools.partial(memory.npz_file, path, num_classes=cfg.num_classes)
    return functools.partial(memory.csv_file, path, cfg.label_column,
                             num_classes=cfg.num_classes)


def resolve(cfg: DataConfig, seed: int) -> tuple[Callable[..., Any], str]:
    """The dataset factory for `cfg.dataset` and a short name for it.

    Cheap: nothing is loaded (the launcher calls this to check the config before it starts
    any rank); a user module is imported, a file's existence is checked.
    """
    builtins = _builtins(cfg, seed)
    if cfg.dataset in builtins:
        return builtins[cfg.dataset], cfg.dataset
    if plugins.is_import_path(cfg.dataset):
        return plugins.load(cfg.dataset, "data.dataset"), cfg.dataset.rpartition(":")[2]
    return _file_factory(cfg), Path(cfg.dataset).stem


def split_indices(n: int, val_fraction: float, seed: int) -> tuple[Tensor, Tensor]:
    """A seeded permutation cut into (train, val); identical on every rank."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_val = math.floor(n * val_fraction)
    if val_fraction > 0 and n_val == 0:
        n_val = 1
    if n - n_val < 1:
        raise DataError(f"val_fraction {val_fraction} leaves no training sample of {n}",
                        "lower --val-fraction")
    return perm[n_val:], perm[:n_val]


def build_splits(cfg: DataConfig, seed: int, dataset: Any = None) -> DataSplits:
    """The configured dataset (or `dataset`, a Dataset or pair given in Python) split."""
    if dataset is None:
        factory, name = resolve(cfg, seed)
        where = f"data.dataset {cfg.dataset!r}"
        dataset = plugins.call(factory, cfg.options, where,
                               "fix the dataset callable or data.options")
    else:
        name, where = type(dataset).__name__, "the dataset passed to fit()"
        if isinstance(dataset, (tuple, list)) and len(dataset) == 2:
            name = type(dataset[0]).__name__
    if isinstance(dataset, (tuple, list)):
        if len(dataset) != 2:
            raise DataError(f"{where} returned a sequence of {len(dataset)} items",
                            "return one Dataset or a (train, val) pair")
        train_set, val_set = dataset
        require_map_style(train_set, f"{where}: the train part")
        require_map_style(val_set, f"{where}: the val part")
        train, val, base = IndexView(train_set), IndexView(val_set), train_set
    else:
        require_map_style(dataset, where)
        train_idx, val_idx = split_indices(len(dataset), cfg.val_fraction, seed)
        train = IndexView(dataset, train_idx.numpy().astype(np.int64))
        val = IndexView(dataset, val_idx.numpy().astype(np.int64))
        base = dataset
    if len(train) == 0:
        raise DataError(f"{where} has no training samples", "give it at least one sample")
    declared = getattr(base, "num_classes", None)
    num_classes = cfg.num_classes or (int(declared) if declared else None)
    shape = getattr(base, "sample_shape", None)
    sample_shape = tuple(shape) if shape is not None else first_sample_shape(base)
    names = getattr(base, "class_names", None) or getattr(base, "classes", None)
    class_names = tuple(str(n) for n in names) if isinstance(names, (list, tuple)) else None
    if class_names is not None and num_classes is None:
        num_classes = len(class_names)
    return DataSplits(train, val, num_classes, sample_shape, name, class_names)
