#!/usr/bin/env bash
# Installs what the test cluster (make cluster-up, docs/cluster.md) takes from Debian:
#   containerd (1.6, the CRI runtime) with runc, containernetworking-plugins (bridge,
#   host-local, loopback), docker-registry (the CNCF distribution registry 2.8: the cluster's
#   OCI registry), busybox-static (local-path-provisioner's helper image), openssl (the
#   cluster's certificates), iproute2. podman comes from tools/install-podman.sh; the
#   Kubernetes components, etcd, CoreDNS and local-path-provisioner are built from their Go
#   modules by tools/cluster/builds.py (`python -m tools.cluster build`), with the machine's Go
#   (>= the go.mod files' version).
# Idempotent: does nothing when every command is already there.
set -euo pipefail

have() { command -v "$1" >/dev/null 2>&1; }
ready() {
    have containerd && have containerd-shim-runc-v2 && have runc && have docker-registry \
        && have openssl && have ip && [[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local \
        && -x /usr/lib/cni/loopback ]] && /bin/busybox --help >/dev/null 2>&1 \
        && file -L /bin/busybox 2>/dev/null | grep -q 'statically linked'
}

if ! have go; then
    echo "error: go not found; the cluster's components are built from Go modules." >&2
    echo "fix: install Go >= $(sed -n 's/^go //p' "$(dirname "$0")/cluster/go.mod") and put it on PATH" >&2
    exit 1
fi

packages=(containerd runc containernetworking-plugins docker-registry busybox-static openssl
          iproute2 file)
if ! ready; then
    if [[ "$(id -u)" -ne 0 ]] || ! have apt-get; then
        echo "error: the cluster's Debian packages are missing (root and apt-get needed)." >&2
        echo "fix: apt-get install -y --no-install-recommends ${packages[*]}" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    apt-get install -y --no-install-recommends "${packages[@]}"
    ready || { echo "error: one of ${packages[*]} is still missing after apt-get install." >&2; exit 1; }
fi
echo "cluster tools: $(go version | cut -d' ' -f3), containerd $(containerd --version | cut -d' ' -f3), $(runc --version | head -n1)"
