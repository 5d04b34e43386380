"""The example's values file, rendered by the real Helm 3 and 4: the chart runs the user's image
unchanged, and the trainer accepts (and resolves) the config file the chart writes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO, run_cli

from tests.chart.chartlib import CHART, NAMESPACE, find, find_tool, trainer_container

EXAMPLE = REPO / "examples" / "mytask"


def _render(helm: str) -> list[dict]:  # type: ignore[type-arg]
    proc = subprocess.run([find_tool(helm), "template", "mytrain", str(CHART), "--namespace",
                           NAMESPACE, "-f", str(EXAMPLE / "values.yaml")],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


@pytest.mark.parametrize("helm", ["helm", "helm3"])
def test_chart_runs_the_users_image_with_import_paths(helm: str, tmp_path: Path) -> None:
    docs = _render(helm)
    (job,) = find(docs, "PyTorchJob")
    for spec in job["spec"]["pytorchReplicaSpecs"].values():
        container = trainer_container(spec["template"])
        assert container["image"] == "registry.example.com/ml/mytask-trainer:1.0"
        assert container["command"] == ["ddp-trainer"]
    (cm,) = [d for d in find(docs, "ConfigMap") if "config.yaml" in d.get("data", {})]
    config = yaml.safe_load(cm["data"]["config.yaml"])
    assert config["model"] == {"name": "mytask.shapes:TinyConvNet", "options": {"width": 32}}
    assert config["data"]["options"] == {"samples": 50000, "seed": 7}
    # The trainer reads that file as the pod would (small data, one quick epoch).
    path = tmp_path / "config.yaml"
    path.write_text(cm["data"]["config.yaml"])
    proc = run_cli("train", "--config", str(path), "--set", "data.options.samples=300",
                   "--epochs", "1", "--metrics-port", "0", "--output-dir", str(tmp_path / "out"),
                   "--checkpoint-dir", str(tmp_path / "ckpt"),
                   env={"PYTHONPATH": f"{REPO}:{EXAMPLE}"})
    assert proc.returncode == 0, proc.stderr


def test_chart_schema_allows_own_keys_only_under_options() -> None:
    proc = subprocess.run([find_tool("helm"), "template", "mytrain", str(CHART), "-f",
                           str(EXAMPLE / "values.yaml"), "--set",
                           "trainerConfig.model.depth=3"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode != 0 and "depth" in proc.stderr


def test_example_dockerfile_passes_hadolint() -> None:
    hadolint = Path(sys.executable).parent / "hadolint"
    proc = subprocess.run([str(hadolint), str(EXAMPLE / "Dockerfile")], capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
