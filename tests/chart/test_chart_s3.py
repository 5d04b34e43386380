"""`storage.s3`: checkpoints and outputs in a bucket, for the PyTorchJob and the TrainJob. The
trainer's config names the s3:// directories, the container gets the AWS variables (the
credentials through secretKeyRef, which a TrainJob's trainer supports, unlike envFrom), and
nothing is mounted at /checkpoints or /outputs."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from .chartlib import (
    CHART,
    NAMESPACE,
    RELEASE,
    crd_errors,
    find,
    k8s_errors,
    one,
    pod_templates,
    render,
    run_helm,
    trainer_container,
    trainjob_pod,
)

S3 = ("storage.s3.bucket=ddp-runs", "storage.s3.endpoint=http://seaweedfs.s3.svc:8333",
      "storage.s3.region=us-east-1", "storage.s3.secretName=s3-credentials")
FULLNAME = f"{RELEASE}-ddp-trainer"
AWS_NAMES = ("AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID",
             "AWS_SECRET_ACCESS_KEY")


def config(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (cm,) = [d for d in find(docs, "ConfigMap") if "config.yaml" in d.get("data", {})]
    loaded: dict[str, Any] = yaml.safe_load(cm["data"]["config.yaml"])
    return loaded


def pods(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """(pod spec, trainer container) pairs of every replica of the rendered job."""
    if kind == "PyTorchJob":
        return [{"spec": t["spec"], "container": trainer_container(t)}
                for t in pod_templates(one(docs, "PyTorchJob")).values()]
    pod = trainjob_pod(docs)
    (container,) = [c for c in pod["spec"]["containers"] if c["name"] == "node"]
    return [{"spec": pod["spec"], "container": container}]


def kind_sets(kind: str) -> tuple[str, ...]:
    return ("apiKind=TrainJob",) if kind == "TrainJob" else ("worker.replicas=1",)


@pytest.mark.parametrize("kind", ["PyTorchJob", "TrainJob"])
def test_a_bucket_sends_checkpoints_and_outputs_there_with_credentials_from_the_secret(
        helm4: str, kind: str) -> None:
    docs = render(helm4, sets=(*kind_sets(kind), *S3))
    cfg = config(docs)
    assert cfg["checkpoint"]["dir"] == f"s3://ddp-runs/{FULLNAME}/checkpoints"
    assert cfg["output"]["dir"] == f"s3://ddp-runs/{FULLNAME}/outputs"
    assert find(docs, "PersistentVolumeClaim") == []
    for pod in pods(docs, kind):
        env = {e["name"]: e for e in pod["container"]["env"]}
        assert env["AWS_ENDPOINT_URL"]["value"] == "http://seaweedfs.s3.svc:8333"
        assert env["AWS_DEFAULT_REGION"]["value"] == "us-east-1"
        assert env["AWS_ACCESS_KEY_ID"]["valueFrom"] == {
            "secretKeyRef": {"name": "s3-credentials", "key": "AWS_ACCESS_KEY_ID"}}
        assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"] == {
            "secretKeyRef": {"name": "s3-credentials", "key": "AWS_SECRET_ACCESS_KEY"}}
        mounts = {m["mountPath"] for m in pod["container"]["volumeMounts"]}
        assert not mounts & {"/checkpoints", "/outputs"}, mounts
        assert "/tmp" in mounts  # where the trainer stages what it uploads
        volumes = {v["name"] for v in pod["spec"]["volumes"]}
        assert not volumes & {"checkpoints", "outputs"}, volumes


@pytest.mark.parametrize("kind", ["PyTorchJob", "TrainJob"])
def test_the_rendered_s3_job_is_valid_against_the_api(helm4: str, kind: str) -> None:
    docs = render(helm4, sets=(*kind_sets(kind), *S3))
    assert crd_errors(one(docs, kind)) == []
    pod = trainjob_pod(docs) if kind == "TrainJob" else {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "m", "namespace": NAMESPACE},
        "spec": pod_templates(one(docs, kind))["Master"]["spec"]}
    assert k8s_errors(pod, "1.35.0") == []


def test_prefix_and_secret_keys_are_taken_as_given(helm4: str) -> None:
    docs = render(helm4, sets=(*S3, "storage.s3.prefix=/team-a/run-7/",
                               "storage.s3.accessKeyIdKey=access",
                               "storage.s3.secretAccessKeyKey=secret"))
    assert config(docs)["checkpoint"]["dir"] == "s3://ddp-runs/team-a/run-7/checkpoints"
    env = {e["name"]: e for e in pods(docs, "PyTorchJob")[0]["container"]["env"]}
    assert env["AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"]["key"] == "access"
    assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"]["key"] == "secret"


def test_aws_s3_needs_only_a_bucket_and_sets_only_what_was_given(helm4: str) -> None:
    # AWS S3 with the pod's own identity (IRSA, EKS Pod Identity): no endpoint, no Secret.
    docs = render(helm4, sets=("storage.s3.bucket=ddp-runs",))
    assert config(docs)["output"]["dir"] == f"s3://ddp-runs/{FULLNAME}/outputs"
    names = {e["name"] for e in pods(docs, "PyTorchJob")[0]["container"]["env"]}
    assert not names & set(AWS_NAMES), names


def test_without_a_bucket_nothing_of_s3_is_rendered(helm4: str) -> None:
    docs = render(helm4, sets=("storage.s3.endpoint=http://x:8333",
                               "storage.s3.secretName=s3-credentials"))
    assert config(docs)["checkpoint"]["dir"] == "/checkpoints"
    (pod, *_) = pods(docs, "PyTorchJob")
    assert not {e["name"] for e in pod["container"]["env"]} & set(AWS_NAMES)
    assert {"/checkpoints", "/outputs"} <= {m["mountPath"]
                                            for m in pod["container"]["volumeMounts"]}


@pytest.mark.parametrize("claim", ["persistence.checkpoints.existingClaim=ckpt",
                                   "persistence.outputs.create.enabled=true"])
def test_a_bucket_beside_a_claim_fails_naming_both(helm4: str, claim: str) -> None:
    proc = run_helm(helm4, "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
                    "--set", "storage.s3.bucket=ddp-runs", "--set", claim)
    assert proc.returncode != 0, proc.stdout[:300]
    key = claim.split(".")[1]
    assert "storage.s3.bucket" in proc.stderr and f"persistence.{key}" in proc.stderr, \
        proc.stderr


@pytest.mark.parametrize("bad", ["storage.s3.bucket=My_Bucket",
                                 "storage.s3.endpoint=seaweedfs:8333",
                                 "storage.s3.secretName=Not_A_Name", "storage.s3.bucket.name=x",
                                 "storage.s3.endpoints=http://x"])
def test_bad_s3_values_fail_at_the_schema(helm4: str, bad: str) -> None:
    proc = run_helm(helm4, "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
                    "--set", bad)
    assert proc.returncode != 0, proc.stdout[:300]
    assert "s3" in proc.stderr, proc.stderr
