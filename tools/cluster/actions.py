"""What `python -m tools.cluster up` does, in order: one list of actions, as kind lists the
actions of `kind create cluster`, and one list of the operators it installs.

ACTIONS run top to bottom, each on what the earlier ones made (the binaries, the configs, the
control plane, the registry's images). OPERATORS run on the host as controllers
(controllers.py): the `operators` action applies each one's objects, in this order, then starts
each one, then does what each needs once it runs; `down` stops them in the reverse order.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.cluster import (
    api,
    builds,
    components,
    configs,
    controllers,
    images,
    kueue,
    nodes,
    operators,
    pki,
    procs,
    prometheus_stack,
    seaweedfs,
    trainer_v2,
)
from tools.cluster.controllers import HostController
from tools.cluster.dns import query_a
from tools.cluster.layout import (
    CLUSTER_DOMAIN,
    HERE,
    KUBERNETES_SERVICE_IP,
    NODE_IP,
    NODE_NAME,
    NODES,
    REPO,
    Node,
    Paths,
    Versions,
    kueue_wanted,
)
from tools.imagebuild.podman import Podman

KUBECONFIGS = ("admin", "controller-manager", "scheduler", "kube-proxy", "coredns",
               "local-path-provisioner")
TOOLS_BIN = REPO / ".tools" / "cluster" / "bin"


def log(message: str) -> None:
    print(f"cluster: {message}", flush=True)


def start_all(paths: Paths, wanted: list[components.Component]) -> None:
    for component in wanted:
        started = time.monotonic()
        pid, fresh = procs.start(paths, component.name, component.argv, component.env)
        procs.wait_for(functools.partial(components.ready, paths, component), component.timeout,
                       f"{component.name} (pid {pid}) ready", paths.logs / f"{component.name}.log",
                       alive=procs.alive(paths, component.name))
        log(f"{component.name} {'started' if fresh else 'already running'} "
            f"({time.monotonic() - started:.1f} s)")


def write_configs(paths: Paths) -> None:
    pki.make(paths.pki)
    pki.kubeconfig(paths.pki, "admin", paths.kubeconfig)
    for user in KUBECONFIGS:
        pki.kubeconfig(paths.pki, user, paths.config / f"{user}.kubeconfig")
    for node in NODES:
        pki.kubeconfig(paths.pki, f"kubelet-client{node.suffix}",
                       paths.config / f"kubelet{node.suffix}.kubeconfig")
        configs.containerd(paths, node)
        configs.cni(paths, node)
        configs.kubelet(paths, node)
        configs.kube_proxy(paths, node)
    configs.corefile(paths)
    configs.registry(paths)
    configs.local_path(paths)
    configs.helper_pod(paths)
    trainer_v2.write_configs(paths)
    kueue.write_config(paths)
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


@dataclass(frozen=True)
class Operator:
    """An operator run on the host: its objects applied before it starts, its process's flags
    and environment, and what follows once it runs."""

    controller: HostController
    install: Callable[[Paths, Path], None]
    """(paths, kubectl): its CRDs, RBAC, webhook configurations and Service."""
    flags: Callable[[Paths], tuple[list[str], dict[str, str]]]
    then: Callable[[Paths, Path], str | None] | None = None
    """(paths, kubectl), once every operator runs; a line to log, or None."""


def _objects(controller: HostController,
             objects: Callable[[Paths, Path], list[dict[str, Any]]]
             ) -> Callable[[Paths, Path], None]:
    return lambda paths, kubectl: controllers.install(paths, kubectl, controller,
                                                      objects(paths, kubectl))


def _runtimes(paths: Paths, kubectl: Path) -> None:
    """Trainer's ClusterTrainingRuntimes, once its webhook (which validates them) runs."""
    api.kubectl(paths, kubectl, "apply", "--server-side", "-f", "-",
                stdin=json.dumps({"apiVersion": "v1", "kind": "List",
                                  "items": trainer_v2.runtimes()}))


def _prometheus(paths: Paths, kubectl: Path) -> str:
    url = prometheus_stack.wait_for_prometheus(paths, kubectl)
    return f"Prometheus {prometheus_stack.PROMETHEUS_VERSION} (prometheus-operator's) at {url}"


OPERATORS: tuple[Operator, ...] = (
    Operator(operators.OPERATOR,
             _objects(operators.OPERATOR,
                      lambda paths, kubectl: operators.manifests(paths, kubectl,
                                                                 operators.source())),
             lambda paths: (operators.arguments(paths),
                            {"MY_POD_NAMESPACE": operators.OPERATOR.namespace})),
    # JobSet before Trainer, which makes JobSets.
    Operator(trainer_v2.JOBSET, _objects(trainer_v2.JOBSET, trainer_v2.jobset_manifests),
             lambda paths: (trainer_v2.arguments(paths, trainer_v2.JOBSET), {})),
    Operator(trainer_v2.TRAINER, _objects(trainer_v2.TRAINER, trainer_v2.trainer_manifests),
             lambda paths: (trainer_v2.arguments(paths, trainer_v2.TRAINER), {}),
             then=lambda paths, kubectl: _runtimes(paths, kubectl)),
    Operator(prometheus_stack.OPERATOR, prometheus_stack.install,
             lambda paths: (prometheus_stack.arguments(), prometheus_stack.environment()),
             then=_prometheus),
    # After the operators of the job kinds it queues: it watches their CRDs from its start.
    # Optional (KUEUE=0 leaves it out): layout.kueue_wanted.
    Operator(kueue.KUEUE, _objects(kueue.KUEUE, kueue.manifests),
             lambda paths: (kueue.arguments(paths), {})),
)


def wanted_operators() -> tuple[Operator, ...]:
    return tuple(op for op in OPERATORS if op.controller is not kueue.KUEUE or kueue_wanted())


def host_controllers(paths: Paths, bins: dict[str, Path]
                     ) -> list[tuple[HostController, components.Component]]:
    """Each of OPERATORS with the process that runs it."""
    out = []
    for op in wanted_operators():
        c = op.controller
        flags, env = op.flags(paths)
        out.append((c, components.Component(
            c.name, controllers.argv(paths, c, [str(bins[c.name]), *flags]),
            f"http://{c.health}{c.ready_path}", user=None, env=env)))
    return out


@dataclass
class Up:
    """What the actions hand on to the later ones."""

    paths: Paths
    versions: Versions
    count: int = 1
    """How many of layout.NODES to run."""
    bins: dict[str, Path] = field(default_factory=dict)
    image: str = ""


def _binaries(up: Up) -> str:
    up.bins = builds.build_all(up.versions)
    TOOLS_BIN.mkdir(parents=True, exist_ok=True)
    link = TOOLS_BIN / "kubectl"
    link.unlink(missing_ok=True)
    link.symlink_to(up.bins["kubectl"])
    return f"kubectl {link}"


def _addons(up: Up) -> None:
    """RBAC of the host processes' certificate users and the local-path storage, before the
    node starts them."""
    api.kubectl(up.paths, up.bins["kubectl"], "apply", "--server-side", "-f",
                str(HERE / "addons.yaml"))


def _images(up: Up) -> str:
    podman = Podman()
    images.system_images(podman, up.paths)
    images.monitoring_images(podman, up.paths, up.bins)
    up.image, built = images.trainer(podman, up.paths)
    return f"{up.image} (built in {built.build_seconds:.0f} s)"


def _node(up: Up) -> None:
    """The first node (the host), the cluster DNS and storage it hosts for every node."""
    paths = up.paths
    start_all(paths, components.node(paths, up.bins, NODES[0])
              + components.host_services(paths, up.bins))
    procs.wait_for(lambda: api.node_ready(paths, NODE_NAME), 120, f"node {NODE_NAME} Ready",
                   paths.logs / "kubelet.log")
    procs.wait_for(dns_answers, 60, "CoreDNS answering kubernetes.default",
                   paths.logs / "coredns.log")


def _further_nodes(up: Up) -> str | None:
    """Nodes 2..N of `up --nodes N`, each in its network namespace, then the routes between
    every node's pods. Adding nodes to a running cluster is the same action."""
    wanted = NODES[:up.count]
    for node in wanted[1:]:
        start_node(up.paths, up.bins, node)
    up.paths.node_count.write_text(f"{max(up.count, _started(up.paths))}\n")
    return ", ".join(n.name for n in wanted)


def start_node(paths: Paths, bins: dict[str, Path], node: Node) -> None:
    """A further node plugged in and its processes started (those already running kept), the
    routes between every started node's pods, and the node Ready."""
    nodes.plug(node)
    start_all(paths, components.node(paths, bins, node))
    nodes.routes(NODES[:max(NODES.index(node) + 1, _started(paths))])
    procs.wait_for(functools.partial(api.node_ready, paths, node.name), 120,
                   f"node {node.name} Ready", paths.logs / f"kubelet{node.suffix}.log")


def _started(paths: Paths) -> int:
    try:
        return int(paths.node_count.read_text())
    except (OSError, ValueError):
        return 1


def _operators(up: Up) -> str:
    """Every operator's objects applied, the operators started, then what each needs."""
    paths, kubectl = up.paths, up.bins["kubectl"]
    for op in wanted_operators():
        op.install(paths, kubectl)
    for controller, process in host_controllers(paths, up.bins):
        start_controller(paths, controller, process)
    said = [op.then(paths, kubectl) for op in wanted_operators() if op.then is not None]
    return "; ".join(line for line in said if line)


def _object_store(up: Up) -> str:
    """SeaweedFS as a Deployment, its bucket and credentials (seaweedfs.py): the S3 store chart
    jobs write to with `storage.s3`. Its `weed` is built once per machine, as the others."""
    from tools.s3server import weed

    began = time.monotonic()
    binary = weed()
    built = time.monotonic()
    ref = images.seaweedfs(Podman(), up.paths, binary)
    line = seaweedfs.install(up.paths, up.bins["kubectl"], ref)
    return f"{line} ({built - began:.0f} s build, {time.monotonic() - built:.0f} s image and pod)"


@dataclass(frozen=True)
class Action:
    name: str
    run: Callable[[Up], str | None]
    """Does it; returns a line for the log, or None."""


ACTIONS: tuple[Action, ...] = (
    Action("binaries", _binaries),
    Action("configs and keys", lambda up: write_configs(up.paths)),
    Action("node interface", lambda up: nodes.first_node()),
    Action("control plane", lambda up: start_all(up.paths,
                                                 components.control_plane(up.paths, up.bins))),
    Action("addons.yaml", _addons),
    Action("images in the registry", _images),
    Action("node", _node),
    Action("further nodes", _further_nodes),
    Action("operators", _operators),
    Action("object store", _object_store),
    Action("chart values", lambda up: values_local(up.paths, up.image)),
)
