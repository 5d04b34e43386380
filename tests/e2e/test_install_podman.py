"""tools/install-podman.sh: a no-op when installed, a clear failure when it cannot install."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tools.imagebuild.podman import Podman

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "install-podman.sh"
BASH = shutil.which("bash") or "/bin/bash"


def test_rerun_with_everything_installed_changes_nothing_and_succeeds(podman: Podman) -> None:
    result = subprocess.run([BASH, str(SCRIPT)], capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("podman: podman version 4.")
    assert "runc version" in result.stdout
    assert "apt-get" not in result.stdout + result.stderr


def test_missing_tools_without_root_fail_with_install_instructions(tmp_path: Path) -> None:
    fake_id = tmp_path / "id"  # uid 1000, and nothing else on PATH
    fake_id.write_text("#!/bin/sh\necho 1000\n")
    fake_id.chmod(0o755)
    result = subprocess.run([BASH, str(SCRIPT)], env={"PATH": str(tmp_path)},
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 1
    assert result.stderr.startswith("error: podman, runc or debootstrap missing and not running")
    assert "apt-get install -y --no-install-recommends podman runc" in result.stderr
