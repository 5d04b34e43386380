"""The same commands through `ddp-trainer jobs` and through kubectl's plugin mechanism."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.cli import main as ddp_trainer_main

REPO = Path(__file__).resolve().parents[2]


def test_ddp_trainer_jobs_runs_the_same_commands(
        kubeconfig_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert ddp_trainer_main(["jobs", "status", "mnist"]) == 0
    assert "State:       Running" in capsys.readouterr().out
    assert ddp_trainer_main(["jobs", "status", "nope"]) == 2
    assert 'pytorchjob "nope" not found' in capsys.readouterr().err
    assert ddp_trainer_main(["jobs", "status", ""]) == 2  # the flags' checks run here too
    assert "job name '' is not a Kubernetes object name" in capsys.readouterr().err


def test_ddp_trainer_jobs_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        ddp_trainer_main(["jobs", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for command in ("list", "status", "logs", "wait", "delete", "suspend", "resume"):
        assert command in out


def test_wait_help_documents_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        ddp_trainer_main(["jobs", "wait", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "exit codes: 0 Succeeded, 1 Failed, 2 error" in out and "3 timed out" in out


def kubectl() -> str:
    found = shutil.which("kubectl") or str(REPO / ".tools" / "bin" / "kubectl")
    assert Path(found).exists(), "kubectl not found: run `make tools` (tools/install-helm.sh)"
    return found


def test_kubectl_finds_and_runs_the_plugin(kubeconfig_file: Path) -> None:
    plugin = Path(sys.executable).with_name("kubectl-ddp")
    assert plugin.exists(), "kubectl-ddp is not installed: `make venv` installs the package"
    env = {**os.environ, "PATH": f"{plugin.parent}{os.pathsep}{os.environ['PATH']}",
           "KUBECONFIG": str(kubeconfig_file)}
    found = subprocess.run([kubectl(), "plugin", "list"], env=env, capture_output=True,
                           text=True, timeout=60, check=False)
    assert str(plugin) in found.stdout, found.stdout + found.stderr

    result = subprocess.run([kubectl(), "ddp", "status", "mnist", "-n", "training"], env=env,
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert "mnist-worker-1" in result.stdout and "gpu-node-3" in result.stdout

    missing = subprocess.run([kubectl(), "ddp", "wait", "nope"], env=env, capture_output=True,
                             text=True, timeout=120, check=False)
    assert missing.returncode == 2  # kubectl passes the plugin's exit code through
    assert missing.stderr.startswith('error: pytorchjob "nope" not found')
