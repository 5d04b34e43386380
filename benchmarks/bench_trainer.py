"""Throughput of `ddp-trainer run` against two bare torchrun-style DDP loops (2 CPU ranks, gloo).

Two workloads:

* ``digits``: the digits train split, MLP 64-128-64-10, SGD lr 0.05 momentum 0.9 (the
  defaults), per-rank batch 32;
* ``mlp256``: 20,000 synthetic samples x 64 features, 10 classes, MLP 64-256-256-10, SGD lr 0.01
  without momentum, per-rank batch 64 (the bring-your-own issue's measurement).

Three loops per workload, same data, model initialisation, optimizer, batch and epochs:

* ``per-sample``: the barest loop a user writes — ``TensorDataset`` + default ``DataLoader`` +
  torch's ``DistributedSampler`` (one ``__getitem__`` per sample, default collate);
* ``batched``: the same loop on ddp-trainer's own data path (``IndexView`` + ``BatchedSampler``
  over ``DistributedShuffleSampler``, one gather per batch), so ours / batched is the pure cost of
  the trainer's loop;
* ``ddp-trainer run``: checkpoints every 50 steps (``checkpoint.every``, which replaces
  epoch-end saves) and at the end, metrics endpoint on, step log on, every other setting at its
  default; its samples/s comes from summary.json.

All three validate every epoch (correct counts all-reduced). Runs alternate (per-sample,
batched, ours, ...) so machine noise hits all; medians and ratios are printed. Targets: ours /
per-sample >= 1.00, ours / batched >= 0.97.

    python benchmarks/bench_trainer.py [--repeats 3] [--workload digits|mlp256|all]
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
               "batch": 32, "epochs": 150},
    "mlp256": {"data": {"dataset": "synthetic", "synthetic_samples": 20000,
                        "synthetic_features": 64, "synthetic_classes": 10},
               "hidden": [256, 256], "lr": 0.01, "momentum": 0.0, "batch": 64, "epochs": 40},
}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bare_rank(rank: int, world: int, port: int, name: str, fetch: str, out: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    from trainer.config import DataConfig, ModelConfig
    from trainer.data import build_splits
    from trainer.distributed import DistContext
    from trainer.loaders import build_train_sampler, eval_loader, train_loader
    from trainer.models import build_model

    w = WORKLOADS[name]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
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
    opt = torch.optim.SGD(model.parameters(), lr=w["lr"], momentum=w["momentum"])
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
    if rank == 0:
        Path(out).write_text(json.dumps({"samples_per_second": total.item() / wall}))
    # Gloo's teardown can abort a rank whose peer closed first (see
    # trainer.distributed.teardown): meet, then leave without it, as the trainer does.
    dist.barrier()
    os._exit(0)


def run_bare(name: str, fetch: str) -> float:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "bare.json")
        mp.spawn(bare_rank, args=(2, _port(), name, fetch, out), nprocs=2, join=True)
        return float(json.loads(Path(out).read_text())["samples_per_second"])


def run_ours(name: str) -> float:
    w = WORKLOADS[name]
    with tempfile.TemporaryDirectory() as tmp:
        sets = [f"data.{k}={v}" for k, v in w["data"].items()]
        sets += [f"model.hidden_sizes={json.dumps(w['hidden'])}",
                 f"optim.momentum={w['momentum']}", "metrics.linger_seconds=0"]
        cmd = [sys.executable, "-m", "trainer", "run", "--nproc-per-node", "2",
               "--epochs", str(w["epochs"]), "--batch-size", str(w["batch"]), "--lr",
               str(w["lr"]), "--output-dir", tmp, "--checkpoint-dir", f"{tmp}/ckpt",
               "--checkpoint-every", "50", "--metrics-port", str(_port()),
               "--metrics-bind-address", "127.0.0.1"]
        for item in sets:
            cmd += ["--set", item]
        subprocess.run(cmd, check=True, cwd=REPO, capture_output=True)
        summary = json.loads((Path(tmp) / "summary.json").read_text())
        return float(summary["samples_per_second"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workload", choices=[*WORKLOADS, "all"], default="all")
    a = p.parse_args()
    names = list(WORKLOADS) if a.workload == "all" else [a.workload]
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    print("| workload | per-sample loop | batched loop | ddp-trainer run | ours / per-sample "
          "| ours / batched |")
    print("|---|---|---|---|---|---|")
    for name in names:
        runs: dict[str, list[float]] = {"per-sample": [], "batched": [], "ours": []}
        for _ in range(a.repeats):
            runs["per-sample"].append(run_bare(name, "per-sample"))
            runs["batched"].append(run_bare(name, "batched"))
            runs["ours"].append(run_ours(name))
        med = {k: statistics.median(v) for k, v in runs.items()}
        print(f"| {name} | {med['per-sample']:,.0f} | {med['batched']:,.0f} | "
              f"{med['ours']:,.0f} | {med['ours'] / med['per-sample']:.3f} | "
              f"{med['ours'] / med['batched']:.3f} |", flush=True)
        for k, v in runs.items():
            print(f"  {name} {k}: {', '.join(f'{x:,.0f}' for x in v)}", flush=True)
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
