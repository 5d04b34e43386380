"""The chart lints and renders the same with Helm 3 and Helm 4, and every rendered object is
valid: built-in kinds against the Kubernetes schemas, custom resources against their real CRDs,
each replica's pod template as a v1/Pod, and the PyTorchJob against the training operator's
admission rules (kubeflow/training-operator v1.9, pkg/webhooks/pytorch/pytorchjob_webhook.go)."""

from __future__ import annotations

import re

import pytest

from .chartlib import (
    CHART,
    NAMESPACE,
    TRAINJOB_VALUE_SETS,
    VALUE_SETS,
    VALUES_DIR,
    as_pod,
    crd_errors,
    find,
    k8s_errors,
    one,
    render,
    run_helm,
    template_text,
)

# Oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the kubectl we install.
K8S_VERSIONS = ("1.27.0", "1.35.0")
BUILTIN_KINDS = {"ConfigMap", "ServiceAccount", "PersistentVolumeClaim", "NetworkPolicy", "Role",
                 "RoleBinding"}
CUSTOM_KINDS = {"PyTorchJob", "PodMonitor", "PrometheusRule"}
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@pytest.mark.parametrize("which", ["helm3", "helm4"])
@pytest.mark.parametrize("value_set", [*VALUE_SETS, *TRAINJOB_VALUE_SETS])
def test_helm_lint_strict_passes(helms: dict[str, str], which: str, value_set: str) -> None:
    proc = run_helm(
        helms[which],
        "lint",
        "--strict",
        str(CHART),
        "--namespace",
        NAMESPACE,
        "-f",
        str(VALUES_DIR / f"{value_set}.yaml"),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout


@pytest.mark.parametrize("value_set", [*VALUE_SETS, *TRAINJOB_VALUE_SETS])
def test_helm3_and_helm4_render_identical_manifests(helms: dict[str, str], value_set: str) -> None:
    assert template_text(helms["helm3"], value_set) == template_text(helms["helm4"], value_set)


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_every_rendered_object_is_of_a_known_kind(helm4: str, value_set: str) -> None:
    kinds = {d["kind"] for d in render(helm4, value_set)}
    assert kinds <= BUILTIN_KINDS | CUSTOM_KINDS, kinds - BUILTIN_KINDS - CUSTOM_KINDS
    assert "PyTorchJob" in kinds


@pytest.mark.parametrize("k8s_version", K8S_VERSIONS)
@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_builtin_objects_and_pod_templates_match_kubernetes_schema(
    helm4: str, value_set: str, k8s_version: str
) -> None:
    docs = render(helm4, value_set)
    objects = [d for d in docs if d["kind"] in BUILTIN_KINDS]
    job = one(docs, "PyTorchJob")
    objects += [as_pod(job, rtype) for rtype in job["spec"]["pytorchReplicaSpecs"]]
    # Custom resources' metadata is only `type: object` in their CRDs: check it as ObjectMeta.
    objects += [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": d["metadata"]}
        for d in docs
        if d["kind"] in CUSTOM_KINDS
    ]
    errors = {f"{o['kind']}/{o['metadata']['name']}": k8s_errors(o, k8s_version) for o in objects}
    assert {k: v for k, v in errors.items() if v} == {}


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_custom_resources_match_their_crd_schema(helm4: str, value_set: str) -> None:
    docs = [d for d in render(helm4, value_set) if d["kind"] in CUSTOM_KINDS]
    errors = {f"{d['kind']}/{d['metadata']['name']}": crd_errors(d) for d in docs}
    assert {k: v for k, v in errors.items() if v} == {}


def test_crd_validation_rejects_an_unknown_field_and_a_wrong_type(helm4: str) -> None:
    job = one(render(helm4, "defaults"), "PyTorchJob")
    job["spec"]["runPolicy"]["cleanPodPolicyy"] = "All"
    job["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = "1"
    errors = "\n".join(crd_errors(job))
    assert "cleanPodPolicyy" in errors
    assert "replicas" in errors


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_pytorchjob_passes_operator_admission_rules(helm4: str, value_set: str) -> None:
    job = one(render(helm4, value_set), "PyTorchJob")
    name = job["metadata"]["name"]
    assert DNS1035.match(name) and len(name) <= 63, name
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert set(specs) <= {"Master", "Worker"}
    assert specs["Master"]["replicas"] == 1
    for rtype, spec in specs.items():
        containers = spec["template"]["spec"]["containers"]
        assert "pytorch" in [c["name"] for c in containers], rtype
        assert all(c.get("image") for c in containers), rtype
        assert spec["restartPolicy"] in {"Always", "OnFailure", "Never", "ExitCode"}
        assert spec["replicas"] >= 1
        # Pods and headless Services are named <job>-<type>-<index>: a DNS-1035 label too.
        last = f"{name}-{rtype.lower()}-{spec['replicas'] - 1}"
        assert DNS1035.match(last) and len(last) <= 63, last
    if "elasticPolicy" in job["spec"]:
        assert "Worker" in specs, "elastic PyTorchJobs need a Worker replica spec"
        assert "nProcPerNode" not in job["spec"]["elasticPolicy"], (
            "deprecated; use spec.nprocPerNode"
        )
    for d in render(helm4, value_set):
        assert DNS1123_SUBDOMAIN.match(d["metadata"]["name"]), d["metadata"]["name"]
        assert d["metadata"]["namespace"], d["kind"]


def test_long_release_name_still_gives_a_valid_job_name(helm4: str) -> None:
    release = "a-very-long-release-name-for-the-big-model-run-v2-abc"  # 53, the most Helm allows
    job = one(render(helm4, "gpu-3x8", release=release), "PyTorchJob")
    name = job["metadata"]["name"]
    assert DNS1035.match(name)
    assert len(f"{name}-worker-1000000") <= 63


def test_release_name_starting_with_a_digit_fails_naming_fullnameoverride(helm4: str) -> None:
    proc = run_helm(helm4, "template", "1run", str(CHART))
    assert proc.returncode != 0
    assert "fullnameOverride" in proc.stderr
    ok = run_helm(helm4, "template", "1run", str(CHART), "--set", "fullnameOverride=run1")
    assert ok.returncode == 0, ok.stderr
    assert (
        one(render(helm4, sets=("fullnameOverride=run1",)), "PyTorchJob")["metadata"]["name"]
        == "run1"
    )


def test_custom_resources_only_reference_the_release_namespace(helm4: str) -> None:
    docs = render(helm4, "defaults")
    assert {d["metadata"]["namespace"] for d in docs} == {NAMESPACE}
    monitor = find(docs, "PodMonitor")[0]
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
