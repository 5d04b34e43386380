"""The podman command line, with the project's settings (``tools/imagebuild/containers.conf``).

Every call names its objects explicitly (never ``--all`` or a prune): other runs, of other
worktrees, may share this machine's container storage.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONTAINERS_CONF = Path(__file__).resolve().parent / "containers.conf"


class PodmanError(RuntimeError):
    """A podman command failed; the message has the command and its stderr."""


class PodmanMissing(PodmanError):
    """podman (or runc) is not installed."""


@dataclass(frozen=True)
class ContainerState:
    """What the kubelet would read from a container's status."""

    name: str
    status: str  # created, running, exited, stopped, ...
    exit_code: int
    pid: int  # host PID of the container's init process (0 when not running)
    ip: str  # address on the pod's network ("" when not running)

    @property
    def running(self) -> bool:
        return self.status == "running"

    @property
    def terminated(self) -> bool:
        return self.status in ("exited", "stopped")


class Podman:
    """Runs podman with ``CONTAINERS_CONF`` pointing at the project's file."""

    def __init__(self, binary: str | None = None, conf: Path = CONTAINERS_CONF) -> None:
        found = binary or shutil.which("podman")
        if not found or not shutil.which("runc"):
            raise PodmanMissing("podman or runc not found on PATH: run `make e2e` "
                                "(tools/install-podman.sh installs them)")
        self.binary = found
        self.env = {**os.environ, "CONTAINERS_CONF": str(conf)}

    def run(self, *args: str, check: bool = True,
            timeout: float = 300) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([self.binary, *args], capture_output=True, text=True,
                              env=self.env, timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise PodmanError(f"podman {' '.join(args)} exited {proc.returncode}: "
                              f"{proc.stderr.strip()[-2000:]}")
        return proc

    def image_exists(self, ref: str) -> bool:
        return self.run("image", "exists", ref, check=False).returncode == 0

    def image_inspect(self, ref: str) -> dict[str, Any]:
        data: list[dict[str, Any]] = json.loads(self.run("image", "inspect", ref).stdout)
        return data[0]

    def images(self, repository: str) -> list[dict[str, Any]]:
        """Local images of `repository`, newest first."""
        out = self.run("images", "--format", "json", "--filter", f"reference={repository}")
        rows: list[dict[str, Any]] = json.loads(out.stdout or "[]")
        return sorted(rows, key=lambda r: r.get("Created", 0), reverse=True)

    def container_state(self, name: str) -> ContainerState | None:
        proc = self.run("container", "inspect", name, check=False)
        if proc.returncode != 0:
            return None
        data = json.loads(proc.stdout)[0]
        state = data["State"]
        networks = data.get("NetworkSettings", {}).get("Networks") or {}
        ip = next((n.get("IPAddress", "") for n in networks.values() if n.get("IPAddress")), "")
        return ContainerState(name, state["Status"], int(state.get("ExitCode", 0)),
                              int(state.get("Pid", 0)), ip)

    def pod_ip(self, pod: str, network: str) -> str:
        """The pod's address on `network` (from its infra container)."""
        infra = self.run("pod", "inspect", pod, "--format", "{{.InfraContainerID}}").stdout
        data = json.loads(self.run("container", "inspect", infra.strip()).stdout)[0]
        networks = data["NetworkSettings"].get("Networks") or {}
        return str(networks.get(network, {}).get("IPAddress", ""))

    def pod_state(self, pod: str) -> str:
        """podman's state of the pod: Running, Degraded (some containers exited), Exited, ...;
        "" when it is gone."""
        proc = self.run("pod", "inspect", pod, "--format", "{{.State}}", check=False)
        return proc.stdout.strip() if proc.returncode == 0 else ""

    def logs(self, container: str) -> str:
        proc = self.run("logs", container, check=False)
        return proc.stdout + proc.stderr

    def volume_mountpoint(self, name: str) -> Path:
        out = self.run("volume", "inspect", name, "--format", "{{.Mountpoint}}").stdout
        return Path(out.strip())

    def remove_volumes(self, names: Sequence[str]) -> None:
        if names:
            self.run("volume", "rm", "--force", *names, check=False)
