"""What checkpoint cadence costs: `ddp-trainer run` (2 CPU ranks, 1 thread each) on the cluster
benchmark's job (digits, MLP 64-128-64-10, per-rank batch 64, SGD 0.05, validation every
epoch), with checkpoints

* ``none``: off (no checkpoint directory), the baseline;
* ``epoch``: at every epoch end (``checkpoint.every_seconds=0``, the cadence before 300 s);
* ``default``: every 300 s (the default) and the final one;

each variant's training samples/s (summary.json) as medians over alternating rounds, and each
variant's median ratio to ``none`` within a round (ratios measured in one run). On a loaded
host those ratios are noisy, so the cost of one save is also measured alone: the job's last
checkpoint, read back and saved again ``--saves`` times the way the background writer saves it
(snapshot, pickle, checksum, write, fsync of the file and the folder), its median wall and
CPU time per save; the cost of a cadence is then that time over the interval between saves.

    .venv/bin/python benchmarks/bench_checkpoint_cadence.py [--rounds 5] [--epochs 40]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VARIANTS: dict[str, list[str]] = {
    "none": [],
    "epoch": ["--set", "checkpoint.every_seconds=0"],
    "default": [],
}


def run(variant: str, epochs: int) -> tuple[float, int]:
    """(samples/s, checkpoints written) of one run."""
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = [] if variant == "none" else ["--checkpoint-dir", f"{tmp}/ckpt", "--set",
                                              "checkpoint.keep=100000"]
        argv = [sys.executable, "-m", "trainer", "run", "--nproc-per-node", "2",
                "--dataset", "digits", "--model", "mlp", "--batch-size", "64",
                "--epochs", str(epochs), "--metrics-port", "0", "--output-dir", f"{tmp}/out",
                "--set", "train.cpu_threads=1", *ckpt, *VARIANTS[variant]]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True,
                              check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"{variant}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
        summary = json.loads(Path(f"{tmp}/out/summary.json").read_text())
        saves = len(list(Path(f"{tmp}/ckpt").glob("ckpt-*.pt"))) if ckpt else 0
        return float(summary["samples_per_second"]), saves


def save_cost(saves: int) -> dict[str, float]:
    """Median wall and CPU ms of one save of the benchmark job's checkpoint."""
    sys.path.insert(0, str(REPO))
    from trainer.components import checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        argv = [sys.executable, "-m", "trainer", "train", "--dataset", "digits", "--model",
                "mlp", "--batch-size", "64", "--epochs", "1", "--metrics-port", "0",
                "--output-dir", f"{tmp}/out", "--checkpoint-dir", f"{tmp}/ckpt"]
        subprocess.run(argv, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                       check=True, capture_output=True)
        state = checkpoint.read(checkpoint.list_checkpoints(Path(f"{tmp}/ckpt"))[0])
        Path(f"{tmp}/again").mkdir()
        walls, cpus = [], []
        for step in range(saves):
            wall, cpu = time.perf_counter(), time.process_time()
            checkpoint.save(Path(f"{tmp}/again"), step, checkpoint.snapshot(state), keep=2)
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
        size = checkpoint.list_checkpoints(Path(f"{tmp}/again"))[0].stat().st_size
    return {"bytes": size, "wall_ms": 1e3 * statistics.median(walls),
            "cpu_ms": 1e3 * statistics.median(cpus)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--saves", type=int, default=50)
    args = parser.parse_args()
    cost = save_cost(args.saves)
    print(f"one save: {cost}", flush=True)
    rates: dict[str, list[float]] = {v: [] for v in VARIANTS}
    saves: dict[str, int] = {}
    ratios: dict[str, list[float]] = {v: [] for v in VARIANTS if v != "none"}
    for r in range(args.rounds):
        order = list(VARIANTS) if r % 2 == 0 else list(reversed(VARIANTS))
        got = {}
        for variant in order:
            got[variant], saves[variant] = run(variant, args.epochs)
            rates[variant].append(got[variant])
        for variant in ratios:
            ratios[variant].append(got[variant] / got["none"])
        print(f"round {r + 1}: " + ", ".join(f"{v} {got[v]:.0f}" for v in VARIANTS)
              + " samples/s", flush=True)
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, load average "
                   f"{os.getloadavg()[0]:.1f} at the end",
        "epochs": args.epochs, "rounds": args.rounds, "checkpoints_per_run": saves,
        "median_samples_per_second": {v: statistics.median(x) for v, x in rates.items()},
        "median_ratio_to_none": {v: statistics.median(x) for v, x in ratios.items()},
        "one_save": cost,
        "save_cpu_share_every_300s": cost["cpu_ms"] / 300e3,
    }
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
