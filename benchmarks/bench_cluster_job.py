"""Our chart's PyTorchJob versus a plain one, side by side on the test cluster (make cluster-up).

The plain job is written the way Kubeflow's own PyTorch examples write it: `torchrun` (which
reads the operator's PET_* variables) running a bare DDP script with a DistributedSampler and
a per-sample DataLoader over a TensorDataset. Like for like, both jobs run in our image, with:

* the same ranks: 1 Master + 1 Worker pod, one CPU rank each. The plain job states
  ``nprocPerNode: "1"``: left out, the operator defaults it to ``auto``, and torchrun then
  starts one rank per core with 1 thread each (4 ranks, twice the global batch, here);
* the same threads: each pod's CPU limit is 1 core (``--cpu-limit``; two pods share this
  2-core node), our ranks derive 1 thread from it (their ``threads:`` log line is checked),
  and the plain job sets ``OMP_NUM_THREADS`` to the same count (torch would start one thread
  per core of the node whatever the limit);
* the same data (digits, the same 80/20 split size), optimizer (SGD 0.05, momentum 0.9),
  epochs, per-rank batch (64; global batch 128) and model, one of two:
  ``small`` (MLP 64-128-64-10, the chart's default: a step of ~1 ms) and ``wide`` (MLP
  64-768-768-10: ~8 ms of one thread's compute a step here, plus its 2.6 MB all-reduce);
* validation after every epoch; our checkpoints at their default cadence (every 300 s by rank
  0's clock, and the final one), the plain job none;
* ours otherwise with the chart's defaults, monitoring on (``--no-monitoring``: off): each
  completed rank serves its final metrics until the PodMonitor's first scrape of them, at most
  ``metrics.linger_seconds`` (twice the scrape interval), which counts in its time to
  `Succeeded` (with ``--no-monitoring`` nobody scrapes: the whole bound).

Reported: wall time from `helm install` / `kubectl apply` to `Succeeded` and the training
samples/s each job logs (ours: the `done:` line; plain: the script's own count over its
training loop), as medians over alternating runs, and the ratios ours / plain.

Each run's namespace is deleted, and waited for, before the next run starts: its teardown
(and, for ours, the monitoring stack reloading after its PodMonitor and rules go) would
otherwise run on the node while the next job trains. ``--node`` pins both jobs to one node
(the cluster may have two); ``--running`` measures on the cluster already up, with the image
its chart values name, without ``python -m tools.cluster up``.

    .venv/bin/python benchmarks/bench_cluster_job.py [--pairs 3] [--model small] [--epochs N]
        [--node ddp-node] [--running] [--no-monitoring]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.cluster.helm import CHART, Release, release_name  # noqa: E402
from tests.cluster.kube import (  # noqa: E402
    RESTRICTED_CONTAINER,
    RESTRICTED_POD,
    STATE,
    Cluster,
    bring_up,
)

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
batch = int(os.environ["BATCH"])
loader = DataLoader(train, batch_size=batch, sampler=sampler)
val_loader = DataLoader(val, batch_size=batch, sampler=DistributedSampler(val, shuffle=False))
widths = [64, *map(int, os.environ["HIDDEN"].split(",")), 10]
layers = []
for a, b in zip(widths, widths[1:]):
    layers += [nn.Linear(a, b), nn.ReLU()]
model = nn.parallel.DistributedDataParallel(nn.Sequential(*layers[:-1]))
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
OURS_THREADS = re.compile(r"threads: (\d+) per rank \((.*)\)")
MODELS = {"small": [128, 64], "wide": [768, 768]}
"""Hidden widths of the MLP 64-...-10 both jobs train."""
EPOCHS = {"small": 250, "wide": 100}
"""The default epochs: about 8 s (small) and 14 s (wide) of training here, where ours' fixed
costs (~35 ms: the final checkpoint, its logs) are under 0.5 %; at 20 epochs (0.85 s and 2.7 s)
they were 1.4-4 %, and pairs' ratios spread 0.84-1.09 (docs/benchmarks.md)."""
BATCH = 64
"""Per rank; 2 ranks: a global batch of 128."""


@dataclass(frozen=True)
class Setup:
    epochs: int
    hidden: list[int]
    cpu_limit: str
    threads: int
    node: str = ""
    """The node both jobs' pods are pinned to (nodeSelector kubernetes.io/hostname); "" for
    wherever the scheduler puts them."""
    monitoring: bool = True
    """Our release creates its PodMonitor, PrometheusRule and dashboard ConfigMap (the
    chart's defaults); off only as a diagnostic of what the cluster's monitoring stack
    costs the node while the job trains."""

    def node_selector(self) -> dict[str, str]:
        return {"kubernetes.io/hostname": self.node} if self.node else {}

    def resources(self) -> dict[str, Any]:
        # Requests stay small: two pods requesting a core each do not fit this 2-core node.
        return {"requests": {"cpu": "100m", "memory": "512Mi"},
                "limits": {"cpu": self.cpu_limit, "memory": "6Gi"}}


def plain_job(name: str, image: str, setup: Setup) -> list[dict[str, Any]]:
    """The ConfigMap holding the script and the PyTorchJob running it with torchrun."""
    env = {"EPOCHS": str(setup.epochs), "HIDDEN": ",".join(map(str, setup.hidden)),
           "BATCH": str(BATCH), "OMP_NUM_THREADS": str(setup.threads), "HOME": "/tmp"}
    container = {"name": "pytorch", "image": image,
                 "command": ["torchrun", "/script/train.py"],
                 "env": [{"name": k, "value": v} for k, v in env.items()],
                 "ports": [{"name": "pytorchjob-port", "containerPort": 23456}],
                 "resources": setup.resources(),
                 "securityContext": RESTRICTED_CONTAINER,
                 "volumeMounts": [{"name": "script", "mountPath": "/script"},
                                  {"name": "tmp", "mountPath": "/tmp"}]}
    template = {"spec": {"securityContext": RESTRICTED_POD, "containers": [container],
                         "volumes": [{"name": "script", "configMap": {"name": name}},
                                     {"name": "tmp", "emptyDir": {}}]}}
    if setup.node:
        template["spec"]["nodeSelector"] = setup.node_selector()
    replica = {"replicas": 1, "restartPolicy": "OnFailure", "template": template}
    return [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
             "data": {"train.py": PLAIN_SCRIPT}},
            {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name},
             "spec": {"nprocPerNode": "1",  # as ours; the operator's default is "auto"
                      "pytorchReplicaSpecs": {"Master": replica, "Worker": replica}}}]


def run_ours(cluster: Cluster, chart: str, setup: Setup, tmp: Path) -> tuple[float, float]:
    values: dict[str, Any] = {
        "resources": setup.resources(), "nodeSelector": setup.node_selector(),
        "trainerConfig": {"train": {"epochs": setup.epochs, "batch_size": BATCH},
                          "model": {"name": "mlp", "hidden_sizes": setup.hidden}}}
    if not setup.monitoring:
        values["metrics"] = {part: {"enabled": False}
                             for part in ("podMonitor", "prometheusRule", "dashboard")}
    release = Release(cluster, release_name(), cluster.namespace("bench"), values)
    began = time.monotonic()
    release.install(chart, tmp=tmp)
    release.wait_condition("Succeeded")
    wall = time.monotonic() - began
    log = cluster.logs(release.pod("master"), release.namespace)
    found, threads = OURS_RATE.search(log), OURS_THREADS.search(log)
    assert found is not None and threads is not None, log[-3000:]
    assert int(threads.group(1)) == setup.threads, threads.group(0)
    delete_namespace(cluster, release.namespace)
    return wall, float(found.group(1))


def run_plain(cluster: Cluster, setup: Setup) -> tuple[float, float] | None:
    """(wall s, samples/s), or None when the job did not succeed in 3 minutes: once (1 of 6
    plain runs, 2026-12-06) the bare script's Worker failed after the Master had logged its
    result, and its restarts could not reach the finished Master (gloo: connection refused)
    while the Master never exited: the job hung."""
    ns, name = cluster.namespace("bench"), release_name().replace("ddp-trainer", "plain")
    objects = plain_job(name, cluster.image, setup)
    for obj in objects:
        obj["metadata"]["namespace"] = ns
    began = time.monotonic()
    cluster.apply(*objects)
    try:
        cluster.wait(f"pytorchjob/{name}", "condition=Succeeded", ns, 180)
    except AssertionError as err:
        print(f"plain job {name} did not succeed: {str(err)[:300]}", flush=True)
        delete_namespace(cluster, ns)
        return None
    wall = time.monotonic() - began
    found = PLAIN_RATE.search(cluster.logs(f"{name}-master-0", ns))
    assert found is not None
    delete_namespace(cluster, ns)
    return wall, float(found.group(1))


def delete_namespace(cluster: Cluster, namespace: str) -> None:
    """Delete the run's namespace and wait until it is gone (pods, volumes, our release's
    PodMonitor and rules), so that its teardown, and the monitoring stack's reload after it,
    do not run on the node during the next run's training."""
    proc = cluster.kubectl("delete", "namespace", namespace, "--wait=true", "--timeout=120s",
                           timeout=150, check=False)
    if proc.returncode != 0:  # measured already: say so and go on
        print(f"namespace {namespace} not gone in 120 s: {proc.stderr.strip()[:200]}", flush=True)


def running_cluster() -> Cluster:
    """The cluster `make cluster-up` left running, with the trainer image its chart values
    name (no `tools.cluster up`: nothing is built or started)."""
    values = json.loads("".join(line for line in (STATE / "values-local.yaml").read_text()
                                .splitlines(keepends=True) if not line.startswith("#")))
    return Cluster(STATE / "kubeconfig",
                   f"{values['image']['repository']}:{values['image']['tag']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--epochs", type=int,
                        help=f"default per model: {EPOCHS}")
    parser.add_argument("--model", choices=sorted(MODELS), default="small")
    parser.add_argument("--cpu-limit", default="1", help="CPU limit of every pod (a quantity)")
    parser.add_argument("--threads", type=int, default=1,
                        help="threads per rank that limit gives (the plain job's "
                             "OMP_NUM_THREADS; ours derive it and the run checks it)")
    parser.add_argument("--node", default="",
                        help="pin both jobs' pods to this node (nodeSelector "
                             "kubernetes.io/hostname), e.g. ddp-node")
    parser.add_argument("--running", action="store_true",
                        help="use the cluster already running, with the image its values "
                             "name, instead of `python -m tools.cluster up` (which builds "
                             "this checkout's image)")
    parser.add_argument("--no-monitoring", action="store_true",
                        help="diagnostic: our release without its PodMonitor, PrometheusRule "
                             "and dashboard ConfigMap")
    args = parser.parse_args()
    args.epochs = args.epochs or EPOCHS[args.model]
    setup = Setup(args.epochs, MODELS[args.model], args.cpu_limit, args.threads, args.node,
                  not args.no_monitoring)
    cluster = running_cluster() if args.running else bring_up()
    with tempfile.TemporaryDirectory() as tmp:
        chart = str(CHART)  # the chart of this checkout; its image: the one bring_up built
        results: dict[str, list[tuple[float, float]]] = {"ours": [], "plain": []}
        for pair in range(args.pairs):
            # Alternate which goes first, so a drift in the node's load hits both alike.
            order = ("ours", "plain") if pair % 2 == 0 else ("plain", "ours")
            got = {kind: run_ours(cluster, chart, setup, Path(tmp)) if kind == "ours"
                   else run_plain(cluster, setup) for kind in order}
            ours, plain = got["ours"], got["plain"]
            assert ours is not None
            if plain is None:
                print(f"pair {pair + 1}: left out (the plain job failed)", flush=True)
                continue
            results["ours"].append(ours)
            results["plain"].append(plain)
            print(f"pair {pair + 1}: ours {ours}, plain {plain} (wall s, samples/s)", flush=True)
    median = {kind: (statistics.median(w for w, _ in runs), statistics.median(r for _, r in runs))
              for kind, runs in results.items()}
    report = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "model": args.model, "hidden": setup.hidden, "epochs": args.epochs,
              "pairs": args.pairs, "cpu_limit": args.cpu_limit, "threads": args.threads,
              "node": args.node or None, "monitoring": setup.monitoring,
              "image": cluster.image,
              "per_rank_batch": BATCH, "ranks": 2, "runs": results, "median": median,
              "wall_ratio_ours_over_plain": median["ours"][0] / median["plain"][0],
              "rate_ratio_ours_over_plain": median["ours"][1] / median["plain"][1],
              # speed to Succeeded (higher is better, like the samples/s ratio)
              "wall_speed_plain_over_ours": median["plain"][0] / median["ours"][0],
              "pair_rate_ratios": [round(o[1] / p[1], 3) for o, p in
                                   zip(results["ours"], results["plain"], strict=True)]}
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
