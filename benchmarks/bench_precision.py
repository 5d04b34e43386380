"""Training-step throughput on CPU: fp32 vs bf16 autocast, eager vs torch.compile.

One process, the trainer's own step path (ClassificationStep under trainer.components.precision's
autocast, backward, clipping off, SGD), on the digits-shaped input: the MLP (64-128-64-10) and
the CNN (16/32 channels) at batch 256. Warm-up steps (and compilation) are excluded; each case
then runs for --seconds. Cases alternate within each repeat; medians are printed.

    python benchmarks/bench_precision.py [--seconds 10] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def samples_per_second(model_name: str, precision: str, compiled: bool, seconds: float) -> float:
    import torch

    from trainer.components.models import build_model
    from trainer.components.precision import Precision
    from trainer.components.steps import ClassificationStep
    from trainer.config import ModelConfig

    torch.manual_seed(0)
    model = build_model(ModelConfig(name=model_name), 10, (1, 8, 8), seed=0)
    net = torch.compile(model) if compiled else model
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    prec, step = Precision(precision, torch.device("cpu")), ClassificationStep()
    x, y = torch.rand(256, 1, 8, 8), torch.randint(0, 10, (256,))

    def one() -> None:
        opt.zero_grad(set_to_none=True)
        with prec.autocast():
            out = step(net, (x, y))
        prec.backward(out.loss)
        prec.step(opt)

    for _ in range(20):  # warm-up, compilation included
        one()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        one()
        n += 1
    return n * 256 / (time.perf_counter() - start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    cases = [(m, prec, comp) for m in ("mlp", "cnn") for prec, comp in
             (("fp32", False), ("bf16", False), ("fp32", True), ("bf16", True))]
    runs: dict[tuple[str, str, bool], list[float]] = {c: [] for c in cases}
    print(f"load average at start: {os.getloadavg()[0]:.2f}", flush=True)
    for _ in range(a.repeats):
        for case in cases:
            runs[case].append(samples_per_second(*case, a.seconds))
    print("| model | precision | mode | samples/s (median) | vs fp32 eager |")
    print("|---|---|---|---|---|")
    for case in cases:
        base = statistics.median(runs[(case[0], "fp32", False)])
        med = statistics.median(runs[case])
        print(f"| {case[0]} | {case[1]} | {'compile' if case[2] else 'eager'} | {med:,.0f} | "
              f"{med / base:.2f} |")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
