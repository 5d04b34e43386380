"""Make the repository root importable so `tests.support` / `tests.metrics` resolve under a
bare `pytest` too (`python -m pytest`, which `make test` uses, adds the cwd already)."""

from __future__ import annotations

import sys
from pathlib import Path

_REPO = str(Path(__file__).resolve().parents[2])
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)
