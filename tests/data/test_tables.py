"""Tables: CSV (in memory), Parquet (converted once, memory-mapped), save_to_disk (mapped)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import datagen
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from conftest import REPO, read_json, run_cli
from test_cli_errors import assert_one_clear_error

from trainer.config import DataConfig
from trainer.data import build_splits
from trainer.data.tables import TableDataset
from trainer.errors import DataError


def _cfg(path: Path, **kw: object) -> DataConfig:
    return DataConfig(dataset=str(path), cache_dir=str(path.parent / "cache"), **kw)  # type: ignore[arg-type]


def test_parquet_files_form_one_memory_mapped_table(tmp_path: Path) -> None:
    datagen.parquet(tmp_path / "pq" / "part-0.parquet", n=100, seed=0)
    datagen.parquet(tmp_path / "pq" / "part-1.parquet", n=50, seed=1)
    s = build_splits(_cfg(tmp_path / "pq", val_fraction=0.2), seed=0)
    assert len(s.train) + len(s.val) == 150 and s.sample_shape == (2,) and s.num_classes == 3
    ds = s.train.base
    assert isinstance(ds, TableDataset)
    assert type(ds.rows.ds.data).__name__ == "MemoryMappedTable"
    x, y = ds.__getitems__([120, 3])
    second = datagen.table(50, 1)
    assert x[0].tolist() == pytest.approx([second["a"][20], second["b"][20]])
    assert y[0] == second["label"][20]


def test_feature_columns_select_and_order_the_features(tmp_path: Path) -> None:
    datagen.parquet(tmp_path / "t.parquet")
    s = build_splits(_cfg(tmp_path / "t.parquet", feature_columns=["b"]), seed=0)
    x, _ = s.train.base.__getitems__([0])
    assert x.shape == (1, 1) and x[0, 0] == pytest.approx(float(datagen.table()["b"][0]))


def test_one_list_column_gives_array_shaped_samples(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    pixels = rng.random((40, 2, 3)).astype("float32")
    pq.write_table(pa.table({"pixels": pixels.tolist(), "label": np.arange(40) % 2}),
                   tmp_path / "img.parquet")
    s = build_splits(_cfg(tmp_path / "img.parquet"), seed=0)
    assert s.sample_shape == (2, 3)
    x, _ = s.train.base.__getitems__([7])
    assert torch.equal(x[0], torch.from_numpy(pixels[7]))


def test_save_to_disk_keeps_classlabel_names(tmp_path: Path) -> None:
    datagen.save_to_disk(tmp_path / "hf", names=("low", "mid", "high"))
    s = build_splits(_cfg(tmp_path / "hf"), seed=0)
    assert s.class_names == ("low", "mid", "high") and s.num_classes == 3


def test_datasetdict_train_and_validation_splits_are_used(tmp_path: Path) -> None:
    import datasets

    parts = {name: datasets.Dataset.from_dict(datagen.table(n, seed))
             for name, n, seed in (("train", 90, 0), ("validation", 30, 1))}
    datasets.DatasetDict(parts).save_to_disk(str(tmp_path / "dd"))
    s = build_splits(_cfg(tmp_path / "dd", val_fraction=0.5), seed=0)
    assert (len(s.train), len(s.val)) == (90, 30)


def test_csv_is_read_by_pyarrow_with_typed_columns(tmp_path: Path) -> None:
    p = tmp_path / "d.csv"
    p.write_text("a,target,b\n" + "\n".join(f"{i * 0.5},{i % 2},{i}" for i in range(20)) + "\n")
    s = build_splits(DataConfig(dataset=str(p), label_column="target"), seed=0)
    assert s.num_classes == 2 and s.sample_shape == (2,)
    x, y = s.train.base.__getitems__([3])
    assert x.tolist() == [[1.5, 3.0]] and y.tolist() == [1]


def test_two_ranks_train_on_parquet_and_save_to_disk(tmp_path: Path) -> None:
    datagen.parquet(tmp_path / "pq" / "t.parquet", n=400)
    datagen.save_to_disk(tmp_path / "hf", n=400)
    for data in ("pq", "hf"):
        proc = run_cli("run", "--nproc-per-node", "2", "--dataset", str(tmp_path / data),
                       "--epochs", "3", "--batch-size", "16", "--set", "data.num_workers=1",
                       "--set", f"data.cache_dir={tmp_path / 'cache'}", "--metrics-port", "0",
                       "--output-dir", str(tmp_path / f"out-{data}"))
        assert proc.returncode == 0, proc.stderr
        summary = read_json(tmp_path / f"out-{data}" / "summary.json")
        assert summary["val_total"] == 80 and summary["val_accuracy"] > 0.6
    assert read_json(tmp_path / "out-hf" / "summary.json")["class_names"] == ["low", "mid",
                                                                              "high"]


def test_parquet_without_the_label_column_fails_in_the_launcher(tmp_path: Path) -> None:
    path = datagen.parquet(tmp_path / "t.parquet")
    proc = run_cli("run", "--nproc-per-node", "2", "--dataset", str(path), "--set",
                   "data.label_column=target", "--metrics-port", "0")
    assert proc.returncode == 2
    assert_one_clear_error(proc, "t.parquet has no column 'target'", "data.label_column")
    assert "[rank" not in proc.stderr


@pytest.mark.parametrize(("columns", "cfg", "message"), [
    ({"a": [1.0, 2.0], "label": ["x", "y"]}, {}, "label column 'label' has type string"),
    ({"t": ["hi", "yo"], "label": [0, 1]}, {}, "feature column 't' has type string"),
    ({"a": [1.0, 2.0], "label": [0, 1]}, {"feature_columns": ["z"]}, "no column 'z'"),
    ({"a": [1.0, None, 3.0], "label": [0, 1, 0]}, {}, "feature column 'a' has a missing"),
    ({"a": [1.0, 2.0, 3.0], "label": [0, None, 1]}, {}, "1 missing values"),
])
def test_bad_tables_are_clear_errors(tmp_path: Path, columns: dict[str, list[object]],
                                     cfg: dict[str, object], message: str) -> None:
    pq.write_table(pa.table(columns), tmp_path / "t.parquet")
    with pytest.raises(DataError, match=message):
        build_splits(_cfg(tmp_path / "t.parquet", **cfg), seed=0)


@pytest.mark.parametrize(("content", "message"), [
    ("x,y\n1,2\n", "no column 'label'"),
    ("a,label\n1,2\n3\n", "Expected 2 columns, got 1"),
    ("a,label\nfoo,1\n", "feature column 'a' has type string"),
    ("", "Empty CSV file"),
])
def test_bad_csv_is_a_clear_error(tmp_path: Path, content: str, message: str) -> None:
    p = tmp_path / "d.csv"
    p.write_text(content)
    with pytest.raises(DataError, match=message):
        build_splits(DataConfig(dataset=str(p)), seed=0)


def test_missing_data_extra_names_it(tmp_path: Path) -> None:
    path = datagen.parquet(tmp_path / "t.parquet")
    code = ("import sys; sys.modules['pyarrow'] = None; sys.modules['datasets'] = None\n"
            "from trainer.config import DataConfig\nfrom trainer.data import build_splits\n"
            "from trainer.errors import DataError\n"
            f"try: build_splits(DataConfig(dataset={str(path)!r}), seed=0)\n"
            "except DataError as e: print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout
    assert "needs the Python package 'pyarrow'" in out and "ddp-trainer[data]" in out
