"""The kubeflow-training SDK in a venv of its own (`.cache/cluster/sdk-venv`), with the pin of
pyproject.toml's `sdk` extra: it requires kubernetes<36, which must not replace the newer client
the rest of the tests run with. Scripts run in it as a user's would."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import tomllib

from tests.cluster.kube import REPO, STATE

VENV = STATE / "sdk-venv"


def requirements() -> list[str]:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    found: list[str] = extras["sdk"]
    return found


def python() -> Path:
    """The venv's python, made (or remade when the pin changed) on first use."""
    stamp = VENV / "requirements.json"
    wanted = json.dumps(requirements())
    if not (stamp.exists() and stamp.read_text() == wanted):
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
        subprocess.run([str(VENV / "bin" / "pip"), "install", "-q", *requirements()],
                       check=True, timeout=600)
        stamp.write_text(wanted)
    return VENV / "bin" / "python"


def run(script: str, **variables: Any) -> Any:
    """Runs `script` in the SDK's venv with `variables` bound (JSON); returns what it printed
    last, parsed as JSON."""
    prelude = "import json\n" + "".join(f"{k} = json.loads({json.dumps(json.dumps(v))})\n"
                                        for k, v in variables.items())
    proc = subprocess.run([str(python()), "-c", prelude + script], capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
