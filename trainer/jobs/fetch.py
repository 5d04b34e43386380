"""`jobs fetch NAME --to DIR`: a job's outputs (``summary.json``,
``steps.jsonl``, ``model/``) copied into a local folder from where the job wrote them, as its
pod template says: its bucket (an ``s3://`` ``output.dir``, the chart's ``storage.s3``) with
s3fs, or its outputs claim (``persistence.outputs``) through a short-lived pod that mounts it
and streams a tar of it. An ``emptyDir`` went with the pods: one line says so.

The bucket is read with the caller's AWS variables where they are set, else with the job's own
(its endpoint, region and the Secret its pods read, where the caller may read it): from outside
the cluster, ``AWS_ENDPOINT_URL`` must name an endpoint reachable from here.
"""

from __future__ import annotations

import base64
import contextlib
import io
import os
import tarfile
import time
import uuid
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from trainer.components import storage
from trainer.jobs.errors import JobsError
from trainer.jobs.kinds import Kind
from trainer.jobs.kube import Cluster

CONFIG_KEY = "config.yaml"
MOUNT = "/outputs"
POD_START_SECONDS = 120.0


def pod_spec(cluster: Cluster, kind: Kind, job: dict[str, Any]) -> dict[str, Any]:
    """The trainer's pod spec: a PyTorchJob's Master (else first) replica template, or a
    TrainJob's runtime's `node` template."""
    spec = job.get("spec") or {}
    if kind.name == "PyTorchJob":
        replicas = spec.get("pytorchReplicaSpecs") or {}
        chosen: dict[str, Any] = replicas.get("Master") or next(iter(replicas.values()), {})
        found: dict[str, Any] = (chosen.get("template") or {}).get("spec") or {}
        return found
    ref = spec.get("runtimeRef") or {}
    runtime = _runtime(cluster, str(ref.get("kind") or "ClusterTrainingRuntime"),
                       str(ref.get("name") or ""))
    for rj in ((runtime.get("spec") or {}).get("template") or {}).get("spec", {}).get(
            "replicatedJobs") or []:
        if rj.get("name") == "node":
            node: dict[str, Any] = rj["template"]["spec"]["template"]["spec"]
            return node
    raise JobsError(f"TrainJob {job['metadata']['name']}: its runtime {ref.get('name')!r} has "
                    "no `node` job to read the outputs' place from",
                    "copy them by hand (docs/jobs.md, Outputs)")


def _runtime(cluster: Cluster, kind: str, name: str) -> dict[str, Any]:
    plural = "clustertrainingruntimes" if kind == "ClusterTrainingRuntime" else \
        "trainingruntimes"
    with cluster.errors(f"get {kind} {name}"):
        if plural == "clustertrainingruntimes":
            found = cluster.custom.get_cluster_custom_object(
                "trainer.kubeflow.org", "v1alpha1", plural, name)
        else:
            found = cluster.custom.get_namespaced_custom_object(
                "trainer.kubeflow.org", "v1alpha1", cluster.namespace, plural, name)
    return dict(found)


def output_dir(cluster: Cluster, spec: dict[str, Any]) -> str:
    """`output.dir` of the config the pods read (the chart's ConfigMap `config`)."""
    volumes = {v.get("name"): v for v in spec.get("volumes") or []}
    config_map = (volumes.get("config") or {}).get("configMap", {}).get("name")
    if not config_map:
        return MOUNT  # not the chart's pods: the image's default
    with cluster.errors(f"get configmap {config_map}"):
        data = cluster.core.read_namespaced_config_map(config_map, cluster.namespace).data or {}
    config = yaml.safe_load(data.get(CONFIG_KEY) or "") or {}
    return str((config.get("output") or {}).get("dir") or MOUNT)


def fetch(cluster: Cluster, kind: Kind, job: dict[str, Any], to: Path) -> str:
    """Copy the job's outputs into `to`; where they came from."""
    spec = pod_spec(cluster, kind, job)
    where = output_dir(cluster, spec)
    name = job["metadata"]["name"]
    to.mkdir(parents=True, exist_ok=True)
    if where.startswith("s3://"):
        _from_bucket(cluster, spec, where, to)
        return where
    volume = _volume_at(spec, where)
    claim = (volume or {}).get("persistentVolumeClaim", {}).get("claimName")
    if not claim:
        raise JobsError(f"{kind.name} {name} wrote its outputs to {where}, "
                        f"{'an emptyDir' if volume else 'no volume'}: they went with its pods",
                        "give the job persistence.outputs (a claim) or storage.s3 (a bucket) "
                        "and run it again")
    _from_claim(cluster, spec, claim, to, name)
    return f"claim {claim}"


def _volume_at(spec: dict[str, Any], path: str) -> dict[str, Any] | None:
    containers = spec.get("containers") or [{}]
    mounts = [m for m in containers[0].get("volumeMounts") or []
              if PurePosixPath(path).is_relative_to(m.get("mountPath", "/-"))]
    if not mounts:
        return None
    mount = max(mounts, key=lambda m: len(m["mountPath"]))
    return next((v for v in spec.get("volumes") or [] if v.get("name") == mount["name"]), None)


def _env_of(cluster: Cluster, spec: dict[str, Any]) -> dict[str, str]:
    """The job's AWS variables, its Secret's keys read where the caller may read it."""
    out: dict[str, str] = {}
    secrets: dict[str, dict[str, str]] = {}
    for var in ((spec.get("containers") or [{}])[0].get("env") or []):
        name = str(var.get("name", ""))
        if not name.startswith("AWS_"):
            continue
        if "value" in var:
            out[name] = str(var["value"])
            continue
        ref = (var.get("valueFrom") or {}).get("secretKeyRef") or {}
        if ref.get("name") and ref.get("key"):
            if ref["name"] not in secrets:
                try:
                    secret = cluster.core.read_namespaced_secret(ref["name"], cluster.namespace)
                    secrets[ref["name"]] = dict(secret.data or {})
                except Exception:  # noqa: BLE001 - not allowed: the caller's own variables
                    secrets[ref["name"]] = {}
            raw = secrets[ref["name"]].get(ref["key"])
            if raw:
                out[name] = base64.b64decode(raw).decode()
    return out


def _from_bucket(cluster: Cluster, spec: dict[str, Any], url: str, to: Path) -> None:
    try:
        import s3fs  # noqa: F401, PLC0415 - the `s3` extra, named with the aws equivalent
    except ImportError:
        raise JobsError(f"the outputs are in {url}; reading it needs s3fs",
                        "pip install 'ddp-trainer[s3]', or: aws s3 cp --recursive "
                        f"{url} {to}") from None
    job_env = _env_of(cluster, spec)
    mine = os.environ.get("AWS_ACCESS_KEY_ID")

    def var(name: str) -> str | None:
        return os.environ.get(name) if mine else os.environ.get(name) or job_env.get(name)

    endpoint = os.environ.get("AWS_ENDPOINT_URL") or job_env.get("AWS_ENDPOINT_URL")
    region = os.environ.get("AWS_DEFAULT_REGION") or job_env.get("AWS_DEFAULT_REGION")
    fs = storage.Store(
        url, "jobs fetch", key=var("AWS_ACCESS_KEY_ID"), secret=var("AWS_SECRET_ACCESS_KEY"),
        endpoint_url=endpoint, client_kwargs={"region_name": region} if region else {}).fs
    root = url[len("s3://"):].rstrip("/")
    try:
        names = fs.find(root)
        if not names:
            raise JobsError(f"{url} holds no outputs (the job has not finished, or wrote "
                            "nowhere else)", "wait for the job: ddp-trainer jobs wait NAME")
        for name in names:
            target = to / Path(name[len(root):].lstrip("/"))
            target.parent.mkdir(parents=True, exist_ok=True)
            fs.get(name, str(target))
    except JobsError:
        raise
    except Exception as exc:  # noqa: BLE001 - botocore's many kinds, named in one line
        raise JobsError(f"reading {url} failed ({type(exc).__name__}: "
                        f"{' '.join(str(exc).split())[:200]})",
                        f"set AWS_ENDPOINT_URL to an endpoint reachable from here (the job's: "
                        f"{endpoint or 'AWS'}) and AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
                        f"or: aws s3 cp --recursive {url} {to}") from None


def _from_claim(cluster: Cluster, spec: dict[str, Any], claim: str, to: Path,
                job: str) -> None:
    """A pod of the job's image mounting `claim` read-only, a tar of it streamed out, then
    deleted: what `kubectl cp` does, without kubectl."""
    from kubernetes.stream import stream  # noqa: PLC0415 - the k8s extra

    container = (spec.get("containers") or [{}])[0]
    name = f"{job}-fetch-{uuid.uuid4().hex[:6]}"[:63]
    secure = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
              "runAsNonRoot": True, "runAsUser": 10001, "seccompProfile": {"type":
                                                                          "RuntimeDefault"}}
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "labels": {"app.kubernetes.io/component": "fetch"}},
           "spec": {"restartPolicy": "Never", "automountServiceAccountToken": False,
                    "nodeSelector": spec.get("nodeSelector"),
                    "tolerations": spec.get("tolerations"),
                    "imagePullSecrets": spec.get("imagePullSecrets"),
                    # as the job's pods run: the same user reads what they wrote
                    "securityContext": spec.get("securityContext"),
                    "containers": [{"name": "fetch", "image": container.get("image"),
                                    "command": ["sleep", "600"],
                                    "securityContext": container.get("securityContext") or secure,
                                    "volumeMounts": [{"name": "outputs", "mountPath": MOUNT,
                                                      "readOnly": True}]}],
                    "volumes": [{"name": "outputs", "persistentVolumeClaim": {
                        "claimName": claim, "readOnly": True}}]}}
    with cluster.errors(f"create a pod mounting claim {claim}"):
        cluster.core.create_namespaced_pod(cluster.namespace, pod)
    try:
        _wait_running(cluster, name, claim)
        client = stream(cluster.core.connect_get_namespaced_pod_exec, name, cluster.namespace,
                        # the run's lock on its directories is no output
                        command=["tar", "cf", "-", "--exclude=./.ddp-trainer.lock", "-C", MOUNT,
                                 "."], stderr=True, stdin=False,
                        stdout=True, tty=False, binary=True, _preload_content=False)
        out = io.BytesIO()
        while client.is_open():
            client.update(timeout=1)
            if client.peek_stdout():
                out.write(client.read_stdout())
        out.write(client.read_stdout() or b"")
        client.close()
        out.seek(0)
        with tarfile.open(fileobj=out, mode="r:") as tar:
            tar.extractall(to, filter="data")
    finally:
        with contextlib.suppress(Exception):  # gone already: nothing left to remove
            cluster.core.delete_namespaced_pod(name, cluster.namespace, grace_period_seconds=0)


def _wait_running(cluster: Cluster, name: str, claim: str) -> None:
    deadline = time.monotonic() + POD_START_SECONDS
    while True:
        pod = cluster.core.read_namespaced_pod(name, cluster.namespace)
        if pod.status.phase == "Running":
            return
        if time.monotonic() > deadline or pod.status.phase in ("Failed", "Succeeded"):
            raise JobsError(f"the pod {name} mounting claim {claim} did not start in "
                            f"{POD_START_SECONDS:.0f} s (phase {pod.status.phase})",
                            f"kubectl describe pod {name}; the claim may be held by a "
                            "ReadWriteOnce pod on another node")
        time.sleep(1)
