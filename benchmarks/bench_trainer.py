"""Throughput of `ddp-trainer run` against a minimal bare DDP loop (2 CPU ranks, gloo).

Same data (digits train split), model (MLP 64-128-64-10), optimizer (SGD, momentum 0.9),
per-rank batch and epochs. ddp-trainer runs with checkpointing at every epoch end and every
50 steps, validation after every epoch, metrics endpoint on; its samples/s is taken from
summary.json (the whole training phase: validation and checkpoints included). The bare loop
does the same work minus checkpoints and metrics: train, then count correct validation
predictions on its shard and all-reduce the counts, every epoch. Runs alternate (bare, ours,
bare, ours, ...) so machine noise hits both; the medians and their ratio are printed.
Target: ratio >= 0.97.

    python benchmarks/bench_trainer.py [--repeats 3] [--epochs 40] [--batch-size 32]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def bare_rank(rank: int, world: int, port: int, epochs: int, batch: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    from trainer.config import DataConfig, ModelConfig
    from trainer.data import load_splits
    from trainer.models import build_model

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    splits = load_splits(DataConfig(dataset="digits"), seed=0)
    ds = TensorDataset(splits.train.x, splits.train.y)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, seed=0)
    loader = DataLoader(ds, batch_size=batch, sampler=sampler)
    val = TensorDataset(splits.val.x, splits.val.y)
    val_loader = DataLoader(val, batch_size=batch,
                            sampler=DistributedSampler(val, world, rank, shuffle=False))
    model = DistributedDataParallel(build_model(ModelConfig(), splits.feature_shape, 10, 0))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    samples = 0
    dist.barrier()
    start = time.perf_counter()
    for epoch in range(epochs):
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
    dist.destroy_process_group()


def run_bare(epochs: int, batch: int) -> float:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "bare.json")
        mp.spawn(bare_rank, args=(2, port, epochs, batch, out), nprocs=2, join=True)
        return float(json.loads(Path(out).read_text())["samples_per_second"])


def run_ours(epochs: int, batch: int) -> float:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        metrics_port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "trainer", "run", "--nproc-per-node", "2", "--dataset",
               "digits", "--epochs", str(epochs), "--batch-size", str(batch), "--output-dir",
               tmp, "--checkpoint-dir", f"{tmp}/ckpt", "--checkpoint-every", "50",
               "--metrics-port", str(metrics_port), "--metrics-bind-address", "127.0.0.1"]
        subprocess.run(cmd, check=True, cwd=REPO, capture_output=True)
        summary = json.loads((Path(tmp) / "summary.json").read_text())
        return float(summary["samples_per_second"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--epochs", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=32)
    a = p.parse_args()
    bare: list[float] = []
    ours: list[float] = []
    for _ in range(a.repeats):
        bare.append(run_bare(a.epochs, a.batch_size))
        ours.append(run_ours(a.epochs, a.batch_size))
    b, o = statistics.median(bare), statistics.median(ours)
    print(f"| loop | samples/s (median of {a.repeats}) | runs |")
    print("|---|---|---|")
    print(f"| bare DDP loop | {b:,.0f} | {', '.join(f'{v:,.0f}' for v in bare)} |")
    print(f"| ddp-trainer run | {o:,.0f} | {', '.join(f'{v:,.0f}' for v in ours)} |")
    print(f"\nratio ddp-trainer / bare = {o / b:.3f} (target >= 0.97)")


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
