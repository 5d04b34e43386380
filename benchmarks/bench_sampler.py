"""Benchmark: DistributedShuffleSampler vs torch's DistributedSampler, and batched delivery.

Part 1 (rank 0 of 8, shuffle=True): time to the first index, time for the rank's full epoch
and peak RSS above the interpreter+torch baseline. Each case runs in a fresh subprocess that
imports torch, numpy and trainer.sampling, records ``ru_maxrss`` (the baseline), builds the
sampler, iterates the epoch and records ``ru_maxrss`` again; the difference is the peak the
sampler added. torch at 10^9 is skipped (it would need ~46 GB).

Part 2: a full epoch of 10^6 in-memory rows (32 float32 features) through a DataLoader, in
microseconds per sample: our BatchedSampler + a dataset with ``__getitems__`` and a
pass-through collate, against torch's DistributedSampler with default batching.

Usage: python benchmarks/bench_sampler.py [--sizes 6,7,8,9] [--skip-loader]
Prints markdown tables; takes ~3-5 minutes on 2 cores (most of it torch at 10^8).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
WORLD, RANK = 8, 0
IMPLS = ("torch", "ours-iter", "ours-chunks")
LABELS = {
    "torch": "torch DistributedSampler",
    "ours-iter": "DistributedShuffleSampler (`__iter__`)",
    "ours-chunks": "DistributedShuffleSampler (`iter_chunks`)",
}


def _maxrss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def child(impl: str, n: int) -> dict[str, Any]:
    """One measurement, in this (fresh) process."""
    import numpy as np  # noqa: F401  (part of the baseline for both implementations)
    from torch.utils.data import DistributedSampler

    from trainer.sampling import DistributedShuffleSampler

    baseline = _maxrss_bytes()
    dataset = range(n)
    t0 = time.perf_counter()
    c0 = time.process_time()
    count = 0
    if impl == "ours-chunks":
        ours = DistributedShuffleSampler(dataset, WORLD, RANK, seed=0)
        ours.set_epoch(0)
        chunks = ours.iter_chunks()
        first_chunk = next(chunks)
        first = time.perf_counter() - t0
        count = first_chunk.size + sum(c.size for c in chunks)
    else:
        sampler = (
            DistributedSampler(dataset, WORLD, RANK, shuffle=True, seed=0)
            if impl == "torch"
            else DistributedShuffleSampler(dataset, WORLD, RANK, seed=0)
        )
        sampler.set_epoch(0)
        it = iter(sampler)
        next(it)
        first = time.perf_counter() - t0
        count = 1
        for _ in it:
            count += 1
    epoch = time.perf_counter() - t0
    cpu = time.process_time() - c0
    peak_above = _maxrss_bytes() - baseline
    if impl != "torch":
        # One wall-clock sample of a few ms is at the mercy of the scheduler on a shared
        # machine: report the median over 5 fresh epochs (each builds its own permutation).
        firsts = []
        for e in range(1, 6):
            again = DistributedShuffleSampler(dataset, WORLD, RANK, seed=0)
            t1 = time.perf_counter()
            again.set_epoch(e)
            if impl == "ours-chunks":
                next(again.iter_chunks())
            else:
                next(iter(again))
            firsts.append(time.perf_counter() - t1)
        first = sorted(firsts)[2]
    return {
        "impl": impl,
        "n": n,
        "count": count,
        "first_s": first,
        "epoch_s": epoch,
        "epoch_cpu_s": cpu,
        "baseline_bytes": baseline,
        "peak_above_bytes": peak_above,
    }


def run_case(impl: str, n: int) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", impl, str(n)],
        check=True,
        capture_output=True,
        text=True,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def sampler_table(sizes: list[int]) -> str:
    rows = [
        "| n | sampler | first index* | epoch (rank 0 of 8) | epoch CPU time "
        "| peak RSS above baseline |",
        "|---|---|---|---|---|---|",
    ]
    torch_epoch: dict[int, float] = {}
    torch_cpu: dict[int, float] = {}
    for n in sizes:
        for impl in IMPLS:
            if impl == "torch" and n > 10**8:
                continue
            r = run_case(impl, n)
            assert r["count"] == -(-n // WORLD), r
            if impl == "torch":
                torch_epoch[n] = r["epoch_s"]
                torch_cpu[n] = r["epoch_cpu_s"]
            ours = impl != "torch" and n in torch_epoch
            speedup = f" ({torch_epoch[n] / r['epoch_s']:.1f}x faster)" if ours else ""
            cpu_speedup = f" ({torch_cpu[n] / r['epoch_cpu_s']:.1f}x)" if ours else ""
            row = (
                f"| 10^{len(str(n)) - 1} | {LABELS[impl]} | {r['first_s'] * 1e3:.2f} ms "
                f"| {r['epoch_s']:.2f} s{speedup} | {r['epoch_cpu_s']:.2f} s{cpu_speedup} "
                f"| {r['peak_above_bytes'] / 2**20:.1f} MiB |"
            )
            rows.append(row)
            print(row, file=sys.stderr, flush=True)
    baseline = run_case("ours-chunks", 10**6)["baseline_bytes"] / 2**20
    rows.append("")
    rows.append("*ours: median of 5 fresh epochs; torch: one (it is seconds of work).")
    rows.append(f"Baseline (interpreter + torch + numpy imported): {baseline:.0f} MiB ru_maxrss.")
    return "\n".join(rows)


def loader_table(n: int = 10**6, features: int = 32, batch: int = 256) -> str:
    """µs per sample for a full epoch through a DataLoader (in this process)."""
    import torch
    from torch.utils.data import DataLoader, DistributedSampler

    from trainer.sampling import BatchedSampler, DistributedShuffleSampler

    torch.set_num_threads(1)
    x = torch.randn(n, features)
    y = torch.randint(0, 10, (n,))

    class Batched:
        def __len__(self) -> int:
            return n

        def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
            idx = torch.as_tensor(indices)
            return x[idx], y[idx]

    class PerItem:
        def __len__(self) -> int:
            return n

        def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
            return x[i], y[i]

    def passthrough(b: Any) -> Any:
        return b

    def epoch_us(loader: DataLoader[Any]) -> float:
        t0 = time.perf_counter()
        seen = 0
        for _, labels in loader:
            seen += len(labels)
        assert seen == n, seen
        return (time.perf_counter() - t0) / n * 1e6

    cases = {
        "BatchedSampler(DistributedShuffleSampler) + `__getitems__`": DataLoader(
            Batched(),
            batch_sampler=BatchedSampler(DistributedShuffleSampler(range(n), 1, 0), batch),
            collate_fn=passthrough,
        ),
        "torch DistributedSampler + `__getitems__` (torch's BatchSampler)": DataLoader(
            Batched(),
            batch_size=batch,
            sampler=DistributedSampler(range(n), 1, 0),
            collate_fn=passthrough,
        ),
        "torch DistributedSampler + `__getitem__` + default collate": DataLoader(
            PerItem(), batch_size=batch, sampler=DistributedSampler(range(n), 1, 0)
        ),
    }
    rows = [
        f"| DataLoader, {n:,} rows x {features} float32, batch {batch} | µs / sample |",
        "|---|---|",
    ]
    for name, loader in cases.items():
        best = min(epoch_us(loader) for _ in range(2))
        rows.append(f"| {name} | {best:.2f} |")
        print(rows[-1], file=sys.stderr, flush=True)
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", nargs=2, metavar=("IMPL", "N"), help=argparse.SUPPRESS)
    ap.add_argument("--sizes", default="6,7,8,9", help="powers of ten to run (default 6,7,8,9)")
    ap.add_argument("--skip-loader", action="store_true", help="skip the DataLoader part")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))  # run from a checkout without installing the package
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]))))
        return
    import torch

    sizes = [10 ** int(p) for p in args.sizes.split(",")]
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    load = os.getloadavg()[0]
    print(
        f"Measured {when} on {platform.machine()}, {os.cpu_count()} cores, load average "
        f"{load:.1f} at start; Python {platform.python_version()}, torch {torch.__version__}.\n"
    )
    print(sampler_table(sizes))
    if not args.skip_loader:
        print()
        print(loader_table())


if __name__ == "__main__":
    main()
