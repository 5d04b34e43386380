"""The real cluster runs what users run: our image as a `restricted` pod, Pod Security
admission refusing a privileged one, two pods training over gloo by DNS name with a
ReadWriteMany claim between them, and kubectl logs/exec/delete on them."""

from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.kube import REPO, RESTRICTED_CONTAINER, RESTRICTED_POD, Cluster, KubectlError
from tools.imagebuild.podman import Podman
from trainer import __version__

SEED = int(os.environ.get("CLUSTER_TEST_SEED", random.randrange(1, 10_000)))
EPOCHS = 4


def pod(name: str, image: str, args: list[str], **spec: Any) -> dict[str, Any]:
    container = {"name": "trainer", "image": image, "args": args,
                 "securityContext": RESTRICTED_CONTAINER,
                 "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                 **spec.pop("container", {})}
    volumes = [{"name": "tmp", "emptyDir": {}}, *spec.pop("volumes", [])]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": spec.pop("labels", {})},
            "spec": {"restartPolicy": "Never", "securityContext": RESTRICTED_POD,
                     "containers": [container], "volumes": volumes,
                     "terminationGracePeriodSeconds": 5, **spec}}


def test_our_image_runs_as_a_restricted_pod(cluster: Cluster) -> None:
    ns = cluster.namespace("version")
    cluster.apply({**pod("version", cluster.image, ["--version"]),
                   "metadata": {"name": "version", "namespace": ns}})
    cluster.wait("pod/version", "jsonpath={.status.phase}=Succeeded", ns)
    assert __version__ in cluster.logs("version", ns)


def test_cluster_up_leaves_its_helper_images_in_the_registry_not_in_podman(
        cluster: Cluster) -> None:
    # A local tag kept after the push would be left dangling by the next `cluster up`: 107
    # images (115 MB an up) piled up on this machine in a day of CI runs.
    nodes = json.loads(cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    pulled = [name for image in nodes[0]["status"]["images"] for name in image["names"]
              if "@" not in name]
    assert any("/pause:" in name for name in pulled), pulled
    podman = Podman()
    kept = [name for name in pulled if podman.image_exists(
        "localhost/ddp-trainer-cluster/" + name.rsplit("/", 1)[1])]
    assert kept == []


def test_a_privileged_pod_is_refused_by_pod_security_admission(cluster: Cluster) -> None:
    ns = cluster.namespace("privileged")
    manifest = pod("root", cluster.image, ["--version"])
    manifest["metadata"]["namespace"] = ns
    manifest["spec"]["securityContext"] = {}
    manifest["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    with pytest.raises(KubectlError) as refused:
        cluster.apply(manifest)
    assert 'violates PodSecurity "restricted:latest"' in refused.value.stderr
    assert "privileged" in refused.value.stderr
    assert cluster.kubectl("get", "pods", "-n", ns, "-o", "name").stdout == ""


def _local_run(tmp_path: Path) -> dict[str, Any]:
    """The same training as two processes of this checkout (`ddp-trainer run`)."""
    out = tmp_path / "local"
    subprocess.run([str(REPO / ".venv" / "bin" / "ddp-trainer"), "run", "--nproc-per-node",
                    "2", "--dataset", "digits", "--epochs", str(EPOCHS), "--seed", str(SEED),
                    "--metrics-port", "0", "--output-dir", str(out)],
                   check=True, capture_output=True, text=True, timeout=600)
    result: dict[str, Any] = json.loads((out / "summary.json").read_text())
    return result


def test_two_pods_train_over_gloo_by_dns_name_like_a_local_run(
        cluster: Cluster, tmp_path: Path) -> None:
    print(f"seed {SEED} (CLUSTER_TEST_SEED reruns it)")
    ns = cluster.namespace("gloo")
    master = f"ddp-0.ddp.{ns}.svc.cluster.local"
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
             "metadata": {"name": "shared", "namespace": ns},
             "spec": {"accessModes": ["ReadWriteMany"],
                      "resources": {"requests": {"storage": "1Gi"}}}}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "ddp", "namespace": ns},
               "spec": {"clusterIP": "None", "selector": {"job": "ddp"},
                        "publishNotReadyAddresses": True,
                        "ports": [{"name": "store", "port": 29500}]}}
    pods = []
    for rank in (0, 1):
        env = [{"name": "MASTER_ADDR", "value": master}, {"name": "MASTER_PORT", "value": "29500"},
               {"name": "WORLD_SIZE", "value": "2"}, {"name": "RANK", "value": str(rank)},
               # `ddp-trainer run --nproc-per-node 2` gives each rank 1 thread on 2 cores; the
               # same here, so that the float sums (and the loss) are the same too.
               {"name": "OMP_NUM_THREADS", "value": "1"}]
        manifest = pod(f"ddp-{rank}", cluster.image, [
            "train", "--dataset", "digits", "--epochs", str(EPOCHS), "--seed", str(SEED),
            "--metrics-port", "0", "--output-dir", f"/shared/out-{rank}"],
            hostname=f"ddp-{rank}", subdomain="ddp", labels={"job": "ddp"},
            container={"env": env, "volumeMounts": [
                {"name": "tmp", "mountPath": "/tmp"}, {"name": "shared", "mountPath": "/shared"}]},
            volumes=[{"name": "shared", "persistentVolumeClaim": {"claimName": "shared"}}])
        manifest["metadata"]["namespace"] = ns
        pods.append(manifest)
    cluster.apply(claim, service, *pods)
    local = _local_run(tmp_path)
    for rank in (0, 1):
        cluster.wait(f"pod/ddp-{rank}", "jsonpath={.status.phase}=Succeeded", ns, timeout=600)
    assert cluster.get("pvc", "shared", ns)["status"]["phase"] == "Bound"
    # Rank 0 wrote the summary on the ReadWriteMany claim; both pods mounted it at once.
    logs = cluster.logs("ddp-0", ns)
    remote = json.loads(_read_from_claim(cluster, ns, "/shared/out-0/summary.json"))
    print(f"cluster {remote['val_accuracy']!r} local {local['val_accuracy']!r}")
    assert remote["world_size"] == 2
    assert (remote["val_correct"], remote["val_total"]) == (local["val_correct"],
                                                            local["val_total"])
    assert remote["val_accuracy"] == local["val_accuracy"]
    assert remote["train_loss"] == local["train_loss"]
    assert f"{remote['val_accuracy']:.4f}" in logs


def _read_from_claim(cluster: Cluster, ns: str, path: str) -> str:
    """The file as another pod sees it through the same claim."""
    reader = pod("reader", cluster.image, [], container={
        "command": ["python", "-c", f"import sys; sys.stdout.write(open({path!r}).read())"],
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"},
                         {"name": "shared", "mountPath": "/shared", "readOnly": True}]},
        volumes=[{"name": "shared", "persistentVolumeClaim": {"claimName": "shared"}}])
    reader["metadata"]["namespace"] = ns
    cluster.apply(reader)
    cluster.wait("pod/reader", "jsonpath={.status.phase}=Succeeded", ns)
    return cluster.logs("reader", ns)


def test_kubectl_logs_exec_and_delete_work_on_a_running_pod(cluster: Cluster) -> None:
    ns = cluster.namespace("kubectl")
    manifest = pod("sleeper", cluster.image, [], container={
        "command": ["python", "-c",
                    "import signal,sys; print('sleeper up', flush=True); "
                    "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)); signal.pause()"]})
    manifest["metadata"]["namespace"] = ns
    cluster.apply(manifest)
    cluster.wait("pod/sleeper", "condition=Ready", ns)
    logs = cluster.kubectl("logs", "sleeper", "-n", ns, "--tail=-1").stdout
    assert "sleeper up" in logs
    out = cluster.kubectl("exec", "sleeper", "-n", ns, "--", "ddp-trainer", "--version").stdout
    assert __version__ in out
    who = cluster.kubectl("exec", "sleeper", "-n", ns, "--", "id", "-u").stdout
    assert who.strip() == "10001"
    cluster.kubectl("delete", "pod", "sleeper", "-n", ns, "--wait=true")
    gone = cluster.kubectl("get", "pod", "sleeper", "-n", ns, check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr
