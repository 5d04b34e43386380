"""Cost and speed of the hang watchdog (trainer/distributed/watchdog.py).

1. The loop's cost: ``Beacon.enter`` (called 5 times an optimizer step: data, step, backward,
   optimizer, agreement) and ``Beacon.stepped``, timed in-process, against the measured step.
2. Throughput with the watchdog on (``dist.hang_seconds=180``, the default) vs off (0):
   ``ddp-trainer run --nproc-per-node 2 --dataset digits`` alternately, the median ratio of
   ``samples_per_second`` and the CPU time per sample of each run's process tree (target: the
   watchdog costs under 1 %).
3. Detection: a rank blocks in its step (tests/fixtures/hangs.py) with ``dist.hang_seconds=H``;
   the verdict says how long the culprit had been stuck when the watchdog fired: its excess
   over H is the detection latency (at most a beat, H/10 clamped to 0.5-5 s, plus a store read).

    .venv/bin/python benchmarks/bench_watchdog.py [--pairs 4] [--epochs 60] [--hang 10 30]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import timeit
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from trainer.distributed.phases import DATA, Beacon  # noqa: E402


def run(out: Path, epochs: int, hang_seconds: float, *extra: str,
        env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str], float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    full = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests' / 'fixtures'}",
            **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", "run", "--nproc-per-node", "2", "--dataset", "digits",
         "--epochs", str(epochs), "--output-dir", str(out), "--metrics-port", "0",
         "--set", "metrics.linger_seconds=0", "--set", f"dist.hang_seconds={hang_seconds}",
         *extra], capture_output=True, text=True, env=full, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return proc, cpu


def loop_cost() -> float:
    beacon = Beacon()
    n = 200_000
    enter = min(timeit.repeat(lambda: beacon.enter(DATA, 1), number=n, repeat=5)) / n
    stepped = min(timeit.repeat(lambda: beacon.stepped(0.003), number=n, repeat=5)) / n
    per_step = 5 * enter + stepped
    print(f"Beacon.enter {enter * 1e6:.2f} us, Beacon.stepped {stepped * 1e6:.2f} us: "
          f"{per_step * 1e6:.2f} us per optimizer step")
    return per_step


def throughput(pairs: int, epochs: int) -> None:
    ratios, cpu_ratios = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(pairs):
            got = {}
            for name, hang in (("off", 0.0), ("on", 180.0)):
                out = Path(tmp) / f"{name}{i}"
                proc, cpu = run(out, epochs, hang)
                if proc.returncode != 0:
                    sys.exit(f"run failed: {proc.stderr[-2000:]}")
                summary = json.loads((out / "summary.json").read_text())
                got[name] = (summary["samples_per_second"], cpu / summary["samples"])
            ratios.append(got["on"][0] / got["off"][0])
            cpu_ratios.append(got["on"][1] / got["off"][1])
            print(f"pair {i}: samples/s off {got['off'][0]:.0f} on {got['on'][0]:.0f} "
                  f"(on/off {ratios[-1]:.3f}); CPU s per sample on/off {cpu_ratios[-1]:.3f}")
    print(f"median samples/s on/off {statistics.median(ratios):.3f}; median CPU per sample "
          f"on/off {statistics.median(cpu_ratios):.3f} over {pairs} pairs")


def detection(hangs: list[float]) -> None:
    verdict = re.compile(r"has been in user code \(the step: forward and loss\) of step \d+ "
                         r"for (\d+) s")
    with tempfile.TemporaryDirectory() as tmp:
        for hang in hangs:
            proc, _ = run(Path(tmp) / f"h{hang:g}", 50, hang, "--set", "train.step=hangs:step",
                          env={"HANG_AT": "60"})
            found = verdict.search(proc.stderr)
            if proc.returncode != 142 or not found:
                sys.exit(f"no verdict (exit {proc.returncode}): {proc.stderr[-2000:]}")
            stuck = float(found.group(1))
            print(f"dist.hang_seconds={hang:g}: verdict after the culprit was stuck {stuck:.0f} s "
                  f"(latency {stuck - hang:.0f} s past the deadline; whole-second resolution)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--hang", type=float, nargs="*", default=[10.0, 30.0])
    args = parser.parse_args()
    loop_cost()
    throughput(args.pairs, args.epochs)
    detection(args.hang)


if __name__ == "__main__":
    main()
