"""Where the test cluster's files, processes and addresses are (docs/cluster.md).

One source for each fact: component versions are read from the go.mod files they are built
from; every path and address the other modules use is defined here.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

# The Go modules the components are built from, each folder named for what it builds (the root
# module, HERE, builds Kubernetes and etcd). Their go.mod files pin every version.
COREDNS_MODULE = HERE / "coredns"
LOCAL_PATH_MODULE = HERE / "local-path-provisioner"
TRAINING_OPERATOR_MODULE = HERE / "training-operator"
TRAINER_V2_MODULE = HERE / "trainer-v2-operator"  # Kubeflow Trainer v2 and JobSet
PROMETHEUS_OPERATOR_MODULE = HERE / "prometheus-operator"  # and its config reloader
PROMETHEUS_MODULE = HERE / "prometheus"
KUEUE_MODULE = HERE / "kueue"  # an optional add-on (docs/queues.md)

# The node's address: an interface of its own (a bridge with no ports), so the node, the
# registry and the cluster DNS have one address that pods reach through the CNI bridge's
# gateway and that never leaves this machine (the kubelet refuses a loopback node IP).
NODE_INTERFACE = "ddp0"
NODE_IP = "10.250.0.1"
NODE_NAME = "ddp-node"
POD_SUBNET = "10.244.0.0/24"
# The nodes' network: NODE_INTERFACE is its switch (a bridge), each further node's network
# namespace is plugged into it by a veth pair, as kind's nodes share one Docker network.
NODE_NETWORK_PREFIX = 24
CLUSTER_CIDR = "10.244.0.0/16"  # every node's pod subnet is a /24 of it
SERVICE_RANGE = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"
CLUSTER_DOMAIN = "cluster.local"
BRIDGE = "ddpbr0"

API_PORT = 6443
ETCD_CLIENT = "http://127.0.0.1:2379"
ETCD_PEER = "http://127.0.0.1:2380"
REGISTRY = f"{NODE_IP}:5000"
DNS_HEALTH = "127.0.0.1:8180"
DNS_READY = "127.0.0.1:8181"


@dataclass(frozen=True)
class Node:
    """One node: its own kubelet, containerd and kube-proxy, pod subnet, bridge and cgroup
    root. The first node runs in the host's network namespace beside the control plane (its
    address is NODE_IP); every other node runs in a network namespace of its own."""

    name: str
    ip: str
    pod_subnet: str
    bridge: str
    netns: str | None
    cgroup_root: str

    @property
    def suffix(self) -> str:
        """Appended to its processes' names ("kubelet", "kubelet-ddp-node-2")."""
        return "" if self.netns is None else f"-{self.name}"

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv` run in the node's network namespace (only that: the mount namespace stays
        the host's, so the kubelet and containerd see each other's mounts as on one machine)."""
        if self.netns is None:
            return argv
        return ["nsenter", f"--net=/run/netns/{self.netns}", "--", *argv]


NODES = (
    Node(NODE_NAME, NODE_IP, POD_SUBNET, BRIDGE, None, "/"),
    Node("ddp-node-2", "10.250.0.2", "10.244.1.0/24", "ddpbr1", "ddp-node-2", "/ddp-node-2"),
)
"""Every node the cluster can have, in order: `up --nodes N` starts the first N."""


def kueue_wanted() -> bool:
    """Kueue is the one optional add-on: `KUEUE=0 make cluster-up` runs the cluster without it
    (its build, objects and process), e.g. while a Kueue pin does not build (docs/cluster.md)."""
    return os.environ.get("KUEUE", "1") != "0"


def _require(gomod: Path, module: str) -> str:
    found = re.search(rf"^\s*(?:require\s+)?{re.escape(module)} (v\S+)", gomod.read_text(), re.M)
    if found is None:
        raise RuntimeError(f"{gomod} does not require {module}")
    return found.group(1)


@dataclass(frozen=True)
class Versions:
    kubernetes: str
    etcd: str
    coredns: str
    local_path: str
    training_operator: str
    trainer: str
    jobset: str
    prometheus_operator: str
    prometheus: str  # its Go module's version: v0.313.0 is Prometheus v3.13.0
    kueue: str

    @classmethod
    def read(cls) -> Versions:
        return cls(kubernetes=_require(HERE / "go.mod", "k8s.io/kubernetes"),
                   etcd=_require(HERE / "go.mod", "go.etcd.io/etcd/server/v3"),
                   coredns=_require(COREDNS_MODULE / "go.mod", "github.com/coredns/coredns"),
                   local_path=_require(LOCAL_PATH_MODULE / "go.mod",
                                       "github.com/rancher/local-path-provisioner"),
                   training_operator=_require(TRAINING_OPERATOR_MODULE / "go.mod",
                                              "github.com/kubeflow/training-operator"),
                   trainer=_require(TRAINER_V2_MODULE / "go.mod", "github.com/kubeflow/trainer/v2"),
                   jobset=_require(TRAINER_V2_MODULE / "go.mod", "sigs.k8s.io/jobset"),
                   prometheus_operator=_require(
                       PROMETHEUS_OPERATOR_MODULE / "go.mod",
                       "github.com/prometheus-operator/prometheus-operator"),
                   prometheus=_require(PROMETHEUS_MODULE / "go.mod",
                                       "github.com/prometheus/prometheus"),
                   kueue=_require(KUEUE_MODULE / "go.mod", "sigs.k8s.io/kueue"))


@dataclass(frozen=True)
class Paths:
    """The cluster's state: config, keys and logs under the checkout's .cache/cluster, the
    node's runtime state (containers, pod volumes) under /var/lib/ddp-trainer-cluster."""

    state: Path
    runtime: Path

    @classmethod
    def default(cls) -> Paths:
        state = Path(os.environ.get("CLUSTER_STATE", str(REPO / ".cache" / "cluster")))
        runtime = Path(os.environ.get("CLUSTER_RUNTIME", "/var/lib/ddp-trainer-cluster"))
        return cls(state.resolve(), runtime)

    @property
    def pki(self) -> Path:
        return self.state / "pki"

    @property
    def logs(self) -> Path:
        return self.state / "logs"

    @property
    def pids(self) -> Path:
        return self.state / "pids"

    @property
    def config(self) -> Path:
        return self.state / "config"

    @property
    def kubeconfig(self) -> Path:
        return self.state / "kubeconfig"

    @property
    def values_local(self) -> Path:
        return self.state / "values-local.yaml"

    @property
    def containerd_socket(self) -> Path:
        return self.runtime / "run" / "containerd.sock"

    def node_config(self, node: Node) -> Path:
        """The node's own configuration files (the first node's are `config` itself)."""
        return self.config if node.netns is None else self.config / node.name

    def node_runtime(self, node: Node) -> Path:
        """The node's runtime state: containers, kubelet root, pod logs, IPAM leases."""
        return self.runtime if node.netns is None else self.runtime / "nodes" / node.name

    def socket_of(self, node: Node) -> Path:
        return self.node_runtime(node) / "run" / "containerd.sock"

    @property
    def node_count(self) -> Path:
        """How many of NODES the last `up` started."""
        return self.state / "nodes"

    @property
    def storage(self) -> Path:
        """Where local-path-provisioner makes the claims' directories (shared by all pods)."""
        return self.runtime / "volumes"


def binaries_cache() -> Path:
    """Built binaries, per version set, outside the clone: only a machine's first build pays."""
    base = Path(os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache")))
    return base / "ddp-trainer" / "cluster"
