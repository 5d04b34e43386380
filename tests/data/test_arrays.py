"""Memory-mapped x.npy/y.npy: batches are gathers of the mapped file, checks stay bounded."""

from __future__ import annotations

import pickle
from pathlib import Path

import datagen
import numpy as np
import pytest
import torch
from conftest import read_json, run_cli
from test_cli_errors import assert_one_clear_error

from trainer.config import DataConfig
from trainer.data import build_splits
from trainer.data.arrays import ArrayDataset
from trainer.data.checks import sample_rows
from trainer.errors import DataError


def test_a_batch_is_the_rows_in_sampler_order(tmp_path: Path) -> None:
    x, y = datagen.arrays(tmp_path, n=300, shape=(2, 3), dtype="float64")
    ds = ArrayDataset(tmp_path)
    order = [17, 3, 299, 3, 0]
    xb, yb = ds.__getitems__(order)
    assert xb.dtype == torch.float32 and xb.shape == (5, 2, 3)
    assert np.array_equal(xb.numpy(), x[order].astype("float32"))
    assert yb.tolist() == y[order].tolist()
    assert ds.sample_shape == (2, 3) and ds.num_classes == 3


def test_the_arrays_are_mapped_not_loaded_and_pickle_as_paths(tmp_path: Path) -> None:
    datagen.arrays(tmp_path, n=20_000, shape=(64,))  # 5 MB of features
    ds = ArrayDataset(tmp_path)
    x, _ = ds._arrays()
    assert isinstance(x, np.memmap)
    clone = pickle.loads(pickle.dumps(ds))
    assert len(pickle.dumps(ds)) < 10_000
    assert torch.equal(clone.__getitems__([5, 1])[0], ds.__getitems__([5, 1])[0])


def test_split_views_share_the_mapped_dataset(tmp_path: Path) -> None:
    datagen.arrays(tmp_path, n=100)
    s = build_splits(DataConfig(dataset=str(tmp_path), val_fraction=0.25), seed=0)
    assert (len(s.train), len(s.val)) == (75, 25)
    assert s.train.base is s.val.base and isinstance(s.train.base, ArrayDataset)


def test_classes_txt_names_the_labels(tmp_path: Path) -> None:
    datagen.arrays(tmp_path, classes=3)
    (tmp_path / "classes.txt").write_text("red\ngreen\nblue\n")
    s = build_splits(DataConfig(dataset=str(tmp_path)), seed=0)
    assert s.class_names == ("red", "green", "blue") and s.num_classes == 3


def test_nan_outside_the_checked_sample_stops_the_batch_that_reads_it(tmp_path: Path) -> None:
    x, y = datagen.arrays(tmp_path, n=10_000)
    row = sorted(set(range(10_000)) - set(sample_rows(10_000).tolist()))[1000]
    x[row, 2] = np.nan  # not among the evenly spaced rows checked up front
    np.save(tmp_path / "x.npy", x)
    ds = ArrayDataset(tmp_path)
    ds.__getitems__([0, 1, 2])
    with pytest.raises(DataError, match=f"sample {row} has NaN or Inf"):
        ds.__getitems__([7, row])


def test_labels_are_range_checked_over_the_whole_file(tmp_path: Path) -> None:
    _, y = datagen.arrays(tmp_path, n=3000)
    y[2999] = 9
    np.save(tmp_path / "y.npy", y)
    with pytest.raises(DataError, match="label 9 is out of range"):
        ArrayDataset(tmp_path, num_classes=3)


def test_two_ranks_train_on_memory_mapped_arrays_with_workers(tmp_path: Path) -> None:
    datagen.arrays(tmp_path / "d", n=400, shape=(8,))
    proc = run_cli("run", "--nproc-per-node", "2", "--dataset", str(tmp_path / "d"),
                   "--epochs", "2", "--batch-size", "16", "--set", "data.num_workers=1",
                   "--metrics-port", "0", "--output-dir", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    assert "memory-mapped arrays x.npy (400 x 8 float32)" in proc.stderr
    summary = read_json(tmp_path / "out" / "summary.json")
    assert summary["val_total"] == 80 and summary["val_accuracy"] > 0.6


def _bad(tmp_path: Path, what: str) -> Path:
    d = tmp_path / "d"
    x, y = datagen.arrays(d, n=50)
    if what == "no y":
        (d / "y.npy").unlink()
    elif what == "lengths":
        np.save(d / "y.npy", y[:40])
    elif what == "float labels":
        np.save(d / "y.npy", y.astype("float32"))
    elif what == "object features":
        np.save(d / "x.npy", np.array(["a"] * 50))
    return d


@pytest.mark.parametrize(("what", "needles"), [
    ("no y", ["y.npy does not exist", "numpy.save"]),
    ("lengths", ["x.npy has 50 samples but y.npy has 40"]),
    ("float labels", ["y.npy must hold integer labels", "float32"]),
    ("object features", ["x.npy has dtype <U1", "float32"]),
])
def test_bad_arrays_fail_in_the_launcher_before_any_rank(tmp_path: Path, what: str,
                                                         needles: list[str]) -> None:
    proc = run_cli("run", "--nproc-per-node", "2", "--dataset", str(_bad(tmp_path, what)),
                   "--metrics-port", "0", "--output-dir", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert_one_clear_error(proc, *needles)
    assert "[rank" not in proc.stderr  # no rank was started
