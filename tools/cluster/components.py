"""The control plane and node processes, in the order they start, with the flags this host
needs (docs/cluster.md explains each non-default one)."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from pathlib import Path

from tools.cluster import api
from tools.cluster.configs import HELPER_IMAGE
from tools.cluster.layout import (
    API_PORT,
    DNS_READY,
    ETCD_CLIENT,
    ETCD_PEER,
    NODE_IP,
    NODE_NAME,
    NODES,
    REGISTRY,
    SERVICE_RANGE,
    Node,
    Paths,
)


@dataclass(frozen=True)
class Component:
    name: str
    argv: list[str]
    ready_url: str
    user: str | None = None  # client certificate for the readiness probe
    verify: bool = True
    env: dict[str, str] = field(default_factory=dict)
    timeout: float = 120


def control_plane(paths: Paths, bins: dict[str, Path]) -> list[Component]:
    pki, cfg = paths.pki, paths.config
    return [
        Component("etcd", [
            str(bins["etcd"]), "--name", NODE_NAME, "--data-dir", str(paths.runtime / "etcd"),
            "--listen-client-urls", ETCD_CLIENT, "--advertise-client-urls", ETCD_CLIENT,
            "--listen-peer-urls", ETCD_PEER, "--initial-advertise-peer-urls", ETCD_PEER,
            "--initial-cluster", f"{NODE_NAME}={ETCD_PEER}",
            # Both on loopback only, so plain HTTP as in a kind node's static etcd test setups.
            "--listen-metrics-urls", "http://127.0.0.1:2381",
            # The tests' churn is small; the default 8 GiB quota would be preallocated.
            "--quota-backend-bytes", str(2 << 30), "--snapshot-count", "10000",
        ], "http://127.0.0.1:2381/health"),
        Component("registry", ["docker-registry", "serve", str(cfg / "registry.json")],
                  f"https://{REGISTRY}/v2/", user=None),
        Component("kube-apiserver", [
            str(bins["kube-apiserver"]), "--etcd-servers", ETCD_CLIENT,
            "--bind-address", NODE_IP, "--advertise-address", NODE_IP,
            "--secure-port", str(API_PORT),
            "--tls-cert-file", str(pki / "apiserver.crt"),
            "--tls-private-key-file", str(pki / "apiserver.key"),
            "--client-ca-file", str(pki / "ca.crt"),
            "--kubelet-client-certificate", str(pki / "apiserver-kubelet-client.crt"),
            "--kubelet-client-key", str(pki / "apiserver-kubelet-client.key"),
            "--kubelet-certificate-authority", str(pki / "ca.crt"),
            "--kubelet-preferred-address-types", "InternalIP",
            "--service-account-key-file", str(pki / "sa.pub"),
            "--service-account-signing-key-file", str(pki / "sa.key"),
            # The issuer is the address the API server answers on, not the usual
            # https://kubernetes.default.svc: Trainer's status server discovers it from its own
            # token and fetches its OIDC keys there, from the host, which does not use the
            # cluster's DNS.
            "--service-account-issuer", f"https://{NODE_IP}:{API_PORT}",
            "--service-cluster-ip-range", SERVICE_RANGE,
            "--authorization-mode", "Node,RBAC",
            # PodSecurity is on by default; named so that the namespace labels' enforcement
            # is visibly part of this cluster.
            "--enable-admission-plugins", "NodeRestriction,PodSecurity",
            "--allow-privileged=true",
            # Webhook calls go to a Service's endpoints (the host, where the operators run),
            # not its ClusterIP: the API server needs no kube-proxy (docs/cluster.md).
            "--enable-aggregator-routing=true",
            "--profiling=false",
        ], f"https://{NODE_IP}:{API_PORT}/readyz", user="admin", timeout=180),
        Component("kube-controller-manager", [
            str(bins["kube-controller-manager"]),
            "--kubeconfig", str(cfg / "controller-manager.kubeconfig"),
            "--authentication-kubeconfig", str(cfg / "controller-manager.kubeconfig"),
            "--authorization-kubeconfig", str(cfg / "controller-manager.kubeconfig"),
            "--bind-address", "127.0.0.1", "--leader-elect=false",
            "--service-account-private-key-file", str(pki / "sa.key"),
            "--root-ca-file", str(pki / "ca.crt"),
            "--cluster-signing-cert-file", str(pki / "ca.crt"),
            "--cluster-signing-key-file", str(pki / "ca.key"),
            "--use-service-account-credentials=true",
            "--service-cluster-ip-range", SERVICE_RANGE,
            # A lost node is NotReady 30 s after its last heartbeat, not 50 s: the kubelets
            # renew their leases every 5 s here (nodeLeaseDurationSeconds 20, configs.py), so
            # 30 s is still six missed renewals (docs/cluster.md, "Two nodes").
            "--node-monitor-grace-period", "30s",
        ], "https://127.0.0.1:10257/healthz", verify=False, user=None),
        Component("kube-scheduler", [
            str(bins["kube-scheduler"]), "--kubeconfig", str(cfg / "scheduler.kubeconfig"),
            "--authentication-kubeconfig", str(cfg / "scheduler.kubeconfig"),
            "--authorization-kubeconfig", str(cfg / "scheduler.kubeconfig"),
            "--bind-address", "127.0.0.1", "--leader-elect=false",
        ], "https://127.0.0.1:10259/healthz", verify=False, user=None),
    ]


def node(paths: Paths, bins: dict[str, Path], node: Node) -> list[Component]:
    """One node's containerd, kubelet and kube-proxy, in its network namespace."""
    cfg = paths.node_config(node)
    runtime = paths.node_runtime(node)
    return [
        Component("containerd" + node.suffix,
                  node.wrap(["containerd", "--config", str(cfg / "containerd.toml")]),
                  "", timeout=60),
        Component("kubelet" + node.suffix, node.wrap([
            str(bins["kubelet"]), "--config", str(cfg / "kubelet.json"),
            "--kubeconfig", str(paths.config / f"kubelet{node.suffix}.kubeconfig"),
            "--hostname-override", node.name, "--node-ip", node.ip,
            "--root-dir", str(runtime / "kubelet"),
            "--cert-dir", str(runtime / "kubelet-pki"),
        ]), f"http://{'127.0.0.1' if node.netns is None else node.ip}:10248/healthz",
            user=None, timeout=120),
        Component("kube-proxy" + node.suffix, node.wrap([
            str(bins["kube-proxy"]), "--config", str(cfg / "kube-proxy.json"),
        ]), f"http://{node.ip}:10256/healthz", user=None, timeout=60),
    ]


def host_services(paths: Paths, bins: dict[str, Path]) -> list[Component]:
    """What the first node hosts for all of them: the cluster DNS and the storage provisioner."""
    cfg = paths.config
    return [
        Component("coredns", [str(bins["coredns"]), "-conf", str(cfg / "Corefile")],
                  f"http://{DNS_READY}/ready", user=None),
        Component("local-path-provisioner", [
            str(bins["local-path-provisioner"]), "start",
            "--kubeconfig", str(cfg / "local-path-provisioner.kubeconfig"),
            "--config", str(cfg / "local-path.json"),
            "--namespace", "local-path-storage", "--configmap-name", "local-path-config",
            "--service-account-name", "local-path-provisioner-service-account",
            "--helper-image", HELPER_IMAGE, "--helper-pod-file", str(cfg / "helper-pod.yaml"),
        ], "", user=None),
    ]


def ready(paths: Paths, component: Component) -> bool:
    for each in NODES:
        if component.name == "containerd" + each.suffix:
            return _listens(paths.socket_of(each))
    if not component.ready_url:
        return True
    ctx = None
    if component.ready_url.startswith("https"):
        ctx = api.context(paths, component.user, component.verify)
    return api.ok(component.ready_url, ctx)


def _listens(path: Path) -> bool:
    """Something accepts connections on the unix socket `path` (a killed containerd leaves its
    socket file behind, so its existence says nothing)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(2)
        try:
            client.connect(str(path))
        except OSError:
            return False
    return True
