"""Fixtures: a seeded API emulator, a generated kubeconfig pointing at it, and a CLI runner."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.jobs.cluster import T0, FakeCluster, PodLog, job, kubeconfig, node_pod, pod, trainjob
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


def cli_runner(capsys: pytest.CaptureFixture[str]) -> Callable[..., Result]:
    """Run ``kubectl ddp ARGS`` in-process; return exit code, stdout and stderr."""
    def run(*args: str) -> Result:
        capsys.readouterr()
        code = kubectl_main(list(args))
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


@pytest.fixture
def ddp(kubeconfig_file: Path, capsys: pytest.CaptureFixture[str]) -> Callable[..., Result]:
    """``kubectl ddp`` against the `cluster` fixture (KUBECONFIG points at it)."""
    return cli_runner(capsys)


def seed_both_kinds(cluster: FakeCluster) -> None:
    """seed() plus, in namespace "training": llm (a TrainJob, Running, 2 nodes x 4 GPUs, 4 ranks
    per node, progress reported), tuned (TrainJob, Complete) and mnist-v2; in "research": probe
    (TrainJob whose node count the runtime decides)."""
    seed(cluster)
    cluster.add_job(trainjob("llm", nodes=2, gpus=4, nproc=4, progress=42))
    at = [T0 + dt.timedelta(seconds=s) for s in range(10)]
    cluster.add_pod(node_pod("llm", 1, node="gpu-node-5"), PodLog([
        (at[1], "INFO node 1 joined"), (at[4], "[rank 5] WARNING slow")]))
    cluster.add_pod(node_pod("llm", 0, node="gpu-node-4"), PodLog([
        (at[0], "INFO world_size=8"), (at[3], "INFO step 10 loss=2.01")]))
    cluster.add_job(trainjob("tuned", nodes=1, gpus=0, state="Succeeded"))
    cluster.add_job(trainjob("probe", namespace="research", nodes=None, nproc=None))


@pytest.fixture
def cluster_v2() -> Iterator[FakeCluster]:
    """An emulator serving both CRDs (training operator v1.9 and Trainer v2 side by side)."""
    with FakeCluster(trainjob_crd=True) as fake:
        seed_both_kinds(fake)
        yield fake


@pytest.fixture
def ddp2(cluster_v2: FakeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
         capsys: pytest.CaptureFixture[str]) -> Callable[..., Result]:
    """Run ``kubectl ddp ARGS`` against cluster_v2 (context namespace "training")."""
    path = tmp_path / "kubeconfig-v2.yaml"
    kubeconfig(path, {"v2": (cluster_v2.url, "training")}, current="v2")
    monkeypatch.setenv("KUBECONFIG", str(path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return cli_runner(capsys)


@pytest.fixture
def first_poll(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Set once a command has read a job (its first poll's answer is in hand): a test changes
    the job after that instead of after a sleep that a slow machine may outlast."""
    from trainer.jobs.kube import Cluster

    read = threading.Event()
    get = Cluster.get

    def get_and_tell(self: Cluster, kind: Any, name: str) -> dict[str, Any]:
        obj = get(self, kind, name)
        read.set()
        return obj

    monkeypatch.setattr(Cluster, "get", get_and_tell)
    return read
