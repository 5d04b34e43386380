"""The control plane and node processes, in the order they start, with the flags this host
needs (docs/cluster.md explains each non-default one)."""

from __future__ import annotations

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
    REGISTRY,
    SERVICE_RANGE,
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
            # token and fetches its OIDC keys there, from the host, which has neither the
            # cluster's DNS nor a kube-proxy for that Service's ClusterIP.
            "--service-account-issuer", f"https://{NODE_IP}:{API_PORT}",
            "--service-cluster-ip-range", SERVICE_RANGE,
            "--authorization-mode", "Node,RBAC",
            # PodSecurity is on by default; named so that the namespace labels' enforcement
            # is visibly part of this cluster.
            "--enable-admission-plugins", "NodeRestriction,PodSecurity",
            "--allow-privileged=true",
            # Webhook calls go to a Service's endpoints, not its ClusterIP: the operators run
            # on the host and no kube-proxy routes ClusterIPs here (docs/cluster.md).
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
        ], "https://127.0.0.1:10257/healthz", verify=False, user=None),
        Component("kube-scheduler", [
            str(bins["kube-scheduler"]), "--kubeconfig", str(cfg / "scheduler.kubeconfig"),
            "--authentication-kubeconfig", str(cfg / "scheduler.kubeconfig"),
            "--authorization-kubeconfig", str(cfg / "scheduler.kubeconfig"),
            "--bind-address", "127.0.0.1", "--leader-elect=false",
        ], "https://127.0.0.1:10259/healthz", verify=False, user=None),
    ]


def node(paths: Paths, bins: dict[str, Path]) -> list[Component]:
    cfg = paths.config
    return [
        Component("containerd", ["containerd", "--config", str(cfg / "containerd.toml")],
                  "", timeout=60),
        Component("kubelet", [
            str(bins["kubelet"]), "--config", str(cfg / "kubelet.json"),
            "--kubeconfig", str(cfg / "kubelet.kubeconfig"),
            "--hostname-override", NODE_NAME, "--node-ip", NODE_IP,
            "--root-dir", str(paths.runtime / "kubelet"),
            "--cert-dir", str(paths.runtime / "kubelet-pki"),
        ], "http://127.0.0.1:10248/healthz", user=None, timeout=120),
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
    if component.name == "containerd":
        return paths.containerd_socket.is_socket()
    if not component.ready_url:
        return True
    ctx = None
    if component.ready_url.startswith("https"):
        ctx = api.context(paths, component.user, component.verify)
    return api.ok(component.ready_url, ctx)
