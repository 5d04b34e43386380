#!/usr/bin/env bash
# Makes `prometheus` and `promtool` available for the metrics tests (`make tools` runs this).
# Idempotent: does nothing when both binaries are already on PATH. Installs Debian's
# `prometheus` package when run as root; otherwise exits non-zero saying how to install.
# The package may start a prometheus service on :9090; we stop and disable it because the
# tests start their own servers on free ports and nothing should keep running afterwards.
set -euo pipefail

have() { command -v "$1" >/dev/null 2>&1; }

if have prometheus && have promtool; then
    echo "prometheus: $(prometheus --version 2>&1 | head -n1)"
    exit 0
fi

if [[ "$(id -u)" -ne 0 ]]; then
    echo "error: prometheus/promtool not found on PATH and not running as root." >&2
    echo "fix: run 'sudo apt-get update && sudo apt-get install -y --no-install-recommends prometheus'" >&2
    echo "     (or put the prometheus and promtool binaries of a release from" >&2
    echo "     https://prometheus.io/download/ on PATH), then run 'make tools' again." >&2
    exit 1
fi

if ! have apt-get; then
    echo "error: prometheus/promtool not found and apt-get is unavailable." >&2
    echo "fix: install prometheus and promtool (https://prometheus.io/download/) onto PATH." >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update
# policy-rc.d exit 101 keeps invoke-rc.d from starting the packaged service during install
# (matters on hosts with an init system; containers usually have none).
policy=/usr/sbin/policy-rc.d
created_policy=0
if [[ ! -e "$policy" ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod +x "$policy"
    created_policy=1
fi
status=0
apt-get install -y --no-install-recommends prometheus || status=$?
if [[ "$created_policy" -eq 1 ]]; then
    rm -f "$policy"
fi
if [[ "$status" -ne 0 ]]; then
    echo "error: apt-get install prometheus failed (exit $status)." >&2
    exit "$status"
fi

# In case a service manager started it anyway, stop and disable it.
# `systemctl disable` also works without a running systemd (it only removes the symlinks).
if have systemctl; then
    if [[ -d /run/systemd/system ]]; then
        systemctl stop prometheus.service >/dev/null 2>&1 || true
    fi
    systemctl disable prometheus.service >/dev/null 2>&1 || true
fi
if have service; then
    service prometheus stop >/dev/null 2>&1 || true
fi
if have update-rc.d; then
    update-rc.d -f prometheus remove >/dev/null 2>&1 || true
fi

for bin in prometheus promtool; do
    if ! have "$bin"; then
        echo "error: $bin still not on PATH after installing the package." >&2
        exit 1
    fi
done
echo "prometheus: $(prometheus --version 2>&1 | head -n1)"
