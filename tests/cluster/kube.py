"""The test cluster as the tests use it: kubectl with the admin kubeconfig, manifests as
dicts, waits on the API's own conditions (kubectl wait watches; nothing sleeps)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
STATE = REPO / ".cache" / "cluster"
KUBECTL = REPO / ".tools" / "cluster" / "bin" / "kubectl"

# The chart's container securityContext (values.yaml), which `restricted` admits.
RESTRICTED_CONTAINER: dict[str, Any] = {
    "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
    "runAsUser": 10001, "runAsGroup": 10001, "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"}}
RESTRICTED_POD: dict[str, Any] = {
    "runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10001,
    "seccompProfile": {"type": "RuntimeDefault"}}


class KubectlError(RuntimeError):
    def __init__(self, args: list[str], proc: subprocess.CompletedProcess[str]) -> None:
        super().__init__(f"kubectl {' '.join(args)} exited {proc.returncode}: "
                         f"{proc.stderr.strip()[-3000:]}")
        self.stderr = proc.stderr


@dataclass(frozen=True)
class Cluster:
    kubeconfig: Path
    image: str

    @property
    def node(self) -> str:
        name: str = _layout().NODE_NAME
        return name

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True,
                timeout: float = 300) -> subprocess.CompletedProcess[str]:
        argv = [str(KUBECTL), "--kubeconfig", str(self.kubeconfig), *args]
        proc = subprocess.run(argv, input=stdin, capture_output=True, text=True,
                              timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise KubectlError(list(args), proc)
        return proc

    def apply(self, *objects: dict[str, Any], check: bool = True
              ) -> subprocess.CompletedProcess[str]:
        body = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)})
        return self.kubectl("apply", "-f", "-", stdin=body, check=check)

    def get(self, kind: str, name: str, namespace: str) -> dict[str, Any]:
        out = self.kubectl("get", kind, name, "-n", namespace, "-o", "json").stdout
        result: dict[str, Any] = json.loads(out)
        return result

    def wait(self, what: str, condition: str, namespace: str, timeout: int = 300) -> None:
        """`kubectl wait` (a watch on the API) for `condition`, e.g. `jsonpath={.status.phase}
        =Succeeded`; on failure the message carries the object's events and logs."""
        proc = self.kubectl("wait", what, "-n", namespace, f"--for={condition}",
                            f"--timeout={timeout}s", check=False, timeout=timeout + 30)
        if proc.returncode != 0:
            described = self.kubectl("describe", what, "-n", namespace, check=False).stdout
            raise AssertionError(f"{what} never reached {condition}: {proc.stderr}\n"
                                 f"{described[-4000:]}")

    def logs(self, pod: str, namespace: str) -> str:
        return self.kubectl("logs", pod, "-n", namespace).stdout

    def namespace(self, prefix: str, enforce: str = "restricted") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        labels = {f"pod-security.kubernetes.io/{mode}": enforce
                  for mode in ("enforce", "warn", "audit")}
        labels["pod-security.kubernetes.io/enforce-version"] = "latest"
        self.apply({"apiVersion": "v1", "kind": "Namespace",
                    "metadata": {"name": name, "labels": labels}})
        return name


def _layout() -> Any:
    """tools/cluster/layout.py, where every path and name of the cluster is defined."""
    from tools.cluster import layout  # noqa: PLC0415 - only the cluster tests need it

    return layout


def node_paths() -> Any:
    """tools/cluster's Paths: where the node keeps pod volumes, its containerd socket."""
    return _layout().Paths.default()


def _node(node_name: str) -> Any:
    """layout.NODES' entry for the node named `node_name`."""
    (node,) = [n for n in _layout().NODES if n.name == node_name]
    return node


def node_runtime(node_name: str) -> Path:
    """Where the node named `node_name` keeps its kubelet root and containers (each node has
    its own, layout.Paths.node_runtime)."""
    found: Path = node_paths().node_runtime(_node(node_name))
    return found


def node_socket(node_name: str) -> Path:
    found: Path = node_paths().socket_of(_node(node_name))
    return found


def api_endpoint() -> str:
    """host:port of the API server."""
    layout = _layout()
    return f"{layout.NODE_IP}:{layout.API_PORT}"


def merged(*layers: Mapping[str, Any]) -> dict[str, Any]:
    """Chart values merged as Helm merges `-f` files: maps deeply, anything else replaced."""
    out: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if isinstance(value, Mapping) and isinstance(out.get(key), dict):
                out[key] = merged(out[key], value)
            else:
                out[key] = dict(value) if isinstance(value, Mapping) else value
    return out


def cluster_tool(*args: str) -> str:
    """`python -m tools.cluster ARGS` (docs/cluster.md); what it printed."""
    proc = subprocess.run([sys.executable, "-m", "tools.cluster", *args], cwd=REPO,
                          text=True, capture_output=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"tools.cluster {' '.join(args)} exited {proc.returncode}:\n"
                           f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return proc.stdout


def restart_process(name: str) -> None:
    """SIGKILL one of the cluster's processes, start it again."""
    cluster_tool("restart", name)


def bring_up(nodes: int = 1) -> Cluster:
    """`python -m tools.cluster up --nodes N` (idempotent: a running cluster is reused, one
    with fewer nodes gets the rest) and the files it wrote."""
    proc = subprocess.run([sys.executable, "-m", "tools.cluster", "up", "--nodes", str(nodes)],
                          cwd=REPO, text=True, capture_output=True, check=False)
    sys.stdout.write(proc.stdout)
    if proc.returncode != 0:
        raise RuntimeError(f"python -m tools.cluster up exited {proc.returncode}:\n"
                           f"{proc.stdout[-3000:]}{proc.stderr[-5000:]}")
    values = json.loads("".join(line for line in (STATE / "values-local.yaml").read_text()
                                .splitlines(keepends=True) if not line.startswith("#")))
    image = f"{values['image']['repository']}:{values['image']['tag']}"
    return Cluster(STATE / "kubeconfig", image)
