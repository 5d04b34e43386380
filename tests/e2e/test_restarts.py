"""Interruptions of the chart's default job (1 Master + 1 Worker, `ddp-trainer train` per
pod), restarted as the restart policy and the operator say; the results must equal the
uninterrupted run's (`default_run`, same values) exactly."""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

from tests.e2e.harness.image import BuiltImage
from tests.e2e.harness.job import Outcome, PlayedJob
from tests.e2e.harness.podman import Podman
from tests.e2e.scenario import (
    RUN_TIMEOUT,
    Run,
    checkpoints,
    played,
    rendered,
    unique_release,
)

# Two epoch-end checkpoints (chart default checkpoint.every: 0) of the ten epochs.
MID_RUN_CHECKPOINTS = 2


def mid_run(job: PlayedJob) -> int:
    """Supervise until the Master has written MID_RUN_CHECKPOINTS; the newest one's step."""
    outcome = job.supervise(RUN_TIMEOUT, until=lambda: len(checkpoints(job)) >= MID_RUN_CHECKPOINTS)
    assert outcome.phase == "Running", f"the run ended before it could be interrupted: {outcome}"
    return int(checkpoints(job)[-1].stem.split("-")[1])


def interrupted(podman: Podman, image: BuiltImage, action: Callable[[PlayedJob], None],
                *layers: dict[str, Any], release: str | None = None) -> tuple[Run, int, Any]:
    """Play the job, do `action` mid-run, supervise to the end. (run, step, action's notes)"""
    notes: dict[str, Any] = {}

    def steer(job: PlayedJob) -> Outcome:
        notes["step"] = mid_run(job)
        notes["action"] = action(job)
        outcome = job.supervise(RUN_TIMEOUT)
        # For the failure message: what each pod's /checkpoints held at the end.
        notes["checkpoints"] = {p.name: sorted(f.name for f in job.volume_dir(
            p, "checkpoints").glob("ckpt-*.pt")) for p in job.pods}
        return outcome

    chart = rendered(image, *layers, release=release)
    with played(podman, chart, steer=steer) as run:
        run.logs = f"checkpoints at the end: {notes['checkpoints']}\n{run.logs}"
        return run, notes["step"], notes["action"]


def assert_matches_uninterrupted(run: Run, baseline: Run) -> dict[str, Any]:
    assert run.outcome.phase == "Succeeded", f"{run.outcome}\n{run.logs}"
    got, want = run.summary, baseline.summary
    assert got["resumed_from_step"], f"the run did not resume from a checkpoint: {got}"
    assert got["steps"] == want["steps"]
    assert got["train_loss"] == want["train_loss"]
    assert got["val_accuracy"] == want["val_accuracy"]
    return got


def test_kill_9_of_the_worker_restarts_in_place_and_matches_the_uninterrupted_run(
        podman: Podman, image: BuiltImage, default_run: Run) -> None:
    def kill_worker(job: PlayedJob) -> None:
        job.kill(job.pod("worker-0"), signal.SIGKILL)

    run, step, _ = interrupted(podman, image, kill_worker)
    worker = run.job.pod("worker-0").name
    assert run.outcome.exits[worker][0] == 128 + signal.SIGKILL, run.outcome
    assert run.outcome.restarts >= 1  # OnFailure: restarted in place, emptyDirs kept
    got = assert_matches_uninterrupted(run, default_run)
    assert got["resumed_from_step"] >= step


def test_a_drain_stops_every_pod_with_143_and_new_pods_resume_from_the_checkpoint_pvc(
        podman: Podman, image: BuiltImage, default_run: Run) -> None:
    release = unique_release()
    claim = {"persistence": {"checkpoints": {"existingClaim": f"{release}-checkpoints"}}}

    def drain(job: PlayedJob) -> tuple[dict[str, int], int]:
        codes = job.drain()  # SIGTERM, the chart's grace period, then the pods are deleted
        stopped_at = int(checkpoints(job)[-1].stem.split("-")[1])  # on the PVC
        job.recreate()
        return codes, stopped_at

    run, step, (codes, stopped_at) = interrupted(podman, image, drain, claim, release=release)
    assert set(codes.values()) == {143}, f"{codes}\n{run.logs}"
    assert stopped_at >= step
    got = assert_matches_uninterrupted(run, default_run)
    assert got["resumed_from_step"] == stopped_at
