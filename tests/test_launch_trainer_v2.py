"""`ddp-trainer run` under Kubeflow Trainer v2: the controller injects only torchrun's
PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR (`<job>-node-0-0.<job>`) and
PET_MASTER_PORT (29500) and runs no launcher (kubeflow/trainer v2.3.0
pkg/runtime/framework/plugins/torch/torch.go:145-166). Each "node" here is a real process tree
with exactly that environment, as the chart runs it (`ddp-trainer run --nproc-per-node N
--config ...`); the world they form must train exactly like the same world started at once."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, free_port, read_json, run_cli

COMMON = ["--dataset", "digits", "--epochs", "1", "--batch-size", "16", "--metrics-port", "0"]
TIMING = {"wall_seconds", "samples_per_second"}
# One thread per rank everywhere: the same float reduction order as the reference launch
# (otherwise `ddp-trainer run` gives each rank cores / nproc-per-node threads).
THREADS = {"OMP_NUM_THREADS": "1"}
JOB = "mytrain"
MASTER = f"{JOB}-node-0-0.{JOB}"  # the headless-Service name the controller sets


def pet_env(nodes: int, nproc: int, rank: int, addr: str, port: int) -> dict[str, str]:
    """The child environment: ours minus every launcher variable, plus exactly the five."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PET_", "TORCHELASTIC_", "KUBEFLOW_TRAINER_"))
           and k not in {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}}
    env.update(THREADS, PYTHONPATH=str(REPO), PET_NNODES=str(nodes), PET_NPROC_PER_NODE=str(nproc),
               PET_NODE_RANK=str(rank), PET_MASTER_ADDR=addr, PET_MASTER_PORT=str(port))
    return env


def run_nodes(tmp_path: Path, nodes: int, nproc: int, addr: str = "127.0.0.1",
              wrap: tuple[str, ...] = ()) -> list[subprocess.CompletedProcess[str]]:
    """Start `nodes` node processes at once (as the Job starts its pods) and wait for all."""
    port = free_port()
    procs = []
    for rank in range(nodes):
        argv = [*wrap, sys.executable, "-m", "trainer", "run", "--nproc-per-node", str(nproc),
                *COMMON, "--output-dir", str(tmp_path / f"node{rank}")]
        procs.append(subprocess.Popen(argv, env=pet_env(nodes, nproc, rank, addr, port),
                                      cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        results.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return results


def summary(path: Path) -> dict[str, Any]:
    return {k: v for k, v in read_json(path / "summary.json").items() if k not in TIMING}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, Any]]:
    """World sizes 2 and 4 started by one standalone `ddp-trainer run`."""
    out = {}
    for world in (2, 4):
        path = tmp_path_factory.mktemp(f"world{world}")
        proc = run_cli("run", "--nproc-per-node", str(world), *COMMON, "--output-dir", str(path),
                       env=THREADS)
        assert proc.returncode == 0, proc.stderr[-2000:]
        out[world] = summary(path)
    return out


@pytest.mark.parametrize(("nodes", "nproc"), [(2, 1), (2, 2)])
def test_nodes_with_only_the_pet_variables_form_the_world_and_train_like_one_launch(
        tmp_path: Path, reference: dict[int, dict[str, Any]], nodes: int, nproc: int) -> None:
    results = run_nodes(tmp_path, nodes, nproc)
    for rank, proc in enumerate(results):
        assert proc.returncode == 0, f"node {rank}: {proc.stderr[-2000:]}"
    got = summary(tmp_path / "node0")  # global rank 0 runs on node 0 and writes the summary
    assert got["world_size"] == nodes * nproc
    assert got == reference[nodes * nproc]
    assert not (tmp_path / "node1" / "summary.json").exists()


def test_the_controllers_master_address_resolves_and_rendezvous_on_it(
        tmp_path: Path, reference: dict[int, dict[str, Any]]) -> None:
    # `<job>-node-0-0.<job>` resolves through the JobSet's headless Service in a cluster; here
    # each node gets a private mount namespace whose /etc/hosts maps it to loopback.
    unshare = shutil.which("unshare")
    assert unshare, "unshare (util-linux) is needed: apt-get install util-linux"
    hosts = tmp_path / "hosts"
    hosts.write_text(Path("/etc/hosts").read_text() + f"\n127.0.0.1 {MASTER}\n")
    # `sh -c SCRIPT CMD ARGS...` runs SCRIPT with $0=CMD: mount, then exec the node command.
    wrap = (unshare, "--mount", "--propagation", "private", "sh", "-c",
            f'mount --bind {hosts} /etc/hosts && exec "$0" "$@"')
    results = run_nodes(tmp_path, 2, 1, addr=MASTER, wrap=wrap)
    for rank, proc in enumerate(results):
        assert proc.returncode == 0, f"node {rank}: {proc.stderr[-2000:]}"
    assert summary(tmp_path / "node0") == reference[2]
