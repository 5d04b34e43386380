"""Optimizers (and, with them, learning-rate schedules) built from the `optim` config."""

from __future__ import annotations

import torch
from torch import nn

from trainer.config import OptimConfig


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, object]]:
    """Decay matrices and embeddings, not parameters with fewer than 2 dimensions (biases,
    LayerNorm/BatchNorm weights): the usual AdamW rule (nanoGPT, Hugging Face Trainer)."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def build_optimizer(cfg: OptimConfig, model: nn.Module) -> torch.optim.Optimizer:
    if cfg.name == "adamw":
        return torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr,
                                 betas=(cfg.betas[0], cfg.betas[1]), eps=cfg.eps)
    if cfg.name == "adam":
        return torch.optim.Adam(model.parameters(), lr=cfg.lr,
                                betas=(cfg.betas[0], cfg.betas[1]), eps=cfg.eps,
                                weight_decay=cfg.weight_decay)
    return torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum,
                           weight_decay=cfg.weight_decay)
