"""What the scenarios share: chart values for our image, one played run, its results."""

from __future__ import annotations

import json
import os
import secrets
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.e2e.harness.chart import Rendered, merge_values, render
from tests.e2e.harness.image import BuiltImage
from tests.e2e.harness.job import Outcome, PlayedJob
from tests.e2e.harness.podman import Podman
from tests.e2e.harness.prometheus import PodMonitorPrometheus

NAMESPACE = "e2e"
# Two trainer settings sized for tests, every other one is the chart's default: a stuck
# collective fails after 60 s instead of 600 s (a failing scenario reports in about a
# minute), and the final metrics are served for 3 s (three 1 s scrape intervals, see
# scrape.SCRAPE_VALUES) instead of 60 s after a run.
TEST_TIMINGS = {"trainerConfig": {"dist": {"timeout_seconds": 60},
                                  "metrics": {"linger_seconds": 3}}}
RUN_TIMEOUT = 300.0


def unique_release() -> str:
    """Release names are unique per run: other worktrees may share this machine's podman."""
    return f"e2e-{secrets.token_hex(3)}"


def chart_values(image: BuiltImage, *layers: Mapping[str, Any]) -> dict[str, Any]:
    """The chart's defaults with our image, CPU only (``gpusPerReplica: 0``), then `layers`."""
    repository, tag = image.ref.rsplit(":", 1)
    return merge_values({"image": {"repository": repository, "tag": tag},
                         "gpusPerReplica": 0}, TEST_TIMINGS, *layers)


def rendered(image: BuiltImage, *layers: Mapping[str, Any],
             release: str | None = None) -> Rendered:
    return render(chart_values(image, *layers), release or unique_release(), NAMESPACE)


def read_json(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def checkpoints(job: PlayedJob) -> list[Path]:
    """The Master's checkpoints, oldest first (rank 0 writes them)."""
    directory = job.volume_dir(job.pod("master-0"), "checkpoints")
    return sorted(directory.glob("ckpt-*.pt"))


def summary(job: PlayedJob) -> dict[str, Any] | None:
    """The Master's summary.json (None when it wrote none)."""
    path = job.volume_dir(job.pod("master-0"), "outputs") / "summary.json"
    return read_json(path) if path.exists() else None


def evaluate(podman: Podman, image: BuiltImage, job: PlayedJob, checkpoint: Path,
             out: Path) -> dict[str, Any]:
    """``ddp-trainer evaluate`` of a Master checkpoint, in the image, as the pods run it
    (UID 10001, read-only root, no capabilities, no network: one process)."""
    volume = job.pod("master-0").podman_volume("checkpoints")
    out.mkdir(parents=True, exist_ok=True)
    os.chown(out, 10001, 10001)
    podman.run("run", "--rm", "--read-only", "--user", "10001:10001", "--cap-drop", "ALL",
               "--security-opt", "no-new-privileges", "--network", "none",
               "--volume", f"{volume}:/checkpoints:ro", "--volume", f"{out}:/outputs",
               image.ref, "evaluate", "--checkpoint", f"/checkpoints/{checkpoint.name}",
               "--output-dir", "/outputs")
    return read_json(out / "eval.json")


@dataclass
class Run:
    """A played job and what came out of it."""

    job: PlayedJob
    outcome: Outcome
    window: tuple[float, float]  # unix times of the start and the end, for range queries
    logs: str  # every pod's trainer output, for failure messages
    prometheus: PodMonitorPrometheus | None = None
    written: dict[str, Any] | None = None  # the Master's summary.json at the end

    @property
    def summary(self) -> dict[str, Any]:
        assert self.written is not None, f"the Master wrote no summary.json\n{self.logs}"
        return self.written


@contextmanager
def played(podman: Podman, rendered_chart: Rendered, *, scrape: bool = False,
           timeout: float = RUN_TIMEOUT,
           steer: Callable[[PlayedJob], Outcome] | None = None) -> Iterator[Run]:
    """Play the job to its end (or let `steer` drive it); tear everything down after."""
    with tempfile.TemporaryDirectory(prefix="e2e-prom-") as tmp:
        prom = (PodMonitorPrometheus(rendered_chart.one("PodMonitor"), Path(tmp))
                if scrape else None)
        try:
            if prom is not None:
                prom.start()
            with PlayedJob(podman, rendered_chart,
                           on_change=prom.refresh if prom is not None else None) as job:
                started = time.time()
                job.start()
                outcome = steer(job) if steer is not None else job.supervise(timeout)
                yield Run(job, outcome, (started, time.time()), job.all_logs(), prom,
                          summary(job))
        finally:
            if prom is not None:
                prom.stop()
