"""Checkpoints on local disk versus S3 (SeaweedFS started here, tests/support/s3.py): for the
default model (the chart's MLP 64-128-64-10 with SGD momentum) and a ~100 MB one (MLP
64-5000-5000-10), each save as the loop makes it (:class:`trainer.loop.save_policy.Saver`):

* ``blocked``: the training thread's time in ``save()`` (the snapshot; the write and the
  upload run on the writer thread);
* ``durable``: from ``save()`` until the checkpoint is durable (written and fsynced; for S3
  also uploaded): the write throughput is the file's size over it;
* ``read``: the newest checkpoint read and verified (local) or downloaded and verified into
  the staging folder (S3): the read throughput;

medians over ``--saves`` saves (each one a fresh step, ``keep`` 2, so rotation runs too).

    .venv/bin/python benchmarks/bench_checkpoint_storage.py [--saves 5]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from tests.support.s3 import SeaweedS3  # noqa: E402
from trainer.components import checkpoint, storage  # noqa: E402
from trainer.components.models import mlp  # noqa: E402
from trainer.config import CheckpointConfig  # noqa: E402
from trainer.loop.save_policy import Saver  # noqa: E402

MODELS = {"default (MLP 64-128-64-10)": (128, 64),
          "~100 MB model (MLP 64-5000-5000-10)": (5000, 5000)}


def cpu_name() -> str:
    with open("/proc/cpuinfo") as fh:  # Linux: platform.processor() says only x86_64
        for line in fh:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.machine()


def state_of(hidden: tuple[int, ...]) -> dict[str, Any]:
    torch.manual_seed(0)
    model = mlp(10, (64,), hidden)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model(torch.randn(8, 64)).sum().backward()
    opt.step()  # the momentum buffers exist, as in a checkpoint after training began
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 1}


def measure(spec: str, state: dict[str, Any], saves: int) -> dict[str, float]:
    saver = Saver(CheckpointConfig(dir=spec, keep=2), is_main=True)
    blocked, durable = [], []
    try:
        for step in range(1, saves + 1):
            t0 = time.perf_counter()
            saver.save(step, lambda: state)
            t1 = time.perf_counter()
            saver.wait()
            blocked.append(t1 - t0)
            durable.append(time.perf_counter() - t0)
    finally:
        saver.close()
    assert saver.directory is not None
    size = checkpoint.checkpoint_path(saver.directory, saves).stat().st_size
    reads = []
    for _ in range(saves):
        t0 = time.perf_counter()
        if storage.is_remote(spec):
            storage._valid.clear()
            for path in checkpoint.list_checkpoints(saver.directory):
                path.unlink()
            storage.pull_latest(spec, checkpoint.problem_of_bytes)
        checkpoint.read_payload(checkpoint.checkpoint_path(saver.directory, saves))
        reads.append(time.perf_counter() - t0)
    if storage.is_remote(spec):
        storage.drop_staging(spec)
    return {"size": size, "blocked": statistics.median(blocked),
            "durable": statistics.median(durable), "read": statistics.median(reads)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--saves", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{time.strftime('%Y-%m-%d')}, {cpu_name()}, "
          f"{os.cpu_count()} CPUs, Python {platform.python_version()}, torch {torch.__version__}")
    with tempfile.TemporaryDirectory() as tmp, SeaweedS3(Path(tmp) / "s3") as s3:
        os.environ.update(s3.env)
        print("| model | where | size | blocked per save | durable per save | write MB/s | "
              "read | read MB/s |")
        print("|---|---|---|---|---|---|---|---|")
        for name, hidden in MODELS.items():
            state = state_of(hidden)
            for where, spec in (("local disk", str(Path(tmp) / f"local-{hidden[0]}")),
                                ("SeaweedFS", s3.url(f"bench-{hidden[0]}"))):
                r = measure(spec, state, args.saves)
                mb = r["size"] / 1e6
                print(f"| {name} | {where} | {mb:.2f} MB | {r['blocked'] * 1e3:.1f} ms | "
                      f"{r['durable'] * 1e3:.1f} ms | {mb / r['durable']:.0f} | "
                      f"{r['read'] * 1e3:.1f} ms | {mb / r['read']:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
