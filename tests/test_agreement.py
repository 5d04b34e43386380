"""Rank agreement on real processes: the chart's default path (one `ddp-trainer train` per pod,
each with its own checkpoint directory, the operator's environment) resumes correctly after a
container restart; a diverged loss and SIGTERM stop every rank at once; failures are exit codes."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, free_port, read_json, run_cli

from trainer.components import checkpoint

FIXTURES = str(REPO / "tests" / "fixtures")
LONG = ["--dataset", "digits", "--batch-size", "8", "--epochs", "2", "--log-every", "5",
        "--checkpoint-every", "20", "--metrics-port", "0", "--set",
        "model.hidden_sizes=[512,512]"]


class Pods:
    """Two "pods", each one `ddp-trainer train` rank with the env the training operator sets
    (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and its own checkpoint and output
    directories (the chart's emptyDirs); restarted like `restartPolicy: OnFailure`."""

    def __init__(self, root: Path, args: list[str], world: int = 2) -> None:
        self.root, self.args, self.world = root, args, world
        self.port = free_port()
        self.procs: dict[int, subprocess.Popen[str]] = {}
        self.logs: dict[int, list[str]] = {r: [] for r in range(world)}
        self.exits: dict[int, list[int]] = {r: [] for r in range(world)}

    def start(self, rank: int) -> None:
        pod = self.root / f"pod{rank}"
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PET_", "TORCHELASTIC_")) and k != "LOCAL_RANK"}
        env.update(PYTHONPATH=f"{REPO}:{FIXTURES}", RANK=str(rank), WORLD_SIZE=str(self.world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(self.port), PYTHONUNBUFFERED="1")
        self.procs[rank] = subprocess.Popen(
            [sys.executable, "-m", "trainer", "train", *self.args, "--checkpoint-dir",
             str(pod / "ckpt"), "--output-dir", str(pod / "out")],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def run(self, restarts: int = 0, timeout: float = 600) -> dict[int, list[int]]:
        """Start every pod; restart a failed one up to `restarts` times; wait for all."""
        for rank in range(self.world):
            self.start(rank)
        budget = restarts
        deadline = time.monotonic() + timeout
        while self.procs:
            assert time.monotonic() < deadline, "pods did not finish"
            for rank, proc in list(self.procs.items()):
                code = proc.poll()
                if code is None:
                    continue
                self.logs[rank].append(proc.stderr.read() if proc.stderr else "")
                self.exits[rank].append(code)
                del self.procs[rank]
                if code != 0 and budget > 0:
                    budget -= 1
                    self.start(rank)
            time.sleep(0.05)
        return self.exits

    def pid(self, rank: int) -> int:
        return self.procs[rank].pid

    def kill_all(self) -> None:
        for proc in self.procs.values():
            proc.kill()


def _step_losses(path: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in map(json.loads, path.read_text().splitlines())}


def _last_logged_step(path: Path) -> int:
    """The last step of the complete lines of a steps.jsonl being written (0: none yet)."""
    text = path.read_text() if path.exists() else ""
    lines = text.splitlines()[:text.count("\n")]  # a line still being written is left out
    return max((json.loads(line)["step"] for line in lines), default=0)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pods-uninterrupted")
    pods = Pods(root, LONG)
    exits = pods.run()
    assert exits == {0: [0], 1: [0]}, pods.logs
    return root / "pod0" / "out"


def test_per_pod_checkpoints_resume_after_a_killed_rank_as_an_uninterrupted_run(
        tmp_path: Path, uninterrupted: Path) -> None:
    import threading

    pods = Pods(tmp_path, LONG)

    def kill_rank1_after_the_first_checkpoint() -> None:
        # Mid-run, after the first checkpoint: once rank 0 has logged a step beyond it.
        ckpt, steps = tmp_path / "pod0" / "ckpt", tmp_path / "pod0" / "out" / "steps.jsonl"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            saved = checkpoint.list_checkpoints(ckpt)
            if saved and _last_logged_step(steps) > int(saved[-1].stem.split("-")[1]):
                break
            time.sleep(0.01)
        os.kill(pods.pid(1), signal.SIGKILL)

    killer = threading.Thread(target=kill_rank1_after_the_first_checkpoint)
    killer.start()
    try:
        exits = pods.run(restarts=6)
    finally:
        killer.join()
        pods.kill_all()
    assert exits[1][0] == -signal.SIGKILL and exits[0][-1] == 0 and exits[1][-1] == 0, (
        exits, pods.logs)
    # Rank 0 saw its peer vanish: a lost rank (exit 4), not a hang and not a traceback.
    assert exits[0][0] == 4 and "another rank stopped responding" in pods.logs[0][0]
    assert not list((tmp_path / "pod1" / "ckpt").glob("ckpt-*.pt"))  # only rank 0 writes
    assert "sent by rank 0 to the ranks without a copy" in pods.logs[0][-1]
    resumed = read_json(tmp_path / "pod0" / "out" / "summary.json")
    want = read_json(uninterrupted / "summary.json")
    at = resumed["resumed_from_step"]
    assert at is not None and at > 0
    assert resumed["steps"] == want["steps"]
    assert resumed["train_loss"] == want["train_loss"]
    assert resumed["val_accuracy"] == want["val_accuracy"]
    got, ref = (_step_losses(p / "steps.jsonl") for p in (tmp_path / "pod0" / "out",
                                                           uninterrupted))
    after = [s for s in ref if s > at]
    assert after and [got[s] for s in after] == [ref[s] for s in after]
    # Each pod counts its own restart beside its checkpoints.
    assert (tmp_path / "pod1" / "ckpt" / ".starts-rank-00001").read_text().strip() == str(
        len(exits[1]))


@pytest.mark.parametrize("launcher", [False, True])
def test_a_loss_that_overflows_on_one_rank_stops_every_rank_with_exit_3(
        tmp_path: Path, launcher: bool) -> None:
    # log_seconds 0: a check every 5 steps exactly, however fast the steps.
    args = ["--dataset", "userplugins:one_extreme_sample", "--model", "mlp", "--epochs", "2",
            "--log-every", "5", "--set", "train.log_seconds=0", "--metrics-port", "0"]
    if launcher:
        proc = run_cli("run", "--nproc-per-node", "2", *args, "--output-dir", str(tmp_path),
                       env={"PYTHONPATH": f"{REPO}:{FIXTURES}"}, timeout=300)
        assert proc.returncode == 3, proc.stderr
        logs = [proc.stderr]
    else:
        pods = Pods(tmp_path, args)
        exits = pods.run(timeout=300)
        assert exits == {0: [3], 1: [3]}, pods.logs  # none exits 4, none hangs
        logs = [pods.logs[0][0], pods.logs[1][0]]
    text = "\n".join(logs)
    errors = re.findall(r"error: training loss became (\S+) on rank (\d) by step (\d+)", text)
    assert len(errors) == 2 and len({(r, s) for _, r, s in errors}) == 1, text
    detected = [int(s) for s in re.findall(r"loss became \S+ on this rank by step (\d+)", text)]
    assert detected and int(errors[0][2]) - min(detected) <= 5  # within one log interval
    assert "Traceback" not in text


def test_evaluate_honours_its_timeout(tmp_path: Path) -> None:
    proc = run_cli("train", "--dataset", "synthetic", "--epochs", "1", "--metrics-port", "0",
                   "--checkpoint-dir", str(tmp_path / "ckpt"), "--output-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    ckpt = checkpoint.list_checkpoints(tmp_path / "ckpt")[0]
    t0 = time.monotonic()
    # Rank 0 of 2 whose peer never comes: the rendezvous must give up after --timeout.
    proc = run_cli("evaluate", "--as-rank", "--checkpoint", str(ckpt), "--timeout", "3",
                   "--output-dir", str(tmp_path / "eval"),
                   env={"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": str(free_port())}, timeout=120)
    assert time.monotonic() - t0 < 60, "the evaluation waited for its default 600 s"
    assert proc.returncode == 4 and "dist.timeout_seconds=3" in proc.stderr, proc.stderr


# Rank 1 joins the group and dies (as a kill -9 would) before the first collective.
_JOIN_AND_DIE = ("import datetime, os, torch.distributed as dist; "
                 "dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=60)); "
                 "print('joined', flush=True); os._exit(9)")


def test_a_rank_killed_while_ddp_is_built_is_a_lost_rank_not_a_traceback(tmp_path: Path) -> None:
    env = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    peer = subprocess.Popen([sys.executable, "-c", _JOIN_AND_DIE], env={**os.environ, **env,
                            "RANK": "1"}, stdout=subprocess.PIPE, text=True)
    try:
        # DistributedDataParallel's constructor runs the first collectives after the join.
        proc = run_cli("train", "--dataset", "synthetic", "--epochs", "1", "--metrics-port", "0",
                       "--timeout", "60", "--output-dir", str(tmp_path),
                       env={**env, "RANK": "0"}, timeout=180)
    finally:
        out, _ = peer.communicate(timeout=60)
    assert peer.returncode == 9 and "joined" in out
    assert proc.returncode == 4, proc.stderr
    assert "another rank stopped responding or died (building DistributedDataParallel" in (
        proc.stderr)
    assert "Traceback" not in proc.stderr and not (tmp_path / "summary.json").exists()


def test_dataparallel_with_several_ranks_fails_before_the_rendezvous(tmp_path: Path) -> None:
    t0 = time.monotonic()
    proc = run_cli("train", "--strategy", "dp", "--metrics-port", "0", env={
        "RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port())}, timeout=120)
    assert proc.returncode == 2 and "'dp' (DataParallel) runs in one process" in proc.stderr
    assert time.monotonic() - t0 < 60  # no wait for the missing peer


def test_torch_sampler_resume_replays_the_epoch_without_counting_its_loss_twice(
        tmp_path: Path) -> None:
    common = ["--dataset", "digits", "--sampler", "torch", "--epochs", "1", "--batch-size",
              "16", "--metrics-port", "0", "--checkpoint-dir", str(tmp_path / "ckpt"),
              "--checkpoint-every", "10"]
    first = run_cli("train", *common, "--max-steps", "40", "--output-dir", str(tmp_path / "a"))
    assert first.returncode == 0, first.stderr
    second = run_cli("train", *common, "--output-dir", str(tmp_path / "b"))
    assert second.returncode == 0, second.stderr
    summary = read_json(tmp_path / "b" / "summary.json")
    replayed = _step_losses(tmp_path / "b" / "steps.jsonl")  # the whole epoch, from step 41
    assert len(replayed) == 90  # 1438 / 16 steps, trained again from the epoch's start
    assert summary["train_loss"] == pytest.approx(sum(replayed.values()) / len(replayed),
                                                  rel=1e-12)


def _checks_every(log_every: int, step_seconds: float, log_seconds: float) -> int:
    """Steps between checks once the ranks agreed on `step_seconds` (one process)."""
    import torch

    from trainer.distributed.agreement import Agreement
    from trainer.distributed.preemption import StopFlag
    from trainer.placement import DistContext

    ctx = DistContext(0, 1, 0, 1, torch.device("cpu"), "gloo", False)
    agreement = Agreement(ctx, StopFlag(), log_every, 15.0, 600.0, min_seconds=log_seconds)
    agreement.exchange(log_every, False, step_seconds, wait=False)
    return agreement.every


def test_fast_steps_are_checked_about_every_log_seconds_slow_ones_within_the_stop_bound() -> None:
    assert _checks_every(10, 0.003, 1.0) == 334  # 3 ms steps: a report a second, not 33
    assert _checks_every(10, 0.003, 0.0) == 10  # log_seconds 0: every log_every steps
    assert _checks_every(10, 0.2, 1.0) == 10  # slower than log_seconds / log_every: unchanged
    assert _checks_every(10, 10.0, 1.0) == 1  # 15 s stop bound / (2 x 10 s): every step
    assert _checks_every(10, 0.001, 100.0) == 7500  # never beyond the stop bound


def _exchange_with_sums(rank: int, world: int, port: int, out: dict) -> None:  # type: ignore[type-arg]
    import torch
    import torch.distributed as dist

    from trainer.distributed.agreement import Agreement
    from trainer.distributed.preemption import StopFlag
    from trainer.placement import DistContext

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    ctx = DistContext(rank, world, rank, world, torch.device("cpu"), "gloo", True)
    stop = StopFlag()
    stop.requested = rank == 1
    agreement = Agreement(ctx, stop, 10, 15.0, 60.0)
    # Negative and tiny sums too: slots under a MAX, not values compared.
    sums = [(-2.5, 7.0), (1e-300, 1.0), (0.1, 5.0)][rank]
    verdict = agreement.exchange(10, rank == 2, 0.01 * (rank + 1), wait=True, sums=sums)
    plain = agreement.exchange(20, False, 0.01, wait=True)
    if rank == 0:
        out["verdict"], out["plain"] = verdict, plain
    dist.destroy_process_group()


def test_an_awaited_exchange_returns_sums_over_ranks_beside_the_verdict() -> None:
    import torch.multiprocessing as mp

    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_exchange_with_sums, args=(3, free_port(), out), nprocs=3, join=True)
        verdict, plain = out["verdict"], out["plain"]
    assert verdict.sums == (math.fsum([-2.5, 1e-300, 0.1]), 13.0)
    assert (verdict.stop, verdict.diverged_rank, verdict.slowest_step) == (True, 2, 0.03)
    assert plain.sums is None and plain.diverged_rank is None


def _leave_before_the_final_barrier(rank: int, world: int, port: int, out: dict) -> None:  # type: ignore[type-arg]
    import torch
    import torch.distributed as dist

    from trainer.distributed.bootstrap import teardown
    from trainer.placement import DistContext

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    dist.barrier()  # both in the group; then rank 1 vanishes without its final barrier
    if rank == 1:
        os._exit(0)
    teardown(DistContext(rank, world, rank, world, torch.device("cpu"), "gloo", True))
    out["returned"] = True


def test_a_peer_gone_before_the_final_barrier_leaves_a_completed_run_completed() -> None:
    import torch.multiprocessing as mp

    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_leave_before_the_final_barrier, args=(2, free_port(), out), nprocs=2,
                 join=True)
        assert out.get("returned") is True
