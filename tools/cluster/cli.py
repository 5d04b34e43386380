"""`make cluster-up` / `make cluster-down`: a real single-node Kubernetes on this host.

    python3 -m tools.cluster up      # build (once per version), start, wait, write files
    python3 -m tools.cluster down    # stop everything it started, remove the state
    python3 -m tools.cluster build   # only the Go builds
    python3 -m tools.cluster restart kube-apiserver   # SIGKILL one process, start it again

Every component is the real one, built from its Go module (go.mod files beside this file) or
taken from Debian (containerd, runc, CNI plugins, the registry); docs/cluster.md lists them,
with each host-specific flag and what is still not real here.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from tools.cluster import actions, builds, components, procs
from tools.cluster.actions import log
from tools.cluster.layout import API_PORT, BRIDGE, NODE_INTERFACE, Paths, Versions, binaries_cache
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


def up(paths: Paths) -> None:
    """Each of actions.ACTIONS, in order (each is idempotent: a running cluster is reused)."""
    began = time.monotonic()
    preflight(paths)
    versions = Versions.read()
    log(f"Kubernetes {versions.kubernetes}, etcd {versions.etcd}, CoreDNS {versions.coredns}, "
        f"local-path-provisioner {versions.local_path}, training operator "
        f"{versions.training_operator}, Kubeflow Trainer {versions.trainer}, JobSet "
        f"{versions.jobset}, prometheus-operator {versions.prometheus_operator}")
    state = actions.Up(paths, versions)
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
              + components.node(paths, bins)}
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
    """Stops every process `up` started (pods' containers included) and removes the state."""
    for name in (*[op.controller.name for op in reversed(actions.OPERATORS)],
                 "local-path-provisioner",
                 "coredns", "kubelet"):
        procs.stop(paths, name)
    _kill_containers()
    for pid in procs.pids_matching(f"-address {paths.containerd_socket}"):
        procs.kill_and_wait(pid, 5)  # the shims
    for name in ("containerd", "kube-scheduler", "kube-controller-manager", "kube-apiserver",
                 "registry", "etcd"):
        procs.stop(paths, name)
    _unmount_under(paths.runtime)
    for netns in Path("/run/netns").glob("cni-*"):  # containerd's pod network namespaces
        subprocess.run(["umount", str(netns)], capture_output=True, check=False)
        netns.unlink(missing_ok=True)
    _remove_cgroups()
    for link in (BRIDGE, NODE_INTERFACE):
        subprocess.run(["ip", "link", "del", link], capture_output=True, check=False)
    shutil.rmtree(paths.runtime, ignore_errors=True)
    # The training operator's certificate rotator writes its serving certificate here.
    shutil.rmtree("/tmp/k8s-webhook-server", ignore_errors=True)
    for name in ("pki", "config", "pids", "kubeconfig", "values-local.yaml"):
        target = paths.state / name
        if target.is_dir():
            shutil.rmtree(target, ignore_errors=True)
        else:
            target.unlink(missing_ok=True)
    log("down: every process stopped, state removed (logs kept in "
        f"{paths.logs}; built binaries kept in {binaries_cache()})")


def _kill_containers() -> None:
    """Every container containerd's k8s.io namespace runs, through runc itself."""
    root = Path("/run/containerd/runc/k8s.io")
    if not root.exists():
        return
    listed = subprocess.run(["runc", "--root", str(root), "list", "-q"], capture_output=True,
                            text=True, check=False).stdout.split()
    for container in listed:
        subprocess.run(["runc", "--root", str(root), "kill", container, "KILL"],
                       capture_output=True, check=False)
        subprocess.run(["runc", "--root", str(root), "delete", "--force", container],
                       capture_output=True, check=False)


def _remove_cgroups() -> None:
    """The kubelet's `kubepods` cgroups (cgroupfs driver), deepest first, once empty."""
    for tree in Path("/sys/fs/cgroup").glob("*/kubepods"):
        for folder in sorted(tree.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            if folder.is_dir():
                with contextlib.suppress(OSError):
                    folder.rmdir()
        with contextlib.suppress(OSError):
            tree.rmdir()


def _unmount_under(root: Path) -> None:
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for target in sorted((m for m in mounts if m.startswith(str(root) + "/")), reverse=True):
        subprocess.run(["umount", "-l", target], capture_output=True, check=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("up", "down", "build", "restart"))
    parser.add_argument("name", nargs="?", help="restart: the process, e.g. kube-apiserver")
    args = parser.parse_args(argv)
    if (args.action == "restart") != (args.name is not None):
        parser.error("a process name goes with restart, and only with it")
    paths = Paths.default()
    try:
        if args.action == "up":
            up(paths)
        elif args.action == "down":
            down(paths)
        elif args.action == "restart":
            restart(paths, args.name)
        else:
            builds.build_all(Versions.read())
    except (ClusterError, builds.BuildError, RuntimeError,
            subprocess.CalledProcessError) as err:
        print(f"cluster: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
