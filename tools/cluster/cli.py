"""`make cluster-up` / `make cluster-down`: a real Kubernetes of one or two nodes on this host.

    python3 -m tools.cluster up      # build (once per version), start, wait, write files
    python3 -m tools.cluster up --nodes 2   # or a second node, each in its network namespace
    python3 -m tools.cluster down    # stop everything it started, remove the state
    python3 -m tools.cluster build   # only the Go builds
    python3 -m tools.cluster restart kube-apiserver   # SIGKILL one process, start it again

Every component is the real one, built from its Go module (go.mod files beside this file) or
taken from Debian (containerd, runc, CNI plugins, the registry); docs/cluster.md lists them,
with each host-specific flag and what is still not real here.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from tools.cluster import actions, builds, components, layout, netns, nodes, procs
from tools.cluster.actions import log
from tools.cluster.layout import (
    API_PORT,
    NODE_INTERFACE,
    NODES,
    Node,
    Paths,
    Versions,
    binaries_cache,
)
from tools.cluster.procs import ClusterError

NEEDS = ("containerd", "containerd-shim-runc-v2", "runc", "docker-registry", "podman",
         "openssl", "ip", "mount", "umount")


def preflight(paths: Paths) -> None:
    if os.geteuid() != 0:
        raise ClusterError("the cluster's node runs containers and makes network interfaces: "
                           "run as root")
    missing = [n for n in NEEDS if shutil.which(n) is None]
    if missing:
        raise ClusterError(f"missing {', '.join(missing)} (fix: bash tools/install-cluster.sh)")
    other = [pid for pid in procs.pids_matching(f"--secure-port {API_PORT} ")
             if pid != procs.pid_of(paths, "kube-apiserver")]
    if other:
        # One cluster per machine: the node's address, ports and /var/lib state are shared.
        raise ClusterError(f"another checkout's cluster is running (kube-apiserver pid "
                           f"{other[0]}) (fix: `python3 -m tools.cluster down` in that "
                           f"checkout, or `kill {other[0]}`)")


def _clear_stale(paths: Paths) -> None:
    """The state of a cluster whose processes are gone (a machine restarted, a checkout
    deleted before `down`) is removed first: its etcd would hand the new kubelet sandboxes and
    pods that no longer exist (stop 48's CI: a stale Prometheus pod never became Ready)."""
    if procs.pids_matching(f"--secure-port {API_PORT} ") or procs.pid_of(paths, "etcd"):
        return  # running: `up` reuses it
    if paths.runtime.exists() or netns.pod_namespaces() or leftovers(paths):
        log(f"a stopped cluster's state is left ({paths.runtime}): removing it first")
        down(paths)


def up(paths: Paths, count: int = 1) -> None:
    """Each of actions.ACTIONS, in order (each is idempotent: a running cluster is reused,
    and one with fewer nodes gets the rest)."""
    if not 1 <= count <= len(NODES):
        raise ClusterError(f"--nodes {count}: this cluster has 1 to {len(NODES)} nodes "
                           f"(fix: --nodes 1 or --nodes {len(NODES)})")
    began = time.monotonic()
    preflight(paths)
    _clear_stale(paths)
    netns.share()
    versions = Versions.read()
    log(f"Kubernetes {versions.kubernetes}, etcd {versions.etcd}, CoreDNS {versions.coredns}, "
        f"local-path-provisioner {versions.local_path}, training operator "
        f"{versions.training_operator}, Kubeflow Trainer {versions.trainer}, JobSet "
        f"{versions.jobset}, prometheus-operator {versions.prometheus_operator}, Kueue "
        f"{versions.kueue if layout.kueue_wanted() else '(left out: KUEUE=0)'}")
    state = actions.Up(paths, versions, count)
    for action in actions.ACTIONS:
        started = time.monotonic()
        said = action.run(state)
        log(f"{action.name}: done in {time.monotonic() - started:.0f} s"
            + (f" ({said})" if said else ""))
    log(f"up in {time.monotonic() - began:.0f} s: KUBECONFIG={paths.kubeconfig}, "
        f"values {paths.values_local}, kubectl {actions.TOOLS_BIN / 'kubectl'}")


def restart(paths: Paths, name: str) -> None:
    """A crash and a restart of one of the cluster's processes: SIGKILL, then the same command
    again, waited for until ready (the tests' failure scenarios)."""
    bins = builds.build_all(Versions.read())
    wanted = {c.name: c for c in components.control_plane(paths, bins)
              + [p for node in NODES for p in components.node(paths, bins, node)]
              + components.host_services(paths, bins)}
    hosted = {p.name: (c, p) for c, p in actions.host_controllers(paths, bins)}
    if name not in wanted and name not in hosted:
        raise ClusterError(f"no process {name} in the cluster (fix: one of "
                           f"{', '.join([*wanted, *hosted])})")
    pid = procs.pid_of(paths, name)
    if pid is not None:
        os.kill(pid, signal.SIGKILL)
        procs.wait_for(lambda: procs.pid_of(paths, name) is None, 10, f"{name} (pid {pid}) gone")
    log(f"{name}: pid {pid} killed with SIGKILL")
    if name in hosted:
        actions.start_controller(paths, *hosted[name])
    else:
        actions.start_all(paths, [wanted[name]])


def down(paths: Paths) -> None:
    """Stops every process `up` started on every node (pods' containers included) and removes
    the state, the nodes' namespaces, routes, iptables rules and cgroups."""
    for name in (*[op.controller.name for op in reversed(actions.OPERATORS)],
                 "local-path-provisioner", "coredns"):
        procs.stop(paths, name)
    for node in reversed(NODES):
        stop_node(paths, node)
    for name in ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "registry",
                 "etcd"):
        procs.stop(paths, name)
    _unmount_under(paths.runtime)
    netns.remove_pods()  # containerd's pod network namespaces
    for node in NODES:
        nodes.remove_cgroups(node)
        if node.netns is not None:
            nodes.unplug(node)
    for link in (NODES[0].bridge, NODE_INTERFACE):
        subprocess.run(["ip", "link", "del", link], capture_output=True, check=False)
    shutil.rmtree(paths.runtime, ignore_errors=True)
    # The training operator's certificate rotator writes its serving certificate here.
    shutil.rmtree("/tmp/k8s-webhook-server", ignore_errors=True)
    for name in ("pki", "config", "pids", "kubeconfig", "values-local.yaml", "nodes"):
        target = paths.state / name
        if target.is_dir():
            shutil.rmtree(target, ignore_errors=True)
        else:
            target.unlink(missing_ok=True)
    left = leftovers(paths)
    if left:
        raise ClusterError("down left behind: " + "; ".join(left))
    log("down: every process stopped, state removed, nothing left on either node (logs kept "
        f"in {paths.logs}; built binaries kept in {binaries_cache()})")


def leftovers(paths: Paths) -> list[str]:
    """What `down` should have removed and has not, on every node: processes, mounts, network
    namespaces and links, cgroups, the kubelet's and kube-proxy's iptables chains."""
    left = [f"process {pid}" for pid in procs.pids_matching(str(paths.runtime) + "/")
            + procs.pids_matching(str(paths.config) + "/")]
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    left += [f"mount {m}" for m in mounts if m.startswith(str(paths.runtime) + "/")]
    left += [f"network namespace {n.name}" for n in netns.NETNS.glob("*")
             if n.name.startswith("cni-") or n.name in {node.netns for node in NODES}]
    left += [f"network namespace mount {m}" for m in netns.pod_namespaces()]
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True,
                           check=False).stdout
    names = {line.split(":")[1].strip().split("@")[0] for line in links.splitlines()}
    left += [f"link {name}" for name in sorted(names & (
        {NODE_INTERFACE} | {n.bridge for n in NODES} | {nodes.veth(n) for n in NODES[1:]}))]
    for node in NODES:
        left += [f"cgroup {c}" for c in nodes.cgroups_of(node)]
    for table in ("filter", "nat", "mangle"):
        rules = subprocess.run(["iptables", "-t", table, "-S"], capture_output=True, text=True,
                               check=False).stdout
        if "KUBE-" in rules:
            left.append(f"KUBE- chains (the kubelet's, kube-proxy's) in the host's iptables "
                        f"{table} table")
    return left


def stop_node(paths: Paths, node: Node) -> None:
    """A node's kube-proxy, kubelet, containers and containerd, and their iptables chains: what
    `down` does on each node."""
    procs.stop(paths, "kube-proxy" + node.suffix)
    proxy = builds.binary("kube-proxy")
    if proxy is not None:
        subprocess.run(node.wrap([str(proxy), "--cleanup"]), capture_output=True, check=False)
    kill_node(paths, node)
    nodes.remove_kube_chains(node)


def kill_node(paths: Paths, node: Node) -> None:
    """SIGKILL to the node's kubelet, containerd, shims and every container: the node lost as
    to a power cut, its network namespace, files and API objects left as they were."""
    for name in ("kubelet", "containerd"):
        pid = procs.pid_of(paths, name + node.suffix)
        if pid is not None:
            procs.kill_and_wait(pid, None)
        (paths.pids / f"{name}{node.suffix}.pid").unlink(missing_ok=True)
    for pid in procs.pids_matching(f"-address {paths.socket_of(node)}"):
        procs.kill_and_wait(pid, None)  # the shims
    _kill_containers(paths.node_runtime(node) / "containerd" / "runc" / "k8s.io")


def _kill_containers(root: Path) -> None:
    """Every container a node's containerd ran in its k8s.io namespace, through runc."""
    if not root.exists():
        return
    listed = subprocess.run(["runc", "--root", str(root), "list", "-q"], capture_output=True,
                            text=True, check=False).stdout.split()
    for container in listed:
        subprocess.run(["runc", "--root", str(root), "kill", container, "KILL"],
                       capture_output=True, check=False)
        subprocess.run(["runc", "--root", str(root), "delete", "--force", container],
                       capture_output=True, check=False)


def _unmount_under(root: Path) -> None:
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for target in sorted((m for m in mounts if m.startswith(str(root) + "/")), reverse=True):
        subprocess.run(["umount", "-l", target], capture_output=True, check=False)


NODE_ACTIONS = ("kill-node", "stop-node", "start-node", "partition", "heal")
"""What happens to a node in the tests' failure scenarios (docs/cluster.md, "Two nodes")."""


def node_named(name: str) -> Node:
    for node in NODES[1:]:
        if node.name == name:
            return node
    raise ClusterError(f"no further node {name} (fix: one of "
                       f"{', '.join(n.name for n in NODES[1:])}; the first node is the host)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("up", "down", "build", "restart", *NODE_ACTIONS))
    parser.add_argument("name", nargs="?", help="restart: the process, e.g. kube-apiserver; "
                        "kill-node, stop-node, start-node, partition, heal: the node, e.g. "
                        "ddp-node-2")
    parser.add_argument("--nodes", type=int, default=int(os.environ.get("NODES", "1")),
                        help="up: how many nodes (default $NODES or 1)")
    args = parser.parse_args(argv)
    if (args.action in ("restart", *NODE_ACTIONS)) != (args.name is not None):
        parser.error(f"a name goes with restart, {', '.join(NODE_ACTIONS)}, and only there")
    paths = Paths.default()
    try:
        if args.action == "up":
            up(paths, args.nodes)
        elif args.action == "down":
            down(paths)
        elif args.action == "restart":
            restart(paths, args.name)
        elif args.action == "kill-node":
            kill_node(paths, node_named(args.name))
            log(f"{args.name}: kubelet, containerd and every container killed (SIGKILL)")
        elif args.action == "stop-node":
            stop_node(paths, node_named(args.name))
            log(f"{args.name}: kube-proxy, kubelet, containerd and every container stopped")
        elif args.action == "start-node":
            actions.start_node(paths, builds.build_all(Versions.read()), node_named(args.name))
            log(f"{args.name}: Ready")
        elif args.action in ("partition", "heal"):
            nodes.partition(node_named(args.name), args.action == "partition")
            log(f"{args.name}: pod traffic to and from the other nodes "
                f"{'dropped' if args.action == 'partition' else 'let through'}")
        else:
            builds.build_all(Versions.read())
    except (ClusterError, builds.BuildError, RuntimeError,
            subprocess.CalledProcessError) as err:
        print(f"cluster: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
