"""ddp-trainer: Kubernetes-native distributed PyTorch training.

``trainer.fit`` / ``trainer.evaluate`` are the Python API (:mod:`trainer.api`;
``trainer.load_checkpoint``: :mod:`trainer.export.loading`); they are
imported lazily so that ``ddp-trainer --version`` and the jobs CLI do not import torch.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_LAZY = {"fit": "trainer.api", "evaluate": "trainer.api", "load_config": "trainer.api",
         "load_checkpoint": "trainer.export.loading", "JobConfig": "trainer.config",
         "StepOutput": "trainer.components.steps"}

__all__ = ["JobConfig", "StepOutput", "__version__", "evaluate", "fit", "load_checkpoint",
           "load_config"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'trainer' has no attribute {name!r}")
