"""What a sharded (DCP) checkpoint of an FSDP run blocks training for: synchronous against
``checkpoint.async_save``.

2 CPU ranks over gloo (1 thread each) shard an MLP (``--width`` wide, ``--layers`` deep, AdamW:
parameters plus two moments, fp32) with ``fully_shard`` per layer, as ``train.strategy: fsdp``
does, and save through the trainer's own ``Saver.save_sharded`` (shards, ``train.pt``, the
marker, the rename, rotation) into a directory both ranks share. Between saves each rank runs
``--steps`` training steps. Per save, on rank 0: ``blocked``, the wall time of the
``save_sharded`` call (what training waits for); ``train``, the ``--steps`` steps after it
(slowed by an async write running beside them; ``train_alone``: the same steps without a
save); ``wait``, what was left of the write after those steps (a later save or the end of
training waits for it). Medians over ``2 x --saves`` saves of each mode, modes alternating.

    .venv/bin/python benchmarks/bench_sharded_checkpoint.py [--width 2048] [--layers 4]
"""

from __future__ import annotations

import argparse
import json
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


def rank_main(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    from trainer.components import sharding
    from trainer.config import CheckpointConfig
    from trainer.loop.save_policy import Saver

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(args.layers):
        layers += [nn.Linear(args.width, args.width), nn.ReLU()]
    model = sharding.shard(nn.Sequential(*layers), [], "fp32")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(8, args.width)

    def train() -> None:
        for _ in range(args.steps):
            optimizer.zero_grad()
            model(x).square().mean().backward()
            optimizer.step()

    train()  # AdamW's moments exist: the state saved is the full training state
    results: dict[str, dict[str, list[float]]] = {"none": {"train_alone": []}}
    for _ in range(args.saves):
        t0 = time.perf_counter()
        train()
        results["none"]["train_alone"].append(time.perf_counter() - t0)
    with tempfile.TemporaryDirectory(dir=out) if rank == 0 else _nothing() as tmp:
        names: list[Any] = [tmp]
        dist.broadcast_object_list(names, src=0)
        for r in range(args.saves):
            for mode in (("sync", "async") if r % 2 == 0 else ("async", "sync")):
                saver = Saver(CheckpointConfig(dir=f"{names[0]}/{mode}", keep=2,
                                               async_save=mode == "async"), rank == 0)
                saver.shards()
                got = results.setdefault(mode, {"blocked": [], "train": [], "wait": []})
                for step in range(1, 3):
                    t0 = time.perf_counter()
                    saver.save_sharded(r * 10 + step, model, optimizer,
                                       lambda: {"step": 0, "model": None, "optimizer": None})
                    blocked = time.perf_counter() - t0
                    t1 = time.perf_counter()
                    train()
                    t2 = time.perf_counter()
                    saver.wait()
                    got["blocked"].append(blocked)
                    got["train"].append(t2 - t1)
                    got["wait"].append(time.perf_counter() - t2)
                saver.close()
                dist.barrier()
        if rank == 0:
            size = sum(p.stat().st_size for p in Path(names[0], "sync").rglob("*")
                       if p.is_file())
            Path(out, "result.json").write_text(json.dumps(
                {"results": results, "bytes_per_checkpoint": size // 2}))
    dist.destroy_process_group()


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--saves", type=int, default=5)
    args = parser.parse_args()
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(rank_main, args=(2, port, args, out), nprocs=2)
        raw = json.loads(Path(out, "result.json").read_text())
    ms = {mode: {k: round(1e3 * statistics.median(v), 1) for k, v in got.items()}
          for mode, got in raw["results"].items()}
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, load average "
                   f"{os.getloadavg()[0]:.1f} at the end",
        "parameters": args.layers * (args.width * args.width + args.width),
        "checkpoint_mb": round(raw["bytes_per_checkpoint"] / 2**20, 1),
        "saves_per_mode": 2 * args.saves,
        "median_ms": ms,
    }
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
