"""One rank of the multi-process resume test (run as a script; not collected by pytest).

It joins a real gloo process group over 127.0.0.1, trains ``--steps`` batches of the epoch (or
to its end with -1) through a DataLoader with a prefetching worker, all-reduces once per step
as DDP would, and rank 0 writes the checkpointed sampler state plus every rank's trained
indices as JSON.
"""

from __future__ import annotations

import argparse
import json
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from trainer.sampling import BatchedSampler, DistributedShuffleSampler


class Rows:
    def __init__(self, n: int) -> None:
        self.y = torch.arange(n)

    def __len__(self) -> int:
        return len(self.y)

    def __getitems__(self, indices: list[int]) -> torch.Tensor:
        return self.y[torch.as_tensor(indices)]


def _identity(batch: torch.Tensor) -> torch.Tensor:
    return batch


def main() -> None:
    ap = argparse.ArgumentParser()
    for name in ("rank", "world", "port", "n", "batch", "steps", "epoch"):
        ap.add_argument(f"--{name}", type=int, required=True)
    ap.add_argument("--state-in", default="")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{a.port}",
        rank=a.rank,
        world_size=a.world,
        timeout=timedelta(seconds=60),
    )
    sampler = DistributedShuffleSampler(range(a.n), seed=7)  # world and rank from the group
    assert (sampler.num_replicas, sampler.rank) == (a.world, a.rank)
    if a.state_in:
        sampler.load_state_dict(json.loads(Path(a.state_in).read_text())["state"])
    sampler.set_epoch(a.epoch)
    loader = DataLoader(
        Rows(a.n),
        batch_sampler=BatchedSampler(sampler, a.batch),
        collate_fn=_identity,
        num_workers=1,
        prefetch_factor=4,  # workers run ahead of training; the state must not count that
    )
    trained: list[int] = []
    steps_done = 0
    for batch in loader:
        if steps_done == a.steps:
            break
        count = torch.tensor([float(len(batch))])
        dist.all_reduce(count)  # a collective per step, like DDP's gradient all-reduce
        trained.extend(batch.tolist())
        steps_done += 1
    state = sampler.state_dict(sampler.start_position + steps_done * a.batch * a.world)
    gathered: list[list[int] | None] = [None] * a.world
    dist.all_gather_object(gathered, trained)
    if a.rank == 0:
        Path(a.out).write_text(json.dumps({"state": state, "trained": gathered}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
