"""How many CPU threads each rank runs: its share of the pod's CPU, decided in one place.

torch starts as many intra-op threads as the machine has cores, whatever the pod may use:
on a 2-core node, 2 one-rank pods ran 2 threads each, spun in libgomp (31.7 % of rank 0's
samples in `perf record`) and trained at 0.44x the samples/s of a plain Kubeflow-example
job, against 1.43-1.58x with 1 thread each (issue 35). The order, first
that is set wins:

1. ``train.cpu_threads`` in the config (> 0);
2. ``OMP_NUM_THREADS`` in the environment (the user's; not the one ``ddp-trainer run`` passes
   its ranks, see :func:`for_launcher`);
3. the pod's CPU: its limit, else its request, as the chart passes them (downward API, in
   millicores: :data:`LIMIT_ENV`, :data:`REQUEST_ENV`), else the cgroup's CPU quota (v2
   ``cpu.max``, v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``), else the cores this process
   may run on (``sched_getaffinity``);

divided by the ranks in the pod (``LOCAL_WORLD_SIZE``, which torchrun and ``ddp-trainer run``
set; 1 without a launcher), rounded down, at least 1.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from trainer.errors import ConfigError

log = logging.getLogger(__name__)

LIMIT_ENV = "DDP_TRAINER_CPU_LIMIT_MILLICORES"
"""The container's CPU limit in millicores (the chart sets it from ``limits.cpu``)."""
REQUEST_ENV = "DDP_TRAINER_CPU_REQUEST_MILLICORES"
"""The container's CPU request in millicores (the chart sets it from ``requests.cpu``)."""
LAUNCHER_ENV = "DDP_TRAINER_OMP_FROM_LAUNCHER"
"""Set by ``ddp-trainer run`` beside the ``OMP_NUM_THREADS`` it passes its ranks: that value
is the launcher's decision, not the user's, and a rank decides again (the config may set it)."""
CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class Threads:
    count: int
    """Intra-op threads of one rank."""
    reason: str
    """Where the count comes from, for the log line."""


def decide(configured: int, ranks: int, env: Mapping[str, str] | None = None,
           cgroup_root: Path = CGROUP_ROOT) -> Threads:
    """Threads for each of `ranks` ranks in this pod (see the module's docstring)."""
    env = os.environ if env is None else env
    if configured > 0:
        return Threads(configured, f"train.cpu_threads={configured}")
    omp = env.get("OMP_NUM_THREADS", "")
    if omp and not env.get(LAUNCHER_ENV):
        try:
            count = int(omp)
        except ValueError:
            count = 0
        if count < 1:
            raise ConfigError(f"OMP_NUM_THREADS={omp!r} is not a positive integer",
                              "unset OMP_NUM_THREADS or set it to 1 or more")
        return Threads(count, f"OMP_NUM_THREADS={count}")
    cpus, source = pod_cpus(env, cgroup_root)
    ranks = max(1, ranks)
    count = max(1, int(cpus // ranks))
    return Threads(count, f"{source} {cpus:g} / {ranks} rank{'s' if ranks > 1 else ''}")


def pod_cpus(env: Mapping[str, str], cgroup_root: Path = CGROUP_ROOT) -> tuple[float, str]:
    """(CPUs this pod may use, where that comes from)."""
    for name, what in ((LIMIT_ENV, "cpu limit"), (REQUEST_ENV, "cpu request")):
        millis = _millicores(env.get(name, ""))
        if millis:
            return millis / 1000, what
    quota = cgroup_quota(cgroup_root)
    if quota is not None:
        return quota, "cgroup cpu quota"
    return float(len(os.sched_getaffinity(0))), "cores"


def _millicores(raw: str) -> int:
    try:
        return max(0, int(raw))
    except ValueError:
        return 0  # not set by the chart (or by hand, wrongly): the next source decides


def cgroup_quota(root: Path = CGROUP_ROOT) -> float | None:
    """CPUs of this cgroup's CFS quota (v2, else v1), or None where there is none."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    for folder in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        try:
            quota_us = int((root / folder / "cpu.cfs_quota_us").read_text())
            period_us = int((root / folder / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
        return quota_us / period_us if quota_us > 0 and period_us > 0 else None
    return None


def ranks_per_pod(env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    try:
        return max(1, int(env.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1  # bootstrap.plan_context reports a malformed LOCAL_WORLD_SIZE


def apply(configured: int, announce: bool) -> Threads:
    """Decide this rank's threads and set them, before its first torch op; rank 0 logs them
    once (`announce`)."""
    threads = decide(configured, ranks_per_pod())
    torch.set_num_threads(threads.count)
    if announce:
        log.info("threads: %d per rank (%s)", threads.count, threads.reason)
    return threads


def for_launcher(nproc: int) -> None:
    """What ``ddp-trainer run`` passes its `nproc` ranks: ``OMP_NUM_THREADS`` from the pod's
    CPU unless the user set it (torchrun's own default is 1 thread and a warning). A rank that
    runs ddp-trainer decides again (:func:`apply`: the config may override it); a user script
    that does not still gets its share."""
    if os.environ.get("OMP_NUM_THREADS") and not os.environ.get(LAUNCHER_ENV):
        return
    os.environ["OMP_NUM_THREADS"] = str(decide(0, nproc).count)
    os.environ[LAUNCHER_ENV] = "1"
