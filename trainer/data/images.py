"""Image folders: ``DIR/<class>/**/*.{jpg,jpeg,png,webp}``, one folder per class (sorted
names give the label indices), decoded with Pillow by whichever process fetches the batch.

Every rank lists the files once (a few seconds for ImageNet's 1.28 M files); the listing is
kept as two numpy arrays (the names as one byte buffer plus offsets, and the labels), not as a
million Python strings, so forked DataLoader workers share it instead of copying it page by
page as reference counts change. Files whose name starts with ``.`` are ignored; any other
file that is not an image is an error, and so is a class folder without images. Decoding
errors name the file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor
from torch.utils.data import Dataset

from trainer.data import checks, extras
from trainer.data.splits import PermutedRange
from trainer.data.transforms import ImageTransform
from trainer.data.views import epoch_of
from trainer.errors import DataError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")
HEADER_SAMPLE = 64
"""Files whose image header is read before training (evenly spaced over the listing)."""


def _visible(entries: list[os.DirEntry[str]]) -> list[os.DirEntry[str]]:
    return [e for e in entries if not e.name.startswith(".")]


def class_folders(root: Path) -> list[str]:
    """The class folder names of `root`, sorted (cheap: one directory listing)."""
    try:
        with os.scandir(root) as it:
            names = sorted(e.name for e in _visible(list(it)) if e.is_dir())
    except OSError as exc:
        raise DataError(f"{root} cannot be listed ({exc})", "check the path and its permissions") \
            from None
    if not names:
        raise DataError(f"{root} has no class folders", "put each class's images in "
                        "DIR/<class name>/ (see docs/data.md)")
    return names


def has_images(folder: Path, probe: int = 8) -> bool:
    """Whether the first few visible entries of `folder` include an image file."""
    try:
        with os.scandir(folder) as it:
            for n, entry in enumerate(e for e in it if not e.name.startswith(".")):
                if entry.name.lower().endswith(IMAGE_SUFFIXES) and entry.is_file():
                    return True
                if n >= probe:
                    return False
    except OSError:
        return False
    return False


def inspect(root: Path, training: bool = True) -> str:
    """The launcher's check: class folders exist (two or more for `training`) and none is
    empty (no file is opened)."""
    classes = class_folders(root)
    if training:
        _two_classes(root, classes)
    for name in classes:
        with os.scandir(root / name) as it:
            if not any(not e.name.startswith(".") for e in it):
                raise _empty(root / name)
    return f"image class folders ({len(classes)} classes)"


def _two_classes(root: Path, classes: list[str] | tuple[str, ...]) -> None:
    """A training folder's classes: two or more (as a one-class array or table is refused)."""
    if len(classes) < 2:
        raise DataError(f"{root} has only one class folder ({classes[0]!r})",
                        "a classifier needs >= 2 classes: put each class's images in its own "
                        "DIR/<class name>/")


def _empty(folder: Path) -> DataError:
    return DataError(f"class folder {folder} has no images",
                     f"add {'/'.join(IMAGE_SUFFIXES)} images to it or remove the folder")


@dataclass
class Listing:
    """Every image of a class-folder tree: file i is ``root/classes[labels[i]]/name(i)``."""

    root: Path
    classes: tuple[str, ...]
    names: npt.NDArray[np.uint8]
    """The relative names (below the class folder), file-system encoded, concatenated."""
    offsets: npt.NDArray[np.int64]
    labels: npt.NDArray[np.int64]

    def __len__(self) -> int:
        return len(self.labels)

    def path(self, i: int) -> Path:
        name = os.fsdecode(self.names[self.offsets[i]:self.offsets[i + 1]].tobytes())
        return self.root / self.classes[int(self.labels[i])] / name


def _class_files(folder: Path) -> list[bytes]:
    found: list[bytes] = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        base = Path(dirpath).relative_to(folder)
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            if not name.lower().endswith(IMAGE_SUFFIXES):
                raise DataError(f"{Path(dirpath) / name} is not an image "
                                f"({', '.join(IMAGE_SUFFIXES)})",
                                "move it out of the class folder (names starting with '.' are "
                                "ignored)")
            found.append(os.fsencode(base / name))
    if not found:
        raise _empty(folder)
    return found


def list_folder(root: Path, classes: list[str] | None = None) -> Listing:
    """List every image below `root`'s class folders. `classes` fixes the label order (a
    validation folder takes its training folder's); its folders must be among them."""
    present = class_folders(root)
    order = classes or present
    _two_classes(root, order)
    unknown = sorted(set(present) - set(order))
    if unknown:
        raise DataError(f"{root} has class folder(s) {unknown[:5]} that the training folder "
                        "lacks", "give validation and training the same class folders")
    chunks: list[bytes] = []
    lengths: list[int] = []
    labels: list[int] = []
    for label, name in enumerate(order):
        if name not in present:
            continue
        files = _class_files(root / name)
        chunks.extend(files)
        lengths.extend(len(f) for f in files)
        labels.extend([label] * len(files))
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    names = np.frombuffer(b"".join(chunks), dtype=np.uint8)
    listing = Listing(root, tuple(order), names, offsets, np.asarray(labels, dtype=np.int64))
    _check_headers(listing)
    return listing


def _check_headers(listing: Listing) -> None:
    """Open a bounded, evenly spaced sample of files (Pillow reads only the header)."""
    extras.require("PIL", "reading image folders")
    from PIL import Image, UnidentifiedImageError

    for i in checks.sample_rows(len(listing), HEADER_SAMPLE):
        path = listing.path(int(i))
        try:
            with Image.open(path):
                pass
        except (OSError, UnidentifiedImageError, ValueError) as exc:
            raise DataError(f"image {path} cannot be read ({exc})",
                            "replace or remove the file (check it with PIL.Image.open)") from None


class ImageFolderDataset(Dataset[tuple[Tensor, Tensor]]):
    """The files `indices` of a :class:`Listing` (all when None) through `transform`.

    A batch is decoded file by file (parallelism comes from DataLoader workers) and
    normalised as one tensor.
    """

    def __init__(self, listing: Listing, transform: ImageTransform,
                 indices: PermutedRange | None = None) -> None:
        self.listing = listing
        self.transform = transform
        self.indices = indices
        self.classes = listing.classes
        self.num_classes = len(listing.classes)
        self.sample_shape = (3, transform.size, transform.size)

    def __len__(self) -> int:
        return len(self.listing) if self.indices is None else len(self.indices)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        x, y = self.__getitems__([index])
        return x[0], y[0]

    def __getitems__(self, indices: list[int]) -> tuple[Tensor, Tensor]:
        epoch = epoch_of(indices) or 0
        pos = np.asarray(indices, dtype=np.int64)
        files = pos if self.indices is None else self.indices[pos]
        images = [self.transform.load(self.listing.path(int(i)), epoch, int(i)) for i in files]
        return self.transform.to_tensor(images), torch.from_numpy(self.listing.labels[files])
