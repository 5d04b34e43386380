"""prometheus-operator and the Prometheus it runs, as kube-prometheus-stack sets them up.

The operator (tools/cluster/prometheus-operator/go.mod pins it) runs on the host in-cluster
mode: its ServiceAccount's token at the pod path (controllers.py) and
KUBERNETES_SERVICE_HOST/PORT naming the API server. Its CRDs and RBAC are the module's
`example/prometheus-operator-crd` and `example/rbac`. A `Prometheus` resource selects
PodMonitors and PrometheusRules labelled
`release: kube-prometheus-stack` in every namespace, the chart's default labels; the operator
makes its StatefulSet, whose pod runs Prometheus (the version the operator defaults to, built
from its module with only Kubernetes discovery: Debian's 2.42 build leaves that out) and the
operator's config reloader (built with the operator). The host reaches that pod at its pod
IP through the node's bridge: `.cache/cluster/prometheus-url`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from tools.cluster import api, controllers, procs
from tools.cluster.builds import module_dir
from tools.cluster.controllers import HostController
from tools.cluster.layout import (
    API_PORT,
    NODE_IP,
    NODES,
    PROMETHEUS_OPERATOR_MODULE,
    REGISTRY,
    Paths,
    Versions,
)

MODULE = "github.com/prometheus-operator/prometheus-operator"
NAMESPACE = "monitoring"


def prometheus_version(module: str) -> str:
    """Prometheus' module versions are v0.<major><minor:02>.<patch>: v0.313.0 is v3.13.0."""
    number, patch = module.removeprefix("v0.").split(".")
    return f"v{int(number) // 100}.{int(number) % 100}.{patch}"


_VERSIONS = Versions.read()
PROMETHEUS_VERSION = prometheus_version(_VERSIONS.prometheus)
PROMETHEUS_IMAGE = f"{REGISTRY}/prometheus:{PROMETHEUS_VERSION}"
RELOADER_IMAGE = f"{REGISTRY}/prometheus-config-reloader:{_VERSIONS.prometheus_operator}"
OPERATOR = HostController(
    name="prometheus-operator", namespace=NAMESPACE, service_account="prometheus-operator",
    health="127.0.0.1:8094", ready_path="/healthz")
# Short intervals: the tests wait for scrapes and alert evaluations, not for production ones.
INTERVAL = "5s"


def source() -> Path:
    return module_dir(MODULE, PROMETHEUS_OPERATOR_MODULE)


def manifests() -> list[dict[str, Any]]:
    """The operator's and Prometheus' ServiceAccounts and RBAC (in `monitoring`), and the
    Prometheus resource (the CRDs are applied from their files: :func:`install`)."""
    root = source() / "example"
    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}]
    for folder, keep in (("prometheus-operator", ("ServiceAccount", "ClusterRole",
                                                  "ClusterRoleBinding")),
                         ("prometheus", ("ServiceAccount", "ClusterRole", "ClusterRoleBinding"))):
        for path in sorted((root / "rbac" / folder).glob("*.yaml")):
            for d in yaml.safe_load_all(path.read_text()):
                if d and d["kind"] in keep:
                    objects.append(_in_namespace(d))
    objects.append(prometheus())
    return objects


def _in_namespace(obj: dict[str, Any]) -> dict[str, Any]:
    if obj["kind"] == "ServiceAccount":
        obj["metadata"]["namespace"] = NAMESPACE
    for subject in obj.get("subjects", []):
        subject["namespace"] = NAMESPACE
    return obj


def prometheus() -> dict[str, Any]:
    everything = {"matchLabels": {"release": "kube-prometheus-stack"}}
    return {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "Prometheus",
        "metadata": {"name": "k8s", "namespace": NAMESPACE},
        "spec": {
            "version": PROMETHEUS_VERSION, "image": PROMETHEUS_IMAGE, "replicas": 1,
            "serviceAccountName": "prometheus",
            "podMonitorSelector": everything, "podMonitorNamespaceSelector": {},
            "serviceMonitorSelector": everything, "serviceMonitorNamespaceSelector": {},
            "ruleSelector": everything, "ruleNamespaceSelector": {},
            "scrapeInterval": INTERVAL, "evaluationInterval": INTERVAL,
            "resources": {"requests": {"cpu": "50m", "memory": "200Mi"}},
            # On the first node, with the cluster's other services (DNS, storage): the tests
            # lose or partition only further nodes (a drain of the first evicts jobs' pods only).
            "nodeSelector": {"kubernetes.io/hostname": NODES[0].name},
            "securityContext": {"runAsNonRoot": True, "runAsUser": 65534, "fsGroup": 65534,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            # Kubernetes discovery from the pod reads the API server's address from these; the
            # kubelet's are the `kubernetes` Service's ClusterIP, routed by kube-proxy; these
            # name the API server itself, one hop fewer (docs/cluster.md).
            "containers": [{"name": "prometheus", "env": [
                {"name": "KUBERNETES_SERVICE_HOST", "value": NODE_IP},
                {"name": "KUBERNETES_SERVICE_PORT", "value": str(API_PORT)}]}],
        },
    }


def install(paths: Paths, kubectl: Path) -> None:
    """The CRDs first, as kubectl reads their files (PyYAML refuses the YAML 1.1 `=` value tag
    they contain), established before the Prometheus resource can be made; then the rest and
    the operator's token (controllers.install)."""
    crds = api.kubectl(paths, kubectl, "apply", "--server-side", "--force-conflicts", "-o",
                       "name", "-f", str(source() / "example" / "prometheus-operator-crd"))
    api.kubectl(paths, kubectl, "wait", "--for=condition=Established", "--timeout=60s",
                *crds.stdout.split())
    controllers.install(paths, kubectl, OPERATOR, manifests())


def arguments() -> list[str]:
    return ["--prometheus-config-reloader", RELOADER_IMAGE,
            "--web.listen-address", OPERATOR.health,
            # No kubelet Service: nothing here scrapes the kubelet.
            "--kubelet-endpoints=false"]


def environment() -> dict[str, str]:
    """In-cluster mode, as in its pod (the token comes from the mounted ServiceAccount)."""
    return {"KUBERNETES_SERVICE_HOST": NODE_IP, "KUBERNETES_SERVICE_PORT": str(API_PORT)}


def wait_for_prometheus(paths: Paths, kubectl: Path) -> str:
    """The URL of the operator's Prometheus once it answers, written to `url_file`."""
    found: list[str] = []

    def answering() -> bool:
        url = prometheus_url(paths, kubectl)
        if url and api.ok(f"{url}/-/ready"):
            found.append(url)
        return bool(found)

    try:
        # 240 s was too short once in CI, while both cores ran the tests outside tests/cluster
        procs.wait_for(answering, 600, "the operator's Prometheus pod answering",
                       paths.logs / f"{OPERATOR.name}.log")
    except procs.ClusterError as exc:  # the operator's log says little of why the pod waits
        pod = api.kubectl(paths, kubectl, "describe", "pod", "prometheus-k8s-0", "-n",
                          NAMESPACE, check=False)
        sts = api.kubectl(paths, kubectl, "get", "statefulset", "-n", NAMESPACE, "-o", "wide",
                          check=False)
        raise procs.ClusterError(f"{exc}\nkubectl describe pod prometheus-k8s-0:\n"
                                 f"{(pod.stdout + pod.stderr)[-3000:]}\n"
                                 f"{sts.stdout}{sts.stderr}") from None
    url_file(paths).write_text(found[0] + "\n")
    return found[0]


def prometheus_url(paths: Paths, kubectl: Path) -> str | None:
    """http://<pod IP>:9090 once the operator's Prometheus pod is Ready, else None."""
    proc = api.kubectl(paths, kubectl, "get", "pod", "prometheus-k8s-0", "-n", NAMESPACE,
                       "-o", "json", check=False)
    if proc.returncode != 0:
        return None
    pod = json.loads(proc.stdout)
    ready = any(c["type"] == "Ready" and c["status"] == "True"
                for c in pod.get("status", {}).get("conditions", []))
    ip = pod.get("status", {}).get("podIP")
    return f"http://{ip}:9090" if ready and ip else None


def url_file(paths: Paths) -> Path:
    return paths.state / "prometheus-url"

