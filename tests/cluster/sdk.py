"""The Kubeflow Python SDKs, each in a venv of its own (`.cache/cluster/<extra>-venv`) with the pin
of its pyproject.toml extra: `sdk` (kubeflow-training, the training operator's TrainingClient)
and `trainer-sdk` (kubeflow, Trainer v2's TrainerClient). Both require kubernetes<36, which must
not replace the newer client the rest of the tests run with, and both install a `kubeflow`
package. Scripts run in them as a user's would."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import tomllib

from tests.cluster.kube import REPO, STATE


def requirements(extra: str) -> list[str]:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    found: list[str] = extras[extra]
    return found


def python(extra: str = "sdk") -> Path:
    """The venv's python, made (or remade when the pin changed) on first use."""
    venv = STATE / f"{extra}-venv"
    stamp = venv / "requirements.json"
    wanted = json.dumps(requirements(extra))
    if not (stamp.exists() and stamp.read_text() == wanted):
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", *requirements(extra)],
                       check=True, timeout=600)
        stamp.write_text(wanted)
    return venv / "bin" / "python"


def run(script: str, extra: str = "sdk", **variables: Any) -> Any:
    """Runs `script` in the SDK's venv with `variables` bound (JSON); returns what it printed
    last, parsed as JSON."""
    prelude = "import json\n" + "".join(f"{k} = json.loads({json.dumps(json.dumps(v))})\n"
                                        for k, v in variables.items())
    # From a file, as a user's script runs: the Trainer SDK reads a CustomTrainer function's
    # source with inspect.getsource, which needs one.
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "user_script.py"
        path.write_text(prelude + script)
        proc = subprocess.run([str(python(extra)), str(path)], capture_output=True, text=True,
                              timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
