"""The chart refuses at render exactly the requests and limits the real API server refuses
(`ddp-trainer.validateResources`): a pod the chart let through would never be created, the
refusal only an event on the job; a valid one it refused would block the install."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.helm import CHART, HELM4, helm
from tests.cluster.kube import Cluster
from tests.cluster.test_cluster import pod

# case: (requests, limits), as a user writes them under the chart's `resources`
CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "cpu-limit-below-request": ({"cpu": "2"}, {"cpu": "1500m"}),
    "cpu-equal-as-exponent": ({"cpu": "20e-1"}, {"cpu": "2"}),
    "cpu-equal-as-decimal-and-milli": ({"cpu": "0.1"}, {"cpu": "100m"}),
    "cpu-request-without-limit": ({"cpu": "8"}, {}),
    "memory-equal-as-binary-and-bytes": ({"memory": "16Gi"}, {"memory": "17179869184"}),
    "memory-request-one-byte-above": ({"memory": "1073741825"}, {"memory": "1Gi"}),
    "gpu-request-below-limit": ({"nvidia.com/gpu": 1}, {"nvidia.com/gpu": 2}),
    "gpu-request-equal-limit": ({"nvidia.com/gpu": 2}, {"nvidia.com/gpu": 2}),
    "gpu-request-without-limit": ({"nvidia.com/gpu": 1}, {}),
}


@pytest.fixture(scope="module")
def namespace(cluster: Cluster) -> str:
    return cluster.namespace("resources")


def chart_accepts(cluster: Cluster, tmp_path: Path, requests: dict[str, Any],
                  limits: dict[str, Any]) -> bool:
    # null drops a default (cpu and memory are set in both): the values hold only the case's.
    defaults = {"cpu": None, "memory": None}
    values = {"gpusPerReplica": 0,
              "resources": {"requests": {**defaults, **requests},
                            "limits": {**defaults, **limits}}}
    path = tmp_path / "values.json"
    path.write_text(json.dumps(values))
    proc = helm(HELM4, "template", "resources", str(CHART), "-f", str(path), cluster=cluster,
                check=False)
    if proc.returncode == 0:
        (job,) = [doc for doc in yaml.safe_load_all(proc.stdout)
                  if doc and doc["kind"] == "PyTorchJob"]
        (container,) = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"][
            "containers"]
        want = {key: value for key, value in (("requests", requests), ("limits", limits))
                if value}
        assert container.get("resources", {}) == want, container
        return True
    assert "resources.requests." in proc.stderr, proc.stderr
    return False


def api_server_accepts(cluster: Cluster, namespace: str, requests: dict[str, Any],
                       limits: dict[str, Any]) -> bool:
    manifest = pod("resources", cluster.image, ["--version"],
                   container={"resources": {"requests": requests, "limits": limits}})
    manifest["metadata"]["namespace"] = namespace
    proc = cluster.kubectl("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(manifest),
                           check=False)
    assert proc.returncode == 0 or "is invalid" in proc.stderr, proc.stderr
    return proc.returncode == 0


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_chart_refuses_exactly_the_resources_the_api_server_refuses(
        cluster: Cluster, namespace: str, tmp_path: Path, case: str) -> None:
    requests, limits = CASES[case]
    server = api_server_accepts(cluster, namespace, requests, limits)
    assert chart_accepts(cluster, tmp_path, requests, limits) == server, \
        f"the API server {'accepts' if server else 'refuses'} {case}; the chart does not"
