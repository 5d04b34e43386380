"""Helpers of the Helm chart tests: real helm 3 and helm 4 binaries, rendering, schemas.

The binaries come from `make tools` (tools/install-helm.sh -> .tools/bin). A missing tool fails
the test that needs it with a line saying so; nothing is skipped.
"""

from __future__ import annotations

import copy
import functools
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "ddp-trainer"
VALUES_DIR = Path(__file__).resolve().parent / "values"
CRD_DIR = Path(__file__).resolve().parent / "crds"
TOOLS_BIN = REPO / ".tools" / "bin"
NAMESPACE = "training"
RELEASE = "mytrain"

# Value sets rendered by the tests (tests/chart/values/<name>.yaml): PyTorchJobs.
VALUE_SETS = sorted(p.stem for p in VALUES_DIR.glob("*.yaml"))
# Value sets that must stay within the Pod Security Standards "restricted" profile (checkov).
RESTRICTED_VALUE_SETS = [v for v in VALUE_SETS if v != "rdma"]
# apiKind: TrainJob (tests/chart/values/trainjob/<name>.yaml), named "trainjob/<name>".
TRAINJOB_VALUE_SETS = sorted(f"trainjob/{p.stem}" for p in (VALUES_DIR / "trainjob").glob("*.yaml"))


def find_tool(name: str) -> str:
    """Absolute path of a tool from .tools/bin or PATH; fails the test when it is missing."""
    candidate = TOOLS_BIN / name
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    found = shutil.which(name)
    if found:
        return found
    pytest.fail(
        f"`{name}` not found in {TOOLS_BIN} or on PATH: run `make tools` first", pytrace=False
    )


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, *args], capture_output=True, text=True, timeout=120)


@functools.cache
def _template_text(helm: str, values: tuple[str, ...], sets: tuple[str, ...], release: str) -> str:
    args = ["template", release, str(CHART), "--namespace", NAMESPACE]
    for v in values:
        args += ["-f", v]
    for s in sets:
        args += ["--set", s]
    proc = run_helm(helm, *args)
    if proc.returncode != 0:
        raise AssertionError(f"helm template failed:\n{proc.stderr}")
    return proc.stdout


def template_text(
    helm: str, value_set: str | None = None, sets: tuple[str, ...] = (), release: str = RELEASE
) -> str:
    values = (str(VALUES_DIR / f"{value_set}.yaml"),) if value_set else ()
    return _template_text(helm, values, tuple(sets), release)


def render(
    helm: str, value_set: str | None = None, sets: tuple[str, ...] = (), release: str = RELEASE
) -> list[dict[str, Any]]:
    """Rendered objects (a fresh deep copy each call)."""
    docs = [d for d in yaml.safe_load_all(template_text(helm, value_set, sets, release)) if d]
    return copy.deepcopy(docs)


def find(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = find(docs, kind)
    assert len(found) == 1, f"expected exactly one {kind}, found {len(found)}"
    return found[0]


def pod_templates(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {rtype: spec["template"] for rtype, spec in job["spec"]["pytorchReplicaSpecs"].items()}


def trainer_container(template: dict[str, Any]) -> dict[str, Any]:
    (container,) = [c for c in template["spec"]["containers"] if c["name"] == "pytorch"]
    return container


def as_pod(job: dict[str, Any], rtype: str) -> dict[str, Any]:
    """The pod the operator creates for replica 0 of `rtype`, as a plain v1/Pod."""
    template = copy.deepcopy(job["spec"]["pytorchReplicaSpecs"][rtype]["template"])
    metadata = template.get("metadata", {})
    metadata["name"] = f"{job['metadata']['name']}-{rtype.lower()}-0"
    metadata["namespace"] = job["metadata"]["namespace"]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": template["spec"]}


def load_crd_schema(filename: str, version: str = "v1") -> dict[str, Any]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    crd = yaml.load((CRD_DIR / filename).read_text(), Loader=loader)  # noqa: S506 (a safe loader)
    for v in crd["spec"]["versions"]:
        if v["name"] == version:
            return v["schema"]["openAPIV3Schema"]
    raise AssertionError(f"{filename} has no version {version}")


INT32 = (-(2**31), 2**31 - 1)


def structural_to_jsonschema(node: Any) -> Any:
    """A CRD's structural openAPIV3Schema as a strict JSON Schema, as the API server applies it.

    - `x-kubernetes-*` keys are annotations, except that `x-kubernetes-int-or-string` accepts
      an integer or a string and `x-kubernetes-preserve-unknown-fields` keeps unknown fields;
    - every other object with `properties` rejects unknown fields (`kubectl --validate=strict`,
      the default, refuses them instead of pruning them silently);
    - `nullable: true` also accepts null; `format: int32` is range-checked.
    """
    if isinstance(node, list):
        return [structural_to_jsonschema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key.startswith("x-kubernetes-") or key in ("nullable", "description"):
            continue
        if key in ("properties", "patternProperties", "definitions"):
            out[key] = {k: structural_to_jsonschema(v) for k, v in value.items()}
        elif key == "pattern" and "(?i)" in value:
            # Go RE2 allows a flag group anywhere; Python only at the start.
            out[key] = "(?i)" + value.replace("(?i)", "")
        else:
            out[key] = structural_to_jsonschema(value)
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.pop("anyOf", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if (
        out.get("type") == "object"
        and "properties" in out
        and "additionalProperties" not in out
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    if node.get("format") == "int32" and out.get("type") == "integer":
        out.setdefault("minimum", INT32[0])
        out.setdefault("maximum", INT32[1])
    if node.get("nullable") and "type" in out:
        out["type"] = (
            [out["type"], "null"] if isinstance(out["type"], str) else [*out["type"], "null"]
        )
    return out


CRD_FILES = {
    ("kubeflow.org/v1", "PyTorchJob"): "kubeflow.org_pytorchjobs.yaml",
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"): "trainer.kubeflow.org_trainjobs.yaml",
    ("trainer.kubeflow.org/v1alpha1", "TrainingRuntime"):
        "trainer.kubeflow.org_trainingruntimes.yaml",
    ("monitoring.coreos.com/v1", "PodMonitor"): "monitoring.coreos.com_podmonitors.yaml",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "monitoring.coreos.com_prometheusrules.yaml",
}


@functools.cache
def crd_validator(api_version: str, kind: str) -> Any:
    import jsonschema

    filename = CRD_FILES.get((api_version, kind))
    if filename is None:
        raise AssertionError(f"no vendored CRD for {api_version} {kind} in {CRD_DIR}")
    schema = structural_to_jsonschema(load_crd_schema(filename, api_version.split("/")[1]))
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def crd_errors(obj: dict[str, Any]) -> list[str]:
    validator = crd_validator(obj["apiVersion"], obj["kind"])
    return [
        f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
        for e in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.path)))
    ]


def k8s_errors(obj: dict[str, Any], version: str) -> list[str]:
    """Errors of a built-in object against the Kubernetes `version` schema (strict)."""
    import kubernetes_validate
    from kubernetes_validate.utils import ValidationError

    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except ValidationError as exc:
        return [f"{'/'.join(map(str, exc.absolute_path)) or '(root)'}: {exc.message}"]
    return []


# -- Kubeflow Trainer v2: the pod the controller builds from a rendered TrainJob ---------------

TORCH_DISTRIBUTED = CRD_DIR / "trainer.kubeflow.org_runtime-torch_distributed.yaml"
# List merge keys of the strategic merge patch (k8s.io/api core/v1 patchMergeKey tags).
MERGE_KEYS = {"containers": "name", "initContainers": "name", "volumes": "name",
              "env": "name", "volumeMounts": "mountPath", "imagePullSecrets": "name",
              "replicatedJobs": "name"}


def strategic_merge(base: Any, patch: Any, key: str = "") -> Any:
    """The subset of Kubernetes' strategic merge patch the chart's runtime patch uses: maps merge
    recursively, lists with a merge key merge item by item, every other list is replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            out[k] = strategic_merge(base[k], v, k) if k in base else copy.deepcopy(v)
        return out
    if isinstance(base, list) and isinstance(patch, list) and key in MERGE_KEYS:
        mk = MERGE_KEYS[key]
        out_list = [copy.deepcopy(b) for b in base]
        for item in patch:
            at = next((i for i, b in enumerate(out_list) if b.get(mk) == item.get(mk)), None)
            if at is None:
                out_list.append(copy.deepcopy(item))
            else:
                out_list[at] = strategic_merge(out_list[at], item)
        return out_list
    return copy.deepcopy(patch)


def _upsert(items: list[dict[str, Any]], new: list[dict[str, Any]], key: str) -> None:
    for item in new:
        at = next((i for i, old in enumerate(items) if old.get(key) == item.get(key)), None)
        if at is None:
            items.append(item)
        else:
            items[at] = item


def trainjob_pod(docs: list[dict[str, Any]], node_rank: int = 0) -> dict[str, Any]:
    """The pod of `node_rank` as Kubeflow Trainer v2.3 and JobSet v0.12 create it from the
    rendered TrainJob, as a plain v1/Pod:

    - the runtime: the rendered TrainingRuntime (createRuntime), else the vendored
      torch-distributed ClusterTrainingRuntime with the runtime patches merged in
      (pkg/runtime/core/trainingruntime.go:256-289);
    - the TrainJob's spec.trainer: image, command, args, env upserted, resourcesPerNode
      (pkg/runtime/framework/plugins/jobset/jobset.go, trainingruntime.go:197-239);
    - the torch plugin's PET_* variables and port 29500 (plugins/torch/torch.go:145-203);
    - the JobSet's and the Job controller's pod labels (jobset_controller.go:1020-1034).
    Only the trainer container's fields the chart renders are modelled.
    """
    job = one(docs, "TrainJob")
    name = job["metadata"]["name"]
    runtimes = find(docs, "TrainingRuntime")
    if runtimes:
        runtime = runtimes[0]
    else:
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        runtime = yaml.load(TORCH_DISTRIBUTED.read_text(), Loader=loader)  # noqa: S506
    jobset = copy.deepcopy(runtime["spec"]["template"]["spec"])
    for patch in job["spec"].get("runtimePatches", []):
        jobset = strategic_merge(jobset, patch["trainingRuntimeSpec"]["template"]["spec"])
    (rjob,) = [r for r in jobset["replicatedJobs"] if r["name"] == "node"]
    template = copy.deepcopy(rjob["template"]["spec"]["template"])
    spec = template["spec"]
    (container,) = [c for c in spec["containers"] if c["name"] == "node"]
    trainer = job["spec"]["trainer"]
    for field in ("image", "command", "args"):
        container[field] = trainer[field]
    env = container.setdefault("env", [])
    _upsert(env, copy.deepcopy(trainer.get("env", [])), "name")
    _upsert(env, [
        {"name": "PET_NNODES", "value": str(trainer["numNodes"])},
        {"name": "PET_NPROC_PER_NODE", "value": str(trainer["numProcPerNode"])},
        {"name": "PET_NODE_RANK", "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}},
        {"name": "PET_MASTER_ADDR", "value": f"{name}-node-0-0.{name}"},
        {"name": "PET_MASTER_PORT", "value": "29500"},
    ], "name")
    if "resourcesPerNode" in trainer:
        container["resources"] = strategic_merge(container.get("resources", {}),
                                                 trainer["resourcesPerNode"])
    _upsert(container.setdefault("ports", []), [{"containerPort": 29500}], "containerPort")
    spec.setdefault("restartPolicy", "OnFailure")  # the JobSet webhook's default
    metadata = template.setdefault("metadata", {})
    metadata["name"] = f"{name}-node-0-{node_rank}-abcde"
    metadata["namespace"] = job["metadata"]["namespace"]
    metadata.setdefault("labels", {}).update({
        "jobset.sigs.k8s.io/jobset-name": name,
        "jobset.sigs.k8s.io/replicatedjob-name": "node",
        "jobset.sigs.k8s.io/job-index": "0",
        "batch.kubernetes.io/job-completion-index": str(node_rank),
    })
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
