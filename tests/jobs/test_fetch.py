"""`jobs fetch`: a finished job's outputs copied into a local folder from where its pod
template says they are: its bucket (an s3:// output.dir: a real SeaweedFS here), read with the
job's own endpoint and Secret where the caller has no AWS variables; an emptyDir is one line.
The claim path (a pod mounting it) runs on the real cluster: tests/cluster/test_jobs_cli.py."""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kmock
import pytest

from tests.jobs.cluster import FakeCluster, job, trainjob

CONFIGMAPS = kmock.resource("v1/configmaps")
SECRETS = kmock.resource("v1/secrets")


def chart_job(cluster: FakeCluster, name: str, output_dir: str,
              env: list[dict[str, Any]] | None = None, outputs: dict[str, Any] | None = None
              ) -> None:
    """A Succeeded PyTorchJob whose pods read the chart's ConfigMap, as the chart renders it."""
    made = job(name, workers=1, gpus=0, state="Succeeded")
    for spec in made["spec"]["pytorchReplicaSpecs"].values():
        pod = spec["template"]["spec"]
        pod["containers"][0]["env"] = env or []
        pod["containers"][0]["volumeMounts"] = [
            {"name": "config", "mountPath": "/etc/ddp-trainer"}] + (
            [{"name": "outputs", "mountPath": "/outputs"}] if outputs else [])
        pod["volumes"] = [{"name": "config", "configMap": {"name": f"{name}-config"}}] + (
            [{"name": "outputs", **outputs}] if outputs else [])
    cluster.add_job(made)
    cluster.add(CONFIGMAPS, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": f"{name}-config", "namespace": "training"},
        "data": {"config.yaml": f"output:\n  dir: {output_dir}\n"}})


@pytest.fixture
def outputs_in_bucket(cluster: FakeCluster, s3_server: Any) -> str:
    url = s3_server.url("digits/outputs")
    fs = s3_server.filesystem()
    root = url[len("s3://"):]
    fs.pipe({f"{root}/summary.json": b'{"steps": 46}', f"{root}/eval.json": b'{"correct": 263}',
             f"{root}/model/model.safetensors": b"weights", f"{root}/model/ddp-trainer.json":
             b"{}"})
    key = base64.b64encode(s3_server.env["AWS_ACCESS_KEY_ID"].encode()).decode()
    secret = base64.b64encode(s3_server.env["AWS_SECRET_ACCESS_KEY"].encode()).decode()
    cluster.add(SECRETS, {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": {
        "name": "s3-credentials", "namespace": "training"},
        "data": {"AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret}})
    chart_job(cluster, "digits", url, env=[
        {"name": "AWS_ENDPOINT_URL", "value": s3_server.endpoint},
        {"name": "AWS_DEFAULT_REGION", "value": s3_server.env["AWS_DEFAULT_REGION"]},
        *({"name": n, "valueFrom": {"secretKeyRef": {"name": "s3-credentials", "key": n}}}
          for n in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"))])
    return url


def test_a_jobs_outputs_come_from_its_bucket_with_the_jobs_own_endpoint_and_secret(
        outputs_in_bucket: str, ddp: Callable[..., Any], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    result = ddp("fetch", "digits", "--to", str(tmp_path / "got"))
    assert result.code == 0, result.err
    got = {p.relative_to(tmp_path / "got").as_posix(): p.read_bytes()
           for p in (tmp_path / "got").rglob("*") if p.is_file()}
    assert got == {"summary.json": b'{"steps": 46}', "eval.json": b'{"correct": 263}',
                   "model/model.safetensors": b"weights", "model/ddp-trainer.json": b"{}"}
    assert f"fetched 4 files of pytorchjob digits from {outputs_in_bucket}" in result.out


def test_an_unreachable_bucket_is_one_line_naming_the_endpoint_to_set(
        outputs_in_bucket: str, ddp: Callable[..., Any], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    result = ddp("fetch", "digits", "--to", str(tmp_path / "got"))
    assert result.code == 2
    (line,) = result.err.strip().splitlines()
    assert line.startswith(f"error: reading {outputs_in_bucket} failed") and \
        "set AWS_ENDPOINT_URL" in line, line


def test_outputs_in_an_empty_dir_went_with_the_pods(
        cluster: FakeCluster, ddp: Callable[..., Any], tmp_path: Path) -> None:
    chart_job(cluster, "scratch", "/outputs", outputs={"emptyDir": {}})
    result = ddp("fetch", "scratch", "--to", str(tmp_path / "got"))
    assert result.code == 2
    assert "wrote its outputs to /outputs, an emptyDir: they went with its pods" in result.err
    assert "persistence.outputs" in result.err


RUNTIMES = kmock.resource("trainer.kubeflow.org/v1alpha1/trainingruntimes")


def test_a_trainjobs_outputs_place_is_read_through_its_runtime(
        cluster_v2: FakeCluster, ddp2: Callable[..., Any], tmp_path: Path) -> None:
    # the chart's TrainingRuntime (trainJob.createRuntime): its `node` job's pod template
    made = trainjob("llm", nodes=2, gpus=0, state="Succeeded")
    made["spec"]["runtimeRef"] = {"apiGroup": "trainer.kubeflow.org",
                                  "kind": "TrainingRuntime", "name": "llm-runtime"}
    cluster_v2.add_job(made)
    cluster_v2.call(lambda: cluster_v2.k.resources.__setitem__(
        "trainer.kubeflow.org/v1alpha1/trainingruntimes", kmock.ResourceInfo(
            kind="TrainingRuntime", singular="trainingruntime", namespaced=True,
            verbs={"get", "list"})))
    pod = {"containers": [{"name": "node", "image": "ddp-trainer:x", "volumeMounts": [
        {"name": "config", "mountPath": "/etc/ddp-trainer"},
        {"name": "outputs", "mountPath": "/outputs"}]}],
        "volumes": [{"name": "config", "configMap": {"name": "llm-config"}},
                    {"name": "outputs", "emptyDir": {}}]}
    cluster_v2.add(RUNTIMES, {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainingRuntime",
        "metadata": {"name": "llm-runtime", "namespace": "training"},
        "spec": {"template": {"spec": {"replicatedJobs": [
            {"name": "node", "template": {"spec": {"template": {"spec": pod}}}}]}}}})
    cluster_v2.add(CONFIGMAPS, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": "llm-config", "namespace": "training"},
        "data": {"config.yaml": "output:\n  dir: /outputs\n"}})
    result = ddp2("fetch", "llm", "--to", str(tmp_path / "got"))
    assert result.code == 2, result.err
    assert "TrainJob llm wrote its outputs to /outputs, an emptyDir" in result.err
