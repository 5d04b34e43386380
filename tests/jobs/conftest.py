"""Fixtures: a seeded API emulator, a generated kubeconfig pointing at it, and a CLI runner."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.jobs.cluster import T0, FakeCluster, PodLog, job, kubeconfig, pod
from trainer.jobs.cli import kubectl_main


@dataclass
class Result:
    code: int
    out: str
    err: str


def seed(cluster: FakeCluster) -> None:
    """Namespace "training": mnist (Running, master + 2 workers, worker-1 restarted twice on
    another node), done (Succeeded), broken (Failed); namespace "research": sweep (Running)."""
    cluster.add_job(job("mnist", workers=2, gpus=2))
    at = [T0 + dt.timedelta(seconds=s) for s in range(10)]
    cluster.add_pod(pod("mnist", "master", 0), PodLog([
        (at[0], "INFO world_size=3 backend=nccl"), (at[3], "INFO step 10 loss=2.01"),
        (at[6], "INFO step 20 loss=1.50"),
    ]))
    cluster.add_pod(pod("mnist", "worker", 0, node="gpu-node-2"), PodLog([
        (at[1], "INFO joined rendezvous"), (at[4], "WARNING slow data loader"),
    ]))
    cluster.add_pod(pod("mnist", "worker", 1, node="gpu-node-3", restarts=2), PodLog([
        (at[2], "INFO joined rendezvous"), (at[5], "INFO {\"json\": \"looking\"}"),
    ]))
    cluster.add_job(job("done", workers=1, gpus=0, state="Succeeded"))
    cluster.add_job(job("broken", workers=1, gpus=1, state="Failed"))
    cluster.add_job(job("sweep", namespace="research", workers=3, gpus=1))


@pytest.fixture
def cluster() -> Iterator[FakeCluster]:
    with FakeCluster() as fake:
        seed(fake)
        yield fake


@pytest.fixture
def closed_port_url() -> str:
    from tests.support.prometheus import free_port

    return f"http://127.0.0.1:{free_port()}"  # nothing listens there


@pytest.fixture
def kubeconfig_file(cluster: FakeCluster, closed_port_url: str, tmp_path: Path,
                    monkeypatch: pytest.MonkeyPatch) -> Path:
    """A kubeconfig with contexts "emulator" (current, namespace "training") and "down"
    (no server listening), exported as KUBECONFIG like a user's shell would."""
    path = tmp_path / "kubeconfig.yaml"
    kubeconfig(path, {"emulator": (cluster.url, "training"),
                      "down": (closed_port_url, "training")}, current="emulator")
    monkeypatch.setenv("KUBECONFIG", str(path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return path


@pytest.fixture
def ddp(kubeconfig_file: Path, capsys: pytest.CaptureFixture[str]) -> Callable[..., Result]:
    """Run ``kubectl ddp ARGS`` in-process; return exit code, stdout and stderr."""
    def run(*args: str) -> Result:
        capsys.readouterr()
        code = kubectl_main(list(args))
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run
