"""A chart-made PyTorchJob on the test cluster as the tests watch and disturb it: its Master's
checkpoints read from the node's disk (where the kubelet or local-path-provisioner keeps the
volume), its results read back through a pod of our image, and its containers killed the way
the kernel kills them (containerd's `ctr task kill`)."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.cluster.helm import Release
from tests.cluster.kube import (
    KUBECTL,
    RESTRICTED_CONTAINER,
    RESTRICTED_POD,
    STATE,
    KubectlError,
    node_runtime,
    node_socket,
)

DONE = re.compile(r"done: (\d+) steps, .* val accuracy (\d\.\d{4}) \((\d+)/(\d+)\)")
# Chart-created ReadWriteMany claims for checkpoints and outputs, so that the test reads
# summary.json and evaluates the final checkpoint after the pods are gone.
KEEP_RESULTS: dict[str, Any] = {"persistence": {
    "checkpoints": {"create": {"enabled": True, "keep": False}},
    "outputs": {"create": {"enabled": True, "keep": False}}}}
KEEP_OUTPUTS: dict[str, Any] = {"persistence": {
    "outputs": {"create": {"enabled": True, "keep": False}}}}
# A test-sized run: 4 epochs, the final metrics not served on after the end.
SHORT: dict[str, Any] = {"trainerConfig": {"train": {"epochs": 4},
                                           "metrics": {"linger_seconds": 0}}}
TRAINJOB: dict[str, Any] = {"apiKind": "TrainJob"}
# The chart's defaults (1 Master + 1 Worker, `OnFailure`) sized for the tests, with epoch-end
# checkpoints: 150 short epochs (about 20 s of training here) leave time to interrupt after the
# second checkpoint, and to restart the operator and the API server in turn; a collective
# stuck on a vanished peer fails after 60 s instead of 600 s; no metrics served on at the end.
FAILOVER: dict[str, Any] = {"trainerConfig": {
    "train": {"epochs": 150}, "checkpoint": {"every_seconds": 0},
    "dist": {"timeout_seconds": 60}, "metrics": {"linger_seconds": 0}}}
MID_RUN = 2  # checkpoints written before an interruption
# The user's code, a ConfigMap named boom in the job's namespace, importable from /user.
USER_MODULE: dict[str, Any] = {
    "env": [{"name": "PYTHONPATH", "value": "/user"}],
    "extraVolumes": [{"name": "user", "configMap": {"name": "boom"}}],
    "extraVolumeMounts": [{"name": "user", "mountPath": "/user", "readOnly": True}]}
BIN = Path(sys.executable).parent

EVALUATE = """
import json, subprocess, sys
summary = json.load(open('/outputs/summary.json'))
proc = subprocess.run(['ddp-trainer', 'evaluate', '--checkpoint', CHECKPOINTS,
                       '--output-dir', '/tmp/eval'], capture_output=True, text=True)
assert proc.returncode == 0, proc.stderr
print(json.dumps({'summary': summary, 'eval': json.load(open('/tmp/eval/eval.json'))}))
"""


@dataclass
class Finished:
    summary: dict[str, Any]
    scored: dict[str, Any] | None  # `ddp-trainer evaluate` of the final checkpoint
    done: re.Match[str]

    def assert_agrees(self) -> None:
        """The Master's log line, summary.json and `evaluate` say the same, exactly."""
        summary, done = self.summary, self.done
        if self.scored is not None:
            assert (self.scored["correct"], self.scored["total"]) == (summary["val_correct"],
                                                                      summary["val_total"])
            assert self.scored["accuracy"] == summary["val_accuracy"]
        assert done.group(2) == f"{summary['val_accuracy']:.4f}"
        assert (int(done.group(3)), int(done.group(4))) == (summary["val_correct"],
                                                            summary["val_total"])
        assert summary["steps"] == int(done.group(1))


def inspect(release: Release, script: str, claims: tuple[str, ...]) -> str:
    """Runs `script` (Python) in a pod of our image with the release's `claims` mounted at
    /checkpoints and /outputs, in its namespace; returns what it printed."""
    name = f"inspect-{release.name[-5:]}"
    mounts = [{"name": "tmp", "mountPath": "/tmp"}] + [
        {"name": key, "mountPath": f"/{key}"} for key in claims]
    volumes = [{"name": "tmp", "emptyDir": {}}] + [
        {"name": key, "persistentVolumeClaim": {"claimName": f"{release.job}-{key}"}}
        for key in claims]
    cluster = release.cluster
    cluster.apply({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": release.namespace},
        "spec": {"restartPolicy": "Never", "securityContext": RESTRICTED_POD,
                 "volumes": volumes,
                 "containers": [{"name": "inspect", "image": cluster.image,
                                 "command": ["python", "-c", script],
                                 "securityContext": RESTRICTED_CONTAINER,
                                 "volumeMounts": mounts}]}})
    cluster.wait(f"pod/{name}", "jsonpath={.status.phase}=Succeeded", release.namespace)
    out = cluster.logs(name, release.namespace)
    cluster.kubectl("delete", "pod", name, "-n", release.namespace, "--wait=false")
    return out


def finished(release: Release, condition: str = "Succeeded") -> Finished:
    """The job reached `condition`; what the Master logged, wrote to its outputs claim and,
    where its checkpoints are on a claim too, what `evaluate` scores of the newest one."""
    release.wait_condition(condition)
    log = release.cluster.logs(release.rank0_pod(), release.namespace)
    done = DONE.search(log)
    assert done is not None, log[-3000:]
    on_claim = release.claims()
    checkpoints = "'/checkpoints'" if "checkpoints" in on_claim else "None"
    script = EVALUATE.replace("CHECKPOINTS", checkpoints)
    if checkpoints == "None":  # emptyDir checkpoints are gone with the pods
        script = ("import json; print(json.dumps({'summary': json.load("
                  "open('/outputs/summary.json')), 'eval': None}))")
    found = json.loads(inspect(release, script, on_claim).strip().splitlines()[-1])
    return Finished(found["summary"], found["eval"], done)


def master_checkpoints(release: Release) -> list[Path]:
    """The Master's checkpoint files, oldest first, read where the node keeps them."""
    return _checkpoint_files(checkpoint_folder(release))


def _checkpoint_files(folder: Path | None) -> list[Path]:
    """Single files, and an FSDP run's sharded folders (`ckpt-<step>.dcp`, listed once
    complete), by step."""
    if folder is None:
        return []
    return sorted((*folder.glob("ckpt-*.pt"), *folder.glob("ckpt-*.dcp")),
                  key=lambda f: f.stem)


def checkpoint_folder(release: Release) -> Path | None:
    """Where the node keeps the Master's checkpoints (None: no claim bound or pod placed yet)."""
    cluster, ns = release.cluster, release.namespace
    if "checkpoints" in release.claims():
        claim = cluster.get("pvc", f"{release.job}-checkpoints", ns)
        volume = claim["spec"].get("volumeName")
        if not volume:
            return None
        pv = cluster.get("pv", volume, "")
        return Path((pv["spec"].get("hostPath") or pv["spec"]["local"])["path"])
    try:
        pod = cluster.get("pod", release.pod("master"), ns)
    except KubectlError:  # between a deletion and the operator's new pod
        return None
    if not pod["spec"].get("nodeName"):
        return None
    folder: Path = (node_runtime(pod["spec"]["nodeName"]) / "kubelet" / "pods"
                    / pod["metadata"]["uid"] / "volumes" / "kubernetes.io~empty-dir"
                    / "checkpoints")
    return folder


def wait_for_checkpoints(release: Release, count: int, after: int = -1,
                         timeout: float = 300) -> int:
    """Polls the node's disk (every 50 ms: an epoch here takes about half a second) until the
    Master has written `count` checkpoints of steps past `after`; the newest one's step. The
    folder is looked up at most once a second (a claim's for good; an emptyDir's again, as a
    new pod has a new one): a lookup is one or two kubectl calls of ~70 ms of CPU each, taken
    from the ranks that share the node's cores."""
    deadline = time.monotonic() + timeout
    on_claim = "checkpoints" in release.claims()
    folder, looked_up = None, -math.inf
    while time.monotonic() < deadline:
        if (folder is None or not on_claim) and time.monotonic() - looked_up >= 1:
            folder, looked_up = checkpoint_folder(release), time.monotonic()
        steps = [int(f.stem.split("-")[1]) for f in _checkpoint_files(folder)]
        if len([s for s in steps if s > after]) >= count:
            return steps[-1]
        time.sleep(0.05)
    raise AssertionError(f"{release.job}: fewer than {count} checkpoints after {timeout} s:\n"
                         + release.cluster.kubectl("describe", "pytorchjob", release.job, "-n",
                                                   release.namespace, check=False).stdout)


def wait_until(check: Callable[[], bool], what: str, timeout: float = 300) -> None:
    """Polls `check` (an API read or the node's disk) once a second until true: a check is
    mostly a kubectl call, ~70 ms of CPU, and polling every 0.2 s kept 0.27 of a core busy
    in kubectl alone (0.075 once a second; 20 s of each, 2026-12-06), taken from the jobs
    the tests wait on."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened in {timeout} s: {what}")
        time.sleep(1)


def uid(release: Release, replica: str) -> str | None:
    try:
        pod = release.cluster.get("pod", release.pod(replica), release.namespace)
    except KubectlError:
        return None
    found: str = pod["metadata"]["uid"]
    return found


def container_id(release: Release, pod: str) -> str:
    """The id of the pod's trainer container, once it runs (not while the init container
    does)."""
    found: list[str] = []

    def running() -> bool:
        status = release.cluster.get("pod", pod, release.namespace)["status"]
        (container,) = status.get("containerStatuses") or [{}]
        if "running" in container.get("state", {}):
            found.append(container["containerID"].removeprefix("containerd://"))
        return bool(found)

    wait_until(running, f"{pod}'s trainer container running")
    return found[0]


def ctr(node: str, *args: str) -> str:
    """containerd's `ctr` on the socket of the node named `node`, in the kubelet's namespace;
    its output."""
    return subprocess.run(["ctr", "--address", str(node_socket(node)), "-n", "k8s.io", *args],
                          check=True, capture_output=True, text=True).stdout


def node_of(release: Release, pod: str) -> str:
    name: str = release.cluster.get("pod", pod, release.namespace)["spec"]["nodeName"]
    return name


def task(node: str, cid: str) -> tuple[str, str] | None:
    """(PID, status) of a container's task on `node`, as `ctr task ls` lists it; None once the
    runtime has removed it."""
    for line in ctr(node, "task", "ls").splitlines():
        if line.startswith(cid):
            _, pid, status = line.split()
            return pid, status
    return None


def kill_containers(release: Release, pods: list[str], signal: str = "SIGKILL") -> None:
    """`signal` to each pod's trainer container (the trainer is PID 1 of its container), from
    the runtime as the kernel's OOM killer, a crash or a preemption would send it. Every
    container is looked up before the first signal, so they go out together. One that stopped
    after an earlier one's signal is passed over: the ranks agree on a SIGTERM
    (trainer/distributed/agreement.py), so a rank may exit 143 on its peer's SIGTERM before its
    own arrives (seen on a loaded CI machine)."""
    targets = [(node_of(release, pod), container_id(release, pod)) for pod in pods]
    for n, (node, cid) in enumerate(targets):
        try:
            ctr(node, "task", "kill", "-s", signal, cid)
        except subprocess.CalledProcessError:
            found = task(node, cid)
            if n == 0 or (found is not None and found[1] == "RUNNING"):
                raise


def kill_container(release: Release, pod: str, signal: str = "SIGKILL") -> None:
    kill_containers(release, [pod], signal)


def cpu_quota_file(release: Release, pod: str) -> Path:
    """The CFS quota file of the pod's trainer container (cgroup v1 `cpu` controller, as the
    kubelet set it from the container's CPU limit): writing it throttles the container as a
    lower limit, or a noisy neighbour, would."""
    cid = container_id(release, pod)
    found = task(node_of(release, pod), cid)
    assert found is not None, f"{pod}'s trainer container {cid} has no task"
    pid = found[0]
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return Path("/sys/fs/cgroup/cpu") / path.lstrip("/") / "cpu.cfs_quota_us"
    raise AssertionError(f"no cgroup v1 cpu controller for pid {pid} of {pod}")


def restarts(release: Release, pod: str) -> tuple[int, int | None]:
    """(restart count, the last terminated exit code) of the pod's trainer container."""
    status = release.cluster.get("pod", pod, release.namespace)["status"]
    (container,) = status["containerStatuses"]
    last = container.get("lastState", {}).get("terminated")
    return container["restartCount"], (last or {}).get("exitCode")


def assert_same_as(got: Finished, want: Finished, resumed: bool = True) -> None:
    """An interrupted run ended with exactly the uninterrupted run's numbers."""
    got.assert_agrees()
    if resumed:
        assert got.summary["resumed_from_step"], got.summary
    else:
        assert not got.summary.get("resumed_from_step"), got.summary
    for key in ("steps", "train_loss", "val_accuracy", "val_correct", "val_total"):
        assert got.summary[key] == want.summary[key], (key, got.summary, want.summary)


def jobs(*args: str, kubeconfig: Path = STATE / "kubeconfig",
         timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`ddp-trainer jobs ARGS` as a user runs it, with the cluster's kubeconfig."""
    env = {**os.environ, "KUBECONFIG": str(kubeconfig),
           "PATH": f"{BIN}:{KUBECTL.parent}:{os.environ['PATH']}"}
    return subprocess.run([str(BIN / "ddp-trainer"), "jobs", *args], capture_output=True,
                          text=True, env=env, timeout=timeout, check=False)


def waited_by_the_cli(release: Release, chart_ref: str, tmp: Path) -> Release:
    """The release installed and run to the end, waited for by `jobs wait`."""
    release.install(chart_ref, tmp=tmp)
    proc = jobs("wait", release.job, "-n", release.namespace, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "Succeeded" in proc.stdout
    return release


def assert_logs_by_rank(release: Release) -> None:
    """`jobs logs`: every line names its rank; rank 0 logs the progress (the others log
    warnings only); the trainer's own prefix is kept, once."""
    logs = jobs("logs", release.job, "-n", release.namespace)
    assert logs.returncode == 0, logs.stderr
    ranks = {line.split("]")[0] for line in logs.stdout.splitlines() if line.startswith("[rank")}
    assert "[rank 0" in ranks and ranks <= {"[rank 0", "[rank 1"}, logs.stdout[-2000:]
    assert "done:" in logs.stdout
    assert "[rank 0] [rank 0]" not in logs.stdout


def terminated(release: Release, pod: str) -> dict[str, Any]:
    """The trainer container's `state.terminated` (else `lastState.terminated`) as `kubectl get
    pod -o json` shows it: exitCode, reason, message."""
    status = release.cluster.get("pod", pod, release.namespace)["status"]
    (container,) = status["containerStatuses"]
    found = (container.get("state", {}).get("terminated")
             or container.get("lastState", {}).get("terminated"))
    assert found, container
    return dict(found)


def status_terminations(release: Release) -> dict[str, list[str]]:
    """`jobs status`'s Terminated section: pod name -> [NAME, PHASE, EXIT, CLASS, RESTARTS,
    WHEN, MESSAGE] (columns three spaces apart)."""
    proc = jobs("status", release.job, "-n", release.namespace)
    assert proc.returncode == 0, proc.stderr
    assert "Terminated:\n" in proc.stdout, proc.stdout
    rows = proc.stdout.split("Terminated:\n")[1].split("Warnings:")[0].splitlines()[1:]
    return {cells[0]: cells for cells in (re.split(r"\s{3,}", row.strip()) for row in rows)}
