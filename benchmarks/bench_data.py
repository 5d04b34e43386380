"""The data path at scale: memory-mapped arrays on 2 CPU ranks, and the image input pipeline.

Arrays (``ddp-trainer run --nproc-per-node 2``, MLP, batch 256, no workers):

* per-rank anonymous RSS (``RssAnon`` of /proc/PID/status, peak, polled every 0.1 s) of a run
  on ``--rows`` x 64 float32 memory-mapped (default 2 x 10^7 rows, 5.1 GB), against the same
  run on a 1,000-row directory (the "empty run"). Target: growth <= 64 MiB;
* samples/s (summary.json) of the memory-mapped run against the same file loaded fully into
  each rank's memory, the file in the page cache. Target: >= 0.90. The in-memory run needs
  2 x the file in RAM; with less available it compares on a smaller file (printed);
* time to first batch: a fresh process opening the directory (with its label scan and feature
  sample check) and fetching its first training batch. Target: < 1 s.

Images (one process, the loop only fetches batches; 224 px, batch 64, files ~500 x 375 JPEG):
images/s of ddp-trainer's training pipeline with 0, 1 and 2 workers against a plain
ImageFolder-style baseline (Pillow per sample, the same crop/flip/normalise, torch's default
DataLoader and collate, same worker counts), and the decode-only limit (Pillow ``convert("RGB")``
of each file, one core). Target: >= 1.0x the baseline. Every measurement runs >= 10 s.

    python benchmarks/bench_data.py [--rows 20000000] [--images 3000] [--work /tmp/bench-data]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
FEATURES = 64
MIN_SECONDS = 10.0


# -- arrays ----------------------------------------------------------------------------------
def write_arrays(root: Path, rows: int, seed: int = 0) -> Path:
    """x.npy (rows x 64 float32) and learnable y.npy, written in chunks (never all in RAM)."""
    if (root / "y.npy").exists() and len(np.load(root / "y.npy", mmap_mode="r")) == rows:
        return root
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    teacher = rng.standard_normal((FEATURES, 10)).astype(np.float32)
    x = np.lib.format.open_memmap(root / "x.npy", "w+", np.float32, (rows, FEATURES))
    y = np.lib.format.open_memmap(root / "y.npy", "w+", np.int64, (rows,))
    for start in range(0, rows, 1 << 20):
        stop = min(rows, start + (1 << 20))
        chunk = rng.standard_normal((stop - start, FEATURES), dtype=np.float32)
        x[start:stop] = chunk
        y[start:stop] = (chunk @ teacher).argmax(1)
    x.flush()
    y.flush()
    del x, y
    return root


def in_memory(path: str) -> Any:
    """The comparison dataset: the same arrays read whole into this rank's memory."""
    import torch

    from trainer.data import InMemoryDataset

    x = torch.from_numpy(np.load(Path(path) / "x.npy"))
    y = torch.from_numpy(np.load(Path(path) / "y.npy"))
    return InMemoryDataset(x, y, 10)


def _rank_pids(launcher: int) -> dict[int, int]:
    found: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            env = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == launcher:
            for item in env:
                if item.startswith(b"RANK="):
                    found[int(item[5:])] = int(entry.name)
    return found


def _rss_anon(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run_ranks(args: list[str], steps: int, env_extra: dict[str, str]) -> dict[str, float]:
    """`ddp-trainer run` on 2 ranks; peak RssAnon per rank and the summary's samples/s."""
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-data-out-{os.getpid()}"
    cmd = [sys.executable, "-m", "trainer", "run", "--nproc-per-node", "2", *args,
           "--batch-size", "256", "--epochs", "1", "--max-steps", str(steps), "--val-fraction",
           "0.001", "--metrics-port", "0", "--log-every", "50", "--output-dir", str(out)]
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'benchmarks'}", **env_extra}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    peaks: dict[int, int] = {}
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            for rank, pid in _rank_pids(proc.pid).items():
                peaks[rank] = max(peaks.get(rank, 0), _rss_anon(pid))
            time.sleep(0.1)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    _, err = proc.communicate()
    stop.set()
    poller.join()
    if proc.returncode != 0:
        raise SystemExit(f"run failed ({proc.returncode}): {err[-2000:]}")
    summary = json.loads((out / "summary.json").read_text())
    return {"rss": float(max(peaks.values())), "samples_per_second":
            float(summary["samples_per_second"]), "wall": float(summary["wall_seconds"])}


def first_batch_seconds(root: Path) -> float:
    code = (
        "import time, torch\n"
        "from trainer.config import DataConfig\nfrom trainer.data import build_splits\n"
        "from trainer.placement import DistContext\n"
        "from trainer.data.loaders import build_train_sampler, train_loader\n"
        "ctx = DistContext(0, 2, 0, 2, torch.device('cpu'), 'gloo', False)\n"
        "t = time.perf_counter()\n"
        f"s = build_splits(DataConfig(dataset={str(root)!r}, val_fraction=0.001), seed=0)\n"
        "sampler = build_train_sampler('shuffle', s.train, ctx, 0)\n"
        "next(iter(train_loader(s.train, sampler, 256, ctx, 0)))\n"
        "print(time.perf_counter() - t)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, text=True,
                         capture_output=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    return float(out.stdout.strip().splitlines()[-1])


def _warm(root: Path) -> None:
    """Read the files once so the page cache holds them (the target's precondition)."""
    for name in ("x.npy", "y.npy"):
        with (root / name).open("rb") as fh:
            while fh.read(1 << 24):
                pass


def _available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def bench_arrays(work: Path, rows: int, steps: int, repeats: int) -> None:
    big = write_arrays(work / f"arrays-{rows}", rows)
    empty = write_arrays(work / "arrays-1000", 1000)
    size = (big / "x.npy").stat().st_size
    compare_rows = rows
    if _available() < 2 * size + (4 << 30):
        compare_rows = int(max(1 << 20, (_available() - (4 << 30)) // (4 * FEATURES * 4)))
    cmp_dir = big if compare_rows == rows else write_arrays(work / f"arrays-{compare_rows}",
                                                            compare_rows)
    _warm(big)
    ttfb = first_batch_seconds(big)
    base = run_ranks(["--dataset", str(empty)], steps, {})
    mapped = run_ranks(["--dataset", str(big)], steps, {})
    _warm(cmp_dir)
    pairs: list[tuple[dict[str, float], dict[str, float]]] = []
    for _ in range(repeats):  # alternating, so machine noise hits both
        pairs.append((run_ranks(["--dataset", str(cmp_dir)], steps, {}),
                      run_ranks(["--dataset", "bench_data:in_memory", "--set",
                                 f"data.options.path={cmp_dir}"], steps, {})))
    rate_mapped = statistics.median(m["samples_per_second"] for m, _ in pairs)
    rate_memory = statistics.median(m["samples_per_second"] for _, m in pairs)
    mib = 1 << 20
    print(f"\narrays: {rows:,} x {FEATURES} float32 = {size / 1e9:.1f} GB memory-mapped, "
          f"2 ranks, {steps} steps of 256 per rank")
    print("| run | peak RssAnon per rank | samples/s | wall s |\n|---|---|---|---|")
    rows_of = [("empty (1,000 rows)", [base]), (f"memory-mapped {rows:,} rows", [mapped]),
               (f"memory-mapped {compare_rows:,} rows", [m for m, _ in pairs]),
               (f"in memory {compare_rows:,} rows", [m for _, m in pairs])]
    for name, runs in rows_of:
        rates = ", ".join(f"{r['samples_per_second']:,.0f}" for r in runs)
        print(f"| {name} | {max(r['rss'] for r in runs) / mib:,.0f} MiB | {rates} | "
              f"{min(r['wall'] for r in runs):.1f} |")
    print(f"anonymous RSS growth over the empty run: {(mapped['rss'] - base['rss']) / mib:.1f} "
          "MiB per rank (target <= 64)")
    print(f"samples/s memory-mapped / in memory ({compare_rows:,} rows, medians of {repeats}): "
          f"{rate_mapped / rate_memory:.3f} (target >= 0.90)")
    print(f"time to first batch: {ttfb:.3f} s (target < 1)")
    if min(r["wall"] for pair in pairs for r in pair) < MIN_SECONDS:
        print(f"warning: a run took < {MIN_SECONDS:.0f} s; raise --steps")


# -- images ----------------------------------------------------------------------------------
def write_images(root: Path, count: int, classes: int = 10) -> Path:
    """~500 x 375 JPEGs (ImageNet's typical size): smooth shapes plus noise, quality 90."""
    from PIL import Image

    if root.is_dir() and sum(1 for _ in root.rglob("*.jpg")) == count:
        return root
    rng = np.random.default_rng(0)
    for i in range(count):
        folder = root / f"class{i % classes:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        w, h = int(rng.integers(400, 600)), int(rng.integers(300, 450))
        coarse = Image.fromarray(rng.integers(0, 255, (6, 8, 3), dtype=np.uint8))
        smooth = np.asarray(coarse.resize((w, h), Image.Resampling.BICUBIC), dtype=np.int16)
        noisy = np.clip(smooth + rng.integers(-20, 20, (h, w, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(noisy).save(folder / f"{i:05d}.jpg", quality=90)
    return root


class Baseline:
    """torchvision-ImageFolder style: a file list, per-sample decode + transforms."""

    def __init__(self, root: Path, size: int) -> None:
        classes = sorted(p.name for p in root.iterdir() if p.is_dir())
        self.files = [(p, c) for c, name in enumerate(classes)
                      for p in sorted((root / name).iterdir())]
        self.size = size
        self.mean = np.array([0.485, 0.456, 0.406], np.float32).reshape(3, 1, 1)
        self.std = np.array([0.229, 0.224, 0.225], np.float32).reshape(3, 1, 1)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        import torch
        from PIL import Image

        from trainer.data.transforms import random_crop_box

        path, label = self.files[i]
        img = Image.open(path).convert("RGB")
        box = random_crop_box(img.width, img.height, np.random.default_rng())
        img = img.resize((self.size, self.size), Image.Resampling.BILINEAR, box=box)
        if np.random.random() < 0.5:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        chw = np.asarray(img, np.float32).transpose(2, 0, 1) / 255.0
        return torch.from_numpy((chw - self.mean) / self.std), label


def _rate(batches: Any) -> float:
    """Images/s over >= MIN_SECONDS, after the first batch (worker start-up excluded)."""
    it = iter(batches())
    next(it)
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < MIN_SECONDS:
        try:
            x, _ = next(it)
        except StopIteration:
            it = iter(batches())
            continue
        count += len(x)
    return count / (time.perf_counter() - start)


def bench_images(work: Path, count: int, size: int = 224, batch: int = 64) -> None:
    import torch
    from PIL import Image
    from torch.utils.data import DataLoader

    from trainer.config import DataConfig
    from trainer.data import build_splits
    from trainer.data.loaders import WorkerOptions, build_train_sampler, train_loader
    from trainer.placement import DistContext

    root = write_images(work / f"images-{count}", count)
    ctx = DistContext(0, 1, 0, 1, torch.device("cpu"), "gloo", False)
    splits = build_splits(DataConfig(dataset=str(root), image_size=size, val_fraction=0.0), 0)
    baseline = Baseline(root, size)
    results: list[tuple[int, float, float]] = []
    for workers in (0, 1, 2):
        sampler = build_train_sampler("shuffle", splits.train, ctx, 0)
        loader = train_loader(splits.train, sampler, batch, ctx, WorkerOptions(workers))
        ours = _rate(lambda loader=loader: loader)
        plain = DataLoader(baseline, batch_size=batch, shuffle=True, num_workers=workers)
        theirs = _rate(lambda plain=plain: plain)
        results.append((workers, ours, theirs))
    files = [p for p, _ in baseline.files]
    decoded, start = 0, time.perf_counter()
    while time.perf_counter() - start < MIN_SECONDS:
        with Image.open(files[decoded % len(files)]) as img:
            img.convert("RGB")
        decoded += 1
    decode_only = decoded / (time.perf_counter() - start)
    print(f"\nimages: {count} JPEGs ~500 x 375, {size} px crops, batch {batch}, one rank")
    print("| workers | ddp-trainer images/s | ImageFolder-style baseline | ratio |")
    print("|---|---|---|---|")
    for workers, ours, theirs in results:
        print(f"| {workers} | {ours:,.0f} | {theirs:,.0f} | {ours / theirs:.2f} |")
    print(f"decode-only limit (Pillow convert('RGB'), one core): {decode_only:,.0f} images/s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=20_000_000)
    p.add_argument("--steps", type=int, default=4000, help="optimizer steps per arrays run")
    p.add_argument("--repeats", type=int, default=3, help="alternating mapped/in-memory pairs")
    p.add_argument("--images", type=int, default=3000)
    p.add_argument("--work", type=Path, default=Path("/tmp/bench-data"))
    p.add_argument("--only", choices=("arrays", "images"), default=None)
    a = p.parse_args()
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, load average "
          f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    if a.only != "images":
        bench_arrays(a.work, a.rows, a.steps, a.repeats)
    if a.only != "arrays":
        bench_images(a.work, a.images)
    print(f"load average at the end: {' '.join(f'{v:.2f}' for v in os.getloadavg())}; "
          f"{math.ceil(_available() / 2**30)} GiB available")


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
