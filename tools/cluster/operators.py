"""The Kubeflow training operator v1, run for real against the cluster.

Its CRDs, RBAC and validating webhook configuration come from the standalone overlay of the
module version it is built from (`go mod download` names the folder), as `kubectl apply -k`
renders it. It runs on the host, as its
ServiceAccount (a token from the TokenRequest API), with only the PyTorchJob controller
enabled. Its `training-operator` Service has no selector: an EndpointSlice points it at the
host, where the operator's webhook server listens, and the API server routes webhook calls
to endpoints (`--enable-aggregator-routing`). The operator's own certificate rotator makes
the webhook certificate into its Secret and writes the CA into the webhook configuration, as
in-cluster; the one thing done here for it is the kubelet's part, the Secret's files at the
rotator's certDir (:func:`mount_webhook_secret`).
"""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path
from typing import Any

import api
import yaml
from configs import HELPER_IMAGE
from layout import HERE, NODE_IP, REPO, Paths
from pki import kubeconfig_token

NAMESPACE = "kubeflow"
MODULE = "github.com/kubeflow/training-operator"
WEBHOOK_PORT = 9443
HEALTH = "127.0.0.1:8091"
INIT_TEMPLATE = REPO / "docs" / "operator" / "pytorch-init-container.yaml"


def module_dir() -> Path:
    proc = subprocess.run(["go", "mod", "download", "-json", MODULE], cwd=HERE / "training",
                          capture_output=True, text=True, check=True)
    return Path(json.loads(proc.stdout)["Dir"])


def manifests(paths: Paths, kubectl: Path, source: Path) -> list[dict[str, Any]]:
    """The release's standalone overlay as `kubectl apply -k` makes it (CRDs, RBAC, webhook
    configuration, the empty webhook-cert Secret its rotator fills), less the Deployment (the
    operator runs on the host) and with the Service pointed at the host."""
    rendered = api.kubectl(paths, kubectl, "kustomize",
                           str(source / "manifests" / "overlays" / "standalone")).stdout
    objects = [d for d in yaml.safe_load_all(rendered)
               if d and d["kind"] not in ("Deployment", "Service")]
    objects.append({"apiVersion": "v1", "kind": "Service",
                    "metadata": {"name": "training-operator", "namespace": NAMESPACE},
                    "spec": {"ports": [{"name": "webhook-server", "port": 443,
                                        "targetPort": WEBHOOK_PORT}]}})
    objects.append({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                    "metadata": {"name": "training-operator-host", "namespace": NAMESPACE,
                                 "labels": {"kubernetes.io/service-name": "training-operator"}},
                    "addressType": "IPv4",
                    "endpoints": [{"addresses": [NODE_IP], "conditions": {"ready": True}}],
                    "ports": [{"name": "webhook-server", "port": WEBHOOK_PORT,
                               "protocol": "TCP"}]})
    return objects


def install(paths: Paths, kubectl: Path) -> None:
    """The manifests applied and the operator's token kubeconfig written."""
    objects = manifests(paths, kubectl, module_dir())
    api.kubectl(paths, kubectl, "apply", "--server-side", "--force-conflicts", "-f", "-",
                stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    token = api.kubectl(paths, kubectl, "create", "token", "training-operator", "-n",
                        NAMESPACE, "--duration", "168h").stdout.strip()
    kubeconfig_token(paths.pki, token, kubeconfig_path(paths))


def kubeconfig_path(paths: Paths) -> Path:
    return paths.config / "training-operator.kubeconfig"


def arguments(paths: Paths) -> list[str]:
    """The operator's flags: only the PyTorchJob controller; the init container of docs/operator
    (Pod Security `restricted`) with an image the cluster has."""
    return ["--kubeconfig", str(kubeconfig_path(paths)), "--enable-scheme=pytorchjob",
            "--metrics-bind-address", "127.0.0.1:8090", "--health-probe-bind-address", HEALTH,
            "--webhook-server-port", str(WEBHOOK_PORT),
            "--pytorch-init-container-template-file", str(INIT_TEMPLATE),
            "--pytorch-init-container-image", HELPER_IMAGE]


def webhook_ready(paths: Paths) -> bool:
    """The rotator wrote its CA into every webhook of the configuration."""
    try:
        config = api.get(paths, "/apis/admissionregistration.k8s.io/v1/"
                         "validatingwebhookconfigurations/validator.training-operator.kubeflow.org")
    except OSError:
        return False
    return all(h["clientConfig"].get("caBundle") for h in config["webhooks"])


CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")  # the rotator's fixed certDir


def mount_webhook_secret(paths: Paths) -> bool:
    """What the kubelet does for the operator's Deployment (the Secret as a volume at the
    rotator's certDir), once the rotator has filled the Secret: True when the files are there.
    The rotator waits for them to match the Secret before its webhook server starts."""
    try:
        secret = api.get(paths, f"/api/v1/namespaces/{NAMESPACE}/secrets/"
                                "training-operator-webhook-cert")
    except OSError:
        return False
    data = secret.get("data") or {}
    if not all(key in data for key in ("ca.crt", "tls.crt", "tls.key")):
        return False
    CERT_DIR.mkdir(parents=True, exist_ok=True)
    for key in ("ca.crt", "tls.crt", "tls.key"):
        (CERT_DIR / key).write_bytes(base64.b64decode(data[key]))
    return True
