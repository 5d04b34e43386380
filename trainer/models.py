"""Models: the seed's two-layer MyModel, an MLP, and a small CNN for image-shaped data."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from trainer.config import ModelConfig
from trainer.errors import ConfigError


class MyModel(nn.Module):
    """The seed article's model: Linear -> Linear (10 -> 20 -> 10 there), sizes generalised."""

    def __init__(self, in_features: int, hidden: int, num_classes: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.fc2(self.fc1(x.flatten(1)))
        return out


class MLP(nn.Module):
    def __init__(self, in_features: int, hidden_sizes: list[int], num_classes: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = in_features
        for h in hidden_sizes:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.net(x.flatten(1))
        return out


class SmallCNN(nn.Module):
    """Two conv blocks and global average pooling: fits 8x8 digits up to ImageNet-sized input."""

    def __init__(self, in_channels: int, channels: list[int], num_classes: int) -> None:
        super().__init__()
        c1, c2 = channels
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, c1, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2, ceil_mode=True),
            nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(c2, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.head(self.features(x).flatten(1))
        return out


def build_model(cfg: ModelConfig, feature_shape: tuple[int, ...], num_classes: int,
                seed: int) -> nn.Module:
    """Build the configured model with weights initialised from `seed` (same on every rank)."""
    torch.manual_seed(seed)
    in_features = math.prod(feature_shape)
    if cfg.name == "mymodel":
        return MyModel(in_features, cfg.hidden_sizes[0], num_classes)
    if cfg.name == "mlp":
        return MLP(in_features, cfg.hidden_sizes, num_classes)
    if len(feature_shape) == 2:  # (H, W) images: add the channel axis the CNN expects
        feature_shape = (1, *feature_shape)
    if len(feature_shape) != 3:
        raise ConfigError(
            f"model.name 'cnn' needs image-shaped samples (C, H, W) but they have shape "
            f"{feature_shape}", "use --model mlp for vectors, or store x as N x C x H x W")
    return _ChannelAdapter(SmallCNN(feature_shape[0], cfg.cnn_channels, num_classes),
                           feature_shape)


class _ChannelAdapter(nn.Module):
    """Reshape a batch to (N, C, H, W) so (N, H, W) files work with the CNN."""

    def __init__(self, inner: nn.Module, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.inner = inner
        self.shape = shape

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.inner(x.reshape(x.shape[0], *self.shape))
        return out
