"""Image transforms with Pillow (torchvision does not import beside this torch).

Training: random resized crop (torchvision's parameters: scale 0.08-1, aspect 3/4-4/3, ten
tries then a center crop) and a horizontal flip with probability 1/2. Evaluation: resize the
shorter side to ``size / 0.875`` and take the center ``size x size`` (224 of 256, the ImageNet
convention). Both end in one ``Image.resize(box=...)`` call, which crops and resamples in a
single pass, and JPEGs are decoded with ``draft``: libjpeg scales by 1/2, 1/4 or 1/8 during
the DCT, to the smallest scale that still gives the crop at least ``size`` pixels, several
times faster than a full decode for photos much larger than the crop.

Randomness: each sample's crop and flip come from a generator seeded with (seed, epoch,
dataset index), so an image gets the same augmentation whatever the number of DataLoader
workers, on whichever rank, and again after a resume.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor
from torch.utils.data import get_worker_info

from trainer.errors import DataError

if TYPE_CHECKING:
    from PIL.Image import Image as PILImage

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
EVAL_CROP_FRACTION = 0.875
"""Center-crop side over the resized shorter side at evaluation (224/256)."""
SCALE = (0.08, 1.0)
RATIO = (3 / 4, 4 / 3)
_MASK64 = (1 << 64) - 1

Box = tuple[float, float, float, float]


def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The generator of one sample's augmentation (about 10 us; a decode takes milliseconds)."""
    return np.random.default_rng([seed & _MASK64, epoch & _MASK64, index & _MASK64])


def random_crop_box(width: int, height: int, rng: np.random.Generator) -> Box:
    """torchvision's RandomResizedCrop box (left, top, right, bottom)."""
    area = width * height
    log_ratio = (math.log(RATIO[0]), math.log(RATIO[1]))
    for _ in range(10):
        target = area * rng.uniform(*SCALE)
        aspect = math.exp(rng.uniform(*log_ratio))
        w = round(math.sqrt(target * aspect))
        h = round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            left = int(rng.integers(0, width - w + 1))
            top = int(rng.integers(0, height - h + 1))
            return (left, top, left + w, top + h)
    ratio = width / height  # fallback: the largest center crop within the aspect range
    if ratio < RATIO[0]:
        w, h = width, round(width / RATIO[0])
    elif ratio > RATIO[1]:
        w, h = round(height * RATIO[1]), height
    else:
        w, h = width, height
    left, top = (width - w) // 2, (height - h) // 2
    return (left, top, left + w, top + h)


def center_crop_box(width: int, height: int) -> Box:
    """The square that resize-shorter-side-then-center-crop keeps, in original pixels."""
    side = min(width, height) * EVAL_CROP_FRACTION
    left, top = (width - side) / 2, (height - side) / 2
    return (left, top, left + side, top + side)


@dataclass(frozen=True)
class ImageTransform:
    """Path -> ``size x size x 3`` uint8 array; batches are normalised by :meth:`to_tensor`."""

    size: int
    train: bool
    seed: int = 0
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD

    def load(self, path: Path, epoch: int, index: int) -> npt.NDArray[np.uint8]:
        from PIL import Image

        rng = sample_rng(self.seed, epoch, index) if self.train else None
        try:
            with Image.open(path) as opened:
                width, height = opened.size
                box = (random_crop_box(width, height, rng) if rng is not None
                       else center_crop_box(width, height))
                img = _decode(opened, box, self.size)
                scale_x, scale_y = img.width / width, img.height / height
                box = (box[0] * scale_x, box[1] * scale_y, box[2] * scale_x, box[3] * scale_y)
                out = img.resize((self.size, self.size), Image.Resampling.BILINEAR, box=box)
                arr = np.asarray(out, dtype=np.uint8)
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
            raise DataError(f"image {path} cannot be decoded ({exc})",
                            "replace or remove the file (check it with PIL.Image.open)") from None
        if rng is not None and rng.random() < 0.5:
            arr = arr[:, ::-1]
        return arr

    def to_tensor(self, images: list[npt.NDArray[np.uint8]]) -> Tensor:
        """N x 3 x size x size float32, ``(pixel / 255 - mean) / std`` per channel.

        Channel-first uint8 first (one strided byte copy per image), then one conversion and
        two in-place passes over the float batch: ~0.5 ms an image at 224 px, against ~1 ms for
        a float copy from the permuted uint8 view.
        """
        chw = np.empty((len(images), 3, self.size, self.size), dtype=np.uint8)
        for i, image in enumerate(images):
            chw[i] = image.transpose(2, 0, 1)
        out = _batch_tensor(chw.shape)
        out.copy_(torch.from_numpy(chw))
        std = torch.tensor(self.std, dtype=torch.float32).view(1, 3, 1, 1)
        mean = torch.tensor(self.mean, dtype=torch.float32).view(1, 3, 1, 1)
        return out.mul_(1.0 / (255.0 * std)).sub_(mean / std)


def _batch_tensor(shape: tuple[int, ...]) -> Tensor:
    """An uninitialised float32 batch; in a DataLoader worker, allocated in shared memory as
    torch's own ``default_collate`` does it (the same internal call), so the batch reaches the
    training process without being copied there: moving a 64 x 3 x 224 x 224 batch into
    shared memory afterwards costs ~40 ms, as much as decoding a fifth of it."""
    if get_worker_info() is None:
        return torch.empty(shape, dtype=torch.float32)
    like = torch.empty(0, dtype=torch.float32)
    storage = like._typed_storage()._new_shared(  # type: ignore[no-untyped-call]
        math.prod(shape), device=like.device)
    return like.new(storage).resize_(shape)


def _decode(img: PILImage, box: Box, size: int) -> PILImage:
    """`img` decoded as RGB: a JPEG at the smallest DCT scale that leaves the crop at least
    `size` pixels wide and high."""
    width, height = img.size
    if img.format == "JPEG":
        crop_w, crop_h = max(1.0, box[2] - box[0]), max(1.0, box[3] - box[1])
        img.draft("RGB", (math.ceil(width * size / crop_w), math.ceil(height * size / crop_h)))
    return img.convert("RGB")
