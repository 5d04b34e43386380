"""k8s/ holds the chart rendered for kubectl-only users; it must match a fresh render."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml

from .chartlib import REPO, crd_errors, k8s_errors

K8S = REPO / "k8s"


def fresh_render(helm: str, out: Path) -> None:
    proc = subprocess.run(
        ["bash", str(REPO / "tools" / "render-k8s.sh"), str(out)],
        env={**os.environ, "HELM": helm},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr


def test_committed_manifests_match_the_chart(helm4: str, tmp_path: Path) -> None:
    fresh_render(helm4, tmp_path)
    rendered = sorted(p.name for p in tmp_path.glob("*.yaml"))
    assert rendered == ["ddp-trainer-trainjob.yaml", "ddp-trainer.yaml",
                        "monitoring-trainjob.yaml", "monitoring.yaml"]
    for name in rendered:
        committed = K8S / name
        assert committed.is_file(), f"k8s/{name} is missing: run `make k8s`"
        assert committed.read_text() == (tmp_path / name).read_text(), (
            f"k8s/{name} is out of date with charts/ddp-trainer: run `make k8s` and commit"
        )


def test_render_script_fails_loudly_without_helm(tmp_path: Path) -> None:
    proc = subprocess.run(
        ["bash", str(REPO / "tools" / "render-k8s.sh"), str(tmp_path)],
        env={**os.environ, "HELM": str(tmp_path / "no-helm")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "make tools" in proc.stderr


def test_plain_manifests_are_valid_and_not_marked_as_helm_managed() -> None:
    docs = [
        d
        for f in ("ddp-trainer.yaml", "ddp-trainer-trainjob.yaml", "monitoring.yaml",
                  "monitoring-trainjob.yaml")
        for d in yaml.safe_load_all((K8S / f).read_text())
        if d
    ]
    assert {d["kind"] for d in docs} == {
        "ServiceAccount",
        "ConfigMap",
        "PyTorchJob",
        "TrainJob",
        "PodMonitor",
        "PrometheusRule",
    }
    for d in docs:
        assert d["metadata"]["namespace"] == "ddp-trainer"
        assert d["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "kubectl"
        errors = (
            crd_errors(d)
            if d["kind"] in {"PyTorchJob", "TrainJob", "PodMonitor", "PrometheusRule"}
            else k8s_errors(d, "1.35.0")
        )
        assert errors == [], (d["kind"], errors)
