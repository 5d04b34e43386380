"""Hangs on the real cluster (docs/distributed.md#hangs): a rank stuck where the trainer cannot
see it is named by the watchdogs within `dist.hang_seconds`, in each pod's termination message,
the `DDPTrainerRankHung` alert, a Warning Event on the job and `jobs status`; every rank exits
142 and the job, restarted by its operator, ends exactly as uninterrupted. The user's code that
hangs is tests/fixtures/hangs.py, mounted from a ConfigMap (each hangs once per pod: a file
beside the pod's checkpoints marks it)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.helm import Release, release_name
from tests.cluster.jobs import (
    FAILOVER,
    KEEP_OUTPUTS,
    MID_RUN,
    USER_MODULE,
    Finished,
    assert_same_as,
    checkpoint_folder,
    finished,
    jobs,
    master_checkpoints,
    wait_for_checkpoints,
    wait_until,
)
from tests.cluster.kube import Cluster, KubectlError, merged
from tests.cluster.monitoring import FAST_SCRAPES, wait_for_alert

HANG_CODE = (Path(__file__).resolve().parents[1] / "fixtures" / "hangs.py").read_text()
# 15 s without a rank moving is a hang here (the digits step takes milliseconds); the verdict's
# trainer_hung is served 10 s for the alert's scrapes before the ranks leave.
WATCHED: dict[str, Any] = merged(FAILOVER, KEEP_OUTPUTS, FAST_SCRAPES, {"trainerConfig": {
    "dist": {"hang_seconds": 15}, "metrics": {"linger_seconds": 10}}})
HUNG_ONCE: dict[str, Any] = merged(WATCHED, USER_MODULE, {
    "env": [{"name": "PYTHONPATH", "value": "/user"}, {"name": "HANG_AT", "value": "400"},
            {"name": "HANG_ONCE", "value": "/checkpoints/hung-once"}]})


def with_user_code(cluster: Cluster, prefix: str) -> str:
    """A namespace holding hangs.py as the ConfigMap USER_MODULE mounts."""
    namespace = cluster.namespace(prefix)
    cluster.apply({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "boom", "namespace": namespace},
                   "data": {"hangs.py": HANG_CODE}})
    return namespace


def rank_pods(release: Release) -> list[str]:
    """The job's pods by node rank: Master and Worker, or the TrainJob's nodes 0 and 1
    (JobSet's Job pods, named with a random suffix)."""
    if release.kind == "pytorchjob":
        return [release.pod("master"), release.pod("worker")]
    return [release.cluster.kubectl(
        "get", "pods", "-n", release.namespace, "-l",
        f"jobset.sigs.k8s.io/jobset-name={release.job},"
        f"batch.kubernetes.io/job-completion-index={index}",
        "-o", "jsonpath={.items[0].metadata.name}").stdout for index in (0, 1)]


def hung_attempts(release: Release) -> dict[str, dict[str, Any]]:
    """Once both ranks' containers were restarted: each pod's hung attempt's end (its
    container's last state), read while the pods exist (the operator may delete them once the
    job has succeeded)."""
    ended: dict[str, dict[str, Any]] = {}

    def restarted() -> bool:
        for pod in rank_pods(release):
            with contextlib.suppress(KubectlError):
                (container,) = release.cluster.get(
                    "pod", pod, release.namespace)["status"]["containerStatuses"]
                last = container.get("lastState", {}).get("terminated")
                if last:
                    ended[pod] = last
        return len(ended) == 2

    wait_until(restarted, "both ranks' containers restarted after the hang")
    return ended


def assert_named_everywhere_and_resumed(release: Release, ended: dict[str, dict[str, Any]],
                                        *said: str, want: Finished, hung: int = 1) -> None:
    """Every pod's hung attempt exited 142 with the verdict naming rank `hung`, its peer
    waiting for it, and `said`; the job ended with `want`'s numbers; `jobs status` and
    `kubectl describe` show the hang."""
    for pod, last in ended.items():
        assert last["exitCode"] == 142, (pod, last)
        line = last["message"].strip()
        assert line.startswith(f"error: hang: rank {hung} (pod ") \
            and f"rank {1 - hung} waits for it" in line and all(part in line for part in said), \
            (pod, line, said)
    assert_same_as(finished(release), want)
    status = jobs("status", release.job, "-n", release.namespace).stdout
    assert f"Hung:        rank {hung} (pod " in status, status
    # the Warning event on the job (the chart's Role: create events, get the job)
    warnings = status.split("Warnings:")[1]
    assert f"/{release.job}" in warnings and "RankHung" in warnings, status
    described = release.cluster.kubectl("describe", release.kind, release.job, "-n",
                                        release.namespace).stdout
    assert "RankHung" in described, described


# Each kind with another hang: the Worker sleeping in the user's step (the verdict names the
# innermost user function, the step's `_block`); the TrainJob's node 1 calling a barrier its
# peer never calls (a desync), named at its line in `desync_step`.
@pytest.mark.parametrize(("kind", "step", "named"), [("PyTorchJob", "step", "_block"),
                                                     ("TrainJob", "desync_step", "desync_step")])
def test_a_rank_hung_in_user_code_is_named_alerted_and_the_job_resumes_as_uninterrupted(
        cluster: Cluster, chart_ref: str, tmp_path: Path, uninterrupted: Finished,
        kind: str, step: str, named: str) -> None:
    # The Worker (rank 1) blocks for ever in the user's step at its 400th call. Its watchdog
    # and the Master's find no rank moving for 15 s, print their stacks, leave the verdict as
    # each pod's termination message and exit 142; OnFailure restarts both containers, which
    # resume from the Master's newest checkpoint.
    namespace = with_user_code(cluster, "hang")
    release = Release(cluster, release_name(), namespace, merged(
        HUNG_ONCE, {"apiKind": kind, "trainerConfig": {"train": {"step": f"hangs:{step}"}}}))
    release.install(chart_ref, tmp=tmp_path)
    alert = wait_for_alert(release, "DDPTrainerRankHung", timeout=240, labels={"rank": "1"})
    assert alert["labels"]["phase"] == "step", alert
    assert_named_everywhere_and_resumed(release, hung_attempts(release), "in user code",
                                        "hangs.py:", f"in {named}", want=uninterrupted)
    cluster.kubectl("delete", "namespace", namespace, "--wait=false")


def test_a_dataloader_worker_stuck_in_the_dataset_is_named_and_the_job_resumes_as_uninterrupted(
        cluster: Cluster, chart_ref: str, tmp_path: Path) -> None:
    # The Worker's DataLoader worker (one per rank) blocks for ever in the dataset's
    # __getitem__ at its 400th item: rank 1 waits for a batch that never comes. The verdict
    # names that wait and the workers; the stuck worker's own stack, which the watchdog has it
    # print, shows the dataset's line in the Worker's log. The same job without the hang runs
    # beside it: the numbers to end with.
    namespace = with_user_code(cluster, "hangdata")
    data = {"trainerConfig": {"data": {"dataset": "hangs:blocking_dataset", "num_workers": 1}}}
    never = [*HUNG_ONCE["env"], {"name": "HANG_RANK", "value": "-1"}]  # lists are replaced
    base = Release(cluster, release_name(), namespace, merged(HUNG_ONCE, data, {"env": never}))
    release = Release(cluster, release_name(), namespace, merged(HUNG_ONCE, data))
    for each in (base, release):
        each.install(chart_ref, tmp=tmp_path)
    alert = wait_for_alert(release, "DDPTrainerRankHung", timeout=240, labels={"rank": "1"})
    assert alert["labels"]["phase"] == "data", alert
    ended = hung_attempts(release)
    worker_log = cluster.kubectl("logs", release.pod("worker"), "-n", namespace,
                                 "--previous").stdout
    assert "hangs.py\", line " in worker_log and "in __getitem__" in worker_log, \
        worker_log[-4000:]
    want = finished(base)
    want.assert_agrees()
    assert_named_everywhere_and_resumed(release, ended, "waiting for its next batch",
                                        "DataLoader workers", want=want)
    cluster.kubectl("delete", "namespace", namespace, "--wait=false")


def test_a_checkpoint_write_that_blocks_is_named_on_rank_0_and_the_job_resumes_as_uninterrupted(
        cluster: Cluster, chart_ref: str, tmp_path: Path, uninterrupted: Finished) -> None:
    # A FIFO where the Master's writer will find the checkpoint of a later epoch's end (an open
    # that blocks, as on a hung network volume): the writer thread blocks, rank 0's next save
    # waits for it, rank 1 waits for rank 0. Once the hang is named the FIFO goes (the volume
    # is back): the restarted ranks resume from the newest checkpoint before it.
    release = Release(cluster, release_name(), cluster.namespace("hangsave"), WATCHED)
    release.install(chart_ref, tmp=tmp_path)
    wait_for_checkpoints(release, MID_RUN)
    folder = checkpoint_folder(release)
    assert folder is not None
    written = master_checkpoints(release)[-2:]
    older, newest = (int(f.stem.split("-")[1]) for f in written)
    # 40 epochs on (of 150, ~5 s here): still ahead when the FIFO is made
    fifo = folder / f"ckpt-{newest + 40 * (newest - older):09d}.pt"
    os.mkfifo(fifo, 0o660)
    owner = written[-1].stat()
    os.chown(fifo, owner.st_uid, owner.st_gid)  # the trainer's, as its own file would be
    try:
        alert = wait_for_alert(release, "DDPTrainerRankHung", timeout=240, labels={"rank": "0"})
    finally:
        fifo.unlink()
    assert alert["labels"]["phase"] == "checkpoint", alert
    assert_named_everywhere_and_resumed(
        release, hung_attempts(release), "saving a checkpoint", "check the checkpoint storage",
        want=uninterrupted, hung=0)
    cluster.kubectl("delete", "namespace", release.namespace, "--wait=false")
