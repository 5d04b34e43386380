"""The nodes' network and cgroups: what a cloud gives each node before its kubelet starts.

The first node is the host itself (layout.NODE_IP on NODE_INTERFACE, a bridge that is the
nodes' switch). Every further node is a network namespace plugged into that bridge by a veth
pair, with the next address of the nodes' network, a default route to the first node (where the
control plane, the registry and the cluster DNS answer) and a cgroup subtree of its own. Each
node then routes every other node's pod subnet to that node's address, as kindnet does between
kind's nodes: pods reach each other across nodes by their own addresses, no overlay.
"""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

from tools.cluster.layout import NODE_INTERFACE, NODE_IP, NODE_NETWORK_PREFIX, NODES, Node

CGROUPS = Path("/sys/fs/cgroup")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def veth(node: Node) -> str:
    """The host's end of the node's cable (its other end is the node's eth0)."""
    return f"ddpv{NODES.index(node) + 1}"


def first_node() -> None:
    """The host's address on the nodes' switch (the kubelet refuses a loopback node IP)."""
    if _ip("link", "show", NODE_INTERFACE, check=False).returncode != 0:
        # A bridge: this kernel has no `dummy` module ("Unknown device type"), and the further
        # nodes' veths are its ports.
        _ip("link", "add", NODE_INTERFACE, "type", "bridge")
    want = f"{NODE_IP}/{NODE_NETWORK_PREFIX}"
    shown = _ip("-4", "addr", "show", "dev", NODE_INTERFACE).stdout
    if want not in shown:
        if f"{NODE_IP}/" in shown:  # an earlier layout's /32
            _ip("addr", "flush", "dev", NODE_INTERFACE)
        _ip("addr", "add", want, "dev", NODE_INTERFACE)
    _ip("link", "set", NODE_INTERFACE, "up")


def plug(node: Node) -> None:
    """A further node's network namespace, cable, address and default route (idempotent)."""
    assert node.netns is not None
    if not Path(f"/run/netns/{node.netns}").exists():
        _ip("netns", "add", node.netns)
    if _ip("link", "show", veth(node), check=False).returncode != 0:
        _ip("link", "add", veth(node), "type", "veth", "peer", "name", "eth0", "netns",
            node.netns)
    _ip("link", "set", veth(node), "master", NODE_INTERFACE, "up")
    inside = ("-n", node.netns)
    if f"{node.ip}/" not in _ip(*inside, "-4", "addr", "show", "dev", "eth0").stdout:
        _ip(*inside, "addr", "add", f"{node.ip}/{NODE_NETWORK_PREFIX}", "dev", "eth0")
    _ip(*inside, "link", "set", "lo", "up")
    _ip(*inside, "link", "set", "eth0", "up")
    _ip(*inside, "route", "replace", "default", "via", NODE_IP)
    # A node forwards between its pods' bridge and the nodes' network; bridged pod traffic
    # goes through iptables, as kube-proxy needs for a Service whose pod is on the same bridge
    # (each network namespace has its own copy of these).
    for key in ("net.ipv4.ip_forward", "net.bridge.bridge-nf-call-iptables"):
        subprocess.run(node.wrap(["sysctl", "-qw", f"{key}=1"]), capture_output=True,
                       check=False)
    cgroup_root(node)


def routes(nodes: tuple[Node, ...]) -> None:
    """On each node, a route to every other node's pod subnet through that node."""
    for here in nodes:
        for there in nodes:
            if there is not here:
                argv = ["ip", "route", "replace", there.pod_subnet, "via", there.ip]
                subprocess.run(here.wrap(argv), capture_output=True, check=True)


def cgroup_root(node: Node) -> None:
    """The node's cgroup subtree in every v1 hierarchy (the kubelet's --cgroup-root must
    exist); cpuset's folders start empty and take no tasks until given cpus and mems."""
    for hierarchy in _hierarchies():
        folder = hierarchy / node.cgroup_root.strip("/")
        folder.mkdir(exist_ok=True)
        if hierarchy.name == "cpuset":
            for name in ("cpuset.cpus", "cpuset.mems"):
                if not (folder / name).read_text().strip():
                    (folder / name).write_text((hierarchy / name).read_text())


def _hierarchies() -> list[Path]:
    return [h for h in sorted(CGROUPS.iterdir())
            if h.is_dir() and not h.is_symlink() and h.name != "unified"]


def remove_cgroups(node: Node) -> None:
    """The node's `kubepods` cgroups, deepest first, once empty; a further node's root too."""
    for base in _cgroup_bases(node):
        tree = base / "kubepods"
        if tree.is_dir():
            for folder in sorted(tree.rglob("*"), key=lambda p: len(p.parts), reverse=True):
                if folder.is_dir():
                    with contextlib.suppress(OSError):
                        folder.rmdir()
            with contextlib.suppress(OSError):
                tree.rmdir()
        if node.netns is not None and base.is_dir():
            with contextlib.suppress(OSError):
                base.rmdir()


def cgroups_of(node: Node) -> list[Path]:
    """The node's cgroup folders that exist: its `kubepods` trees (and a further node's root)."""
    found = []
    for base in _cgroup_bases(node):
        if (base / "kubepods").exists():
            found.append(base / "kubepods")
        if node.netns is not None and base.exists():
            found.append(base)
    return found


def _cgroup_bases(node: Node) -> list[Path]:
    """The node's cgroup root in every hierarchy (the host's root for the first node)."""
    return [hierarchy / node.cgroup_root.strip("/") for hierarchy in _hierarchies()]


def unplug(node: Node) -> None:
    """A further node's namespace (its veth goes with it) and the routes to its pods."""
    assert node.netns is not None
    for here in NODES:
        if here is not node and (here.netns is None or Path(f"/run/netns/{here.netns}").exists()):
            subprocess.run(here.wrap(["ip", "route", "del", node.pod_subnet]),
                           capture_output=True, check=False)
    _ip("netns", "del", node.netns, check=False)
    _ip("link", "del", veth(node), check=False)


def remove_kube_chains(node: Node) -> None:
    """The `KUBE-*` iptables chains in the node's namespace, and the rules that jump to them:
    the kubelet's (KUBE-FIREWALL, KUBE-KUBELET-CANARY) and whatever `kube-proxy --cleanup`
    left."""
    for table in ("filter", "nat", "mangle"):
        rules = subprocess.run(node.wrap(["iptables", "-t", table, "-S"]), capture_output=True,
                               text=True, check=False).stdout.splitlines()
        for rule in rules:
            if rule.startswith("-A ") and "KUBE-" in rule and not rule.split()[1].startswith(
                    "KUBE-"):
                subprocess.run(node.wrap(["iptables", "-t", table, "-D", *rule.split()[1:]]),
                               capture_output=True, check=False)
        chains = [r.split()[1] for r in rules if r.startswith("-N KUBE-")]
        for flag in ("-F", "-X"):
            for chain in chains:
                subprocess.run(node.wrap(["iptables", "-t", table, flag, chain]),
                               capture_output=True, check=False)


def partition(node: Node, on: bool) -> None:
    """Drops (or lets through again) every packet between this node's pods and the other
    nodes' pods, in the node's own namespace: the node, its kubelet and the control plane keep
    talking, as when a network's pod traffic breaks but its nodes stay Ready."""
    assert node.netns is not None
    for direction in ("-s", "-d"):
        rule = ["FORWARD", direction, _others(node), "-j", "DROP"]
        present = subprocess.run(node.wrap(["iptables", "-C", *rule]), capture_output=True,
                                 check=False).returncode == 0
        if on and not present:
            subprocess.run(node.wrap(["iptables", "-I", *rule]), check=True)
        elif not on and present:
            subprocess.run(node.wrap(["iptables", "-D", *rule]), check=True)


def _others(node: Node) -> str:
    return ",".join(n.pod_subnet for n in NODES if n is not node)
