"""The invariants every bad input must keep: a documented exit code, exactly one line
``error: <problem> (fix: <fix>)`` on stderr (besides log lines), no traceback, and every file
that existed before byte-identical afterwards."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ERROR_LINE = re.compile(r"^(\[rank \d+\] )?error: .+ \(fix: .+\)$")
LOG_LINE = re.compile(r"^(\[rank \d+\] )?(DEBUG|INFO|WARNING) ")

BOOKKEEPING = (".starts-rank-",)
"""Files a run may update even when it fails: the start counters beside the checkpoints."""


@dataclass(frozen=True)
class Case:
    id: str
    argv: tuple[str, ...]
    """CLI arguments; ``{tmp}`` is replaced by the case's directory."""
    code: int
    needles: tuple[str, ...] = ()
    """Texts the error line must contain."""
    setup: Callable[[Path], None] | None = None
    warnings: int = 0
    """WARNING lines expected besides the error line."""


def snapshot(root: Path) -> dict[Path, bytes]:
    """Every regular file under `root` (bookkeeping files excluded), with its bytes."""
    return {p: p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.name.startswith(BOOKKEEPING)}


def assert_unchanged(before: dict[Path, bytes]) -> None:
    for path, data in before.items():
        assert path.is_file(), f"{path} was removed"
        assert path.read_bytes() == data, f"{path} was changed"


def assert_one_error_line(proc: subprocess.CompletedProcess[str], code: int,
                          needles: tuple[str, ...] = (), warnings: int = 0) -> str:
    """The exit code, one error line of the documented form containing `needles`, `warnings`
    WARNING lines, nothing else but log lines, no traceback; returns the error line."""
    text = proc.stderr
    assert "Traceback" not in text, text
    assert proc.returncode == code, f"exit {proc.returncode}, not {code}: {text}"
    lines = [line for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if "error:" in line and not LOG_LINE.match(line)]
    assert len(errors) == 1, text
    assert ERROR_LINE.match(errors[0]), errors[0]
    others = [line for line in lines if line not in errors]
    assert all(LOG_LINE.match(line) for line in others), text
    assert sum("WARNING" in line for line in others) == warnings, text
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]
