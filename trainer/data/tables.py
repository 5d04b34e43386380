"""Tables: CSV files, Parquet files, and Hugging Face ``datasets`` ``save_to_disk`` directories.

* a ``.csv`` file is read into memory by pyarrow's CSV reader (C++, typed columns): for tables
  that fit in memory;
* Parquet files are converted once by Hugging Face ``datasets`` (row group by row group, so in
  bounded memory) into an Arrow file in ``data.cache_dir``, then memory-mapped like a
  ``save_to_disk`` directory; later runs, and the other ranks of the node, reuse the
  conversion (``datasets`` holds a file lock while it writes);
* a ``save_to_disk`` directory is memory-mapped as it is.

Columns: ``data.label_column`` holds integer class indices (a ``datasets`` ``ClassLabel``
also gives the class names); ``data.feature_columns`` (default: every other column) are
numeric scalars, stacked into N x F, or exactly one column of equal-length (nested) lists of
numbers, giving N x ... . A batch is one Arrow ``take`` of its rows.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor
from torch.utils.data import Dataset

from trainer.config import DataConfig
from trainer.data import checks, extras
from trainer.errors import DataError

if TYPE_CHECKING:
    import pyarrow as pa

PARQUET_SUFFIXES = (".parquet", ".pq")


def _is_list(t: pa.DataType) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_list(t) or pa.types.is_large_list(t)
                or pa.types.is_fixed_size_list(t))


def _leaf(t: pa.DataType) -> pa.DataType:
    while _is_list(t):
        t = t.value_type
    return t


def _numeric(t: pa.DataType) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_integer(t) or pa.types.is_floating(t))


def columns(schema: pa.Schema, cfg: DataConfig, where: str) -> list[str]:
    """The feature columns of `schema` after checking them and the label column."""
    names = list(schema.names)
    wanted = [*cfg.feature_columns, cfg.label_column]
    missing = [c for c in wanted if c not in names]
    if missing:
        field = "data.label_column" if cfg.label_column in missing else "data.feature_columns"
        raise DataError(f"{where} has no column {missing[0]!r} (columns: {names})",
                        f"set {field} to the name of an existing column")
    import pyarrow as pa

    label_type = schema.field(cfg.label_column).type
    if not pa.types.is_integer(label_type):
        raise DataError(f"{where}: label column {cfg.label_column!r} has type {label_type}, "
                        "not integer", "store class indices 0..C-1 as integers (map class "
                        "names to indices first, or use a datasets ClassLabel)")
    features = cfg.feature_columns or [c for c in names if c != cfg.label_column]
    if not features:
        raise DataError(f"{where} has only the label column", "add feature columns")
    for name in features:
        t = schema.field(name).type
        if not _numeric(_leaf(t)):
            raise DataError(f"{where}: feature column {name!r} has type {t}, not numeric",
                            "set data.feature_columns to the numeric columns (text must be "
                            "tokenized first: see docs/custom-code.md)")
        if _is_list(t) and len(features) > 1:
            raise DataError(f"{where}: feature column {name!r} holds lists, so it must be the "
                            "only feature column", f"set data.feature_columns to [{name}]")
    return features


# -- the three sources -----------------------------------------------------------------------
def inspect_csv(path: Path, cfg: DataConfig) -> str:
    """Column names and types from the first block of the file (1 MiB)."""
    extras.require("pyarrow", "reading .csv files")
    import pyarrow.csv as pa_csv

    try:
        with pa_csv.open_csv(path) as reader:
            schema = reader.schema
    except (OSError, ValueError) as exc:
        raise checks.unreadable(path, exc, "CSV table",
                         "write a header line and one comma-separated row per sample") from None
    columns(schema, cfg, str(path))
    return f"CSV table ({len(schema.names)} columns)"


def inspect_parquet(files: Sequence[Path], cfg: DataConfig) -> str:
    """Every file's schema and row count, from its footer."""
    extras.require("pyarrow", "reading Parquet files")
    import pyarrow.parquet as pq

    rows = 0
    for path in files:
        try:
            meta = pq.read_metadata(path)
        except (OSError, ValueError) as exc:
            raise checks.unreadable(path, exc, "Parquet file",
                             "re-write it (e.g. pyarrow.parquet.write_table)") from None
        columns(meta.schema.to_arrow_schema(), cfg, str(path))
        rows += meta.num_rows
    return f"Parquet table ({len(files)} file(s), {rows} rows)"


def _load_from_disk(root: Path) -> Any:
    extras.require("datasets", "reading a save_to_disk directory")
    import datasets

    try:
        return datasets.load_from_disk(str(root))  # memory-maps the Arrow files
    except (OSError, ValueError) as exc:  # FileNotFoundError included
        raise DataError(f"{root} is not a readable save_to_disk directory ({exc})",
                        "re-create it with datasets.Dataset.save_to_disk") from None


def arrow_dataset(root: Path) -> Any:
    """The ``datasets.Dataset`` of a save_to_disk directory (of a DatasetDict: its train
    split)."""
    loaded = _load_from_disk(root)
    if hasattr(loaded, "column_names") and isinstance(loaded.column_names, dict):
        if "train" not in loaded:
            raise DataError(f"{root} is a DatasetDict without a 'train' split (has "
                            f"{sorted(loaded)})", "save the training split as 'train'")
        return loaded["train"]
    return loaded


def inspect_arrow(root: Path, cfg: DataConfig) -> str:
    ds = arrow_dataset(root)
    columns(ds.data.schema, cfg, str(root))
    return f"save_to_disk Arrow table ({ds.num_rows} rows, memory-mapped)"


@contextlib.contextmanager
def _quiet_progress() -> Iterator[None]:
    """No per-rank progress bars from ``datasets`` while it converts (restored after)."""
    import datasets

    was_enabled = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if was_enabled:
            datasets.enable_progress_bars()


def parquet_dataset(files: Sequence[Path], cfg: DataConfig) -> Any:
    """Parquet files as one memory-mapped ``datasets.Dataset`` (converted once, cached)."""
    extras.require("datasets", "reading Parquet files")
    import datasets

    schema_cols = [*cfg.feature_columns, cfg.label_column] if cfg.feature_columns else None
    try:
        with _quiet_progress():
            return datasets.Dataset.from_parquet([str(f) for f in files],
                                                 cache_dir=cfg.cache_dir or None,
                                                 columns=schema_cols)
    except OSError as exc:
        raise DataError(f"cannot convert {files[0].parent} to a memory-mapped Arrow file "
                        f"({exc})", "set data.cache_dir to a writable directory with room "
                        "for the table") from None


def read_csv(path: Path) -> pa.Table:
    extras.require("pyarrow", "reading .csv files")
    import pyarrow.csv as pa_csv

    try:
        return pa_csv.read_csv(path)
    except (OSError, ValueError) as exc:
        raise checks.unreadable(path, exc, "CSV table",
                         "write a header line and one comma-separated row per sample") from None


# -- the dataset -----------------------------------------------------------------------------
class Rows(Protocol):
    """Random access to rows as Arrow tables."""

    def __len__(self) -> int: ...
    def take(self, indices: list[int]) -> pa.Table: ...
    def column(self, name: str) -> pa.ChunkedArray: ...


class InMemoryRows:
    def __init__(self, table: pa.Table) -> None:
        self.table = table

    def __len__(self) -> int:
        return int(self.table.num_rows)

    def take(self, indices: list[int]) -> pa.Table:
        return self.table.take(indices)

    def column(self, name: str) -> pa.ChunkedArray:
        return self.table.column(name)


class MappedRows:
    """A ``datasets.Dataset`` (memory-mapped; it pickles as its file paths)."""

    def __init__(self, ds: Any) -> None:
        self.ds = ds.with_format("arrow")

    def __len__(self) -> int:
        return int(self.ds.num_rows)

    def take(self, indices: list[int]) -> pa.Table:
        return self.ds[list(indices)]

    def column(self, name: str) -> pa.ChunkedArray:
        return self.ds[name]


def class_names(ds: Any, label: str) -> tuple[str, ...] | None:
    """A ``ClassLabel`` column's names."""
    names = getattr(ds.features.get(label), "names", None)
    return tuple(str(n) for n in names) if names else None


class TableDataset(Dataset[tuple[Tensor, Tensor]]):
    """Features and labels of a table's rows; a batch is one ``take``."""

    def __init__(self, rows: Rows, features: list[str], label: str, where: str,
                 num_classes: int = 0, names: tuple[str, ...] | None = None) -> None:
        self.rows = rows
        self.features = features
        self.label = label
        self.where = where
        self.class_names = names
        if len(rows) < 1:
            raise DataError(f"{where} has no rows", "add one row per sample")
        self.sample_shape = self._row_shape(rows.take([0]))
        self.num_classes = self._check(num_classes or len(names or ()))

    def _check(self, num_classes: int) -> int:
        """Labels: nulls and range over the whole column, which Arrow scans chunk by chunk
        without materialising it; features: an evenly spaced sample of rows."""
        import pyarrow.compute as pc

        labels = self.rows.column(self.label)
        if labels.null_count:
            raise DataError(f"{self.where}: label column {self.label!r} has "
                            f"{labels.null_count} missing values", "give every row a label")
        bounds = pc.min_max(labels)
        n = len(self.rows)
        classes = checks.label_classes(int(bounds["min"].as_py()), int(bounds["max"].as_py()),
                                       n, num_classes, self.where)
        rows = checks.sample_rows(n).tolist()
        checks.require_finite(self._features(self.rows.take(rows), rows), rows, self.where)
        return classes

    def _is_array_column(self, table: pa.Table) -> bool:
        return len(self.features) == 1 and _is_list(table.schema.field(self.features[0]).type)

    def _row_shape(self, first: pa.Table) -> tuple[int, ...]:
        """(F,) for scalar columns; the first row's nested list shape for one list column."""
        if not self._is_array_column(first):
            return (len(self.features),)
        value = first.column(self.features[0])[0].as_py()
        try:
            return tuple(int(d) for d in np.asarray(value, dtype=np.float32).shape)
        except (TypeError, ValueError):
            raise DataError(f"{self.where}: row 0 of column {self.features[0]!r} is a ragged "
                            "nested list", "give every sample an array of one shape") from None

    def _features(self, table: pa.Table, rows: Sequence[int]) -> npt.NDArray[np.float32]:
        import pyarrow.compute as pc

        for name in self.features:
            if table.column(name).null_count:
                raise DataError(f"{self.where}: feature column {name!r} has a missing value "
                                f"in one of rows {list(rows)[:8]}...", "impute missing values")
        if not self._is_array_column(table):
            cols = [table.column(c).to_numpy() for c in self.features]
            return np.column_stack(cols).astype(np.float32, copy=False)
        values = table.column(self.features[0]).combine_chunks()
        while _is_list(values.type):
            values = pc.list_flatten(values)
        # np.array copies: Arrow's buffers are read-only, and a batch is handed on as a tensor
        flat = np.array(values.to_numpy(zero_copy_only=False), dtype=np.float32)
        n, shape = table.num_rows, self.sample_shape
        if flat.size != n * math.prod(shape):
            raise DataError(f"{self.where}: rows of column {self.features[0]!r} have different "
                            "lengths", "give every sample the same number of values")
        return flat.reshape(n, *shape)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        x, y = self.__getitems__([index])
        return x[0], y[0]

    def __getitems__(self, indices: list[int]) -> tuple[Tensor, Tensor]:
        table = self.rows.take(indices)
        x = self._features(table, indices)
        checks.require_finite(x, indices, self.where)
        y = np.array(table.column(self.label).to_numpy(), dtype=np.int64)
        return torch.from_numpy(x), torch.from_numpy(y)
