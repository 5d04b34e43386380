"""Datasets: real and file data load, bad files fail clearly, the split is deterministic."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from trainer.config import DataConfig
from trainer.data import InMemoryDataset, build_splits, split_indices
from trainer.errors import DataError


def test_digits_is_real_image_shaped_data() -> None:
    s = build_splits(DataConfig(dataset="digits", val_fraction=0.2), seed=0)
    assert s.sample_shape == (1, 8, 8) and s.num_classes == 10
    assert len(s.train) + len(s.val) == 1797
    assert float(s.train.base.x.max()) <= 1.0


def test_synthetic_is_deterministic_from_the_seed() -> None:
    cfg = DataConfig(dataset="synthetic", synthetic_samples=50, synthetic_features=4)
    a, b, c = (build_splits(cfg, seed).train.batch(list(range(40))) for seed in (1, 1, 2))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


def test_split_is_disjoint_covering_and_seeded() -> None:
    tr, va = split_indices(101, 0.2, seed=3)
    assert sorted(torch.cat([tr, va]).tolist()) == list(range(101))
    assert len(va) == 20
    tr2, va2 = split_indices(101, 0.2, seed=3)
    assert torch.equal(va, va2)


def test_getitems_returns_a_collated_batch() -> None:
    ds = InMemoryDataset(torch.arange(10.0).reshape(5, 2), torch.arange(5))
    x, y = ds.__getitems__([4, 0])
    assert x.tolist() == [[8.0, 9.0], [0.0, 1.0]] and y.tolist() == [4, 0]


def test_npz_file_loads(tmp_path: Path) -> None:
    p = tmp_path / "d.npz"
    np.savez(p, x=np.random.rand(30, 3).astype("float32"), y=np.arange(30) % 3)
    s = build_splits(DataConfig(dataset=str(p)), seed=0)
    assert s.num_classes == 3 and s.sample_shape == (3,) and s.name == "d"


def test_csv_file_loads_with_configured_label_column(tmp_path: Path) -> None:
    p = tmp_path / "d.csv"
    rows = "\n".join(f"{i * 0.5},{i % 2},{i}" for i in range(20))
    p.write_text("a,target,b\n" + rows + "\n")
    s = build_splits(DataConfig(dataset=str(p), label_column="target"), seed=0)
    assert s.num_classes == 2 and s.sample_shape == (2,)


@pytest.mark.parametrize(("content", "message"), [
    ("x,y\n", "no column 'label'"),
    ("a,label\n1,2\n3\n", "has 1 fields"),
    ("a,label\nfoo,1\n", "non-numeric"),
    ("", "is empty"),
])
def test_bad_csv_is_a_clear_error(tmp_path: Path, content: str, message: str) -> None:
    p = tmp_path / "d.csv"
    p.write_text(content)
    with pytest.raises(DataError, match=message):
        build_splits(DataConfig(dataset=str(p)), seed=0)


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        build_splits(DataConfig(dataset=str(tmp_path / "none.npz")), seed=0)


def test_corrupt_npz_is_a_clear_error(tmp_path: Path) -> None:
    p = tmp_path / "d.npz"
    p.write_bytes(b"PK\x03\x04 definitely not a zip")
    with pytest.raises(DataError, match="not a readable .npz"):
        build_splits(DataConfig(dataset=str(p)), seed=0)


def test_npz_without_y_names_the_missing_array(tmp_path: Path) -> None:
    p = tmp_path / "d.npz"
    np.savez(p, x=np.zeros((4, 2)))
    with pytest.raises(DataError, match=r"lacks array\(s\) \['y'\]"):
        build_splits(DataConfig(dataset=str(p)), seed=0)


def test_label_out_of_range_is_rejected(tmp_path: Path) -> None:
    p = tmp_path / "d.npz"
    np.savez(p, x=np.zeros((6, 2), "float32"), y=np.array([0, 1, 2, 3, 4, 9]))
    with pytest.raises(DataError, match="label 9 is out of range"):
        build_splits(DataConfig(dataset=str(p), num_classes=5), seed=0)
    np.savez(p, x=np.zeros((3, 2), "float32"), y=np.array([0, -1, 1]))
    with pytest.raises(DataError, match="label -1 is out of range"):
        build_splits(DataConfig(dataset=str(p)), seed=0)


def test_nan_features_are_rejected(tmp_path: Path) -> None:
    p = tmp_path / "d.npz"
    x = np.zeros((4, 2), "float32")
    x[1, 1] = np.nan
    np.savez(p, x=x, y=np.array([0, 1, 0, 1]))
    with pytest.raises(DataError, match="NaN or Inf"):
        build_splits(DataConfig(dataset=str(p)), seed=0)
