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

Whatever the source, a rank runs at most as many threads as the cores it may use (its affinity,
and the cgroup's quota rounded up): ``OMP_NUM_THREADS=1000`` on 2 cores ran 1000 threads, and
under a pod's process limit torch crashed (SIGSEGV) starting them. ``OMP_NUM_THREADS`` is
checked before torch's import: libgomp reads it then, and warns about a bad value on its own.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from trainer.config import MAX_CPU_THREADS
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
           cgroup_root: Path = CGROUP_ROOT, cores: int | None = None) -> Threads:
    """Threads for each of `ranks` ranks in this pod (see the module's docstring), at most
    `cores` (default: :func:`usable_cores`)."""
    env = os.environ if env is None else env
    cap = usable_cores(cgroup_root) if cores is None else cores
    if configured > 0:
        return _capped(configured, f"train.cpu_threads={configured}", cap)
    omp = users_omp(env)
    if omp is not None:
        return _capped(omp, f"OMP_NUM_THREADS={omp}", cap)
    cpus, source = pod_cpus(env, cgroup_root)
    ranks = max(1, ranks)
    count = max(1, int(cpus // ranks))
    return _capped(count, f"{source} {cpus:g} / {ranks} rank{'s' if ranks > 1 else ''}", cap)


def _capped(count: int, reason: str, cores: int) -> Threads:
    if count <= cores:
        return Threads(count, reason)
    return Threads(cores, f"{reason}, capped at the {cores} usable core{'s' if cores > 1 else ''}")


def users_omp(env: Mapping[str, str] | None = None) -> int | None:
    """The threads the user's ``OMP_NUM_THREADS`` asks for (libgomp's reading: the first of a
    comma-separated list, one per nesting level), None when unset or the launcher's; a value
    libgomp would refuse, or one above :data:`~trainer.config.MAX_CPU_THREADS`, is a
    ConfigError. Call it before torch's import to answer before libgomp's own warning."""
    env = os.environ if env is None else env
    raw = env.get("OMP_NUM_THREADS", "")
    if not raw or env.get(LAUNCHER_ENV):
        return None
    try:
        count = int(raw.split(",")[0])
    except ValueError:
        count = 0
    if not 1 <= count <= MAX_CPU_THREADS:
        shown = raw if len(raw) <= 40 else f"{raw[:40]}... ({len(raw)} characters)"
        raise ConfigError(f"OMP_NUM_THREADS={shown!r} is not a thread count in [1, "
                          f"{MAX_CPU_THREADS}]", "unset OMP_NUM_THREADS or set it to 1 or more, "
                          "at most the cores here")
    return count


def usable_cores(cgroup_root: Path = CGROUP_ROOT) -> int:
    """Cores this process may run on: its affinity, at most the cgroup's quota rounded up."""
    cores = len(os.sched_getaffinity(0))
    quota = cgroup_quota(cgroup_root)
    return cores if quota is None else max(1, min(cores, math.ceil(quota)))


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


def cgroup_throttled_seconds(root: Path = CGROUP_ROOT) -> float:
    """Seconds this cgroup's CFS quota has held its processes back so far (`cpu.stat`:
    v2 ``throttled_usec``, v1 ``throttled_time`` in ns); 0 where there is no quota or no such
    file (the kubelet's cAdvisor exports the same as
    ``container_cpu_cfs_throttled_seconds_total``, where it is scraped)."""
    for stat, key, scale in (("cpu.stat", "throttled_usec", 1e-6),
                             ("cpu/cpu.stat", "throttled_time", 1e-9),
                             ("cpu,cpuacct/cpu.stat", "throttled_time", 1e-9)):
        try:
            lines = (root / stat).read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            name, _, value = line.partition(" ")
            if name == key and value.strip().isdigit():
                return int(value) * scale
    return 0.0


def ranks_per_pod(env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    try:
        return max(1, int(env.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1  # bootstrap.plan_context reports a malformed LOCAL_WORLD_SIZE


def apply(configured: int, announce: bool) -> Threads:
    """Decide this rank's threads and set them, before its first torch op; rank 0 logs them
    once (`announce`)."""
    import torch  # here: the module is read before torch's import (users_omp)

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
    omp = users_omp()
    if omp is not None:  # the user's, at most the cores here (a script's torch reads it)
        if (capped := decide(0, 1).count) != omp:
            os.environ["OMP_NUM_THREADS"] = str(capped)
        return
    os.environ["OMP_NUM_THREADS"] = str(decide(0, nproc).count)
    os.environ[LAUNCHER_ENV] = "1"
