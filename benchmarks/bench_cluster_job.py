"""Our chart's PyTorchJob versus a plain one, side by side on the test cluster (make cluster-up).

The plain job is written the way Kubeflow's own PyTorch examples write it: `torchrun` (which
reads the operator's PET_* variables) running a bare DDP script with a DistributedSampler and
a per-sample DataLoader over a TensorDataset. Both run in our image, on the same data (digits,
the same 80/20 split size), model (MLP 64-128-64-10), optimizer (SGD 0.05, momentum 0.9),
epochs, per-rank batch (64) and world size (1 Master + 1 Worker, one CPU rank each), and both
validate after every epoch. Reported: wall time from `helm install` / `kubectl apply` to
`Succeeded` and the training samples/s each job logs (ours: the `done:` line; plain: the
script's own count over its training loop), as medians over alternating runs, and the ratios.

    .venv/bin/python benchmarks/bench_cluster_job.py [--pairs 3] [--epochs 20]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.cluster.helm import Release, push_chart, release_name  # noqa: E402
from tests.cluster.kube import RESTRICTED_CONTAINER, RESTRICTED_POD, Cluster, bring_up  # noqa: E402

PLAIN_SCRIPT = r'''
import os, time
import torch, torch.distributed as dist
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
x, y = load_digits(return_X_y=True)
x = torch.tensor(x / 16.0, dtype=torch.float32)
y = torch.tensor(y)
perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
cut = int(len(x) * 0.8)
train = TensorDataset(x[perm[:cut]], y[perm[:cut]])
val = TensorDataset(x[perm[cut:]], y[perm[cut:]])
sampler = DistributedSampler(train)
loader = DataLoader(train, batch_size=64, sampler=sampler)
val_loader = DataLoader(val, batch_size=64, sampler=DistributedSampler(val, shuffle=False))
model = nn.parallel.DistributedDataParallel(nn.Sequential(
    nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10)))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
seen, began = 0, time.perf_counter()
for epoch in range(int(os.environ["EPOCHS"])):
    sampler.set_epoch(epoch)
    model.train()
    for xb, yb in loader:
        opt.zero_grad()
        nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
        seen += len(xb)
    model.eval()
    correct = torch.zeros(2)
    with torch.no_grad():
        for xb, yb in val_loader:
            correct += torch.tensor([(model(xb).argmax(1) == yb).sum().item(), len(yb)])
    dist.all_reduce(correct)
total = torch.tensor([float(seen)])
dist.all_reduce(total)
if rank == 0:
    print(f"plain: {total.item() / (time.perf_counter() - began):.0f} samples/s, "
          f"val accuracy {correct[0] / correct[1]:.4f}", flush=True)
dist.destroy_process_group()
'''
PLAIN_RATE = re.compile(r"plain: (\d+) samples/s")
OURS_RATE = re.compile(r"done: \d+ steps, (\d+) samples/s")


def plain_job(name: str, image: str, epochs: int) -> list[dict[str, Any]]:
    """The ConfigMap holding the script and the PyTorchJob running it with torchrun."""
    container = {"name": "pytorch", "image": image,
                 "command": ["torchrun", "/script/train.py"],
                 "env": [{"name": "EPOCHS", "value": str(epochs)},
                         {"name": "HOME", "value": "/tmp"}],
                 "ports": [{"name": "pytorchjob-port", "containerPort": 23456}],
                 "resources": {"requests": {"cpu": "100m", "memory": "512Mi"},
                               "limits": {"cpu": "2", "memory": "6Gi"}},
                 "securityContext": RESTRICTED_CONTAINER,
                 "volumeMounts": [{"name": "script", "mountPath": "/script"},
                                  {"name": "tmp", "mountPath": "/tmp"}]}
    template = {"spec": {"securityContext": RESTRICTED_POD, "containers": [container],
                         "volumes": [{"name": "script", "configMap": {"name": name}},
                                     {"name": "tmp", "emptyDir": {}}]}}
    replica = {"replicas": 1, "restartPolicy": "OnFailure", "template": template}
    return [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
             "data": {"train.py": PLAIN_SCRIPT}},
            {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name},
             "spec": {"pytorchReplicaSpecs": {"Master": replica, "Worker": replica}}}]


def run_ours(cluster: Cluster, chart: str, epochs: int, tmp: Path) -> tuple[float, float]:
    release = Release(cluster, release_name(), cluster.namespace("bench"), {
        "trainerConfig": {"train": {"epochs": epochs}, "metrics": {"linger_seconds": 0}}})
    began = time.monotonic()
    release.install(chart, tmp=tmp)
    release.wait_condition("Succeeded")
    wall = time.monotonic() - began
    found = OURS_RATE.search(cluster.logs(release.pod("master"), release.namespace))
    assert found is not None
    cluster.kubectl("delete", "namespace", release.namespace, "--wait=false")
    return wall, float(found.group(1))


def run_plain(cluster: Cluster, epochs: int) -> tuple[float, float]:
    ns, name = cluster.namespace("bench"), release_name().replace("ddp-trainer", "plain")
    objects = plain_job(name, cluster.image, epochs)
    for obj in objects:
        obj["metadata"]["namespace"] = ns
    began = time.monotonic()
    cluster.apply(*objects)
    cluster.wait(f"pytorchjob/{name}", "condition=Succeeded", ns, 900)
    wall = time.monotonic() - began
    found = PLAIN_RATE.search(cluster.logs(f"{name}-master-0", ns))
    assert found is not None
    cluster.kubectl("delete", "namespace", ns, "--wait=false")
    return wall, float(found.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=20)
    args = parser.parse_args()
    cluster = bring_up()
    with tempfile.TemporaryDirectory() as tmp:
        chart = push_chart(cluster, Path(tmp))
        results: dict[str, list[tuple[float, float]]] = {"ours": [], "plain": []}
        for pair in range(args.pairs):
            results["ours"].append(run_ours(cluster, chart, args.epochs, Path(tmp)))
            results["plain"].append(run_plain(cluster, args.epochs))
            print(f"pair {pair + 1}: ours {results['ours'][-1]}, plain {results['plain'][-1]} "
                  "(wall s, samples/s)", flush=True)
    median = {kind: (statistics.median(w for w, _ in runs), statistics.median(r for _, r in runs))
              for kind, runs in results.items()}
    report = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "epochs": args.epochs, "pairs": args.pairs, "median": median,
              "wall_ratio_ours_over_plain": median["ours"][0] / median["plain"][0],
              "rate_ratio_ours_over_plain": median["ours"][1] / median["plain"][1]}
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
