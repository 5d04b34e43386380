"""A PyTorchJob played on podman: its pods, the operator's restarts, drains, teardown.

What stands in for Kubernetes here (docs/e2e.md):

- The operator's Services: one podman network per job; each pod joins it under its own
  name, so ``<job>-master-0`` and ``<job>-worker-<i>`` resolve as the headless Services
  make them resolve (aardvark-dns).
- The operator's worker init container (waits for the Master's name): the Master's pod is
  started first and the Workers once it runs.
- The kubelet and the operator's restart handling (pkg/controller.v1/common/pod.go,
  ReconcilePods, v1.9.4): a failed container of an ``OnFailure`` (or ``Always``) replica is
  restarted in place, keeping the pod's emptyDirs; an ``ExitCode`` replica's pod is deleted
  and recreated for exit codes >= 128 (fresh emptyDirs) and fails the job on 1-127;
  ``Never`` fails the job. Restarts count against ``runPolicy.backoffLimit``
  (core.PastBackoffLimit: the job fails once they reach it). The kubelet's CrashLoopBackOff
  delays are not played: a restart is immediate.
- The job succeeds when the Master's container exits 0 (PyTorchJob UpdateJobStatus).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from tests.e2e.harness.chart import Rendered
from tests.e2e.harness.kubelet import PlayablePod, create_volume, playable
from tests.e2e.harness.operator import replica_pods
from tests.e2e.harness.podman import ContainerState, Podman, PodmanError

POLL_SECONDS = 0.25


@dataclass
class PodRecord:
    """What the harness knows about one replica's pod."""

    pod: PlayablePod
    exits: list[int] = field(default_factory=list)  # every exit of its trainer container
    created: int = 0  # times the pod was created (recreations add one)
    done: bool = False  # exited for good (success, or the job failed)
    seen_exit: bool = False  # the current exit was handled
    old_logs: str = ""  # the trainer's logs of the pods deleted so far


@dataclass(frozen=True)
class Outcome:
    phase: str  # Succeeded, Failed, or Running (the supervision stopped early)
    reason: str
    exits: dict[str, list[int]]
    restarts: int


class PlayedJob:
    """Start with ``with PlayedJob(podman, rendered) as job: job.start()``; always torn down."""

    def __init__(self, podman: Podman, rendered: Rendered,
                 on_change: Callable[[PlayedJob], None] | None = None) -> None:
        self.podman = podman
        self.job = rendered.job
        self.name = str(self.job["metadata"]["name"])
        self.network = self.name
        self.backoff_limit = int(self.job["spec"].get("runPolicy", {}).get("backoffLimit", 6))
        self.configmaps = rendered.all("ConfigMap")
        self.records = {p.name: PodRecord(playable(p)) for p in replica_pods(self.job)}
        self.restarts = 0
        self.failure = ""
        self.on_change = on_change
        self._dir = Path(tempfile.mkdtemp(prefix=f"e2e-{self.name}-"))
        self._claims: set[str] = set()

    # -- lifecycle -----------------------------------------------------------------------

    def __enter__(self) -> PlayedJob:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.teardown()

    def pod(self, name_or_suffix: str) -> PlayablePod:
        """A pod by name or by suffix (``"master-0"``, ``"worker-0"``)."""
        for name, record in self.records.items():
            if name == name_or_suffix or name.endswith("-" + name_or_suffix):
                return record.pod
        raise KeyError(name_or_suffix)

    @property
    def pods(self) -> list[PlayablePod]:
        return [r.pod for r in self.records.values()]

    def start(self, ready_timeout: float = 120) -> None:
        """Network, PVC stand-ins, then the Master's pod and, once it runs, the Workers."""
        # --internal: no route out of the network; names still resolve, and the host (the
        # node, where Prometheus runs) still reaches the pods.
        self.podman.run("network", "create", "--internal", self.network)
        for record in self.records.values():
            for claim in record.pod.claims:
                if claim not in self._claims:
                    create_volume(self.podman, claim, record.pod.fs_group)
                    self._claims.add(claim)
        first, *rest = self.records.values()
        self._create(first)
        deadline = time.monotonic() + ready_timeout
        while not self._state(first).running:
            if self._state(first).terminated or time.monotonic() > deadline:
                break  # supervise() reports what happened to it
            time.sleep(POLL_SECONDS)
        for record in rest:
            self._create(record)

    def _create(self, record: PodRecord) -> None:
        pod = record.pod
        for empty in pod.empty_dirs:
            create_volume(self.podman, empty.podman_volume, pod.fs_group, empty.memory)
        mounted = {v["configMap"]["name"] for v in pod.manifest["spec"]["volumes"]
                   if "configMap" in v}
        docs = [c for c in self.configmaps if c["metadata"]["name"] in mounted]
        path = self._dir / f"{pod.name}.yaml"
        path.write_text(yaml.safe_dump_all([*docs, pod.manifest], sort_keys=False))
        self.podman.run("kube", "play", "--network", self.network, str(path))
        record.created += 1
        record.seen_exit = False
        self._changed()

    def delete(self, pod: PlayablePod) -> None:
        """Delete the pod (containers still running are killed) and its emptyDirs."""
        record = self.records[pod.name]
        if self._state(record).status != "missing":
            record.old_logs += self.podman.logs(pod.container)
        self.podman.run("pod", "rm", "--force", "--time", "0", pod.name, check=False)
        self.podman.remove_volumes([e.podman_volume for e in pod.empty_dirs])

    def teardown(self) -> None:
        """Remove every pod, volume and the network; a step that fails does not stop the
        others (the first error is raised at the end)."""
        names = {v["configMap"]["name"] for r in self.records.values()
                 for v in r.pod.manifest["spec"]["volumes"] if "configMap" in v}
        steps: list[Callable[[], object]] = [
            *[lambda pod=r.pod: self.delete(pod) for r in self.records.values()],
            lambda: self.podman.remove_volumes(sorted(names | self._claims)),
            lambda: self.podman.run("network", "rm", "--force", self.network, check=False)]
        errors: list[Exception] = []
        for step in steps:
            try:
                step()
            except (PodmanError, subprocess.TimeoutExpired) as err:
                errors.append(err)
        shutil.rmtree(self._dir, ignore_errors=True)
        if errors:
            raise errors[0]

    # -- what the pods do ----------------------------------------------------------------

    def _state(self, record: PodRecord) -> ContainerState:
        state = self.podman.container_state(record.pod.container)
        return state or ContainerState(record.pod.container, "missing", 0, 0, "")

    def state(self, pod: PlayablePod) -> ContainerState:
        return self._state(self.records[pod.name])

    def pod_ip(self, pod: PlayablePod) -> str:
        return self.podman.pod_ip(pod.name, self.network)

    def logs(self, pod: PlayablePod) -> str:
        """The trainer's output in every container the pod has had, oldest first."""
        record = self.records[pod.name]
        current = self.podman.logs(pod.container) if self._state(record).status != "missing" \
            else ""
        return record.old_logs + current

    def all_logs(self, tail: int = 60) -> str:
        return "\n".join(f"--- {p.name} (last {tail} lines)\n"
                         + "\n".join(self.logs(p).splitlines()[-tail:]) for p in self.pods)

    def volume_dir(self, pod: PlayablePod, volume: str) -> Path:
        """Host path of the pod's volume `volume` (read it as the node's root would)."""
        return self.podman.volume_mountpoint(pod.podman_volume(volume))

    def kill(self, pod: PlayablePod, sig: int = signal.SIGKILL) -> None:
        """Send `sig` to the pod's trainer process (the container's init, PID 1 inside)."""
        state = self.state(pod)
        if not state.running or state.pid <= 0:
            raise RuntimeError(f"{pod.name} is not running ({state.status}); cannot kill it")
        os.kill(state.pid, sig)

    def drain(self) -> dict[str, int]:
        """Evict every pod at once, as a node drain does: SIGTERM to the trainer, SIGKILL
        after the pod's grace period, then the pod is deleted. Returns each trainer's exit
        code. (The kubelet stops the app containers before the sandbox; `podman pod stop`
        would stop the infra container too and take the pod's network away mid-shutdown.)"""
        threads = [threading.Thread(target=self.podman.run, args=(
            "stop", "--time", str(r.pod.grace_seconds), r.pod.container),
            kwargs={"check": False, "timeout": r.pod.grace_seconds + 120})
            for r in self.records.values()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        codes = {name: self._state(r).exit_code for name, r in self.records.items()}
        for record in self.records.values():
            record.exits.append(codes[record.pod.name])
            self.delete(record.pod)
        self._changed()
        return codes

    def recreate(self) -> None:
        """Create every deleted pod again (the operator does after a drain), Master first."""
        for record in self.records.values():
            record.done = False
        first, *rest = self.records.values()
        self._create(first)
        for record in rest:
            self._create(record)

    # -- the operator's and the kubelet's decisions ----------------------------------------

    def supervise(self, timeout: float, until: Callable[[], bool] | None = None) -> Outcome:
        """Apply the restart policy until the job ends, `until()` holds, or `timeout`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for record in self.records.values():
                self._handle(record)
            master = next(iter(self.records.values()))
            if self.failure:
                return self._outcome("Failed", self.failure)
            if all(r.done for r in self.records.values()) and master.exits[-1:] == [0]:
                return self._outcome("Succeeded", "the Master's container exited 0")
            if until is not None and until():
                return self._outcome("Running", "the condition held")
            time.sleep(POLL_SECONDS)
        return self._outcome("Running", f"timed out after {timeout:.0f} s")

    def _handle(self, record: PodRecord) -> None:
        state = self._state(record)
        if record.done or record.seen_exit or not state.terminated:
            return
        code = state.exit_code
        record.exits.append(code)
        record.seen_exit = True
        policy = record.pod.replica.restart_policy
        if code == 0 and policy != "Always":
            record.done = True
            self._changed()
            return
        retry_in_place = policy in ("OnFailure", "Always")
        recreate = policy == "ExitCode" and code >= 128
        if not (retry_in_place or recreate):
            self._fail(f"{record.pod.name} exited {code} ({policy}: not retried)")
        elif self.restarts >= self.backoff_limit:
            self._fail(f"{record.pod.name} exited {code} after {self.restarts} restarts "
                       f"(backoffLimit {self.backoff_limit})")
        else:
            self.restarts += 1
            if recreate:
                self.delete(record.pod)
                self._create(record)
            else:
                self._restart_in_place(record)
        self._changed()

    def _restart_in_place(self, record: PodRecord, timeout: float = 60) -> None:
        """Start the exited container again (same container, same volumes). podman stops a
        played pod when its last container exits; a container started while that stop is
        under way is SIGTERMed and, 10 s later, SIGKILLed by it (a restarted worker's exit
        137, seen in a full local test run), so the stop is awaited first. `podman start`
        can still be refused ("container state improper") for a moment after it, so it is
        retried."""
        deadline = time.monotonic() + timeout
        while self.podman.pod_state(record.pod.name) in ("Running", "Degraded"):
            if time.monotonic() > deadline:
                break  # start anyway; a refused start is retried below
            time.sleep(POLL_SECONDS)
        while True:
            proc = self.podman.run("start", record.pod.container, check=False)
            if proc.returncode == 0:
                record.seen_exit = False
                return
            if time.monotonic() > deadline:
                raise PodmanError(f"cannot restart {record.pod.container}: {proc.stderr}")
            time.sleep(POLL_SECONDS)

    def _fail(self, reason: str) -> None:
        self.failure = reason
        for record in self.records.values():
            record.done = True

    def _outcome(self, phase: str, reason: str) -> Outcome:
        return Outcome(phase, reason, {n: list(r.exits) for n, r in self.records.items()},
                       self.restarts)

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change(self)

    def describe(self) -> dict[str, Any]:
        """Pod name -> state, for failure messages."""
        return {n: self._state(r) for n, r in self.records.items()}
