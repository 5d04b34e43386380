#!/usr/bin/env bash
# Makes the container runtime of the end-to-end tests available (`make e2e` runs this):
#   podman (Debian bookworm's 4.3) with runc, netavark + aardvark-dns + iptables (podman
#   networks with DNS by name; netavark fails with "No such file or directory" without
#   iptables), catatonit (podman builds the pods' infra "pause" image from it on the first
#   `kube play`: "finding pause binary: exec: catatonit" without it, as a CI machine showed;
#   Debian only recommends it), and debootstrap (the local base image: no registry can be
#   pulled here).
# Idempotent: does nothing when every command is already on PATH. Installs the Debian packages
# when run as root; otherwise exits non-zero with one line saying how to install them.
# Nothing of the machine's own configuration is changed: the project's settings live in
# tools/imagebuild/containers.conf, which the harness passes through CONTAINERS_CONF.
set -euo pipefail

have() { command -v "$1" >/dev/null 2>&1; }
# netavark/aardvark-dns live in /usr/lib/podman, not on PATH.
ready() {
    have podman && have runc && have catatonit && have debootstrap && have iptables \
        && [[ -x /usr/lib/podman/netavark && -x /usr/lib/podman/aardvark-dns ]]
}

if ready; then
    echo "podman: $(podman --version), $(runc --version | head -n1)"
    exit 0
fi

packages=(podman runc conmon catatonit netavark aardvark-dns iptables debootstrap)
if [[ "$(id -u)" -ne 0 ]]; then
    echo "error: podman, runc or debootstrap missing and not running as root." >&2
    echo "fix: run 'sudo apt-get update && sudo apt-get install -y --no-install-recommends ${packages[*]}'" >&2
    exit 1
fi
if ! have apt-get; then
    echo "error: podman, runc or debootstrap missing and apt-get is unavailable." >&2
    echo "fix: install ${packages[*]} with this machine's package manager." >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update
# --no-install-recommends: crun (which refuses this machine's hybrid cgroup layout) and the
# rootless helpers stay out; the project's containers.conf selects runc anyway.
apt-get install -y --no-install-recommends "${packages[@]}"

if ! ready; then
    echo "error: one of ${packages[*]} is still missing after apt-get install." >&2
    exit 1
fi
echo "podman: $(podman --version), $(runc --version | head -n1)"
