"""Throughput of `ddp-trainer run` against two bare torchrun-style DDP loops (2 CPU ranks, gloo).

Two workloads:

* ``digits``: the digits train split, MLP 64-128-64-10, SGD lr 0.05 momentum 0.9 (the
  defaults), per-rank batch 32, 300 epochs (~6,900 steps: 12-30 s here, by the host's speed);
* ``mlp256``: 20,000 synthetic samples x 64 features, 10 classes, MLP 64-256-256-10, SGD lr 0.01
  without momentum, per-rank batch 64, 40 epochs (the bring-your-own issue's measurement).

Three loops per workload, same data, model initialisation, optimizer, batch and epochs, each
started as 2 ranks by torch's elastic agent (the bare loops by ``torchrun --standalone``, ours by
the agent ``ddp-trainer run`` embeds):

* ``per-sample``: the barest loop a user writes — ``TensorDataset`` + default ``DataLoader`` +
  torch's ``DistributedSampler`` (one ``__getitem__`` per sample, default collate) + torch's
  default SGD;
* ``batched``: the same loop on ddp-trainer's own data path (``IndexView`` + ``BatchedSampler``
  over ``DistributedShuffleSampler``, one gather per batch) and its own optimizer build
  (``trainer.components.optim.build_optimizer``: fused kernels), so ours / batched is the pure
  cost of the trainer's loop;
* ``ddp-trainer run``: checkpoints every 500 steps (``--checkpoint-every``: the cadence of
  Hugging Face's ``TrainingArguments.save_steps`` default and torchtitan's train configs'
  ``Checkpoint(interval=500)``; it replaces epoch-end saves) and at the end, metrics endpoint
  on, step log on, every other setting at its default; its samples/s comes from summary.json.
  A durable save (snapshot, pickling, checksum, fsync) costs a few ms of CPU here whatever the
  loop does: ``--checkpoint-every 50`` measures that cost (12 saves a second on digits).

All three validate every epoch (correct counts all-reduced). Runs alternate (per-sample,
batched, ours, ...) so machine noise hits all; medians, their ratios and the median of each
repeat's own ratios are printed, over all repeats and over the clean ones: on a shared VM the
hypervisor's steal time (``/proc/stat``) is recorded for every run, and a repeat in which any
side lost more than ``--max-steal`` (2 %) of the CPU to other guests is not clean.

Separate processes of one build differ by up to ~10 % here (the same bare loop ran at 34.7 ms
an epoch in one pair of ranks, 38.0 ms in another), more than the loop cost being measured.
So ours / batched is also measured *paired*: ``ddp-trainer run`` starts a script whose two
ranks alternate ``trainer.fit()`` (what ``ddp-trainer train`` runs: the same checkpoints,
metrics endpoint and step log) and the batched loop, ``--paired-repeats`` times, in the same
processes; a pair in which either side lost more than ``--max-steal`` is not clean.

Targets: ours / per-sample >= 1.00, ours / batched >= 0.97.

    python benchmarks/bench_trainer.py [--repeats 5] [--workload digits|mlp256|all]
                                        [--max-steal 0.02] [--checkpoint-every 500]
                                        [--paired-repeats 6]

``--repeats 0`` measures the paired mode alone; ``--paired-repeats 0`` the separate one alone.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

WORKLOADS: dict[str, dict[str, Any]] = {
    "digits": {"data": {"dataset": "digits"}, "hidden": [128, 64], "lr": 0.05, "momentum": 0.9,
               "batch": 32, "epochs": 300},
    "mlp256": {"data": {"dataset": "synthetic", "synthetic_samples": 20000,
                        "synthetic_features": 64, "synthetic_classes": 10},
               "hidden": [256, 256], "lr": 0.01, "momentum": 0.0, "batch": 64, "epochs": 40},
}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_ticks() -> list[int]:
    """The machine's CPU time counters (/proc/stat), or [] where there is none."""
    try:
        return [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except OSError:
        return []


def _steal_ratio(before: list[int], after: list[int]) -> float:
    """Share of CPU time the hypervisor gave to other guests between two readings: the noise
    that moves identical runs here by up to 30 %."""
    if len(before) < 8 or len(after) < 8:
        return 0.0
    delta = [b - a for a, b in zip(before, after, strict=True)]
    return delta[7] / max(1, sum(delta[:8]))


def bare_rank(name: str, fetch: str, out: str) -> None:
    """One rank of a bare loop, started by torchrun (RANK, WORLD_SIZE, MASTER_* set)."""
    import torch
    import torch.distributed as dist

    world = int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo")
    samples_per_second = bare_loop(name, fetch)
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps({"samples_per_second": samples_per_second}))
    # Gloo's teardown can abort a rank whose peer closed first (see
    # trainer.distributed.bootstrap.teardown): meet, then leave without it, as the trainer does.
    dist.barrier()
    os._exit(0)


def bare_loop(name: str, fetch: str) -> float:
    """Train `name` with a bare DDP loop in the joined process group; global samples/s."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    from trainer.components.models import build_model
    from trainer.components.optim import build_optimizer
    from trainer.config import DataConfig, ModelConfig, OptimConfig
    from trainer.data import build_splits
    from trainer.data.loaders import build_train_sampler, eval_loader, train_loader
    from trainer.placement import DistContext

    w = WORKLOADS[name]
    rank, world = dist.get_rank(), dist.get_world_size()
    ctx = DistContext(rank, world, rank, world, torch.device("cpu"), "gloo", True)
    splits = build_splits(DataConfig(**w["data"]), seed=0)
    if fetch == "per-sample":
        xs, ys = splits.train.batch(list(range(len(splits.train))))
        ds = TensorDataset(xs, ys)
        sampler: Any = DistributedSampler(ds, num_replicas=world, rank=rank, seed=0)
        loader: Any = DataLoader(ds, batch_size=w["batch"], sampler=sampler)
        vx, vy = splits.val.batch(list(range(len(splits.val))))
        val = TensorDataset(vx, vy)
        val_loader: Any = DataLoader(val, batch_size=w["batch"],
                                     sampler=DistributedSampler(val, world, rank, shuffle=False))
    else:
        sampler = build_train_sampler("shuffle", splits.train, ctx, seed=0)
        loader = train_loader(splits.train, sampler, w["batch"], ctx, 0)
        val_loader, _ = eval_loader(splits.val, w["batch"], ctx)
    model = DistributedDataParallel(build_model(
        ModelConfig(hidden_sizes=w["hidden"]), splits.num_classes, splits.sample_shape, 0))
    if fetch == "per-sample":  # what a user writes: torch's default (per-parameter) SGD
        opt: Any = torch.optim.SGD(model.parameters(), lr=w["lr"], momentum=w["momentum"])
    else:  # ours, built as ddp-trainer builds it (fused kernels): the loop is all that differs
        opt = build_optimizer(OptimConfig(lr=w["lr"], momentum=w["momentum"]), model.module)
    samples = 0
    dist.barrier()
    start = time.perf_counter()
    for epoch in range(w["epochs"]):
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()
            samples += len(y)
        counts = torch.zeros(2)
        with torch.no_grad():
            for x, y in val_loader:
                counts += torch.tensor([(model(x).argmax(1) == y).sum().item(), len(y)])
        dist.all_reduce(counts)
    wall = time.perf_counter() - start
    total = torch.tensor([float(samples)])
    dist.all_reduce(total)
    return float(total.item()) / wall


def fit_config(name: str, checkpoint_every: int, directory: str) -> dict[str, Any]:
    """What run_ours passes on the command line, as a trainer.fit() config."""
    w = WORKLOADS[name]
    return {"data": dict(w["data"]), "model": {"hidden_sizes": w["hidden"]},
            "optim": {"lr": w["lr"], "momentum": w["momentum"]},
            "train": {"epochs": w["epochs"], "batch_size": w["batch"]},
            "output": {"dir": directory},
            "checkpoint": {"dir": f"{directory}/ckpt", "every": checkpoint_every},
            "metrics": {"linger_seconds": 0}}


def paired_rank(name: str, checkpoint_every: str, repeats: str, out: str) -> None:
    """One rank of the paired measurement, started by ``ddp-trainer run`` (script mode): the
    same two processes alternate trainer.fit() (what ``ddp-trainer train`` runs: checkpoints,
    metrics to the launcher's endpoint, step log) and the bare batched loop. Separate
    processes of one build differ by up to ~10 % here (the same loop ran at 34.7 ms an epoch in
    one pair of ranks, 38.0 ms in another), which separate runs cannot tell from the loop's
    own cost."""
    import torch.distributed as dist

    import trainer

    dist.init_process_group("gloo")  # fit() joins this group (trainer.distributed.bootstrap.join)
    runs: dict[str, list[float]] = {"ours": [], "batched": [], "steal": []}
    for r in range(int(repeats)):
        before, steal = _cpu_ticks(), 0.0
        for side in ("ours", "batched") if r % 2 == 0 else ("batched", "ours"):
            if side == "batched":
                runs[side].append(bare_loop(name, "batched"))
            else:
                with tempfile.TemporaryDirectory() as tmp:
                    summary = trainer.fit(fit_config(name, int(checkpoint_every), tmp))
                runs[side].append(float(summary["samples_per_second"]))
            after = _cpu_ticks()
            steal, before = max(steal, _steal_ratio(before, after)), after
        runs["steal"].append(steal)  # the larger of the pair's two sides
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(runs))
    dist.barrier()
    os._exit(0)


def run_paired(name: str, checkpoint_every: int, repeats: int) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "paired.json"
        subprocess.run([sys.executable, "-m", "trainer", "run", "--nproc-per-node", "2",
                        "--metrics-port", str(_port()), "--metrics-bind-address", "127.0.0.1",
                        "--set", "metrics.linger_seconds=0", __file__, "--paired-rank", name,
                        str(checkpoint_every), str(repeats), str(out)],
                       check=True, cwd=REPO, capture_output=True)
        runs: dict[str, list[float]] = json.loads(out.read_text())
        return runs


def run_bare(name: str, fetch: str) -> float:
    # Under torchrun, as the issue measured it: both sides then pay for an elastic agent
    # (ddp-trainer run embeds the same one), so the ratio compares the loops alone.
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "bare.json")
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", "2", __file__, "--bare-rank", name, fetch, out],
                       check=True, cwd=REPO, capture_output=True)
        return float(json.loads(Path(out).read_text())["samples_per_second"])


def run_ours(name: str, checkpoint_every: int) -> float:
    w = WORKLOADS[name]
    with tempfile.TemporaryDirectory() as tmp:
        sets = [f"data.{k}={v}" for k, v in w["data"].items()]
        sets += [f"model.hidden_sizes={json.dumps(w['hidden'])}",
                 f"optim.momentum={w['momentum']}", "metrics.linger_seconds=0"]
        cmd = [sys.executable, "-m", "trainer", "run", "--nproc-per-node", "2",
               "--epochs", str(w["epochs"]), "--batch-size", str(w["batch"]), "--lr",
               str(w["lr"]), "--output-dir", tmp, "--checkpoint-dir", f"{tmp}/ckpt",
               "--checkpoint-every", str(checkpoint_every), "--metrics-port", str(_port()),
               "--metrics-bind-address", "127.0.0.1"]
        for item in sets:
            cmd += ["--set", item]
        subprocess.run(cmd, check=True, cwd=REPO, capture_output=True)
        summary = json.loads((Path(tmp) / "summary.json").read_text())
        return float(summary["samples_per_second"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5,
                   help="alternations of the three loops in separate processes (0: none)")
    p.add_argument("--workload", choices=[*WORKLOADS, "all"], default="all")
    p.add_argument("--max-steal", type=float, default=0.02,
                   help="host steal ratio above which a repeat is not clean (default 0.02)")
    p.add_argument("--paired-repeats", type=int, default=6,
                   help="alternations of ours and the batched loop in the same two ranks "
                        "(0: none)")
    p.add_argument("--checkpoint-every", type=int, default=500,
                   help="ddp-trainer's checkpoint.every (default 500)")
    a = p.parse_args()
    names = list(WORKLOADS) if a.workload == "all" else [a.workload]
    print(f"load average at start: {os.getloadavg()[0]:.2f}; ddp-trainer checkpoints every "
          f"{a.checkpoint_every} steps")
    print("| workload | per-sample loop | batched loop | ddp-trainer run | ours / per-sample "
          "| ours / batched |")
    print("|---|---|---|---|---|---|")
    for name in names:
        if a.repeats:
            separate(name, a)
        if a.paired_repeats:
            paired_only(name, a)
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


def separate(name: str, a: argparse.Namespace) -> None:
    """The three loops in separate processes, alternating, ``--repeats`` times."""
    runs: dict[str, list[float]] = {"per-sample": [], "batched": [], "ours": []}
    stolen: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(a.repeats):
        for side in runs:
            before = _cpu_ticks()
            runs[side].append(run_bare(name, side) if side != "ours"
                              else run_ours(name, a.checkpoint_every))
            stolen[side].append(_steal_ratio(before, _cpu_ticks()))
    # A repeat is clean when no side lost more than --max-steal of the CPU to other guests
    # (runs that did are 10-45 % slower here); every side of it is kept or dropped.
    clean = [i for i in range(a.repeats) if max(stolen[k][i] for k in runs) <= a.max_steal]
    for label, kept in (("all", list(range(a.repeats))), ("clean", clean)):
        if not kept:
            print(f"| {name} ({label}: none of {a.repeats} repeats) | | | | | |")
            continue
        med = {k: statistics.median(v[i] for i in kept) for k, v in runs.items()}
        print(f"| {name} ({label}: {len(kept)} of {a.repeats} repeats) | "
              f"{med['per-sample']:,.0f} | {med['batched']:,.0f} | {med['ours']:,.0f} | "
              f"{med['ours'] / med['per-sample']:.3f} | {med['ours'] / med['batched']:.3f} |",
              flush=True)
    for k, v in runs.items():
        print(f"  {name} {k}: {', '.join(f'{x:,.0f}' for x in v)} (host steal "
              f"{', '.join(f'{x:.0%}' for x in stolen[k])})", flush=True)
    # Neighbouring runs share the host's load of the moment: their ratios drift less.
    paired = {base: statistics.median(o / x for o, x in zip(runs["ours"], runs[base],
                                                             strict=True))
              for base in ("per-sample", "batched")}
    print(f"  {name} median of per-repeat ratios (all repeats): ours / per-sample "
          f"{paired['per-sample']:.3f}, ours / batched {paired['batched']:.3f}", flush=True)


def paired_only(name: str, a: argparse.Namespace) -> None:
    """Ours and the batched loop alternating in the same two ranks."""
    same = run_paired(name, a.checkpoint_every, a.paired_repeats)
    steal = same.pop("steal")
    # As in separate(): a pair in which the host stole more than --max-steal is not clean.
    clean = [i for i, x in enumerate(steal) if x <= a.max_steal]
    for label, kept in (("all", list(range(len(steal)))), ("clean", clean)):
        if not kept:
            print(f"| {name} (paired, {label}: none of {len(steal)} pairs) | | | | | |")
            continue
        med = {k: statistics.median(v[i] for i in kept) for k, v in same.items()}
        pairs = statistics.median(same["ours"][i] / same["batched"][i] for i in kept)
        print(f"| {name} (paired, {label}: {len(kept)} of {len(steal)} alternations in the same "
              f"2 ranks) | | {med['batched']:,.0f} | {med['ours']:,.0f} | | "
              f"{med['ours'] / med['batched']:.3f} (per pair {pairs:.3f}) |", flush=True)
    for k, v in same.items():
        print(f"  {name} paired {k}: {', '.join(f'{x:,.0f}' for x in v)}", flush=True)
    print(f"  {name} paired host steal: {', '.join(f'{x:.0%}' for x in steal)}", flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    if sys.argv[1:2] == ["--bare-rank"]:
        bare_rank(*sys.argv[2:5])
    elif sys.argv[1:2] == ["--paired-rank"]:
        paired_rank(*sys.argv[2:6])
    else:
        main()
