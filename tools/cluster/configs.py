"""The configuration files of the node's components: containerd, CNI, kubelet, CoreDNS, the
registry and the local-path provisioner. Each non-default setting says why (docs/cluster.md
has the same list for readers)."""

from __future__ import annotations

import json
from pathlib import Path

from tools.cluster.layout import (
    CLUSTER_CIDR,
    CLUSTER_DOMAIN,
    DNS_HEALTH,
    DNS_READY,
    HERE,
    NODE_IP,
    NODES,
    REGISTRY,
    Node,
    Paths,
)

PAUSE_IMAGE = f"{REGISTRY}/pause:3.10.2"  # kubeadm 1.37's pause version, made locally
HELPER_IMAGE = f"{REGISTRY}/busybox:1.35"  # local-path's helper pods (Debian's busybox-static)


def containerd(paths: Paths, node: Node) -> Path:
    rt = paths.node_runtime(node) / "containerd"
    cfg = paths.node_config(node)
    socket = paths.socket_of(node)
    text = f"""version = 2
root = "{rt}/root"
state = "{rt}/state"
[grpc]
  address = "{socket}"
[ttrpc]
  address = "{socket}.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # No CAP_SYS_RESOURCE in this sandbox: a pod's oom_score_adj may only be raised, never
  # lowered below the runtime's own.
  restrict_oom_score_adj = true
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        # cgroupfs, as the kubelet: no systemd runs here.
        SystemdCgroup = false
        # runc's state per node (its default, /run/containerd/runc, would be shared).
        Root = "{rt}/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cfg / 'cni'}"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{paths.config / 'certs.d'}"
"""
    hosts = paths.config / "certs.d" / REGISTRY.replace(":", ":")
    hosts.mkdir(parents=True, exist_ok=True)
    # The node trusts the registry's TLS through the cluster CA, as a node trusts a private
    # registry's CA; images are pulled over HTTPS as from any registry.
    (hosts / "hosts.toml").write_text(
        f'server = "https://{REGISTRY}"\n\n[host."https://{REGISTRY}"]\n'
        f'  capabilities = ["pull", "resolve"]\n  ca = "{paths.pki / "ca.crt"}"\n')
    return _write(cfg / "containerd.toml", text)


def cni(paths: Paths, node: Node) -> Path:
    """bridge + host-local on the node's own pod subnet, as kindnet writes on each node; the
    routes to the other nodes' subnets are network.py's."""
    conf = {
        "cniVersion": "1.0.0", "name": "ddp-pods",
        "plugins": [{
            "type": "bridge", "bridge": node.bridge, "isGateway": True, "hairpinMode": True,
            # Pods talk to each other, to the nodes and to the control plane only, all inside
            # CLUSTER_CIDR or the nodes' network, and both route back: nothing to masquerade.
            "ipMasq": False,
            "ipam": {"type": "host-local", "ranges": [[{"subnet": node.pod_subnet}]],
                     "routes": [{"dst": "0.0.0.0/0"}],
                     "dataDir": str(paths.node_runtime(node) / "cni-ipam")},
        }, {"type": "loopback"}],
    }
    return _write(paths.node_config(node) / "cni" / "10-ddp-pods.conflist",
                  json.dumps(conf, indent=1))


def kubelet(paths: Paths, node: Node) -> Path:
    cfg = paths.node_config(node)
    name = "kubelet" + node.suffix
    config: dict[str, object] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(paths.pki / "ca.crt")}},
        "authorization": {"mode": "Webhook"},
        "tlsCertFile": str(paths.pki / f"{name}.crt"),
        "tlsPrivateKeyFile": str(paths.pki / f"{name}.key"),
        "containerRuntimeEndpoint": f"unix://{paths.socket_of(node)}",
        # The host mounts cgroup v1 controllers (plus an empty unified tree): kubelet >= 1.35
        # refuses cgroup v1 unless told not to.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "clusterDNS": [NODE_IP], "clusterDomain": CLUSTER_DOMAIN,
        # Pods' resolv.conf for dnsPolicy Default: the host's may name resolvers pods cannot
        # reach; the cluster DNS is the only one here.
        "resolvConf": str(_write(paths.config / "resolv.conf", f"nameserver {NODE_IP}\n")),
        # No swap accounting and 2 cores: do not refuse to start, do not evict on a
        # developer's disk that is 90 % full.
        "failSwapOn": False,
        "evictionHard": {"memory.available": "200Mi", "nodefs.available": "1%",
                         "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        # The sandbox may not lower the kubelet's oom_score_adj (no CAP_SYS_RESOURCE).
        "oomScoreAdj": 0,
        "serializeImagePulls": False,
        "podCIDR": node.pod_subnet,
        "maxPods": 60,
        "serverTLSBootstrap": False,
        "rotateCertificates": False,
        # Short waits so the tests' pods start and stop promptly (defaults are 1 m syncs).
        "syncFrequency": "10s", "fileCheckFrequency": "10s", "nodeStatusUpdateFrequency": "5s",
        # Its lease renewed every 5 s (a quarter of this): the controller manager's grace
        # period before NotReady is 30 s (components.py).
        "nodeLeaseDurationSeconds": 20,
    }
    if node.netns is not None:
        config.update({
            # Its own cgroup subtree (cgroups are not namespaced here) and its own pod logs:
            # each kubelet garbage-collects what it finds there as its own.
            "cgroupRoot": node.cgroup_root,
            "podLogsDir": str(paths.node_runtime(node) / "pod-logs"),
            # Probed from the host, where the node's loopback is not.
            "healthzBindAddress": node.ip,
        })
    return _write(cfg / "kubelet.json", json.dumps(config, indent=1))


def kube_proxy(paths: Paths, node: Node) -> Path:
    """iptables mode, as kubeadm's default; conntrack sysctls left as they are (the sandbox
    may not write them)."""
    config = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(paths.config / "kube-proxy.kubeconfig")},
        "mode": "iptables", "hostnameOverride": node.name,
        "clusterCIDR": CLUSTER_CIDR, "detectLocalMode": "ClusterCIDR",
        "bindAddress": node.ip, "nodePortAddresses": ["primary"],
        "healthzBindAddress": f"{node.ip}:10256",
        "metricsBindAddress": f"{node.ip}:10249",
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s",
                      "tcpCloseWaitTimeout": "0s"},
    }
    return _write(paths.node_config(node) / "kube-proxy.json", json.dumps(config, indent=1))


def corefile(paths: Paths) -> Path:
    text = f""".:53 {{
    bind {NODE_IP}
    errors
    health {DNS_HEALTH}
    ready {DNS_READY}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {paths.config / 'coredns.kubeconfig'}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    cache 5
    loadbalance
}}
"""
    return _write(paths.config / "Corefile", text)


def registry(paths: Paths) -> Path:
    config = {
        "version": 0.1, "log": {"level": "info"},
        "storage": {"filesystem": {"rootdirectory": str(paths.runtime / "registry")},
                    "delete": {"enabled": True}},
        "http": {"addr": REGISTRY, "tls": {"certificate": str(paths.pki / "registry.crt"),
                                            "key": str(paths.pki / "registry.key")}},
    }
    return _write(paths.config / "registry.json", json.dumps(config, indent=1))


def local_path(paths: Paths) -> Path:
    """local-path-provisioner's config: one shared folder, so every claim (ReadWriteMany
    included) is a directory there that any pod on this node mounts."""
    config = {"sharedFileSystemPath": str(paths.storage)}
    return _write(paths.config / "local-path.json", json.dumps(config, indent=1))


def helper_pod(paths: Paths) -> Path:
    """local-path-provisioner's helper pod template (tools/cluster/helper-pod.yaml), pinned to
    the first node, with the registry's busybox."""
    template = (HERE / "helper-pod.yaml").read_text()
    return _write(paths.config / "helper-pod.yaml", template.replace(
        "HELPER_IMAGE", HELPER_IMAGE).replace("FIRST_NODE", NODES[0].name))


def _write(path: Path, text: str) -> Path:
    """Writes `text` unless the file has it already: kube-proxy exits when its configuration
    file changes, and a second `up` writes every file again."""
    text = text if text.endswith("\n") else text + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)
    return path
