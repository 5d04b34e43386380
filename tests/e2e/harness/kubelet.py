"""A replica pod as podman 4.3 can play it, and the kubelet's part that podman does not do.

``podman kube play`` runs the pod spec itself: image, command and args, env (including the
``metadata.name`` downward API), the ConfigMap volume, ``runAsUser``/``runAsGroup``,
``readOnlyRootFilesystem``, ``capabilities.drop``, ``allowPrivilegeEscalation``, seccomp,
CPU and memory limits, and the pod's hostname. Four things differ from a kubelet, and the
harness changes exactly those (each checked on podman 4.3.1, Debian bookworm):

1. ``emptyDir``: podman names the volume after the pod's volume name alone, so every pod
   of the job would share one ``checkpoints`` volume (hiding per-pod state) and it would
   outlive the pod. Each emptyDir becomes a named volume ``<pod>-<volume>`` that the harness
   creates like the kubelet (mode 0777, group ``fsGroup`` with setgid; ``medium: Memory`` as
   tmpfs) and deletes with the pod. ``sizeLimit`` is not enforced (podman 4.3 refuses a
   size option on volumes without project quota).
2. ``ports``: podman publishes every ``containerPort`` on the host (Kubernetes never does,
   and two pods would collide on :9310). They are removed from the played pod; the
   processes still listen on them on the pod's own address.
3. ``fieldRef: metadata.namespace``: podman 4.3 rejects the field path; the harness puts
   the value in, as the kubelet's downward API does.
4. ``restartPolicy``: ``Never`` for podman; :mod:`.job` restarts containers itself, as the
   kubelet and the operator would (see there), so it can count and order them.

``persistentVolumeClaim`` volumes stay as they are: podman mounts the named volume
``<claimName>``, which the harness creates as the PVC stand-in (shared by the pods, kept).
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from typing import Any

from tests.e2e.harness.operator import DEFAULT_CONTAINER, ReplicaPod
from tests.e2e.harness.podman import Podman


@dataclass(frozen=True)
class EmptyDir:
    volume: str  # the pod's volume name
    podman_volume: str  # <pod>-<volume>
    memory: bool


@dataclass(frozen=True)
class PlayablePod:
    replica: ReplicaPod
    manifest: dict[str, Any]  # what podman kube play reads
    empty_dirs: tuple[EmptyDir, ...]
    claims: tuple[str, ...]  # PVC claim names (the stand-in volumes)
    grace_seconds: int
    fs_group: int | None

    @property
    def name(self) -> str:
        return self.replica.name

    @property
    def container(self) -> str:
        """podman's name of the trainer container: ``<pod>-<container>``."""
        return f"{self.name}-{DEFAULT_CONTAINER}"

    def podman_volume(self, volume: str) -> str:
        """The podman volume behind the pod's volume `volume` (emptyDir or PVC)."""
        for spec in self.manifest["spec"]["volumes"]:
            if spec["name"] == volume and "persistentVolumeClaim" in spec:
                return str(spec["persistentVolumeClaim"]["claimName"])
        raise KeyError(f"pod {self.name} has no volume {volume}")


def playable(replica: ReplicaPod) -> PlayablePod:
    manifest = copy.deepcopy(replica.manifest)
    spec = manifest["spec"]
    name = replica.name
    namespace = manifest["metadata"]["namespace"]
    empty_dirs: list[EmptyDir] = []
    claims: list[str] = []
    for volume in spec.get("volumes", []):
        if "emptyDir" in volume:
            empty = volume.pop("emptyDir") or {}
            podman_volume = f"{name}-{volume['name']}"
            empty_dirs.append(EmptyDir(volume["name"], podman_volume,
                                       empty.get("medium") == "Memory"))
            volume["persistentVolumeClaim"] = {"claimName": podman_volume}
        elif "persistentVolumeClaim" in volume:
            claims.append(volume["persistentVolumeClaim"]["claimName"])
    for container in spec["containers"]:
        container.pop("ports", None)
        for env in container.get("env", []):
            ref = env.get("valueFrom", {}).get("fieldRef", {})
            if ref.get("fieldPath") == "metadata.namespace":
                env.pop("valueFrom")
                env["value"] = namespace
    spec["restartPolicy"] = "Never"
    fs_group = spec.get("securityContext", {}).get("fsGroup")
    return PlayablePod(replica, manifest, tuple(empty_dirs), tuple(claims),
                       int(spec.get("terminationGracePeriodSeconds", 30)),
                       None if fs_group is None else int(fs_group))


def create_volume(podman: Podman, name: str, fs_group: int | None, memory: bool = False) -> None:
    """A volume as the kubelet sets up an emptyDir (or applies fsGroup to a new PVC):
    world-writable, group `fs_group` with setgid so files created in it keep the group."""
    if memory:
        options = "mode=2777" + (f",gid={fs_group}" if fs_group is not None else "")
        podman.run("volume", "create", "--opt", "type=tmpfs", "--opt", "device=tmpfs",
                   "--opt", f"o={options}", name)
        return
    podman.run("volume", "create", name)
    mountpoint = podman.volume_mountpoint(name)
    if fs_group is not None:
        os.chown(mountpoint, 0, fs_group)
    os.chmod(mountpoint, 0o2777)
