"""tools/install-prometheus.sh: a no-op when installed, a clear failure when it cannot install."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.support.prometheus import require_binary

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "install-prometheus.sh"
BASH = shutil.which("bash") or "/bin/bash"


def test_rerun_with_prometheus_installed_changes_nothing_and_succeeds() -> None:
    require_binary("prometheus")
    require_binary("promtool")
    result = subprocess.run([BASH, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("prometheus: prometheus, version ")
    assert "apt-get" not in result.stdout + result.stderr


def test_missing_binaries_without_root_fail_with_install_instructions(tmp_path: Path) -> None:
    # A PATH with only a fake `id` (uid 1000): no prometheus, promtool or apt-get on it.
    fake_id = tmp_path / "id"
    fake_id.write_text("#!/bin/sh\necho 1000\n")
    fake_id.chmod(0o755)
    result = subprocess.run(
        [BASH, str(SCRIPT)],
        env={"PATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "not running as root" in result.stderr
    assert "apt-get install -y --no-install-recommends prometheus" in result.stderr
    assert "make tools" in result.stderr
