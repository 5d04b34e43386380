"""Image class folders: layouts, transforms, per-sample augmentation seeds, bad images."""

from __future__ import annotations

from pathlib import Path

import datagen
import numpy as np
import pytest
import torch
from conftest import read_json, run_cli
from PIL import Image
from test_cli_errors import assert_one_clear_error

from trainer.components import checkpoint
from trainer.config import DataConfig
from trainer.data import build_splits
from trainer.data.images import ImageFolderDataset
from trainer.data.loaders import WorkerOptions, build_train_sampler, train_loader
from trainer.data.transforms import ImageTransform, center_crop_box, random_crop_box
from trainer.placement import DistContext

CPU = DistContext(0, 1, 0, 1, torch.device("cpu"), "gloo", False)


def _splits(root: Path, **kw: object) -> object:
    return build_splits(DataConfig(dataset=str(root), image_size=16, **kw), seed=0)  # type: ignore[arg-type]


def test_class_folders_split_into_augmented_train_and_plain_val(tmp_path: Path) -> None:
    datagen.images(tmp_path, classes=("cat", "dog", "eel"), per_class=10)
    s = _splits(tmp_path, val_fraction=0.2)
    assert s.class_names == ("cat", "dog", "eel") and s.num_classes == 3  # type: ignore[attr-defined]
    assert s.sample_shape == (3, 16, 16)  # type: ignore[attr-defined]
    train, val = s.train.base, s.val.base  # type: ignore[attr-defined]
    assert isinstance(train, ImageFolderDataset) and train.transform.train
    assert isinstance(val, ImageFolderDataset) and not val.transform.train
    files = [*train.indices.to_array().tolist(), *val.indices.to_array().tolist()]
    assert sorted(files) == list(range(30)) and len(val) == 6


def test_imagenet_layout_keeps_its_own_validation_split(tmp_path: Path) -> None:
    datagen.images(tmp_path / "train", classes=("a", "b"), per_class=6)
    datagen.images(tmp_path / "val", classes=("b",), per_class=3, seed=1)
    s = _splits(tmp_path, val_fraction=0.5)
    assert (len(s.train), len(s.val)) == (12, 3)  # type: ignore[attr-defined]
    _, labels = s.val.batch([0, 1, 2])  # type: ignore[attr-defined]
    assert labels.tolist() == [1, 1, 1]  # b is class 1 of the training folders


def test_batches_are_normalised_rgb(tmp_path: Path) -> None:
    folder = tmp_path / "c" / "grey"
    folder.mkdir(parents=True)
    for i in range(4):  # grey-scale and palette images become 3 channels
        Image.new("L" if i % 2 else "P", (30, 20), color=128).save(folder / f"{i}.png")
    datagen.images(tmp_path / "c", classes=("rgb",), per_class=4)
    s = _splits(tmp_path / "c", val_fraction=0.5, image_mean=[0.5, 0.5, 0.5],
                image_std=[0.25, 0.25, 0.25])
    x, _ = s.val.batch([0, 1])  # type: ignore[attr-defined]
    assert x.shape == (2, 3, 16, 16) and x.dtype == torch.float32
    assert float(x.min()) >= -2.0 - 1e-6 and float(x.max()) <= 2.0 + 1e-6


def test_evaluation_transform_is_deterministic(tmp_path: Path) -> None:
    datagen.images(tmp_path, per_class=5)
    s = _splits(tmp_path)
    a, b = s.val.batch([0, 1]), s.val.batch([0, 1])  # type: ignore[attr-defined]
    assert torch.equal(a[0], b[0])


def _epoch_batches(root: Path, workers: int, epoch: int) -> list[torch.Tensor]:
    s = _splits(root, val_fraction=0.0)
    sampler = build_train_sampler("shuffle", s.train, CPU, seed=0)  # type: ignore[attr-defined]
    loader = train_loader(s.train, sampler, 4, CPU,  # type: ignore[attr-defined]
                          WorkerOptions(num_workers=workers, seed=0))
    sampler.set_epoch(epoch)
    return [x for x, _ in loader]


def test_augmentation_depends_on_seed_epoch_and_sample_not_on_workers(tmp_path: Path) -> None:
    datagen.images(tmp_path, per_class=6)
    serial = _epoch_batches(tmp_path, 0, epoch=1)
    parallel = _epoch_batches(tmp_path, 2, epoch=1)
    assert all(torch.equal(a, b) for a, b in zip(serial, parallel, strict=True))
    other_epoch = _epoch_batches(tmp_path, 0, epoch=2)
    assert not torch.equal(torch.cat(serial).sum(0), torch.cat(other_epoch).sum(0))


def test_random_crop_box_stays_inside_with_torchvision_scale_and_ratio() -> None:
    rng = np.random.default_rng(0)
    for w, h in [(500, 375), (64, 64), (20, 300), (1, 1)]:
        for _ in range(200):
            left, top, right, bottom = random_crop_box(w, h, rng)
            assert 0 <= left < right <= w and 0 <= top < bottom <= h
    inside = [random_crop_box(500, 375, rng) for _ in range(500)]
    areas = [(r - x) * (b - y) / (500 * 375) for x, y, r, b in inside]
    assert min(areas) >= 0.07 and max(areas) <= 1.0
    assert center_crop_box(400, 200) == (112.5, 12.5, 287.5, 187.5)  # 175 = 0.875 x 200


def test_jpeg_draft_decoding_matches_a_full_decode(tmp_path: Path) -> None:
    yy, xx = np.mgrid[0:960, 0:1280]
    smooth = np.stack([xx % 256, yy % 256, (xx + yy) % 256], -1).astype(np.uint8)
    path = tmp_path / "big.jpg"
    Image.fromarray(smooth).save(path, quality=95)
    fast = ImageTransform(64, train=False).load(path, 0, 0)
    with Image.open(path) as img:
        full = img.convert("RGB").resize((64, 64), Image.Resampling.BILINEAR,
                                         box=center_crop_box(1280, 960))
    diff = np.abs(fast.astype(int) - np.asarray(full, dtype=int))
    assert fast.shape == (64, 64, 3) and diff.mean() < 4.0


def test_two_ranks_with_workers_keep_class_names_in_summary_and_checkpoint(
        tmp_path: Path) -> None:
    datagen.images(tmp_path / "d" / "train", classes=("cat", "dog"), per_class=16)
    datagen.images(tmp_path / "d" / "val", classes=("cat", "dog"), per_class=4, seed=1)
    proc = run_cli("run", "--nproc-per-node", "2", "--dataset", str(tmp_path / "d"),
                   "--model", "cnn", "--epochs", "3", "--batch-size", "4", "--set",
                   "data.image_size=16", "--set", "data.num_workers=1", "--lr", "0.1",
                   "--metrics-port", "0", "--output-dir", str(tmp_path / "out"),
                   "--checkpoint-dir", str(tmp_path / "ckpt"))
    assert proc.returncode == 0, proc.stderr
    assert "train and validation splits of image class folders (2 classes)" in proc.stderr
    summary = read_json(tmp_path / "out" / "summary.json")
    assert summary["class_names"] == ["cat", "dog"] and summary["val_total"] == 8
    state, path = checkpoint.load_latest(tmp_path / "ckpt")  # type: ignore[misc]
    assert state["class_names"] == ["cat", "dog"]
    # the checkpoint directory: its newest checkpoint, with workers on 2 ranks
    evaluated = run_cli("evaluate", "--checkpoint", str(tmp_path / "ckpt"), "--nproc-per-node",
                        "2", "--dataset", str(tmp_path / "d"), "--output-dir",
                        str(tmp_path / "ev"))
    assert evaluated.returncode == 0, evaluated.stderr
    report = read_json(tmp_path / "ev" / "eval.json")
    assert (report["checkpoint"], report["correct"]) == (str(path), summary["val_correct"])


def test_resume_with_other_worker_counts_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    datagen.images(tmp_path / "d", per_class=16)
    common = ["--dataset", str(tmp_path / "d"), "--model", "cnn", "--batch-size", "4",
              "--epochs", "2", "--checkpoint-every", "3", "--set", "data.image_size=16",
              "--metrics-port", "0"]
    full = run_cli("run", "--nproc-per-node", "2", *common, "--output-dir",
                   str(tmp_path / "full"), "--checkpoint-dir", str(tmp_path / "c-full"))
    assert full.returncode == 0, full.stderr
    ckpt = tmp_path / "c-split"
    first = run_cli("run", "--nproc-per-node", "2", *common, "--max-steps", "5", "--set",
                    "data.num_workers=2", "--output-dir", str(tmp_path / "a"),
                    "--checkpoint-dir", str(ckpt))
    assert first.returncode == 0, first.stderr
    second = run_cli("run", "--nproc-per-node", "2", *common, "--set", "data.num_workers=1",
                     "--output-dir", str(tmp_path / "b"), "--checkpoint-dir", str(ckpt))
    assert second.returncode == 0, second.stderr
    resumed, uninterrupted = (read_json(tmp_path / d / "summary.json") for d in ("b", "full"))
    assert resumed["resumed_from_step"] == 5
    assert resumed["train_loss"] == pytest.approx(uninterrupted["train_loss"], rel=1e-12)
    assert resumed["val_loss"] == pytest.approx(uninterrupted["val_loss"], rel=1e-12)


def test_empty_class_folder_fails_in_the_launcher(tmp_path: Path) -> None:
    datagen.images(tmp_path / "d", per_class=3)
    (tmp_path / "d" / "empty").mkdir()
    proc = run_cli("run", "--nproc-per-node", "2", "--dataset", str(tmp_path / "d"),
                   "--set", "data.format=images", "--metrics-port", "0")
    assert proc.returncode == 2
    assert_one_clear_error(proc, "class folder", "empty has no images")
    assert "[rank" not in proc.stderr


def test_non_image_file_in_a_class_folder_is_named(tmp_path: Path) -> None:
    datagen.images(tmp_path / "d", per_class=3)
    (tmp_path / "d" / "dog" / "notes.txt").write_text("hello")
    (tmp_path / "d" / "dog" / ".DS_Store").write_text("ignored")
    proc = run_cli("train", "--dataset", str(tmp_path / "d"), "--model", "cnn", "--set",
                   "data.image_size=16", "--metrics-port", "0",
                   "--output-dir", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert_one_clear_error(proc, "dog/notes.txt is not an image", "move it out")


def test_undecodable_image_is_named_even_from_a_worker(tmp_path: Path) -> None:
    datagen.images(tmp_path / "d", per_class=40)
    s = build_splits(DataConfig(dataset=str(tmp_path / "d"), image_size=16), seed=0)
    train, val = s.train.base, s.val.base
    # The preflight decodes the first batch (2) of each split in the rank itself; break a file
    # that only a DataLoader worker reads.
    preflight = {*train.indices[np.arange(2)].tolist(), *val.indices[np.arange(2)].tolist()}
    broken = next(train.listing.path(i) for i in train.indices.to_array().tolist()
                  if i not in preflight and train.listing.path(i).suffix == ".jpg")
    data = broken.read_bytes()
    broken.write_bytes(data[:len(data) * 4 // 5])  # headers intact, pixels cut off
    proc = run_cli("train", "--dataset", str(tmp_path / "d"), "--model", "cnn", "--set",
                   "data.image_size=16", "--set", "data.num_workers=2", "--epochs", "1",
                   "--batch-size", "2", "--metrics-port", "0",
                   "--output-dir", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert_one_clear_error(proc, f"image {broken} cannot be decoded", "replace or remove")
    assert not (tmp_path / "out" / "summary.json").exists()
