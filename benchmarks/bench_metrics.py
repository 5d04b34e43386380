"""Cost of the Prometheus exporter: training throughput with metrics on vs off.

Runs ``ddp-trainer run --nproc-per-node 2 --dataset digits`` alternately with
``--metrics-port 0`` (off) and a free port (on, scraped once a second like a busy
Prometheus would; ``--scrape-every``), reads ``samples_per_second`` from each run's
summary.json and reports the median on/off ratio (target: within 1 %). Alternating and
taking medians cancels most of the drift of a shared machine; the CPU time per sample of
each run's process tree is reported too, being far less sensitive to other load. It also
times ``sink.log()`` and one scrape in-process and estimates the overhead per step from
them and the measured step time.

    .venv/bin/python benchmarks/bench_metrics.py [--pairs 5] [--epochs 100] [--scrape-every 1]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import timeit
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape_loop(port: int, every: float, stop: threading.Event, count: list[int]) -> None:
    while not stop.wait(every):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                r.read()
                count[0] += 1
        except OSError:
            pass  # before the launcher binds / after it closes


def one_run(
    metrics_on: bool, epochs: int, batch_size: int, scrape_every: float
) -> tuple[float, float, int]:
    """samples/s of one 2-rank run, the CPU seconds of its process tree per 1000 samples,
    and how many scrapes it served."""
    port = free_port() if metrics_on else 0
    with tempfile.TemporaryDirectory(prefix="bench-metrics-") as tmp:
        cmd = [
            sys.executable, "-m", "trainer", "run",
            "--nproc-per-node", "2",
            "--dataset", "digits",
            "--epochs", str(epochs),
            "--batch-size", str(batch_size),
            "--metrics-port", str(port),
            "--metrics-bind-address", "127.0.0.1",
            "--output-dir", tmp,
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if "MULTIPROC_DIR" not in k.upper()}
        env["PYTHONPATH"] = str(REPO)
        stop, count = threading.Event(), [0]
        scraper = threading.Thread(
            target=scrape_loop, args=(port, scrape_every, stop, count), daemon=True
        )
        if metrics_on and scrape_every > 0:
            scraper.start()
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        try:
            subprocess.run(cmd, cwd=REPO, env=env, check=True, capture_output=True, text=True)
        finally:
            stop.set()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        summary = json.loads((Path(tmp) / "summary.json").read_text())
    # CPU time (launcher and ranks; includes start-up) hardly depends on how busy the
    # machine is, unlike wall-clock throughput.
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return float(summary["samples_per_second"]), cpu / summary["samples"] * 1000, count[0]


PAYLOAD: dict[str, Any] = {
    "train/loss": 0.5,
    "train/accuracy": 0.9,
    "train/steps": 10.0,
    "train/samples": 320.0,
    "train/step_seconds": [0.004] * 10,
    "train/data_wait_seconds": 0.001,
    "train/forward_seconds": 0.002,
    "train/lr": 0.05,
    "train/epoch": 3.0,
    "train/progress_ratio": 0.4,
    "train/last_step_timestamp": 1.8e9,
}


def micro_in_this_process() -> tuple[float, float]:
    """Microseconds per sink.log() with a typical 10-step interval payload, and
    milliseconds per scrape of what this process exported."""
    sys.path.insert(0, str(REPO))
    from prometheus_client import generate_latest

    from trainer.config import MetricsConfig
    from trainer.metrics import RunInfo, build_metrics
    from trainer.metrics.serve import multiprocess_registry

    multiprocess = bool(os.environ.get("DDP_TRAINER_METRICS_DIR"))
    # In launcher mode the rank does not bind; in single mode bind a throwaway port.
    cfg = MetricsConfig(port=free_port(), bind_address="127.0.0.1")
    info = RunInfo(0, 0, 2, 2 if multiprocess else 1, "gloo", "ddp", "mlp", "digits", "cpu", "b")
    sink = build_metrics(cfg, info)
    n = 20_000
    seconds = min(timeit.repeat(lambda: sink.log(PAYLOAD, 1), number=n, repeat=3))
    # What the endpoint does per scrape: the registry of this rank, or in launcher mode
    # the merge of the mmap files the launcher performs.
    registry = (
        multiprocess_registry(Path(os.environ["DDP_TRAINER_METRICS_DIR"]))
        if multiprocess
        else sink.registry  # type: ignore[attr-defined]
    )
    scrape = min(timeit.repeat(lambda: generate_latest(registry), number=200, repeat=3)) / 200
    sink.close()
    return seconds / n * 1e6, scrape * 1e3


def log_call_cost() -> dict[str, float]:
    """sink.log() cost in single-process mode and in launcher (mmap) mode, each in a fresh
    interpreter because prometheus_client's value class is per process."""
    out: dict[str, float] = {}
    for mode in ("single", "launcher"):
        with tempfile.TemporaryDirectory(prefix="bench-metrics-mp-") as tmp:
            env = {k: v for k, v in os.environ.items() if "MULTIPROC_DIR" not in k.upper()}
            env["PYTHONPATH"] = str(REPO)
            if mode == "launcher":
                env["DDP_TRAINER_METRICS_DIR"] = tmp
            res = subprocess.run(
                [sys.executable, __file__, "--micro"],
                env=env, check=True, capture_output=True, text=True,
            )  # fmt: skip
            log_us, scrape_ms = (float(v) for v in res.stdout.split())
            out[f"log_call_us_{mode}"] = log_us
            out[f"scrape_ms_{mode}"] = scrape_ms
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5, help="on/off run pairs (default 5)")
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument(
        "--scrape-every", type=float, default=1.0, help="seconds between scrapes (0: none)"
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--micro", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.micro:
        print("{:.3f} {:.4f}".format(*micro_in_this_process()))
        return 0

    micro = log_call_cost()
    print(
        f"sink.log() per log interval (10 steps): {micro['log_call_us_single']:.1f} us "
        f"single-process, {micro['log_call_us_launcher']:.1f} us launcher (mmap) mode; "
        f"one scrape {micro['scrape_ms_single']:.2f} ms / {micro['scrape_ms_launcher']:.2f} ms"
    )

    on: list[float] = []
    off: list[float] = []
    ratios: list[float] = []
    cpu_ratios: list[float] = []
    scrapes = 0
    one_run(False, 2, args.batch_size, 0)  # warm caches (imports, dataset) before measuring
    for i in range(args.pairs):
        # Alternate which goes first so a drifting machine does not favour one side.
        order = (True, False) if i % 2 == 0 else (False, True)
        pair: dict[bool, float] = {}
        cpu: dict[bool, float] = {}
        for metrics_on in order:
            sps, cpu_per_k, served = one_run(
                metrics_on, args.epochs, args.batch_size, args.scrape_every
            )
            pair[metrics_on] = sps
            cpu[metrics_on] = cpu_per_k
            scrapes += served
        on.append(pair[True])
        off.append(pair[False])
        ratios.append(pair[True] / pair[False])
        cpu_ratios.append(cpu[True] / cpu[False])
        print(
            f"pair {i + 1}/{args.pairs}: on {pair[True]:8.0f}  off {pair[False]:8.0f} samples/s"
            f"  on/off {ratios[-1]:.4f}   CPU s/1k samples on {cpu[True]:.3f}"
            f" off {cpu[False]:.3f}  on/off {cpu_ratios[-1]:.4f}",
            flush=True,
        )

    result = {
        **micro,
        "pairs": args.pairs,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "scrape_every_seconds": args.scrape_every,
        "median_on_samples_per_second": statistics.median(on),
        "median_off_samples_per_second": statistics.median(off),
        "median_ratio_on_off": statistics.median(ratios),
        "ratios": ratios,
        "median_cpu_ratio_on_off": statistics.median(cpu_ratios),
        "cpu_ratios": cpu_ratios,
        "scrapes_served": scrapes,
    }
    # Noise-free estimate: exporter time per step (one log() per 10 steps, launcher mode)
    # relative to the measured step time (global batch / global samples per second).
    step_us = 1e6 * args.batch_size * 2 / result["median_off_samples_per_second"]
    result["estimated_overhead_percent"] = micro["log_call_us_launcher"] / 10 / step_us * 100
    print(
        f"estimated exporter overhead: {result['estimated_overhead_percent']:.3f} % of a "
        f"{step_us / 1000:.2f} ms step (log every 10 steps)"
    )
    diff = (result["median_ratio_on_off"] - 1) * 100
    print(
        f"median on/off throughput ratio {result['median_ratio_on_off']:.4f} "
        f"({diff:+.2f} %; target within 1 %), min {min(ratios):.4f}, max {max(ratios):.4f}, "
        f"{scrapes} scrapes served"
    )
    print(
        f"median on/off CPU time per sample {result['median_cpu_ratio_on_off']:.4f} "
        f"({(result['median_cpu_ratio_on_off'] - 1) * 100:+.2f} %)"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
