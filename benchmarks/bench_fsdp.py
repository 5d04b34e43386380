"""Memory per rank and step time, DDP against FSDP, on the causal LM example's GPT-2.

Each case starts N gloo CPU ranks (``torch.multiprocessing``, one thread each), builds the
example's ``tiny_gpt2`` (``examples/causal_lm``) from the same seed on every rank, wraps it as
the trainer does (``DistributedDataParallel`` as ``trainer.build.wrap_model`` builds it, or
``trainer.components.sharding.shard``: one FSDP unit per ``GPT2Block``, then the root) and
trains it with the trainer's AdamW (``build_optimizer``: fused under DDP, foreach under FSDP)
on the example's byte-level data, the global batch fixed whatever N (per-rank batch =
global / N). After the steps each rank counts the bytes of the tensor storage it holds,
each storage once (a view shares its base's):

* parameters: each parameter's local tensor (its shard under FSDP);
* gradients: each ``.grad``'s local tensor, plus DDP's gradient buckets (its reducer's
  flat copies of the gradients, ``gradient_as_bucket_view=False``, torch's default and ours);
* optimizer state: every tensor of ``optimizer.state`` (AdamW's step, exp_avg, exp_avg_sq);

and reports its process's peak RSS (``ru_maxrss``, which includes torch itself and the full
model every rank builds before sharding it), and how much of it came after the imports (the
peak before the model is built subtracted). Step time: the median of rank 0's timed steps (after
--warmup untimed ones, each ended by a barrier) over --repeats alternating rounds.

    python benchmarks/bench_fsdp.py [--ranks 1 2 4] [--d-model 512] [--layers 8] [--steps 4]
        [--repeats 1]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "causal_lm"
MIB = 2**20


def storage_bytes(tensors: list[Any], seen: set[int]) -> int:
    """Bytes of the storages behind `tensors` (local shards of DTensors) not in `seen`."""
    total = 0
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        storage = local.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def ddp_bucket_bytes(model: Any) -> int:
    """Bytes of DDP's gradient buckets, from its logging data (the bucket sizes it built)."""
    data = model._get_ddp_logging_data()  # noqa: SLF001 - torch's only view of the buckets
    return sum(int(b) for b in str(data.get("bucket_sizes", "")).split(", ") if b)


def worker(rank: int, world: int, args: argparse.Namespace, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    sys.path[:0] = [str(REPO), str(EXAMPLE)]
    import torch
    import torch.distributed as dist
    from causal_lm.model import tiny_gpt2
    from causal_lm.text import ByteTextDataset
    from torch.nn.parallel import DistributedDataParallel

    from trainer.components import sharding
    from trainer.components.optim import build_optimizer
    from trainer.components.task_steps import CausalLMStep
    from trainer.config import OptimConfig

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    torch.manual_seed(0)
    model = tiny_gpt2(d_model=args.d_model, layers=args.layers, heads=args.heads,
                      context=args.seq_len)
    n_params = sum(p.numel() for p in model.parameters())
    wrapped = (sharding.shard(model, [], "fp32") if args.strategy == "fsdp"
               else DistributedDataParallel(model))
    opt = build_optimizer(OptimConfig(name="adamw", lr=1e-3), wrapped)
    per_rank = args.global_batch // world
    data = ByteTextDataset(samples=args.global_batch * (args.warmup + args.steps),
                           seq_len=args.seq_len).input_ids
    step_fn = CausalLMStep()
    times, losses = [], []
    for i in range(args.warmup + args.steps):
        batch = data[i * args.global_batch + rank * per_rank:][:per_rank]
        dist.barrier()
        start = time.perf_counter()
        opt.zero_grad(set_to_none=False)  # gradients stay allocated, as measured below
        loss = step_fn(wrapped, batch)["loss"]
        loss.backward()
        opt.step()
        dist.barrier()
        if i >= args.warmup:
            times.append(time.perf_counter() - start)
        mean = loss.detach() / world  # the global batch's loss (equal shards), outside the timing
        dist.all_reduce(mean)
        losses.append(float(mean))
    seen: set[int] = set()
    params = storage_bytes(list(model.parameters()), seen)
    grads = storage_bytes([p.grad for p in model.parameters() if p.grad is not None], seen)
    if args.strategy == "ddp" and world > 1:
        grads += ddp_bucket_bytes(wrapped)
    state = storage_bytes([v for s in opt.state.values() for v in s.values()
                           if isinstance(v, torch.Tensor)], seen)
    row = {"rank": rank, "params": params, "grads": grads, "optimizer": state,
           "base_rss": base_rss,
           "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
           "step_s": times, "losses": losses, "n_params": n_params}
    Path(out, f"{rank}.json").write_text(json.dumps(row))
    dist.destroy_process_group()


def run_case(strategy: str, world: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    from torch.multiprocessing.spawn import spawn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args.strategy = strategy
    with tempfile.TemporaryDirectory() as out:
        spawn(worker, args=(world, args, port, out),  # type: ignore[no-untyped-call]
              nprocs=world, join=True)
        return [json.loads(Path(out, f"{r}.json").read_text()) for r in range(world)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=1,
                        help="rounds over all cases, alternating (step times: medians of all)")
    args = parser.parse_args()
    print(f"# {time.strftime('%Y-%m-%d', time.gmtime())} {platform.machine()} "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; GPT-2 d_model "
          f"{args.d_model}, {args.layers} layers, global batch {args.global_batch} x "
          f"{args.seq_len} tokens, AdamW", flush=True)
    cases = [(strategy, world) for world in args.ranks for strategy in ("ddp", "fsdp")]
    found: dict[tuple[str, int], list[list[dict[str, Any]]]] = {c: [] for c in cases}
    for _ in range(args.repeats):
        for strategy, world in cases:
            found[strategy, world].append(run_case(strategy, world, args))
    print("| strategy | ranks | params MiB/rank | grads MiB/rank | optimizer MiB/rank | "
          "sum MiB/rank | x of 1 rank | peak RSS MiB (max rank) | of it after imports | "
          "step s (rank 0, median) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    base: float | None = None
    for strategy, world in cases:
        rows = found[strategy, world][0]
        worst = max(rows, key=lambda r: r["params"] + r["grads"] + r["optimizer"])
        total = (worst["params"] + worst["grads"] + worst["optimizer"]) / MIB
        base = base or total
        step = statistics.median(t for rep in found[strategy, world] for t in rep[0]["step_s"])
        print(f"| {strategy} | {world} | {worst['params'] / MIB:.1f} | "
              f"{worst['grads'] / MIB:.1f} | {worst['optimizer'] / MIB:.1f} | {total:.1f} | "
              f"{total / base:.2f} | {max(r['peak_rss'] for r in rows) / MIB:.0f} | "
              f"{max(r['peak_rss'] - r['base_rss'] for r in rows) / MIB:.0f} | {step:.2f} |")
    print(f"# {rows[0]['n_params']:,} parameters; load average {os.getloadavg()[0]:.1f}; the "
          "global loss of the last step:",
          {f"{s}/{n}": round(found[s, n][0][0]["losses"][-1], 5) for s, n in cases})


if __name__ == "__main__":
    main()
