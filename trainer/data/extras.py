"""The optional packages of ``ddp-trainer[data]``, imported only by the formats using them."""

from __future__ import annotations

import importlib

from trainer.errors import DataError

EXTRA = "ddp-trainer[data]"
_DISTRIBUTIONS = {"PIL": "pillow", "pyarrow": "pyarrow", "datasets": "datasets"}


def require(module: str, purpose: str) -> None:
    """Import `module` (then a plain ``import`` of it is free) or raise naming the extra."""
    try:
        importlib.import_module(module)
    except ImportError:
        dist = _DISTRIBUTIONS.get(module.partition(".")[0], module)
        raise DataError(f"{purpose} needs the Python package {dist!r}, which is not installed",
                        f"pip install '{EXTRA}'") from None
