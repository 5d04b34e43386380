"""Two real nodes (`python -m tools.cluster up --nodes 2`: a second kubelet, containerd and
kube-proxy in a network namespace of their own, pods routed between the nodes as kindnet routes
them). The chart's PyTorchJob and TrainJob train across the two nodes with exactly the numbers of
a run on one node, and recover exactly from what happens to nodes: a network partition between
the nodes' pods, the loss of a whole node (kubelet, containerd and every container killed), and
`kubectl drain`.

`make test` runs this module beside the tests outside tests/cluster, and the rest of
tests/cluster after it; the second node is reserved for this module's pods by a taint they
tolerate (tests/cluster/reserve.py); its `down` stops both nodes and fails if anything is left
on either."""

from __future__ import annotations

import functools
import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.helm import Release, release_name
from tests.cluster.jobs import (
    KEEP_RESULTS,
    MID_RUN,
    TRAINJOB,
    Finished,
    assert_same_as,
    finished,
    wait_for_checkpoints,
    wait_until,
)
from tests.cluster.kube import (
    RESTRICTED_CONTAINER,
    RESTRICTED_POD,
    Cluster,
    bring_up,
    cluster_tool,
    merged,
)
from tests.cluster.reserve import FIRST, SECOND, TOLERATION, reserve_command

OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"
# 140 short epochs with a checkpoint at each epoch's end, so that the three disruptions each come
# after fresh checkpoints and before the end (at 100, a PyTorchJob once ended before the drain);
# a lost peer is given up on after 30 s (rendezvous included: a restarted rank waits that long
# for a peer whose node is coming back); restarts not limited by the backoff limit (the chained
# disruptions restart each rank several times); no metrics linger; one thread per rank, as up
# to four jobs share the two cores; the second node's reservation tolerated.
RUN: dict[str, Any] = merged(KEEP_RESULTS, {
    "trainerConfig": {"train": {"epochs": 140, "cpu_threads": 1},
                      "checkpoint": {"every_seconds": 0},
                      "dist": {"timeout_seconds": 30}, "metrics": {"linger_seconds": 0}},
    "runPolicy": {"backoffLimit": 20}, "tolerations": [TOLERATION]})
# The TrainJob with the chart's own runtime: a referenced runtime fixes the backoff limit (6).
TRAIN_JOB: dict[str, Any] = merged(TRAINJOB, {"trainJob": {"createRuntime": True}})
ONE_NODE: dict[str, Any] = {"nodeSelector": {"kubernetes.io/hostname": FIRST}}


@pytest.fixture(scope="module")
def two_nodes(cluster: Cluster) -> Cluster:
    """The cluster with its second node (added to a running one-node cluster; started again
    if stopped) and reserved for this module's pods (tests/cluster/reserve.py)."""
    bring_up(nodes=2)
    subprocess.run(reserve_command(), check=True, capture_output=True)
    cluster_tool("start-node", SECOND)
    wait_until(lambda: ready(cluster, SECOND), f"{SECOND} Ready", timeout=180)
    return cluster


def ready(cluster: Cluster, node: str) -> bool:
    conditions = cluster.get("node", node, "")["status"].get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def pods(release: Release) -> list[dict[str, Any]]:
    """The job's pods (PyTorchJob: Master and Worker; TrainJob: its JobSet's node pods)."""
    label = ("training.kubeflow.org/job-name" if release.kind == "pytorchjob"
             else "jobset.sigs.k8s.io/jobset-name")
    out = release.cluster.kubectl("get", "pods", "-n", release.namespace, "-l",
                                  f"{label}={release.job}", "-o", "json").stdout
    found: list[dict[str, Any]] = json.loads(out)["items"]
    return found


def running_on(release: Release) -> dict[str, str]:
    """Pod name -> node, of the job's pods whose trainer container runs (not terminating)."""
    placed = {}
    for pod in pods(release):
        statuses = pod["status"].get("containerStatuses") or [{}]
        if (not pod["metadata"].get("deletionTimestamp")
                and all("running" in s.get("state", {}) for s in statuses)):
            placed[pod["metadata"]["name"]] = pod["spec"].get("nodeName", "")
    return placed


def spread(release: Release) -> bool:
    """Both of the job's pods run, one on each node."""
    return sorted(running_on(release).values()) == [FIRST, SECOND]


def remade_on_second(release: Release) -> bool:
    """Both of the job's pods (not those being deleted) are placed on the second node, or the
    job already ended there."""
    current = [p for p in pods(release) if not p["metadata"].get("deletionTimestamp")]
    return (sorted(p["spec"].get("nodeName", "") for p in current) == [SECOND, SECOND]
            or any(p["status"].get("phase") == "Succeeded" for p in current))


def last_exits(release: Release) -> dict[str, int | None]:
    """Pod name -> the exit code its trainer container last ended with (None: not yet)."""
    found: dict[str, int | None] = {}
    for pod in pods(release):
        for status in pod["status"].get("containerStatuses") or []:
            last = status.get("lastState", {}).get("terminated")
            found[pod["metadata"]["name"]] = last["exitCode"] if last else None
    return found


def install(cluster: Cluster, chart_ref: str, tmp: Path, prefix: str,
            *layers: dict[str, Any]) -> Release:
    release = Release(cluster, release_name(), cluster.namespace(prefix), merged(RUN, *layers))
    release.install(chart_ref, tmp=tmp)
    return release


def restricted_pod(name: str, image: str, node: str, command: list[str],
                   labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels or {}},
            "spec": {"nodeName": node, "restartPolicy": "Never",
                     "securityContext": RESTRICTED_POD, "terminationGracePeriodSeconds": 1,
                     "volumes": [{"name": "tmp", "emptyDir": {}}],
                     "containers": [{"name": "c", "image": image, "command": command,
                                     "securityContext": RESTRICTED_CONTAINER,
                                     "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}]}]}}


def test_a_cluster_ip_service_reaches_its_pod_on_the_other_node_from_a_pod_and_the_host(
        two_nodes: Cluster) -> None:
    cluster = two_nodes
    ns = cluster.namespace("clusterip")
    server = restricted_pod("server", cluster.image, FIRST, [
        "python", "-c", "import pathlib, runpy, socket, sys; "
        "pathlib.Path('/tmp/index.html').write_text('served-by-' + socket.gethostname()); "
        "sys.argv = ['http.server', '8080', '--directory', '/tmp']; "
        "runpy.run_module('http.server', run_name='__main__')"], labels={"app": "server"})
    # Ready (and so in the Service's endpoints) once it listens.
    server["spec"]["containers"][0]["readinessProbe"] = {"tcpSocket": {"port": 8080},
                                                         "periodSeconds": 1}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "server"},
               "spec": {"selector": {"app": "server"}, "ports": [{"port": 80,
                                                                  "targetPort": 8080}]}}
    for obj in (server, service):
        obj["metadata"]["namespace"] = ns
    cluster.apply(server, service)
    cluster.wait("pod/server", "condition=Ready", ns)
    ip = cluster.get("service", "server", ns)["spec"]["clusterIP"]
    client = restricted_pod("client", cluster.image, SECOND, [
        "python", "-c", "import urllib.request as u; "
        f"print(u.urlopen('http://server.{ns}.svc.cluster.local/', timeout=10).read().decode(),"
        f" u.urlopen('http://{ip}/', timeout=10).read().decode())"])
    client["metadata"]["namespace"] = ns
    cluster.apply(client)
    cluster.wait("pod/client", "jsonpath={.status.phase}=Succeeded", ns, timeout=180)
    assert cluster.logs("client", ns).split() == ["served-by-server"] * 2
    # From the first node itself (kube-proxy's rules in the host's namespace).
    with urllib.request.urlopen(f"http://{ip}/", timeout=10) as answer:
        assert answer.read().decode().strip() == "served-by-server"
    cluster.kubectl("delete", "pod", "server", "-n", ns, "--wait=false")


@pytest.fixture(scope="module")
def on_one_node(two_nodes: Cluster, chart_ref: str,
                tmp_path_factory: pytest.TempPathFactory) -> Release:
    """The PyTorchJob with both pods on the first node, started now. The TrainJob's numbers are
    the same: both run the same trainer on the same values and seed."""
    return install(two_nodes, chart_ref, tmp_path_factory.mktemp("one"), "one", ONE_NODE)


@pytest.fixture(scope="module")
def reference(on_one_node: Release) -> Finished:
    """What the one-node run ended with."""
    found = finished(on_one_node)
    assert set(running_on(on_one_node).values()) <= {FIRST}, running_on(on_one_node)
    assert not found.summary.get("resumed_from_step"), found.summary
    return found


def test_jobs_spread_over_two_nodes_end_exactly_as_on_one(
        two_nodes: Cluster, chart_ref: str, tmp_path: Path, on_one_node: Release,
        request: pytest.FixtureRequest) -> None:
    spread_out = {kind: install(two_nodes, chart_ref, tmp_path, f"two-{kind}",
                                {"spreadAcrossNodes": "required"}, *layer)
                  for kind, layer in (("pytorchjob", ()), ("trainjob", (TRAIN_JOB,)))}
    # The one-node run started beside these (on_one_node) is waited for after them.
    for kind, release in spread_out.items():
        # Seen while they run: the operator deletes a Worker still running at the end.
        wait_until(functools.partial(spread, release), f"{kind}: one pod on each node")
    reference: Finished = request.getfixturevalue("reference")
    for release in spread_out.values():
        assert_same_as(finished(release), reference, resumed=False)


def test_partition_node_loss_and_drain_each_end_exactly_as_uninterrupted(
        two_nodes: Cluster, chart_ref: str, tmp_path: Path, reference: Finished) -> None:
    cluster = two_nodes
    # Each rank held to 0.15 of a core (its one thread's numbers are the same at any speed): the
    # run outlasts the three disruptions and what comes between them, and leaves the rest of
    # the CPU to the tests that run beside this module (`make test`).
    jobs = {kind: install(cluster, chart_ref, tmp_path, f"nodes-{kind}",
                          {"spreadAcrossNodes": "preferred", "nodeLossToleranceSeconds": 5,
                           "resources": {"limits": {"cpu": "150m"}}}, *layer)
            for kind, layer in (("pytorchjob", ()), ("trainjob", (TRAIN_JOB,)))}
    for kind, release in jobs.items():
        wait_until(lambda r=release: spread(r), f"{kind}: one pod on each node")
    steps = {kind: wait_for_checkpoints(r, MID_RUN) for kind, r in jobs.items()}

    # (c) A partition: the pods of the two nodes stop reaching each other while both nodes stay
    # Ready. Every rank gives up on its peer after dist.timeout_seconds and exits 4 (restarted
    # in place); once the network is back they meet again and resume from their checkpoints.
    began = time.monotonic()
    cluster_tool("partition", SECOND)
    try:
        for kind, release in jobs.items():
            wait_until(lambda r=release: list(last_exits(r).values()) == [4, 4],
                       f"{kind}: every rank exited 4", timeout=180)
        detected = time.monotonic() - began
    finally:
        cluster_tool("heal", SECOND)
    print(f"partition: every rank of both jobs exited 4 after {detected:.0f} s")
    # The timeout, plus the kubelet's restart backoff (10 s) and a start on a busy machine.
    assert detected < 30 + 45, detected
    steps = {kind: wait_for_checkpoints(r, MID_RUN, after=steps[kind])
             for kind, r in jobs.items()}

    # (b) The second node is lost: kubelet, containerd and every container on it killed. The
    # node turns NotReady, taint-based eviction deletes its pods after the chart's 5 s
    # toleration, and the out-of-service taint (Kubernetes' step for a node that is known to be
    # down) lets the pod garbage collector remove them; the operators then make new pods, on the
    # first node.
    lost = {kind: [n for n, node in running_on(r).items() if node == SECOND]
            for kind, r in jobs.items()}
    began = time.monotonic()
    cluster_tool("kill-node", SECOND)
    wait_until(lambda: not ready(cluster, SECOND), f"{SECOND} NotReady", timeout=120)
    not_ready = time.monotonic() - began
    for kind, release in jobs.items():
        wait_until(lambda r=release, k=kind: all(
            p["metadata"].get("deletionTimestamp") for p in pods(r)
            if p["metadata"]["name"] in lost[k]), f"{kind}: the lost node's pod evicted",
            timeout=120)
    evicted = time.monotonic() - began
    cluster.kubectl("taint", "node", SECOND, f"{OUT_OF_SERVICE}=nodeshutdown:NoExecute")
    for kind, release in jobs.items():
        wait_until(lambda r=release: sorted(running_on(r).values()) == [FIRST, FIRST],
                   f"{kind}: both pods running on {FIRST}", timeout=300)
    recovered = time.monotonic() - began
    print(f"node loss: NotReady after {not_ready:.0f} s, pods evicted after {evicted:.0f} s, "
          f"both jobs running on {FIRST} after {recovered:.0f} s")
    cluster_tool("start-node", SECOND)  # the node back: containerd and kubelet again
    cluster.kubectl("taint", "node", SECOND, f"{OUT_OF_SERVICE}-")
    wait_until(lambda: ready(cluster, SECOND), f"{SECOND} Ready again", timeout=180)
    steps = {kind: wait_for_checkpoints(r, MID_RUN, after=steps[kind])
             for kind, r in jobs.items()}

    # (d) `kubectl drain` of the node the jobs now run on (their pods only, the rest of the node
    # left as it is): every pod is evicted (SIGTERM: the ranks stop at one step and save), and
    # made again on the other node. The drained node is schedulable again once they are placed
    # there: the pods that read each job's results (finished) tolerate no reservation, and the
    # other node is reserved for the jobs' pods (seen: left cordoned, those stayed Pending).
    try:
        cluster.kubectl("drain", FIRST, "--pod-selector", "app.kubernetes.io/name=ddp-trainer",
                        "--delete-emptydir-data", "--timeout=180s", timeout=240)
        for kind, release in jobs.items():
            wait_until(functools.partial(remade_on_second, release),
                       f"{kind}: both pods made again on {SECOND}", timeout=300)
        cluster.kubectl("uncordon", FIRST)
        for kind, release in jobs.items():
            got = finished(release)
            assert_same_as(got, reference)
            assert got.summary["resumed_from_step"] >= steps[kind], (kind, got.summary)
            # rank 0's pod is kept when the job ends (the operators delete only running pods)
            node = release.cluster.get("pod", release.rank0_pod(), release.namespace)
            assert node["spec"]["nodeName"] == SECOND, (kind, node["spec"]["nodeName"])
    finally:
        cluster.kubectl("uncordon", FIRST)


@pytest.fixture(autouse=True)
def _nodes_left_schedulable(two_nodes: Cluster) -> Iterator[None]:
    yield
    for node in (FIRST, SECOND):
        two_nodes.kubectl("uncordon", node, check=False)
    two_nodes.kubectl("taint", "node", SECOND, f"{OUT_OF_SERVICE}-", check=False)
