"""``--dataset s3://bucket/key-or-prefix``: copied into a local cache once per machine and read
as the local path would be, against a real S3 server (SeaweedFS, tests/support/s3.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.conftest import read_json, run_cli
from tests.data import datagen
from trainer.config import DataConfig


def _npz(root: Path) -> Path:
    x, y = datagen.arrays(root / "arrays")
    np.savez(root / "train.npz", x=x, y=y)
    return root / "train.npz"


def _parquet(root: Path) -> Path:
    return datagen.parquet(root / "table.parquet")


def _csv(root: Path) -> Path:
    cols = datagen.table(90)
    root.mkdir(parents=True, exist_ok=True)
    (root / "table.csv").write_text("a,b,label\n" + "".join(
        f"{cols['a'][i]},{cols['b'][i]},{cols['label'][i]}\n" for i in range(90)))
    return root / "table.csv"


def _npy_folder(root: Path) -> Path:
    datagen.arrays(root / "arrays")
    return root / "arrays"


def _images(root: Path) -> Path:
    datagen.images(root / "images", per_class=6)
    return root / "images"


def _upload(server: Any, local: Path, prefix: str) -> str:
    fs, url = server.filesystem(), server.url(prefix)
    target = url.removeprefix("s3://")
    if local.is_dir():
        for path in sorted(p for p in local.rglob("*") if p.is_file()):
            fs.put_file(str(path), f"{target}/{path.relative_to(local).as_posix()}")
    else:
        fs.put_file(str(local), target)
    return url


@pytest.fixture
def s3_env(s3_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    for key, value in s3_server.env.items():
        monkeypatch.setenv(key, value)
    return s3_server


def _samples(dataset: str, cache: Path) -> tuple[int, int, list[Any]]:
    from trainer.data.source import build_splits

    splits = build_splits(DataConfig(dataset=dataset, cache_dir=str(cache)), seed=0)
    first = [splits.train[i] for i in range(3)]
    return len(splits.train), len(splits.val), first


@pytest.mark.parametrize("make", [_npz, _npy_folder, _parquet, _csv, _images],
                         ids=["npz", "npy-folder", "parquet", "csv", "image-folder"])
def test_a_dataset_in_s3_gives_the_same_samples_as_its_local_copy(
        make: Callable[[Path], Path], s3_env: Any, tmp_path: Path) -> None:
    local = make(tmp_path / "data")
    url = _upload(s3_env, local, f"datasets/{make.__name__}/{local.name}")
    here, there = _samples(str(local), tmp_path / "c1"), _samples(url, tmp_path / "c2")
    assert here[:2] == there[:2]
    for a, b in zip(here[2], there[2], strict=True):
        for u, v in zip(a, b, strict=True):
            assert torch.equal(torch.as_tensor(u), torch.as_tensor(v))


def test_the_copy_is_reused_until_the_store_lists_other_objects(
        s3_env: Any, tmp_path: Path) -> None:
    from trainer.data import remote

    url = _upload(s3_env, _npz(tmp_path / "data"), "datasets/reuse/train.npz")
    cache = str(tmp_path / "cache")
    first = remote.local_copy(url, cache)
    stamp = first.stat().st_mtime_ns
    assert remote.local_copy(url, cache) == first
    assert first.stat().st_mtime_ns == stamp  # not fetched again
    x, y = datagen.arrays(tmp_path / "other", n=50, seed=3)
    np.savez(tmp_path / "other.npz", x=x, y=y)
    _upload(s3_env, tmp_path / "other.npz", "datasets/reuse/train.npz")  # replaced in the store
    again = remote.local_copy(url, cache)
    assert len(np.load(again)["y"]) == 50


def test_a_two_rank_run_on_an_s3_dataset_ends_as_on_the_local_file(
        s3_env: Any, tmp_path: Path) -> None:
    data = _npz(tmp_path / "data")
    url = _upload(s3_env, data, "datasets/run/train.npz")
    common = ["--nproc-per-node", "2", "--epochs", "2", "--batch-size", "16", "--metrics-port",
              "0"]
    env = s3_env.env
    local = run_cli("run", *common, "--dataset", str(data), "--output-dir",
                    str(tmp_path / "local"))
    assert local.returncode == 0, local.stderr
    remote = run_cli("run", *common, "--dataset", url, "--output-dir", str(tmp_path / "s3"),
                     "--set", f"data.cache_dir={tmp_path / 'cache'}", env=env)
    assert remote.returncode == 0, remote.stderr
    a, b = read_json(tmp_path / "local" / "summary.json"), read_json(tmp_path / "s3" /
                                                                      "summary.json")
    assert (a["steps"], a["val_accuracy"]) == (b["steps"], b["val_accuracy"])
    assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-12)
    assert f"(copy of {url})" in remote.stderr
    # one copy on this machine, for the launcher and both ranks
    assert len([p for p in (tmp_path / "cache" / "s3").iterdir() if p.is_dir()]) == 1


@pytest.mark.parametrize(("name", "says"), [
    ("datasets/missing/none.npz", "no such object or prefix in the store"),
    ("datasets/missing-prefix/", "no such object or prefix in the store")])
def test_a_missing_s3_dataset_is_one_line_and_exit_2(name: str, says: str, s3_env: Any,
                                                     tmp_path: Path) -> None:
    url = s3_env.url(name)
    proc = run_cli("train", "--dataset", url, "--epochs", "1", "--metrics-port", "0",
                   "--output-dir", str(tmp_path / "out"), env=s3_env.env)
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert says in errors[0] and "(fix: check the name (aws s3 ls" in errors[0]


def test_wrong_credentials_for_an_s3_dataset_are_one_line_and_exit_2(
        s3_server: Any, tmp_path: Path) -> None:
    env = {**s3_server.env, "AWS_SECRET_ACCESS_KEY": "not-the-secret"}
    proc = run_cli("train", "--dataset", s3_server.url("datasets/x.npz"), "--epochs", "1",
                   "--metrics-port", "0", "--output-dir", str(tmp_path / "out"), env=env)
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert errors[0].startswith("error: data.dataset s3://") and "AWS_ACCESS_KEY_ID" in errors[0]
