"""The chart as users install it on the test cluster: packaged, pushed to the cluster's OCI
registry and installed from there with Helm 4 (or from the folder with Helm 3), with
`.cache/cluster/values-local.yaml` and otherwise the values a test names."""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.cluster.kube import REPO, STATE, Cluster

CHART = REPO / "charts" / "ddp-trainer"
HELM4 = REPO / ".tools" / "bin" / "helm"
HELM3 = REPO / ".tools" / "bin" / "helm3"
REGISTRY = "10.250.0.1:5000"  # tools/cluster/layout.py


def chart_version() -> str:
    found = re.search(r"^version:\s*(\S+)", (CHART / "Chart.yaml").read_text(), re.M)
    assert found is not None
    return found.group(1).strip("\"'")


def helm(binary: Path, *args: str, cluster: Cluster, check: bool = True,
         timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig),
           "HELM_CACHE_HOME": str(STATE / "helm" / "cache"),
           "HELM_CONFIG_HOME": str(STATE / "helm" / "config"),
           "HELM_DATA_HOME": str(STATE / "helm" / "data")}
    proc = subprocess.run([str(binary), *args], capture_output=True, text=True, env=env,
                          timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"{binary.name} {' '.join(args)} exited {proc.returncode}:\n"
                             f"{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    return proc


def release(cluster: Cluster) -> str:
    """`make release` to the cluster's registry (the image under the chart's appVersion tag and
    the packaged chart, pushed as a user's CI pushes them); the chart's oci:// reference."""
    proc = subprocess.run(["make", "-s", "release", f"REGISTRY={REGISTRY}",
                           f"REGISTRY_CA={STATE / 'pki' / 'ca.crt'}"], cwd=REPO,
                          capture_output=True, text=True, timeout=1800, check=False)
    assert proc.returncode == 0, f"make release exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    chart = f"oci://{REGISTRY}/charts/ddp-trainer"
    assert f"release: chart {chart} {chart_version()}" in proc.stdout, proc.stdout
    return chart


@dataclass
class Release:
    cluster: Cluster
    name: str
    namespace: str
    values: dict[str, Any] = field(default_factory=dict)

    @property
    def job(self) -> str:
        return self.name  # the chart's fullname is the release name when it contains "ddp-trainer"

    def install(self, source: str, binary: Path = HELM4, tmp: Path | None = None) -> None:
        self._helm("install", source, binary, tmp)

    def _helm(self, action: str, source: str, binary: Path, tmp: Path | None) -> None:
        values = (tmp or Path("/tmp")) / f"values-{uuid.uuid4().hex[:6]}.json"
        values.write_text(json.dumps(self.values))
        args = [action, self.name, source, "-n", self.namespace,
                "-f", str(STATE / "values-local.yaml"), "-f", str(values)]
        if source.startswith("oci://"):
            args += ["--version", chart_version(), "--ca-file", str(STATE / "pki" / "ca.crt")]
        helm(binary, *args, cluster=self.cluster)

    @property
    def kind(self) -> str:
        return "trainjob" if self.values.get("apiKind") == "TrainJob" else "pytorchjob"

    def wait_condition(self, condition: str, timeout: int = 600) -> None:
        """A PyTorchJob's condition; for a TrainJob, Trainer's name for it (Complete)."""
        if self.kind == "trainjob":
            condition = {"Succeeded": "Complete"}.get(condition, condition)
        self.cluster.wait(f"{self.kind}/{self.job}", f"condition={condition}", self.namespace,
                          timeout)

    def upgrade(self, source: str, binary: Path = HELM4, tmp: Path | None = None) -> None:
        self._helm("upgrade", source, binary, tmp)

    def rank0_pod(self) -> str:
        """The pod of global rank 0: the Master, or the TrainJob's node 0 (JobSet's Job pod,
        named with a random suffix)."""
        if self.kind == "pytorchjob":
            return self.pod("master")
        selector = (f"jobset.sigs.k8s.io/jobset-name={self.job},"
                    "batch.kubernetes.io/job-completion-index=0")
        names = self.cluster.kubectl("get", "pods", "-n", self.namespace, "-l", selector,
                                     "-o", "jsonpath={.items[*].metadata.name}").stdout.split()
        assert len(names) == 1, f"pods of node 0: {names}"
        return names[0]

    def claims(self) -> tuple[str, ...]:
        """The persistence keys whose claims the chart creates with these values."""
        persistence = self.values.get("persistence", {})
        return tuple(key for key in ("checkpoints", "outputs")
                     if persistence.get(key, {}).get("create", {}).get("enabled"))

    def pod(self, replica: str, index: int = 0) -> str:
        return f"{self.job}-{replica}-{index}"


def release_name() -> str:
    return f"ddp-trainer-{uuid.uuid4().hex[:5]}"
