"""From `data.dataset` to the train/validation splits every rank trains on.

A name resolves to a factory — a built-in (``digits``, ``synthetic``), a path (a file or a
directory, whose layout :mod:`trainer.data.layout` detects), or a user callable
``package.module:callable`` called with ``data.options`` — and the factory returns a map-style
Dataset or a ``(train, val)`` pair. A single dataset is split by a seeded permutation of its
indices (the seed article's ``SubsetRandomSampler`` idea made distributed, see
:mod:`trainer.data.splits`): identical on every rank with no communication, and nothing is
copied.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainer import plugins
from trainer.components import storage
from trainer.config import DATASET_NAMES, DataConfig
from trainer.data import layout, memory, remote
from trainer.data.splits import split, split_indices
from trainer.data.views import IndexView, first_sample_shape, require_map_style
from trainer.errors import DataError

__all__ = ["DataSplits", "build_splits", "resolve", "split_indices"]

log = logging.getLogger(__name__)


@dataclass
class DataSplits:
    train: IndexView
    val: IndexView
    num_classes: int | None
    """Classes, from ``data.num_classes``, the dataset's ``num_classes`` or class names, or
    max(label) + 1 over the labels it exposes (``targets``, ``labels``); None: unknown."""
    sample_shape: tuple[int, ...] | None
    """Shape of one sample's inputs (the dataset's ``sample_shape`` or sample 0's)."""
    name: str
    """Short dataset name for logs and metrics (file stem for files)."""
    class_names: tuple[str, ...] | None = None
    """Names of the classes, index i naming label i (the dataset's ``classes`` or
    ``class_names``); kept in checkpoints and in summary.json."""


BUILTIN_DATASETS: dict[str, Callable[[DataConfig, int], Callable[..., Any]]] = {
    "digits": lambda cfg, seed: functools.partial(memory.digits, num_classes=cfg.num_classes),
    "synthetic": lambda cfg, seed: functools.partial(
        memory.synthetic, samples=cfg.synthetic_samples, features=cfg.synthetic_features,
        classes=cfg.synthetic_classes, seed=seed, num_classes=cfg.num_classes),
}
"""The built-in datasets by `data.dataset`: the one list of their names (config.DATASET_NAMES
reads it)."""


def _builtins(cfg: DataConfig, seed: int) -> dict[str, Callable[..., Any]]:
    return {name: make(cfg, seed) for name, make in BUILTIN_DATASETS.items()}


def _file_factory(cfg: DataConfig, seed: int) -> Callable[..., Any]:
    """Detect and check the layout at the path (headers, schemas, listings: no data read); an
    ``s3://`` dataset is copied into the local cache first (:mod:`trainer.data.remote`)."""
    if storage.is_remote(cfg.dataset):
        local = remote.local_copy(cfg.dataset, cfg.cache_dir)
        found = layout.detect(local, dataclasses.replace(cfg, dataset=str(local)))
        log.info("data.dataset %s (copy of %s)", found.summary(), cfg.dataset)
        return layout.factory(found, dataclasses.replace(cfg, dataset=str(local)), seed)
    if not Path(cfg.dataset).exists() and not (os.sep in cfg.dataset
                                               or Path(cfg.dataset).suffix):
        raise DataError(f"data.dataset: {cfg.dataset!r} is neither a built-in, a path nor an "
                        "import path", f"use one of {', '.join(DATASET_NAMES)}, a data path "
                        "or package.module:callable")
    found = layout.detect(Path(cfg.dataset), cfg)
    log.info("data.dataset %s", found.summary())
    return layout.factory(found, cfg, seed)


def resolve(cfg: DataConfig, seed: int) -> tuple[Callable[..., Any], str]:
    """The dataset factory for `cfg.dataset` and a short name for it.

    Cheap: nothing is loaded (the launcher calls this to check the config before it starts
    any rank); a user module is imported, a path's layout is detected and its headers,
    schemas or directory listing checked (:mod:`trainer.data.layout`).
    """
    builtins = _builtins(cfg, seed)
    if cfg.dataset in builtins:
        return builtins[cfg.dataset], cfg.dataset
    if plugins.is_import_path(cfg.dataset):
        return plugins.load(cfg.dataset, "data.dataset"), cfg.dataset.rpartition(":")[2]
    return _file_factory(cfg, seed), Path(cfg.dataset).stem


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
        train_idx, val_idx = split(len(dataset), cfg.val_fraction, seed)
        train, val = IndexView(dataset, train_idx), IndexView(dataset, val_idx)
        base = dataset
    if len(train) == 0:
        raise DataError(f"{where} has no training samples", "give it at least one sample")
    declared = getattr(base, "num_classes", None)
    num_classes = cfg.num_classes or (int(declared) if declared else None)
    shape = getattr(base, "sample_shape", None)
    sample_shape = tuple(shape) if shape is not None else first_sample_shape(base)
    if sample_shape is not None and math.prod(sample_shape) == 0:
        raise DataError(f"{where}: each sample has 0 features (shape {sample_shape}): a model "
                        "would see no input", "give every sample at least one feature (x of "
                        "shape N x F with F >= 1)")
    names = getattr(base, "class_names", None) or getattr(base, "classes", None)
    class_names = tuple(str(n) for n in names) if isinstance(names, (list, tuple)) else None
    if class_names is not None and num_classes is None:
        num_classes = len(class_names)
    if num_classes is None:
        num_classes = exposed_classes(base, val.base if val.base is not base else None)
    return DataSplits(train, val, num_classes, sample_shape, name, class_names)


LABEL_ATTRIBUTES = ("targets", "labels")
"""Attributes holding every sample's label (torchvision's datasets name theirs `targets`)."""


def exposed_classes(*datasets: Any) -> int | None:
    """max(label) + 1 over the labels `datasets` expose as a whole (a `targets` or `labels`
    sequence of integers, read without loading a sample), or None when one does not."""
    top = -1
    for ds in (d for d in datasets if d is not None):
        labels = next((getattr(ds, a) for a in LABEL_ATTRIBUTES
                       if getattr(ds, a, None) is not None), None)
        if labels is None:
            return None
        try:
            values = torch.as_tensor(labels)
        except (TypeError, ValueError, RuntimeError):
            return None
        if values.dim() != 1 or values.is_floating_point() or values.is_complex() \
                or values.dtype == torch.bool or values.numel() == 0:
            return None
        top = max(top, int(values.max()))
    return top + 1 if top >= 0 else None
