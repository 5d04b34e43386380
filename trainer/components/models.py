"""Built-in models (the article's two-layer MyModel, an MLP, a small CNN) and the one function
that builds any model, built-in or user import path, for training and for `evaluate`."""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from trainer import plugins
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


def mymodel(num_classes: int, sample_shape: tuple[int, ...],
            hidden_sizes: list[int] | tuple[int, ...] = (20,)) -> MyModel:
    """The article's two-layer model; its hidden width is the first of `hidden_sizes`."""
    return MyModel(math.prod(sample_shape), list(hidden_sizes)[0], num_classes)


def mlp(num_classes: int, sample_shape: tuple[int, ...],
        hidden_sizes: list[int] | tuple[int, ...] = (128, 64)) -> MLP:
    return MLP(math.prod(sample_shape), list(hidden_sizes), num_classes)


def cnn(num_classes: int, sample_shape: tuple[int, ...],
        cnn_channels: list[int] | tuple[int, ...] = (16, 32)) -> nn.Module:
    if len(sample_shape) == 2:  # (H, W) images: add the channel axis the CNN expects
        sample_shape = (1, *sample_shape)
    if len(sample_shape) != 3:
        raise ConfigError(
            f"model.name 'cnn' needs image-shaped samples (C, H, W) but they have shape "
            f"{sample_shape}", "use --model mlp for vectors, or store x as N x C x H x W")
    return _ChannelAdapter(SmallCNN(sample_shape[0], list(cnn_channels), num_classes),
                           sample_shape)


BUILTIN_MODELS: dict[str, Callable[[ModelConfig], Callable[..., nn.Module]]] = {
    # model.options override these config fields (functools.partial lets keywords win).
    "mymodel": lambda cfg: functools.partial(mymodel, hidden_sizes=cfg.hidden_sizes),
    "mlp": lambda cfg: functools.partial(mlp, hidden_sizes=cfg.hidden_sizes),
    "cnn": lambda cfg: functools.partial(cnn, cnn_channels=cfg.cnn_channels),
}
"""The built-in models by `model.name`: the one list of their names (config.MODEL_NAMES reads
it)."""


def _builtins(cfg: ModelConfig) -> dict[str, Callable[..., nn.Module]]:
    return {name: make(cfg) for name, make in BUILTIN_MODELS.items()}


def resolve(cfg: ModelConfig) -> Callable[..., Any]:
    """The model factory `cfg.name` names (imports a user module; builds nothing)."""
    return plugins.resolve(cfg.name, "model.name", _builtins(cfg))


def build_model(cfg: ModelConfig, num_classes: int | None, sample_shape: tuple[int, ...] | None,
                seed: int) -> nn.Module:
    """Build the configured model, weights initialised from `seed` (the same on every rank).

    The factory gets `num_classes` and `sample_shape` when the dataset defines them and the
    factory accepts them, plus everything in `cfg.options`.
    """
    factory = resolve(cfg)
    offered: dict[str, Any] = {}
    if num_classes is not None:
        offered["num_classes"] = num_classes
    if sample_shape is not None:
        offered["sample_shape"] = tuple(sample_shape)
    kwargs = {**plugins.accepted(factory, offered), **cfg.options}
    if cfg.name in _builtins(cfg):
        for name in ("num_classes", "sample_shape"):
            if name not in kwargs:
                raise ConfigError(f"model.name {cfg.name!r} needs the dataset's {name}, which "
                                  "it does not define",
                                  "give the dataset num_classes and sample_shape attributes, "
                                  "set data.num_classes, or use a model of your own")
        _check_fits(cfg.name, factory, kwargs)
    elif num_classes is None and "num_classes" not in kwargs and _names(factory, "num_classes"):
        raise ConfigError(f"model.name {cfg.name!r} takes num_classes, but the dataset neither "
                          "defines num_classes nor exposes its labels (targets or labels)",
                          "set data.num_classes (or model.options.num_classes)")
    torch.manual_seed(seed)
    model = plugins.call(factory, kwargs, f"model.name {cfg.name!r}",
                         "fix the model callable or model.options")
    if not isinstance(model, nn.Module):
        raise plugins.PluginError(f"model.name {cfg.name!r} returned a {type(model).__name__}, "
                                  "not a torch.nn.Module",
                                  "return an nn.Module instance from the callable")
    return model


def available_memory() -> int | None:
    """Bytes this process can still allocate: MemAvailable, or less under a cgroup memory
    limit (a pod's); None where neither can be read."""
    found: list[int] = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except OSError:
        pass
    for limit, usage in (("memory.max", "memory.current"),  # cgroup v2, then v1
                         ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):
        try:
            cgroup = Path("/sys/fs/cgroup")
            found.append(int((cgroup / limit).read_text()) - int((cgroup / usage).read_text()))
        except (OSError, ValueError):  # no such file, or "max": no limit
            continue
    return min(found) if found else None


def _check_fits(name: str, factory: Callable[..., Any], kwargs: dict[str, Any]) -> None:
    """A built-in model whose float32 weights alone exceed the memory left is one line, not
    a process that initialises terabytes until the OOM killer ends it. Counted on the meta
    device: nothing allocated."""
    try:
        with torch.device("meta"):
            params = sum(p.numel() for p in factory(**kwargs).parameters())
    except Exception:  # noqa: BLE001 - e.g. a bad model.options key: the real call reports it
        return
    free = available_memory()
    if free is not None and 4 * params > free:
        raise ConfigError(
            f"model.name {name!r} with these sizes has {params:.3g} parameters: "
            f"{4 * params / 1e9:.3g} GB of float32 weights, more than the {free / 1e9:.3g} GB "
            "of memory left",
            "lower model.hidden_sizes / model.cnn_channels, or data.num_classes")


def _names(factory: Any, parameter: str) -> bool:
    """Whether `factory`'s signature names `parameter` (not just **kwargs)."""
    try:
        return parameter in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False


class _ChannelAdapter(nn.Module):
    """Reshape a batch to (N, C, H, W) so (N, H, W) files work with the CNN."""

    def __init__(self, inner: nn.Module, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.inner = inner
        self.shape = shape

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.inner(x.reshape(x.shape[0], *self.shape))
        return out
