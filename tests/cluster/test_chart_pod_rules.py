"""The chart refuses at render exactly the requests and limits, and the tolerations, the real API
server refuses (`ddp-trainer.validateResources`, `ddp-trainer.validateTolerations` and the
schema): a pod the chart let through would never be created, the refusal only an event on the
job; a valid one it refused would block the install."""

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
RESOURCES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "cpu-limit-below-request": ({"cpu": "2"}, {"cpu": "1500m"}),
    "cpu-equal-as-exponent": ({"cpu": "20e-1"}, {"cpu": "2"}),
    "cpu-equal-as-decimal-and-milli": ({"cpu": "0.1"}, {"cpu": "100m"}),
    "cpu-request-without-limit": ({"cpu": "8"}, {}),
    "memory-equal-as-binary-and-bytes": ({"memory": "16Gi"}, {"memory": "17179869184"}),
    "memory-request-one-byte-above": ({"memory": "1073741825"}, {"memory": "1Gi"}),
    "gpu-request-below-limit": ({"nvidia.com/gpu": 1}, {"nvidia.com/gpu": 2}),
    "gpu-request-equal-limit": ({"nvidia.com/gpu": 2}, {"nvidia.com/gpu": 2}),
    "gpu-request-without-limit": ({"nvidia.com/gpu": 1}, {}),
    "limit-name-without-a-domain": ({}, {"foo": 1}),
    "limit-name-with-a-domain": ({}, {"example.com/foo": 1}),
    "memory-request-of-an-exabyte": ({"memory": "1E"}, {"memory": "16Gi"}),
    "memory-limit-of-an-exabyte": ({"memory": "8Gi"}, {"memory": "1E"}),
}


# case: one toleration, as a user writes it under the chart's `tolerations`
TOLERATIONS: dict[str, dict[str, Any]] = {
    "exists-without-key": {"operator": "Exists"},
    "equal-without-key": {"operator": "Equal", "value": "x"},
    "exists-with-a-value": {"key": "a", "operator": "Exists", "value": "x"},
    "seconds-without-no-execute": {"key": "a", "effect": "NoSchedule", "tolerationSeconds": 5},
    "seconds-with-no-execute": {"key": "a", "effect": "NoExecute", "tolerationSeconds": 5},
    "operator-misspelt": {"key": "a", "operator": "Exist"},
    "effect-misspelt": {"key": "a", "operator": "Exists", "effect": "NoSchedul"},
    "equal-with-value-and-effect": {"key": "a", "value": "b", "effect": "NoSchedule"},
    "key-not-a-label-name": {"key": "a b!", "operator": "Exists"},
    "key-with-a-prefix": {"key": "example.com/a_b-c.d", "operator": "Exists"},
    "value-not-a-label-value": {"key": "a", "value": "x y!"},
    "seconds-above-int64": {"key": "a", "effect": "NoExecute",
                            "tolerationSeconds": 2**63},
    # Helm reads values as float64: 2**63 - 1 arrives as 2**63 (refused by the schema's int64
    # maximum) and any value above 2**53 renders rounded; the largest it keeps exactly
    "seconds-at-2-to-the-53": {"key": "a", "effect": "NoExecute",
                               "tolerationSeconds": 2**53},
}


@pytest.fixture(scope="module")
def namespace(cluster: Cluster) -> str:
    return cluster.namespace("podrules")


def render(cluster: Cluster, tmp_path: Path, values: dict[str, Any]) -> dict[str, Any] | None:
    """The Master's pod spec the chart renders with `values`, or None when it refuses them
    (naming the value)."""
    path = tmp_path / "values.json"
    path.write_text(json.dumps({"gpusPerReplica": 0, **values}))
    proc = helm(HELM4, "template", "rules", str(CHART), "-f", str(path), cluster=cluster,
                check=False)
    if proc.returncode != 0:
        assert any(key in proc.stderr for key in values), proc.stderr
        return None
    (job,) = [doc for doc in yaml.safe_load_all(proc.stdout)
              if doc and doc["kind"] == "PyTorchJob"]
    spec: dict[str, Any] = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    return spec


def api_server_accepts(cluster: Cluster, namespace: str, **spec: Any) -> bool:
    container = spec.pop("container", {})
    manifest = pod("rules", cluster.image, ["--version"], container=container, **spec)
    manifest["metadata"]["namespace"] = namespace
    proc = cluster.kubectl("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(manifest),
                           check=False)
    # a number beyond int64 is refused when the server decodes the pod, before validation
    assert proc.returncode == 0 or "is invalid" in proc.stderr \
        or "cannot unmarshal number" in proc.stderr, proc.stderr
    return proc.returncode == 0


@pytest.mark.parametrize("case", sorted(RESOURCES))
def test_the_chart_refuses_exactly_the_resources_the_api_server_refuses(
        cluster: Cluster, namespace: str, tmp_path: Path, case: str) -> None:
    requests, limits = RESOURCES[case]
    server = api_server_accepts(cluster, namespace,
                                container={"resources": {"requests": requests, "limits": limits}})
    # null drops a per-GPU default (cpu and memory in both): the pod holds only the case's.
    defaults = {"cpu": None, "memory": None}
    spec = render(cluster, tmp_path, {"resources": {"perGpu": {"requests": defaults,
                                                               "limits": defaults},
                                                    "requests": requests, "limits": limits}})
    if spec is not None:
        want = {key: value for key, value in (("requests", requests), ("limits", limits))
                if value}
        (container,) = spec["containers"]
        assert container.get("resources", {}) == want, container
    assert (spec is not None) == server, \
        f"the API server {'accepts' if server else 'refuses'} {case}; the chart does not"


@pytest.mark.parametrize("case", sorted(TOLERATIONS))
def test_the_chart_refuses_exactly_the_tolerations_the_api_server_refuses(
        cluster: Cluster, namespace: str, tmp_path: Path, case: str) -> None:
    toleration = TOLERATIONS[case]
    server = api_server_accepts(cluster, namespace, tolerations=[toleration])
    spec = render(cluster, tmp_path, {"tolerations": [toleration]})
    if spec is not None:
        assert toleration in spec["tolerations"], spec["tolerations"]
    assert (spec is not None) == server, \
        f"the API server {'accepts' if server else 'refuses'} {case}; the chart does not"
