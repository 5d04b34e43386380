"""Controllers run for real on the host, each as its Deployment would run it in-cluster.

The training operator, Kubeflow Trainer and JobSet are controller-runtime managers whose release
manifests (CRDs, RBAC, webhook configurations, an empty webhook-certificate Secret) are applied
as rendered, less their Deployment; prometheus-operator (no webhook) runs the same way
(prometheus_stack.py). Each runs as its ServiceAccount (a token from the
TokenRequest API) and fills its own webhook Secret with its certificate rotator, which writes
the CA into its webhook configurations. What a kubelet does for their pods is done here:
- the Secret's files at the rotator's fixed certDir (/tmp/k8s-webhook-server/serving-certs in
  all three releases): every controller gets a mount namespace of its own with a folder of ours
  bind-mounted there, as a container would have the Secret volume (:func:`argv`,
  :func:`mount_webhook_secret`);
- the Service: its selector is dropped and an EndpointSlice points it at the host's port, where
  the API server reaches the webhook (`--enable-aggregator-routing`). A Service that pods call
  (Trainer's status server) is headless, so the pods' DNS answer is the host itself, with or
  without a kube-proxy to route a ClusterIP (docs/cluster.md);
- the ServiceAccount's token, CA and namespace at the pod's path (Trainer reads its token to
  learn the cluster's token issuer).
"""

from __future__ import annotations

import base64
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.cluster import api
from tools.cluster.layout import NODE_IP, Paths
from tools.cluster.pki import kubeconfig_token

CERT_DIR = "/tmp/k8s-webhook-server/serving-certs"  # controller-runtime's, fixed in the rotators
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"  # where a pod has its token


@dataclass(frozen=True)
class Port:
    name: str
    port: int  # the Service's
    host: int  # where the controller listens on the host


@dataclass(frozen=True)
class HostController:
    name: str  # the process name and its binary's
    namespace: str
    service_account: str
    health: str  # host:port of its /readyz (or /healthz: `ready_path`)
    service: str = ""  # the webhook Service the rotator names its certificate after
    secret: str = ""  # the webhook Secret it fills
    webhooks: tuple[str, ...] = ()  # "validating/NAME" or "mutating/NAME"
    ports: tuple[Port, ...] = ()
    headless: bool = False
    ready_path: str = "/readyz"

    def kubeconfig(self, paths: Paths) -> Path:
        return paths.config / f"{self.name}.kubeconfig"

    def certs(self, paths: Paths) -> Path:
        return paths.state / "certs" / self.name

    def service_account_dir(self, paths: Paths) -> Path:
        return paths.state / "serviceaccounts" / self.name


def service_objects(c: HostController) -> list[dict[str, Any]]:
    """The controller's Service without a selector and the EndpointSlice that points it here."""
    if not c.service:
        return []
    spec: dict[str, Any] = {"ports": [{"name": p.name, "port": p.port, "targetPort": p.host}
                                      for p in c.ports]}
    if c.headless:
        spec["clusterIP"] = "None"
    return [
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": c.service, "namespace": c.namespace}, "spec": spec},
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
         "metadata": {"name": f"{c.service}-host", "namespace": c.namespace,
                      "labels": {"kubernetes.io/service-name": c.service}},
         "addressType": "IPv4",
         "endpoints": [{"addresses": [NODE_IP], "conditions": {"ready": True}}],
         "ports": [{"name": p.name, "port": p.host, "protocol": "TCP"} for p in c.ports]},
    ]


def install(paths: Paths, kubectl: Path, c: HostController, objects: list[dict[str, Any]]) -> None:
    """The release's objects applied (less its Deployment and Service, replaced by ours) and the
    controller's token kubeconfig written."""
    kept = [o for o in objects if o["kind"] != "Deployment"
            and not (o["kind"] == "Service" and o["metadata"]["name"] == c.service)]
    api.kubectl(paths, kubectl, "apply", "--server-side", "--force-conflicts", "-f", "-",
                stdin=json.dumps({"apiVersion": "v1", "kind": "List",
                                  "items": kept + service_objects(c)}))
    token = api.kubectl(paths, kubectl, "create", "token", c.service_account, "-n",
                        c.namespace, "--duration", "168h").stdout.strip()
    paths.config.mkdir(parents=True, exist_ok=True)
    kubeconfig_token(paths.pki, token, c.kubeconfig(paths))
    account = c.service_account_dir(paths)  # what the kubelet projects into every pod
    account.mkdir(parents=True, exist_ok=True)
    (account / "token").write_text(token)
    (account / "namespace").write_text(c.namespace)
    shutil.copyfile(paths.pki / "ca.crt", account / "ca.crt")


def argv(paths: Paths, c: HostController, command: list[str]) -> list[str]:
    """`command` in a mount namespace of its own where the certDir and the ServiceAccount folder
    are this controller's, as in its pod."""
    for folder in (c.certs(paths), c.service_account_dir(paths), Path(CERT_DIR)):
        folder.mkdir(parents=True, exist_ok=True)
    # The ServiceAccount folder must not appear on the host, where clients take its presence
    # for being in a pod (the kubeflow-training SDK then reads its namespace file): a tmpfs
    # over /run (/var/run's target) in the controller's namespace holds the mount point.
    script = (f'mount --bind "$0" {CERT_DIR} && mount -t tmpfs tmpfs /run && mkdir -p {SA_DIR} '
              f'&& mount --bind "$1" {SA_DIR} && shift && exec "$@"')
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script,
            str(c.certs(paths)), str(c.service_account_dir(paths)), *command]


def mount_webhook_secret(paths: Paths, c: HostController) -> bool:
    """The kubelet's part once the rotator has filled the Secret: its files in the controller's
    certDir. True when they are there (the rotator waits for them before its webhook serves)."""
    if not c.secret:
        return True
    try:
        secret = api.get(paths, f"/api/v1/namespaces/{c.namespace}/secrets/{c.secret}")
    except OSError:
        return False
    data = secret.get("data") or {}
    if not all(key in data for key in ("ca.crt", "tls.crt", "tls.key")):
        return False
    for key in ("ca.crt", "tls.crt", "tls.key"):
        (c.certs(paths) / key).write_bytes(base64.b64decode(data[key]))
    return True


def webhooks_ready(paths: Paths, c: HostController) -> bool:
    """The rotator wrote its CA into every webhook of its configurations."""
    for ref in c.webhooks:
        kind, name = ref.split("/")
        try:
            config = api.get(paths, f"/apis/admissionregistration.k8s.io/v1/{kind}"
                                    f"webhookconfigurations/{name}")
        except OSError:
            return False
        if not all(h["clientConfig"].get("caBundle") for h in config["webhooks"]):
            return False
    return True
