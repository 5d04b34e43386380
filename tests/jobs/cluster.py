"""An in-memory Kubernetes API server, served over real HTTP, holding PyTorchJobs, TrainJobs and
pods.

It is kmock's ``KubernetesEmulator`` (a stateful API emulator on aiohttp: create, get, list,
merge-patch, delete, discovery) running on its own event loop in a background thread, so the
synchronous ``kubernetes`` client talks to it over a real socket exactly as to an API server.
Two things the training operator's clients rely on and kmock 0.8 does not do are added here,
at the HTTP boundary only:

- ``labelSelector`` on list requests (the job's pods are found by the operator's labels);
- the ``pods/log`` sub-resource: a pod's log (with ``timestamps``, ``tailLines`` and
  ``follow``), or the 400 a real API server answers while the container is waiting to start.

Objects are seeded in the shapes the training operator v1.9 writes (``job()``, ``pod()``) and
Kubeflow Trainer v2.3 with JobSet v0.12 write (``trainjob()``, ``node_pod()``).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import kmock
import requests

JOBS = kmock.resource("kubeflow.org/v1/pytorchjobs")
TRAINJOBS = kmock.resource("trainer.kubeflow.org/v1alpha1/trainjobs")
PODS = kmock.resource("v1/pods")
EVENTS = kmock.resource("v1/events")
BATCH_JOBS = kmock.resource("batch/v1/jobs")
JOB_NAME = "training.kubeflow.org/job-name"
REPLICA_TYPE = "training.kubeflow.org/replica-type"
REPLICA_INDEX = "training.kubeflow.org/replica-index"
T0 = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.timezone.utc)


def stamp(when: dt.datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def matches(labels: dict[str, str], selector: str) -> bool:
    """Equality-based label selectors (``a=b``, ``a==b``, ``a!=b``, ``a``, ``!a``)."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


class OperatorEmulator(kmock.KubernetesEmulator):  # type: ignore[misc]
    """KubernetesEmulator plus label selectors on lists."""

    async def _serve_list(self, request: Any) -> Any:
        result = await super()._serve_list(request)
        selector = request.params.get("labelSelector")
        if selector:
            result["items"] = [
                item for item in result["items"]
                if matches(item.get("metadata", {}).get("labels") or {}, selector)
            ]
        return result


@dataclass
class PodLog:
    lines: list[tuple[dt.datetime, str]] = field(default_factory=list)
    waiting: str | None = None  # e.g. "ContainerCreating": the API answers 400
    follow_delay: float = 0.05  # seconds between lines when followed


class FakeCluster:
    """The emulator on 127.0.0.1:<free port>; use as a context manager."""

    def __init__(self, crd: bool = True, trainjob_crd: bool = False) -> None:
        self.crd = crd
        self.trainjob_crd = trainjob_crd
        self.url = ""
        self.logs: dict[tuple[str, str], PodLog] = {}
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="k8s-emulator", daemon=True)
        self._error: BaseException | None = None
        self.k: Any = None

    # -- lifecycle ---------------------------------------------------------------------

    def __enter__(self) -> FakeCluster:
        self._thread.start()
        if not self._ready.wait(30) or self._error is not None:
            raise RuntimeError(f"the Kubernetes emulator did not start: {self._error!r}")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # noqa: BLE001 - reported by __enter__
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        # aiohttp logs each request at INFO; the trainer's CLI points logging at a stderr that
        # pytest closes after the test, so the server would log into a closed stream.
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with OperatorEmulator() as k, kmock.Server(k) as server:
            self.k = k
            if self.crd:
                k.resources["kubeflow.org/v1/pytorchjobs"] = kmock.ResourceInfo(
                    kind="PyTorchJob", singular="pytorchjob", namespaced=True,
                    verbs={"get", "list", "watch", "create", "patch", "update", "delete"},
                    subresources={"status"},
                )
            if self.trainjob_crd:
                k.resources["trainer.kubeflow.org/v1alpha1/trainjobs"] = kmock.ResourceInfo(
                    kind="TrainJob", singular="trainjob", namespaced=True,
                    verbs={"get", "list", "watch", "create", "patch", "update", "delete"},
                    subresources={"status"},
                )
            k.resources["v1/pods"] = kmock.ResourceInfo(
                kind="Pod", singular="pod", namespaced=True, verbs={"get", "list"},
                subresources={"log", "status"},
            )
            k.resources["v1/events"] = kmock.ResourceInfo(
                kind="Event", singular="event", namespaced=True, verbs={"get", "list"})
            k.resources["batch/v1/jobs"] = kmock.ResourceInfo(
                kind="Job", singular="job", namespaced=True, verbs={"get", "list"})
            k["get", PODS, kmock.subresource("log")] << self._serve_log
            self.url = str(server.url).rstrip("/")
            self._ready.set()
            await self._stop.wait()

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on the emulator's loop (object stores are not thread-safe)."""
        assert self._loop is not None

        async def wrapper() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(wrapper(), self._loop).result(10)

    # -- seeding -----------------------------------------------------------------------

    def add_job(self, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        resource = TRAINJOBS if obj["kind"] == "TrainJob" else JOBS
        self.call(lambda: self.k.objects.__setitem__(
            (resource, meta["namespace"], meta["name"]), obj))

    def add_pod(self, obj: dict[str, Any], log: PodLog | None = None) -> None:
        meta = obj["metadata"]
        self.call(lambda: self.k.objects.__setitem__((PODS, meta["namespace"], meta["name"]), obj))
        self.logs[(meta["namespace"], meta["name"])] = log or PodLog()

    def add(self, resource: Any, obj: dict[str, Any]) -> None:
        """Any other object (an Event, a batch Job), stored as the API server would."""
        meta = obj["metadata"]
        self.call(lambda: self.k.objects.__setitem__(
            (resource, meta["namespace"], meta["name"]), obj))

    def patch_job(self, namespace: str, name: str, patch: dict[str, Any],
                  path: str = "kubeflow.org/v1/namespaces/{ns}/pytorchjobs") -> None:
        """Change a job as the controller would: a merge patch over HTTP."""
        response = requests.patch(
            f"{self.url}/apis/{path.format(ns=namespace)}/{name}",
            json=patch, headers={"Content-Type": "application/merge-patch+json"}, timeout=10,
        )
        response.raise_for_status()

    def job(self, namespace: str, name: str,
            path: str = "kubeflow.org/v1/namespaces/{ns}/pytorchjobs") -> dict[str, Any] | None:
        response = requests.get(f"{self.url}/apis/{path.format(ns=namespace)}/{name}",
                                timeout=10)
        if response.status_code == 404:
            return None
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    # -- pods/log ----------------------------------------------------------------------

    def _serve_log(self, request: Any) -> Any:
        log = self.logs.get((request.namespace, request.name))
        if log is None:
            raise kmock.KubernetesError(
                status=404, reason="NotFound", message=f'pods "{request.name}" not found'
            )
        if log.waiting:
            container = request.params.get("container", "pytorch")
            raise kmock.KubernetesError(
                status=400, reason="BadRequest",
                message=f'container "{container}" in pod "{request.name}" is waiting to '
                        f"start: {log.waiting}",
            )
        lines = log.lines
        if "tailLines" in request.params:
            lines = lines[-int(request.params["tailLines"]):]
        # The Python client sends booleans as "True"; the API server parses either case.
        stamped = request.params.get("timestamps", "").lower() == "true"

        def render(when: dt.datetime, text: str) -> bytes:
            prefix = when.strftime("%Y-%m-%dT%H:%M:%S.%f") + "123Z " if stamped else ""
            return (prefix + text + "\n").encode()

        if request.params.get("follow", "").lower() != "true":
            return b"".join(render(w, t) for w, t in lines) or b""

        async def stream() -> AsyncIterator[bytes]:
            for when, text in lines:
                await asyncio.sleep(log.follow_delay)
                yield render(when, text)

        return stream()


# -- object shapes, as the training operator v1.9 writes them ----------------------------


def condition(type_: str, reason: str, message: str, at: dt.datetime,
              status: str = "True") -> dict[str, str]:
    return {"type": type_, "status": status, "reason": reason, "message": message,
            "lastUpdateTime": stamp(at), "lastTransitionTime": stamp(at)}


def job(name: str, namespace: str = "training", *, workers: int = 2, gpus: int = 1,
        state: str = "Running", suspend: bool = False) -> dict[str, Any]:
    """A PyTorchJob with one master and `workers` workers, `gpus` GPUs each."""
    def replica(count: int) -> dict[str, Any]:
        return {
            "replicas": count,
            "restartPolicy": "OnFailure",
            "template": {"spec": {"containers": [{
                "name": "pytorch",
                "image": "ghcr.io/ddp-trainer/ddp-trainer:0.1.0",
                "args": ["run", "--nproc-per-node", "1"],
                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {},
            }]}},
        }

    conds = [condition("Created", "PyTorchJobCreated",
                       f"PyTorchJob {namespace}/{name} is created.", T0)]
    statuses = {"Master": {"active": 1}, "Worker": {"active": workers}}
    if state in ("Running", "Succeeded", "Failed"):
        conds.append(condition("Running", "PyTorchJobRunning",
                               f"PyTorchJob {namespace}/{name} is running.",
                               T0 + dt.timedelta(seconds=20)))
    if state == "Succeeded":
        conds[-1]["status"] = "False"
        conds.append(condition("Succeeded", "PyTorchJobSucceeded",
                               f"PyTorchJob {namespace}/{name} successfully completed.",
                               T0 + dt.timedelta(minutes=30)))
        statuses = {"Master": {"succeeded": 1}, "Worker": {"succeeded": workers}}
    if state == "Failed":
        conds[-1]["status"] = "False"
        conds.append(condition("Failed", "PyTorchJobFailed",
                               f"PyTorchJob {namespace}/{name} is failed because 1 Worker "
                               "replica(s) failed.", T0 + dt.timedelta(minutes=5)))
        statuses = {"Master": {"active": 0}, "Worker": {"failed": 1, "active": workers - 1}}
    if state == "Suspended":
        conds.append(condition("Suspended", "PyTorchJobSuspended",
                               f"PyTorchJob {namespace}/{name} is suspended.",
                               T0 + dt.timedelta(minutes=2)))
        statuses = {"Master": {}, "Worker": {}}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {
            "name": name, "namespace": namespace, "uid": f"uid-{name}",
            "creationTimestamp": stamp(T0),
            "labels": {"app.kubernetes.io/name": "ddp-trainer"},
        },
        "spec": {
            "runPolicy": {"cleanPodPolicy": "None", "suspend": suspend},
            "nprocPerNode": "1",
            "pytorchReplicaSpecs": {"Master": replica(1), "Worker": replica(workers)},
        },
        "status": {"conditions": conds, "replicaStatuses": statuses,
                   "startTime": stamp(T0 + dt.timedelta(seconds=5))},
    }


def pod(job_name: str, replica_type: str, index: int, namespace: str = "training", *,
        node: str = "gpu-node-1", phase: str = "Running", restarts: int = 0,
        waiting: str | None = None, terminated: dict[str, Any] | None = None,
        last_terminated: dict[str, Any] | None = None) -> dict[str, Any]:
    """A pod of the job; `terminated` / `last_terminated`: its container's
    ``state.terminated`` / ``lastState.terminated`` (exitCode, reason, message)."""
    labels = {
        JOB_NAME: job_name,
        REPLICA_TYPE: replica_type,
        REPLICA_INDEX: str(index),
        "training.kubeflow.org/operator-name": "pytorchjob-controller",
    }
    if replica_type == "master":
        labels["training.kubeflow.org/job-role"] = "master"
    state: dict[str, Any] = (
        {"waiting": {"reason": waiting}} if waiting
        else {"terminated": terminated} if terminated
        else {"running": {"startedAt": stamp(T0 + dt.timedelta(seconds=10))}}
    )
    last = {"terminated": last_terminated} if last_terminated else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{job_name}-{replica_type}-{index}", "namespace": namespace,
                     "labels": labels, "creationTimestamp": stamp(T0)},
        "spec": {"nodeName": node,
                 "containers": [{"name": "pytorch",
                                 "image": "ghcr.io/ddp-trainer/ddp-trainer:0.1.0"}]},
        "status": {
            "phase": phase,
            "startTime": stamp(T0 + dt.timedelta(seconds=8)),
            "containerStatuses": [{
                "name": "pytorch", "image": "ghcr.io/ddp-trainer/ddp-trainer:0.1.0",
                "imageID": "", "ready": waiting is None and phase == "Running",
                "restartCount": restarts, "state": state, "lastState": last,
            }],
        },
    }


# -- object shapes, as Kubeflow Trainer v2.3 and JobSet v0.12 write them -------------------

TRAINJOB_PATH = "trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs"


def trainjob(name: str, namespace: str = "training", *, nodes: int | None = 2, gpus: int = 1,
             nproc: int | None = 1, state: str = "Running", suspend: bool = False,
             progress: int | None = None) -> dict[str, Any]:
    """A TrainJob on the torch-distributed runtime, in the shape the chart renders it."""
    trainer: dict[str, Any] = {
        "image": "ghcr.io/ddp-trainer/ddp-trainer:0.1.0",
        "command": ["ddp-trainer"],
        "args": ["run", "--nproc-per-node", str(nproc or 1)],
    }
    if nodes is not None:
        trainer["numNodes"] = nodes
    if nproc is not None:
        trainer["numProcPerNode"] = nproc
    if gpus:
        trainer["resourcesPerNode"] = {"limits": {"nvidia.com/gpu": gpus}}
    conds: list[dict[str, str]] = []
    if state == "Succeeded":
        # The JobSet's conditions, renamed (trainer v2.3.0 plugins/jobset/jobset.go:450-457).
        conds.append(condition("Complete", "AllJobsCompleted", "jobset completed successfully",
                               T0 + dt.timedelta(minutes=30)))
    if state == "Failed":
        conds.append(condition("Failed", "FailedJobs",
                               "jobset failed due to one or more job failures",
                               T0 + dt.timedelta(minutes=5)))
    if state == "Suspended" or suspend:
        conds.append(condition("Suspended", "Suspended", "TrainJob is suspended",
                               T0 + dt.timedelta(minutes=2)))
    status: dict[str, Any] = {"conditions": conds, "jobsStatus": [
        {"name": "node", "active": 1 if state == "Running" else 0, "ready": 0,
         "succeeded": 1 if state == "Succeeded" else 0,
         "failed": 1 if state == "Failed" else 0, "suspended": 0}]}
    if progress is not None:
        status["trainerStatus"] = {
            "progressPercentage": progress, "estimatedRemainingSeconds": 754,
            "metrics": [{"name": "train_loss", "value": "0.4121"},
                        {"name": "val_accuracy", "value": "0.9361"}],
            "lastUpdatedTime": stamp(T0 + dt.timedelta(minutes=3))}
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}",
                     "creationTimestamp": stamp(T0)},
        "spec": {"runtimeRef": {"apiGroup": "trainer.kubeflow.org",
                                "kind": "ClusterTrainingRuntime", "name": "torch-distributed"},
                 "suspend": suspend, "trainer": trainer},
        "status": status,
    }


def node_pod(job_name: str, index: int, namespace: str = "training", *,
             node: str = "gpu-node-1", phase: str = "Running", restarts: int = 0,
             waiting: str | None = None) -> dict[str, Any]:
    """A pod of a TrainJob's indexed `node` Job, labelled as JobSet and the Job controller do."""
    obj = pod(job_name, "master", index, namespace, node=node, phase=phase, restarts=restarts,
              waiting=waiting)
    obj["metadata"]["name"] = f"{job_name}-node-0-{index}-x{index}z9"
    obj["metadata"]["labels"] = {
        "jobset.sigs.k8s.io/jobset-name": job_name,
        "jobset.sigs.k8s.io/replicatedjob-name": "node",
        "jobset.sigs.k8s.io/job-index": "0",
        "batch.kubernetes.io/job-completion-index": str(index),
        "batch.kubernetes.io/job-name": f"{job_name}-node-0",
        "trainer.kubeflow.org/trainjob-ancestor-step": "trainer",
    }
    obj["metadata"]["annotations"] = {"batch.kubernetes.io/job-completion-index": str(index)}
    obj["spec"]["containers"][0]["name"] = "node"
    obj["status"]["containerStatuses"][0]["name"] = "node"
    return obj


def event(kind: str, name: str, reason: str, message: str, at: dt.datetime, *,
          namespace: str = "training", type_: str = "Warning", count: int = 1,
          series: bool = False) -> dict[str, Any]:
    """A core/v1 Event about `kind`/`name`: as controllers record them (count, lastTimestamp),
    or with `series` as the scheduler does through events.k8s.io (eventTime, series.count)."""
    obj: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Event", "type": type_, "reason": reason,
        "message": message,
        "metadata": {"name": f"{name}.{reason.lower()}{int(at.timestamp())}",
                     "namespace": namespace, "creationTimestamp": stamp(at)},
        "involvedObject": {"kind": kind, "name": name, "namespace": namespace},
    }
    if series:
        micro = at.strftime("%Y-%m-%dT%H:%M:%S.000000Z")
        obj |= {"eventTime": micro, "series": {"count": count, "lastObservedTime": micro},
                "reportingComponent": "default-scheduler"}
    else:
        obj |= {"count": count, "firstTimestamp": stamp(at), "lastTimestamp": stamp(at)}
    return obj


def kubeconfig(path: Any, contexts: dict[str, tuple[str, str]], current: str) -> None:
    """Write a kubeconfig: context name -> (server URL, namespace)."""
    import yaml

    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": current,
        "clusters": [{"name": f"{name}-cluster", "cluster": {"server": server}}
                     for name, (server, _) in contexts.items()],
        "users": [{"name": "tester", "user": {"token": "test-token"}}],
        "contexts": [{"name": name, "context": {"cluster": f"{name}-cluster", "user": "tester",
                                               "namespace": namespace}}
                     for name, (_, namespace) in contexts.items()],
    }
    path.write_text(yaml.safe_dump(doc))
