"""`make cluster-up` / `make cluster-down`: a real single-node Kubernetes on this host.

    python3 tools/cluster/cluster.py up      # build (once per version), start, wait, write files
    python3 tools/cluster/cluster.py down    # stop everything it started, remove the state
    python3 tools/cluster/cluster.py build   # only the Go builds
    python3 tools/cluster/cluster.py restart kube-apiserver   # SIGKILL one process, start it again

Every component is the real one, built from its Go module (go.mod files beside this file) or
taken from Debian (containerd, runc, CNI plugins, the registry); docs/cluster.md lists them,
with each host-specific flag and what is still not real here.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import api
import builds
import components
import configs
import controllers
import images
import operators
import pki
import procs
import prometheus_stack
import trainer_v2
from controllers import HostController
from dns import query_a
from layout import (
    API_PORT,
    BRIDGE,
    CLUSTER_DOMAIN,
    HERE,
    KUBERNETES_SERVICE_IP,
    NODE_INTERFACE,
    NODE_IP,
    NODE_NAME,
    REPO,
    Paths,
    Versions,
)
from procs import ClusterError

NEEDS = ("containerd", "containerd-shim-runc-v2", "runc", "docker-registry", "podman",
         "openssl", "ip", "mount", "umount")
KUBECONFIGS = ("admin", "controller-manager", "scheduler", "kube-proxy", "coredns",
               "local-path-provisioner")
TOOLS_BIN = REPO / ".tools" / "cluster" / "bin"


def log(message: str) -> None:
    print(f"cluster: {message}", flush=True)


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
                           f"{other[0]}) (fix: `python3 tools/cluster/cluster.py down` in that "
                           f"checkout, or `kill {other[0]}`)")


def node_interface() -> None:
    """The node's address on an interface of its own (layout.NODE_IP)."""
    if subprocess.run(["ip", "link", "show", NODE_INTERFACE], capture_output=True,
                      check=False).returncode != 0:
        # A bridge without ports: this kernel has no `dummy` module ("Unknown device type").
        subprocess.run(["ip", "link", "add", NODE_INTERFACE, "type", "bridge"], check=True)
    shown = subprocess.run(["ip", "-4", "addr", "show", "dev", NODE_INTERFACE],
                           capture_output=True, text=True, check=True).stdout
    if f"{NODE_IP}/" not in shown:
        subprocess.run(["ip", "addr", "add", f"{NODE_IP}/32", "dev", NODE_INTERFACE],
                       check=True)
    subprocess.run(["ip", "link", "set", NODE_INTERFACE, "up"], check=True)


def start_all(paths: Paths, wanted: list[components.Component]) -> None:
    for component in wanted:
        started = time.monotonic()
        pid, fresh = procs.start(paths, component.name, component.argv, component.env)
        procs.wait_for(lambda c=component: components.ready(paths, c), component.timeout,
                       f"{component.name} (pid {pid}) ready", paths.logs / f"{component.name}.log",
                       alive=procs.alive(paths, component.name))
        log(f"{component.name} {'started' if fresh else 'already running'} "
            f"({time.monotonic() - started:.1f} s)")


def write_configs(paths: Paths) -> None:
    pki.make(paths.pki)
    pki.kubeconfig(paths.pki, "admin", paths.kubeconfig)
    for user in KUBECONFIGS:
        pki.kubeconfig(paths.pki, user, paths.config / f"{user}.kubeconfig")
    pki.kubeconfig(paths.pki, "kubelet-client", paths.config / "kubelet.kubeconfig")
    configs.containerd(paths)
    configs.cni(paths)
    configs.kubelet(paths)
    configs.corefile(paths)
    configs.registry(paths)
    configs.local_path(paths)
    helper = (HERE / "helper-pod.yaml").read_text().replace("HELPER_IMAGE", configs.HELPER_IMAGE)
    (paths.config / "helper-pod.yaml").write_text(helper)
    paths.storage.mkdir(parents=True, exist_ok=True)


def start_controller(paths: Paths, controller: HostController, process: components.Component,
                     ) -> None:
    """A controller, once its rotator's certificate is where its webhook server reads it (the
    kubelet's part in-cluster) and its CA is in its webhook configurations."""
    began = time.monotonic()
    log_file = paths.logs / f"{process.name}.log"
    pid, fresh = procs.start(paths, process.name, process.argv, process.env)
    alive = procs.alive(paths, process.name)
    procs.wait_for(lambda: controllers.mount_webhook_secret(paths, controller), 60,
                   f"the webhook Secret of {process.name}", log_file, alive=alive)
    procs.wait_for(lambda: components.ready(paths, process), process.timeout,
                   f"{process.name} (pid {pid}) ready", log_file, alive=alive)
    procs.wait_for(lambda: controllers.webhooks_ready(paths, controller), 60,
                   f"the webhook CA of {process.name} in its configurations", log_file)
    log(f"{process.name} {'started' if fresh else 'already running'} "
        f"({time.monotonic() - began:.1f} s)")


def install_controllers(paths: Paths, bins: dict[str, Path]) -> None:
    """Every operator's release manifests applied, the operators started, then the runtimes
    (their webhook validates them)."""
    kubectl = bins["kubectl"]
    trainer_v2.write_configs(paths)
    controllers.install(paths, kubectl, operators.OPERATOR,
                        operators.manifests(paths, kubectl, operators.module_dir()))
    controllers.install(paths, kubectl, trainer_v2.JOBSET,
                        trainer_v2.jobset_manifests(paths, kubectl))
    controllers.install(paths, kubectl, trainer_v2.TRAINER,
                        trainer_v2.trainer_manifests(paths, kubectl))
    prometheus_stack.install(paths, kubectl)
    for controller, process in components.host_controllers(paths, bins):
        start_controller(paths, controller, process)
    api.kubectl(paths, kubectl, "apply", "--server-side", "-f", "-",
                stdin=json.dumps({"apiVersion": "v1", "kind": "List",
                                  "items": trainer_v2.runtimes()}))
    url = prometheus_stack.wait_for_prometheus(paths, kubectl)
    log(f"Prometheus {prometheus_stack.PROMETHEUS_VERSION} (prometheus-operator's) at {url}")


def restart(paths: Paths, name: str) -> None:
    """A crash and a restart of one of the cluster's processes: SIGKILL, then the same command
    again, waited for until ready (the tests' failure scenarios)."""
    bins = builds.build_all(Versions.read())
    wanted = {c.name: c for c in components.control_plane(paths, bins)
              + components.node(paths, bins)}
    hosted = {p.name: (c, p) for c, p in components.host_controllers(paths, bins)}
    if name not in wanted and name not in hosted:
        raise ClusterError(f"no process {name} in the cluster (fix: one of "
                           f"{', '.join([*wanted, *hosted])})")
    pid = procs.pid_of(paths, name)
    if pid is not None:
        os.kill(pid, signal.SIGKILL)
        procs.wait_for(lambda: procs.pid_of(paths, name) is None, 10, f"{name} (pid {pid}) gone")
    log(f"{name}: pid {pid} killed with SIGKILL")
    if name in hosted:
        start_controller(paths, *hosted[name])
    else:
        start_all(paths, [wanted[name]])


def values_local(paths: Paths, image: str) -> None:
    repository, tag = image.rsplit(":", 1)
    values = {
        "image": {"repository": repository, "tag": tag},
        # No GPUs on this node: one CPU rank per pod.
        "gpusPerReplica": 0,
        # Two cores and 24 GiB for the whole node: the defaults (2 CPUs, 8 GiB requested per
        # replica) would leave a 2-pod job unschedulable.
        "resources": {"requests": {"cpu": "100m", "memory": "512Mi"},
                      "limits": {"cpu": "2", "memory": "6Gi"}},
    }
    header = ("# Chart values for the test cluster (make cluster-up), only those that must\n"
              "# differ from the chart's defaults here. JSON, which is YAML.\n")
    paths.values_local.write_text(header + json.dumps(values, indent=1) + "\n")


def dns_answers() -> bool:
    try:
        return query_a(f"kubernetes.default.svc.{CLUSTER_DOMAIN}", NODE_IP) == \
            [KUBERNETES_SERVICE_IP]
    except OSError:
        return False


def up(paths: Paths) -> None:
    began = time.monotonic()
    preflight(paths)
    versions = Versions.read()
    log(f"Kubernetes {versions.kubernetes}, etcd {versions.etcd}, CoreDNS {versions.coredns}, "
        f"local-path-provisioner {versions.local_path}, training operator "
        f"{versions.training_operator}, Kubeflow Trainer {versions.trainer}, JobSet "
        f"{versions.jobset}, prometheus-operator {versions.prometheus_operator}")
    t = time.monotonic()
    bins = builds.build_all(versions)
    log(f"binaries ready ({time.monotonic() - t:.0f} s)")
    TOOLS_BIN.mkdir(parents=True, exist_ok=True)
    link = TOOLS_BIN / "kubectl"
    link.unlink(missing_ok=True)
    link.symlink_to(bins["kubectl"])
    write_configs(paths)
    node_interface()
    start_all(paths, components.control_plane(paths, bins))
    api.kubectl(paths, bins["kubectl"], "apply", "--server-side", "-f",
                str(HERE / "addons.yaml"))
    t = time.monotonic()
    podman = images.Podman()
    images.system_images(podman, paths)
    images.monitoring_images(podman, paths, bins)
    image, built = images.trainer(podman, paths)
    log(f"images in the registry: {image} (built in {built.build_seconds:.0f} s; "
        f"{time.monotonic() - t:.0f} s with pushes)")
    start_all(paths, components.node(paths, bins))
    procs.wait_for(lambda: api.node_ready(paths, NODE_NAME), 120, f"node {NODE_NAME} Ready",
                   paths.logs / "kubelet.log")
    procs.wait_for(dns_answers, 60, "CoreDNS answering kubernetes.default",
                   paths.logs / "coredns.log")
    install_controllers(paths, bins)
    values_local(paths, image)
    log(f"up in {time.monotonic() - began:.0f} s: KUBECONFIG={paths.kubeconfig}, "
        f"values {paths.values_local}, kubectl {link}")


def down(paths: Paths) -> None:
    """Stops every process `up` started (pods' containers included) and removes the state."""
    for name in (*[c.name for c in reversed(components.HOSTED)], "local-path-provisioner",
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
        f"{paths.logs}; built binaries kept in {builds.binaries_cache()})")


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
