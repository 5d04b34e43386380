"""Vision-style example: 16x16 grey images of a ring, a square or a cross, placed at random.

Everything is generated from a seed, so no data ships with the example. The dataset returns
``(image, label)`` samples one at a time (no ``__getitems__``): ddp-trainer collates them with
torch's ``default_collate``, as any plain map-style Dataset is.

    ddp-trainer run --nproc-per-node 2 --dataset mytask.shapes:ShapesDataset \\
        --model mytask.shapes:TinyConvNet --set data.options.samples=2000
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import Dataset

from trainer import StepOutput

CLASSES = ("ring", "square", "cross")
SIZE = 16


def _draw(kind: int, rng: np.random.Generator) -> np.ndarray:
    img = np.zeros((SIZE, SIZE), np.float32)
    r = int(rng.integers(3, 6))  # half-size of the shape
    cy, cx = (int(v) for v in rng.integers(r + 1, SIZE - r - 1, size=2))
    yy, xx = np.mgrid[:SIZE, :SIZE]
    if kind == 0:  # ring
        d = np.hypot(yy - cy, xx - cx)
        img[(d >= r - 1) & (d <= r)] = 1.0
    elif kind == 1:  # square outline
        box = (abs(yy - cy) <= r) & (abs(xx - cx) <= r)
        inner = (abs(yy - cy) <= r - 1) & (abs(xx - cx) <= r - 1)
        img[box & ~inner] = 1.0
    else:  # cross
        img[(abs(yy - cy) <= r) & (xx == cx)] = 1.0
        img[(abs(xx - cx) <= r) & (yy == cy)] = 1.0
    return img + rng.normal(0.0, 0.15, img.shape).astype(np.float32)


class ShapesDataset(Dataset[tuple[Tensor, Tensor]]):
    """`samples` images (class i is sample i % 3), generated once from `seed`."""

    num_classes = len(CLASSES)
    sample_shape = (1, SIZE, SIZE)

    def __init__(self, samples: int = 3000, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        labels = np.arange(samples) % self.num_classes
        self.images = torch.from_numpy(np.stack([_draw(int(k), rng) for k in labels]))[:, None]
        self.labels = torch.from_numpy(labels).long()

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        return self.images[index], self.labels[index]


class TinyConvNet(nn.Module):
    """conv-BN-ReLU-pool twice, then a linear head (BatchNorm: DDP broadcasts its buffers)."""

    def __init__(self, num_classes: int, sample_shape: tuple[int, ...], width: int = 16) -> None:
        super().__init__()
        channels = sample_shape[0]
        self.features = nn.Sequential(
            nn.Conv2d(channels, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(),
            nn.AdaptiveMaxPool2d(1),
        )
        self.head = nn.Linear(2 * width, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.head(self.features(x).flatten(1))
        return out


def smoothed_step(model: nn.Module, batch: tuple[Tensor, Tensor]) -> StepOutput:
    """A custom step (``--step mytask.shapes:smoothed_step``): label-smoothed cross-entropy."""
    images, labels = batch
    logits = model(images)
    loss = F.cross_entropy(logits, labels, label_smoothing=0.1)
    correct = (logits.detach().argmax(1) == labels).sum()
    return StepOutput(loss, correct, labels.numel())
