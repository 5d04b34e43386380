"""Numeric precision of the training step: fp32, bf16 autocast, or fp16 with a GradScaler.

bf16 keeps fp32's exponent range, so it needs no loss scaling and costs no extra device sync.
fp16 (CUDA only) scales the loss; a step whose scaled gradients overflow is skipped by the
scaler, and the schedule must not advance for it, so fp16 reads the skip decision on the host
once per step (one device sync; the price of exact schedules under fp16).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from trainer.errors import ConfigError

_NO_AUTOCAST = contextlib.nullcontext()
"""fp32's autocast: nothing (reusable, so the loop builds no context manager a step)."""


class Precision:
    def __init__(self, name: str, device: torch.device) -> None:
        self.check(name, device)
        self.name = name
        self.device = device
        self.scaler = torch.amp.GradScaler("cuda") if name == "fp16" else None
        self._scale: float | None = None

    @staticmethod
    def check(name: str, device: torch.device) -> None:
        if name == "fp16" and device.type != "cuda":
            raise ConfigError("train.precision 'fp16' needs a CUDA device (this rank has "
                              f"{device.type})", "use --set train.precision=bf16 on CPU")

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.name == "fp32":
            return _NO_AUTOCAST
        dtype = torch.bfloat16 if self.name == "bf16" else torch.float16
        return torch.autocast(self.device.type, dtype=dtype)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()  # type: ignore[no-untyped-call]

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Bring the gradients to their true scale (before clipping them)."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Apply the update; False when the scaler skipped it (inf/NaN gradients)."""
        if self.scaler is None:
            optimizer.step()
            return True
        before = self._scale if self._scale is not None else self.scaler.get_scale()
        self.scaler.step(optimizer)
        self.scaler.update()
        self._scale = self.scaler.get_scale()  # the step's one device sync
        return self._scale >= before  # the scale drops exactly when a step was skipped

    def state_dict(self) -> dict[str, Any]:
        return {"name": self.name, "scaler": self.scaler.state_dict() if self.scaler else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
            self._scale = None
