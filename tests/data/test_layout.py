"""`--dataset PATH`: the layout is detected, said, overridable by data.format, and checked
cheaply before any rank starts."""

from __future__ import annotations

from pathlib import Path

import datagen
import numpy as np
import pytest
from conftest import run_cli
from test_cli_errors import assert_one_clear_error

from trainer.config import DataConfig
from trainer.data.layout import detect
from trainer.errors import DataError


def _detect(path: Path, fmt: str = "auto") -> tuple[str, Path, Path | None]:
    found = detect(path, DataConfig(dataset=str(path), format=fmt))
    return found.format, found.root, found.val


def test_each_layout_is_recognised(tmp_path: Path) -> None:
    datagen.arrays(tmp_path / "arrays")
    datagen.images(tmp_path / "folders", per_class=2)
    datagen.parquet(tmp_path / "tables" / "a.parquet")
    datagen.save_to_disk(tmp_path / "hf")
    np.savez(tmp_path / "f.npz", x=np.zeros((4, 2)), y=np.arange(4) % 2)
    (tmp_path / "f.csv").write_text("a,label\n1,0\n2,1\n")
    assert _detect(tmp_path / "arrays")[0] == "npy"
    assert _detect(tmp_path / "folders")[0] == "images"
    assert _detect(tmp_path / "tables")[0] == "parquet"
    assert _detect(tmp_path / "tables" / "a.parquet")[0] == "parquet"
    assert _detect(tmp_path / "hf")[0] == "arrow"
    assert _detect(tmp_path / "f.npz")[0] == "npz"
    assert _detect(tmp_path / "f.csv")[0] == "csv"


def test_train_and_val_subdirectories_are_the_split_layout(tmp_path: Path) -> None:
    datagen.arrays(tmp_path / "a" / "train")
    datagen.arrays(tmp_path / "a" / "validation", seed=1)
    assert _detect(tmp_path / "a") == ("npy", tmp_path / "a" / "train",
                                       tmp_path / "a" / "validation")
    datagen.images(tmp_path / "i" / "train", per_class=2)
    datagen.images(tmp_path / "i" / "val", per_class=2)
    assert _detect(tmp_path / "i")[0:2] == ("images", tmp_path / "i" / "train")


def test_class_folders_named_train_and_val_stay_class_folders(tmp_path: Path) -> None:
    datagen.images(tmp_path, classes=("train", "val"), per_class=2)
    assert _detect(tmp_path) == ("images", tmp_path, None)


def test_data_format_overrides_the_guess(tmp_path: Path) -> None:
    datagen.arrays(tmp_path)
    datagen.parquet(tmp_path / "t.parquet")
    assert _detect(tmp_path)[0] == "npy"
    assert _detect(tmp_path, "parquet")[0] == "parquet"
    (tmp_path / "data.txt").write_text("a,label\n1,0\n2,1\n")
    assert _detect(tmp_path / "data.txt", "csv")[0] == "csv"


def test_an_unknown_layout_says_what_is_expected(tmp_path: Path) -> None:
    (tmp_path / "readme.md").write_text("hi")
    with pytest.raises(DataError, match="holds no dataset layout.*set data.format"):
        _detect(tmp_path)
    with pytest.raises(DataError, match="unknown file type '.md'"):
        _detect(tmp_path / "readme.md")
    with pytest.raises(DataError, match="no class folders"):
        _detect(tmp_path, "images")


def test_the_launcher_says_which_layout_it_found(tmp_path: Path) -> None:
    datagen.arrays(tmp_path / "d", n=60)
    proc = run_cli("run", "--nproc-per-node", "1", "--dataset", str(tmp_path / "d"),
                   "--epochs", "1", "--metrics-port", "0", "--output-dir", str(tmp_path / "o"))
    assert proc.returncode == 0, proc.stderr
    launcher = [line for line in proc.stderr.splitlines()
                if line.startswith("INFO data.dataset")]
    assert launcher == [f"INFO data.dataset {tmp_path / 'd'}: memory-mapped arrays x.npy "
                        "(60 x 6 float32) and y.npy (int64) (data.format npy)"]


def test_an_unknown_format_is_a_config_error() -> None:
    proc = run_cli("train", "--set", "data.format=hdf5", "--metrics-port", "0")
    assert proc.returncode == 2
    assert_one_clear_error(proc, "data.format", "unknown format 'hdf5'", "npy")
