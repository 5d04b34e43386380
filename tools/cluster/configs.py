"""The configuration files of the node's components: containerd, CNI, kubelet, CoreDNS, the
registry and the local-path provisioner. Each non-default setting says why (docs/cluster.md
has the same list for readers)."""

from __future__ import annotations

import json
from pathlib import Path

from tools.cluster.layout import (
    BRIDGE,
    CLUSTER_DOMAIN,
    DNS_HEALTH,
    DNS_READY,
    NODE_IP,
    POD_SUBNET,
    REGISTRY,
    Paths,
)

PAUSE_IMAGE = f"{REGISTRY}/pause:3.10.2"  # kubeadm 1.37's pause version, made locally
HELPER_IMAGE = f"{REGISTRY}/busybox:1.35"  # local-path's helper pods (Debian's busybox-static)


def containerd(paths: Paths) -> Path:
    rt = paths.runtime / "containerd"
    text = f"""version = 2
root = "{rt}/root"
state = "{rt}/state"
[grpc]
  address = "{paths.containerd_socket}"
[ttrpc]
  address = "{paths.containerd_socket}.ttrpc"
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
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{paths.config / 'cni'}"
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
    return _write(paths.config / "containerd.toml", text)


def cni(paths: Paths) -> Path:
    conf = {
        "cniVersion": "1.0.0", "name": "ddp-pods",
        "plugins": [{
            "type": "bridge", "bridge": BRIDGE, "isGateway": True, "hairpinMode": True,
            # Pods talk to each other and to the node's address only: nothing to masquerade.
            "ipMasq": False,
            "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_SUBNET}]],
                     "routes": [{"dst": "0.0.0.0/0"}],
                     "dataDir": str(paths.runtime / "cni-ipam")},
        }, {"type": "loopback"}],
    }
    return _write(paths.config / "cni" / "10-ddp-pods.conflist", json.dumps(conf, indent=1))


def kubelet(paths: Paths) -> Path:
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(paths.pki / "ca.crt")}},
        "authorization": {"mode": "Webhook"},
        "tlsCertFile": str(paths.pki / "kubelet.crt"),
        "tlsPrivateKeyFile": str(paths.pki / "kubelet.key"),
        "containerRuntimeEndpoint": f"unix://{paths.containerd_socket}",
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
        "podCIDR": POD_SUBNET,
        "maxPods": 60,
        "serverTLSBootstrap": False,
        "rotateCertificates": False,
        # Short waits so the tests' pods start and stop promptly (defaults are 1 m syncs).
        "syncFrequency": "10s", "fileCheckFrequency": "10s", "nodeStatusUpdateFrequency": "5s",
    }
    return _write(paths.config / "kubelet.json", json.dumps(config, indent=1))


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


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text if text.endswith("\n") else text + "\n")
    return path
