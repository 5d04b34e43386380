"""SeaweedFS on the test cluster: the object store chart jobs write their checkpoints and outputs
to (`storage.s3`), as a Deployment and a Service in the namespace `s3`.

The `weed` binary is the one the object-storage tests run (tools/s3server.py: built from
tools/s3server/go.mod into the cluster's build cache), in an image made here (images.py) and
pushed to the cluster's registry; `weed server -s3` runs master, volume server, filer and S3
gateway in one process, its data in an emptyDir (the store lives as long as its pod, which is
as long as the cluster). Once it answers, the bucket is made and the Secret `s3-credentials`
(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY) is there for tests to copy into their namespace.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tools.cluster import api, procs
from tools.cluster.layout import CLUSTER_DOMAIN, NODES, REGISTRY, Paths

NAMESPACE = "s3"
NAME = "seaweedfs"
PORT = 8333
BUCKET = "ddp-trainer"
SECRET = "s3-credentials"
REGION = "us-east-1"
# A test cluster's store, reachable only on this machine: fixed credentials, in the Secret.
ACCESS_KEY = "ddptrainer"
SECRET_KEY = "ddptrainer-cluster-secret-key-01"
ENDPOINT = f"http://{NAME}.{NAMESPACE}.svc.{CLUSTER_DOMAIN}:{PORT}"
REPOSITORY = f"{REGISTRY}/seaweedfs"

CONTAINERFILE = """FROM scratch
COPY weed /bin/weed
USER 65534:65534
ENTRYPOINT ["/bin/weed"]
"""


def image(weed: Path) -> str:
    """One tag per build of `weed`: its cache folder's hash (`seaweedfs-<hash>`)."""
    return f"{REPOSITORY}:{weed.parent.name.rsplit('-', 1)[1]}"


def identities() -> str:
    return json.dumps({"identities": [{
        "name": "ddp-trainer", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
        "actions": ["Admin", "Read", "List", "Tagging", "Write"]}]})


def objects(ref: str) -> list[dict[str, Any]]:
    labels = {"app.kubernetes.io/name": NAME}
    restricted = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                  "capabilities": {"drop": ["ALL"]}}
    args = ["server", "-ip=127.0.0.1", "-ip.bind=0.0.0.0", "-dir=/data", "-volume.max=0",
            "-master.volumeSizeLimitMB=64", "-volume.preStopSeconds=0", "-filer", "-s3",
            f"-s3.port={PORT}", "-s3.config=/etc/seaweedfs/s3.json", "-s3.port.iceberg=0",
            "-s3.port.lance=0"]
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE, "labels": {
            "pod-security.kubernetes.io/enforce": "restricted"}}},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": SECRET, "namespace": NAMESPACE},
         "stringData": {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}},
        {"apiVersion": "v1", "kind": "Secret",
         "metadata": {"name": f"{NAME}-identities", "namespace": NAMESPACE},
         "stringData": {"s3.json": identities()}},
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": labels},
         "spec": {"replicas": 1, "strategy": {"type": "Recreate"},
                  "selector": {"matchLabels": labels},
                  "template": {"metadata": {"labels": labels}, "spec": {
                      # The first node: the two-node tests lose only the second.
                      "nodeSelector": {"kubernetes.io/hostname": NODES[0].name},
                      "automountServiceAccountToken": False,
                      "securityContext": {"runAsNonRoot": True, "runAsUser": 65534,
                                          "runAsGroup": 65534, "fsGroup": 65534,
                                          "seccompProfile": {"type": "RuntimeDefault"}},
                      "containers": [{
                          "name": "weed", "image": ref, "args": args, "workingDir": "/data",
                          "ports": [{"name": "s3", "containerPort": PORT}],
                          "readinessProbe": {"tcpSocket": {"port": PORT}, "periodSeconds": 2},
                          "resources": {"requests": {"cpu": "50m", "memory": "128Mi"},
                                        "limits": {"memory": "1Gi"}},
                          "securityContext": restricted,
                          "volumeMounts": [{"name": "data", "mountPath": "/data"},
                                           {"name": "tmp", "mountPath": "/tmp"},
                                           {"name": "identities", "mountPath": "/etc/seaweedfs",
                                            "readOnly": True}]}],
                      "volumes": [{"name": "data", "emptyDir": {"sizeLimit": "8Gi"}},
                                  {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
                                  {"name": "identities",
                                   "secret": {"secretName": f"{NAME}-identities"}}]}}}},
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": labels},
         "spec": {"selector": labels, "ports": [{"name": "s3", "port": PORT,
                                                 "targetPort": "s3"}]}},
    ]


def pod_endpoint(paths: Paths, kubectl: Path) -> str | None:
    """http://<pod IP>:8333 of the Ready SeaweedFS pod (the host reaches pods on the node's
    bridge), else None."""
    proc = api.kubectl(paths, kubectl, "get", "pod", "-n", NAMESPACE, "-l",
                       f"app.kubernetes.io/name={NAME}", "-o", "json", check=False)
    if proc.returncode != 0:
        return None
    for pod in json.loads(proc.stdout).get("items", []):
        status = pod.get("status", {})
        ready = any(c["type"] == "Ready" and c["status"] == "True"
                    for c in status.get("conditions", []))
        if ready and status.get("podIP") and not pod["metadata"].get("deletionTimestamp"):
            return f"http://{status['podIP']}:{PORT}"
    return None


def bucket_made(endpoint: str) -> bool:
    """Make the bucket (or find it there); False while the store cannot take it yet (its S3
    port opens before its master has a volume server)."""
    try:
        import s3fs  # noqa: PLC0415 - the venv's `s3` extra (make venv), only for this add-on
    except ImportError:
        raise procs.ClusterError("the object store's bucket is made through s3fs, which this "
                                 "Python lacks (fix: make venv, or pip install -e '.[s3]')"
                                 ) from None
    fs = s3fs.S3FileSystem(key=ACCESS_KEY, secret=SECRET_KEY, endpoint_url=endpoint,
                           client_kwargs={"region_name": REGION}, skip_instance_cache=True,
                           use_listings_cache=False)
    try:
        if not fs.exists(BUCKET):
            fs.mkdir(BUCKET)
        fs.pipe(f"{BUCKET}/.ready", b"ok")
        return True
    except Exception:  # noqa: BLE001 - botocore and aiohttp raise many types while it starts
        return False


def install(paths: Paths, kubectl: Path, ref: str) -> str:
    """The objects applied, the pod Ready and the bucket made; a line for the log."""
    api.kubectl(paths, kubectl, "apply", "--server-side", "--force-conflicts", "-f", "-",
                stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects(ref)}))
    found: list[str] = []

    def serving() -> bool:
        endpoint = pod_endpoint(paths, kubectl)
        if endpoint and bucket_made(endpoint):
            found.append(endpoint)
        return bool(found)

    try:
        procs.wait_for(serving, 300, f"SeaweedFS in namespace {NAMESPACE} taking bucket {BUCKET}",
                       paths.logs / "kubelet.log")
    except procs.ClusterError as exc:
        pod = api.kubectl(paths, kubectl, "describe", "pod", "-n", NAMESPACE, "-l",
                          f"app.kubernetes.io/name={NAME}", check=False)
        logs = api.kubectl(paths, kubectl, "logs", "-n", NAMESPACE, f"deploy/{NAME}",
                           "--tail=30", check=False)
        raise procs.ClusterError(f"{exc}\n{(pod.stdout + pod.stderr)[-3000:]}\n"
                                 f"{(logs.stdout + logs.stderr)[-3000:]}") from None
    return f"SeaweedFS at {ENDPOINT} (pod {found[0]}), bucket {BUCKET}, Secret {NAMESPACE}/{SECRET}"
