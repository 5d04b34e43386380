"""Interruptions of the chart's job on the real cluster, recovered by the real operator and
kubelet; each run must end with exactly the uninterrupted run's numbers (same values, same
seed). And what the v1.9.4 operator really does under `restartPolicy: ExitCode`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.cluster.helm import Release, release_name
from tests.cluster.jobs import (
    FAILOVER,
    KEEP_OUTPUTS,
    KEEP_RESULTS,
    MID_RUN,
    USER_MODULE,
    Finished,
    assert_same_as,
    finished,
    kill_container,
    kill_containers,
    master_checkpoints,
    restarts,
    status_terminations,
    terminated,
    uid,
    wait_for_checkpoints,
    wait_until,
)
from tests.cluster.kube import Cluster, KubectlError, merged, restart_process
from tests.cluster.monitoring import FAST_SCRAPES, alerts_values, job_alerts, wait_for_alert


def run(cluster: Cluster, chart_ref: str, tmp: Path, prefix: str,
        *layers: dict[str, Any]) -> Release:
    release = Release(cluster, release_name(), cluster.namespace(prefix),
                      merged(FAILOVER, *layers))
    release.install(chart_ref, tmp=tmp)
    return release


def test_a_deleted_worker_pod_is_recreated_and_the_run_ends_as_uninterrupted(
        cluster: Cluster, chart_ref: str, tmp_path: Path, uninterrupted: Finished) -> None:
    release = run(cluster, chart_ref, tmp_path, "delworker", KEEP_OUTPUTS)
    step = wait_for_checkpoints(release, MID_RUN)
    worker = uid(release, "worker")
    cluster.kubectl("delete", "pod", release.pod("worker"), "-n", release.namespace,
                    "--wait=false")
    # A new Worker pod (the operator's), the Master restarted in place (its emptyDir kept).
    wait_until(lambda: uid(release, "worker") not in (None, worker), "a new Worker pod")
    got = finished(release)
    assert_same_as(got, uninterrupted)
    assert got.summary["resumed_from_step"] >= step
    assert restarts(release, release.pod("master"))[0] >= 1


def test_an_fsdp_job_resumes_from_its_sharded_checkpoint_as_uninterrupted(
        cluster: Cluster, chart_ref: str, tmp_path: Path) -> None:
    # train.strategy fsdp with the checkpoints on a claim both pods mount (one node here):
    # each rank writes its shard (ckpt-<step>.dcp). The Worker pod deleted mid-run; the job
    # ends with exactly the numbers of the same run uninterrupted, which runs beside it.
    # 30 epochs: FSDP's sharded save at each epoch's end makes an epoch ~2 s here (150 took
    # 5 min with the two jobs side by side, 60 took 168 s); the Worker goes after the second
    fsdp = {"trainerConfig": {"train": {"strategy": "fsdp", "epochs": 30}}}
    base = run(cluster, chart_ref, tmp_path, "fsdpbase", KEEP_RESULTS, fsdp)
    release = run(cluster, chart_ref, tmp_path, "fsdpdel", KEEP_RESULTS, fsdp)
    step = wait_for_checkpoints(release, MID_RUN)
    assert all(f.suffix == ".dcp" and (f / "COMPLETE").is_file()
               for f in master_checkpoints(release)), master_checkpoints(release)
    worker = uid(release, "worker")
    cluster.kubectl("delete", "pod", release.pod("worker"), "-n", release.namespace,
                    "--wait=false")
    wait_until(lambda: uid(release, "worker") not in (None, worker), "a new Worker pod")
    got, want = finished(release), finished(base)
    want.assert_agrees()
    assert_same_as(got, want)
    assert got.summary["resumed_from_step"] >= step
    for done in (base, release):
        cluster.kubectl("delete", "namespace", done.namespace, "--wait=false")


def test_a_sigkilled_worker_restarts_in_place_and_the_run_ends_as_uninterrupted(
        cluster: Cluster, chart_ref: str, tmp_path: Path, uninterrupted: Finished) -> None:
    release = run(cluster, chart_ref, tmp_path, "sigkill", KEEP_OUTPUTS)
    step = wait_for_checkpoints(release, MID_RUN)
    kill_container(release, release.pod("worker"))
    # Restarted in place by the kubelet, the kill's status kept as its last state (read now:
    # cleanPodPolicy Running deletes a Worker still running when the Master completes).
    wait_until(lambda: restarts(release, release.pod("worker")) == (1, 137),
               "the Worker restarted in place after exit 137")
    got = finished(release)
    assert_same_as(got, uninterrupted)
    assert got.summary["resumed_from_step"] >= step


def test_every_pod_deleted_resumes_from_the_checkpoint_claim_as_uninterrupted_and_alerts(
        cluster: Cluster, chart_ref: str, tmp_path: Path, uninterrupted: Finished) -> None:
    # DDPTrainerRestarting at its default, one restart: the pods made anew are new series
    # (new pod IPs) that start at the ranks' restart count, 1, kept on the claim. Resumed, they
    # train for only about 10 s: scraped every 5 s and serving on for 20 s after training,
    # their count is scraped (a CI run with 15 s scrapes and no linger never saw it).
    release = run(cluster, chart_ref, tmp_path, "drain", KEEP_RESULTS, FAST_SCRAPES,
                  {"trainerConfig": {"metrics": {"linger_seconds": 20}}})
    step = wait_for_checkpoints(release, MID_RUN)
    cluster.kubectl("delete", "pod", "-n", release.namespace, "-l",
                    f"training.kubeflow.org/job-name={release.job}", "--wait=false")
    got = finished(release)
    assert_same_as(got, uninterrupted)
    assert got.summary["resumed_from_step"] >= step
    alert = wait_for_alert(release, "DDPTrainerRestarting")
    assert float(alert["value"]) == 1.0, alert


def test_a_stopped_rank_fires_the_stall_alert_and_continued_ends_as_uninterrupted(
        cluster: Cluster, chart_ref: str, tmp_path: Path, uninterrupted: Finished) -> None:
    # A rank frozen mid-run (SIGSTOP of the Worker's trainer: a hung collective or data
    # loader looks the same from outside): the Master waits in the all-reduce, no rank steps,
    # and the stall alert fires after 10 s + 5 s instead of 10 min + 2 min; the collective
    # timeout is raised so that the wait outlasts the alert. Continued (SIGCONT), the run
    # ends without a restart and with the uninterrupted numbers; the alert resolves.
    release = run(cluster, chart_ref, tmp_path, "stall", KEEP_OUTPUTS,
                  {"trainerConfig": {"dist": {"timeout_seconds": 180}}},
                  alerts_values(stalled={"seconds": 10, "for": "5s"}))
    wait_for_checkpoints(release, MID_RUN)
    worker = release.pod("worker")
    kill_container(release, worker, "SIGSTOP")
    try:
        alert = wait_for_alert(release, "DDPTrainerTrainingStalled", timeout=150)
    finally:
        kill_container(release, worker, "SIGCONT")
    assert float(alert["value"]) > 10, alert
    wait_until(lambda: not job_alerts(release, "DDPTrainerTrainingStalled"),
               "the stall alert resolved")
    got = finished(release)
    assert_same_as(got, uninterrupted, resumed=False)
    assert restarts(release, release.pod("master"))[0] == 0


def test_the_operator_and_the_api_server_restarted_mid_run_leave_training_untouched(
        cluster: Cluster, chart_ref: str, tmp_path: Path, uninterrupted: Finished) -> None:
    release = run(cluster, chart_ref, tmp_path, "ctrlplane", KEEP_OUTPUTS)
    wait_for_checkpoints(release, MID_RUN)
    restart_process("training-operator")
    restart_process("kube-apiserver")
    newest = master_checkpoints(release)[-1]
    assert int(newest.stem.split("-")[1]) < uninterrupted.summary["steps"], \
        "the run ended before both restarts: nothing was proven"
    got = finished(release)
    # Not resumed: no rank restarted (a restart of any rank restarts all from a checkpoint).
    assert_same_as(got, uninterrupted, resumed=False)
    assert restarts(release, release.pod("master"))[0] == 0


# `restartPolicy: ExitCode` as the v1.9.4 operator implements it (pkg/controller.v1/common/
# pod.go ReconcilePods, common/job.go ReconcileJobs, pkg/core/job.go PastBackoffLimit): the
# pods get `restartPolicy: Never`; a pod that failed with an exit code >= 128 is deleted and
# made anew, one that failed with 1-127 fails the job at once. `backoffLimit` fails the job on
# a new failed pod only when the job key's requeue count + 1 exceeds it: with 0, the first
# failed pod ends the job; with 1 or more, recreations are not counted (the requeue count is
# the reconcile loop's error retries, normally 0). The in-place restart counts it also sums
# are always 0 under ExitCode.
EXIT_CODE: dict[str, Any] = {"restartPolicy": "ExitCode"}


def sigterm_every_pod(release: Release) -> dict[str, str | None]:
    """SIGTERM to each trainer as the kubelet sends it on preemption: every rank stops at the
    same step and exits 143. The pods' uids before."""
    before = {replica: uid(release, replica) for replica in ("master", "worker")}
    kill_containers(release, [release.pod(replica) for replica in before], "SIGTERM")
    return before


def wait_for_new_pods(release: Release, before: dict[str, str | None]) -> None:
    for replica, old in before.items():
        wait_until(lambda r=replica, o=old: uid(release, r) not in (None, o),
                   f"a new {replica} pod")


def test_exit_code_policy_recreates_pods_that_exit_143_uncounted_by_backoff_limit_1(
        cluster: Cluster, chart_ref: str, tmp_path: Path, uninterrupted: Finished) -> None:
    release = run(cluster, chart_ref, tmp_path, "exit143", KEEP_RESULTS, EXIT_CODE,
                  {"runPolicy": {"backoffLimit": 1}})
    wait_for_checkpoints(release, MID_RUN)
    # Two preemptions of the whole job, each one recreating both pods: four failed pods.
    wait_for_new_pods(release, sigterm_every_pod(release))
    stopped = wait_for_checkpoints(release, 1)  # the newest: where SIGTERM stopped the ranks
    wait_for_checkpoints(release, 1, after=stopped)  # the new pods train on
    wait_for_new_pods(release, sigterm_every_pod(release))
    got = finished(release)
    assert_same_as(got, uninterrupted)
    assert got.summary["resumed_from_step"] > stopped
    assert restarts(release, release.pod("master"))[0] == 0  # made anew, never restarted


def test_exit_code_policy_with_backoff_limit_0_fails_on_the_first_failed_pod(
        cluster: Cluster, chart_ref: str, tmp_path: Path) -> None:
    release = run(cluster, chart_ref, tmp_path, "backoff0", KEEP_OUTPUTS, EXIT_CODE,
                  {"runPolicy": {"backoffLimit": 0}})
    wait_for_checkpoints(release, MID_RUN)
    sigterm_every_pod(release)
    release.wait_condition("Failed")
    job = cluster.get("pytorchjob", release.job, release.namespace)
    (failed,) = [c for c in job["status"]["conditions"] if c["type"] == "Failed"]
    assert "backoff limit" in failed["message"], failed


def test_exit_code_policy_fails_the_job_at_once_on_exit_3(
        cluster: Cluster, chart_ref: str, tmp_path: Path) -> None:
    # A diverging learning rate: every rank exits 3, a permanent failure (1-127).
    release = run(cluster, chart_ref, tmp_path, "exit3", KEEP_OUTPUTS, EXIT_CODE,
                  {"trainerConfig": {"optim": {"lr": 1.0e30}},  # rendered `1e+30`
                   "runPolicy": {"backoffLimit": 5}})
    release.wait_condition("Failed")
    # The first rank to exit 3 failed the job at once; a rank still running then was deleted
    # by the chart's cleanPodPolicy (Running). What is left exited 3, neither restarted nor
    # made anew.
    kept = []
    for replica in ("master", "worker"):
        try:
            pod = cluster.get("pod", release.pod(replica), release.namespace)
        except KubectlError:  # deleted
            continue
        if pod["metadata"].get("deletionTimestamp"):
            continue
        (status,) = pod["status"]["containerStatuses"]
        assert status["state"]["terminated"]["exitCode"] == 3, status
        assert status["restartCount"] == 0
        kept.append(release.pod(replica))
    assert kept, "no pod of the failed job is left"
    log = cluster.logs(kept[0], release.namespace)
    assert "loss became" in log, log[-2000:]
    # The rank's error line is its container's termination message, classed by `jobs status`.
    line = terminated(release, kept[0])["message"].strip()
    assert "error: training loss became" in line and line in log, (line, log[-2000:])
    assert status_terminations(release)[kept[0]][2:4] == ["3", "diverged"]


def test_exit_code_policy_a_sigkilled_worker_fails_the_job_through_the_masters_exit_4(
        cluster: Cluster, chart_ref: str, tmp_path: Path) -> None:
    # The killed Worker's 137 is retryable, but the Master sees its peer vanish and exits 4
    # (lost rank), which ExitCode takes as permanent: under ExitCode a killed rank ends the
    # job. OnFailure (the default) recovers from it (the SIGKILL test above).
    release = run(cluster, chart_ref, tmp_path, "exit137", KEEP_OUTPUTS, EXIT_CODE)
    wait_for_checkpoints(release, MID_RUN)
    kill_container(release, release.pod("worker"))
    release.wait_condition("Failed")
    master = cluster.get("pod", release.pod("master"), release.namespace)
    (status,) = master["status"]["containerStatuses"]
    assert status["state"]["terminated"]["exitCode"] == 4, status
    line = status["state"]["terminated"]["message"]
    assert "error: " in line and "(fix: " in line, status
    cells = status_terminations(release)[release.pod("master")]
    assert cells[2:4] == ["4", "lost peer"] and cells[6] == line.strip(), cells


# Why a rank failed, where users look: each class of exit in the container's termination
# message (`kubectl describe pod`) and `jobs status`. Four Master-only jobs at once, never
# restarted; exit 3 and exit 4 are the ExitCode tests' above.
ALONE: dict[str, Any] = {"worker": {"replicas": 0}, "restartPolicy": "Never"}
BOOM = """
import torch
from torch import nn


class Boom(nn.Module):
    # Passes the trainer's one-batch check (eval mode); raises in the first training step.
    def __init__(self, num_classes=10):
        super().__init__()
        self.num_classes = num_classes
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, x):
        if self.training:
            raise ValueError("boom: the user's model failed in training")
        return self.scale * torch.zeros(x.shape[0], self.num_classes)


class Hog(Boom):
    # 1.6 GB of activations on the first forward (the trainer's one-batch check).
    def forward(self, x):
        return super().forward(x) + torch.ones(400_000_000)[0]
"""
USER_CODE = merged(USER_MODULE, {"trainerConfig": {"model": {"name": "boom:Boom"}}})
# A model whose forward allocates 1.6 GB under a 1 GiB limit: the kernel's OOM killer ends the
# trainer before it can say anything. (Built-in models too large for the memory left fail
# before they are built, exit 2: trainer/components/models.py.)
OOM = merged(USER_MODULE, {"trainerConfig": {"model": {"name": "boom:Hog"}},
                           "resources": {"limits": {"memory": "1Gi"}}})
# (exit code, class in `jobs status`, text of the error line; None: no line, killed)
CLASSES: dict[str, tuple[dict[str, Any], tuple[int, str, str | None]]] = {
    "config": ({"extraArgs": ["--set", "train.epochs=many"]}, (2, "config", "train.epochs")),
    "usercode": (USER_CODE, (5, "user code", "user code raised ValueError: boom")),
    "sigterm": ({}, (143, "preempted", "stopped by SIGTERM at step")),
    "oom": (OOM, (137, "OOM-killed", None)),
}


def test_each_exit_class_is_the_termination_message_and_named_by_jobs_status(
        cluster: Cluster, chart_ref: str, tmp_path: Path) -> None:
    releases: dict[str, Release] = {}
    for key, (values, _) in CLASSES.items():
        namespace = cluster.namespace(key)
        if key in ("usercode", "oom"):
            cluster.apply({"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": {"name": "boom", "namespace": namespace},
                           "data": {"boom.py": BOOM}})
        releases[key] = Release(cluster, release_name(), namespace,
                                merged(FAILOVER, ALONE, values))
        releases[key].install(chart_ref, tmp=tmp_path)
    wait_for_checkpoints(releases["sigterm"], 1)
    kill_container(releases["sigterm"], releases["sigterm"].pod("master"), "SIGTERM")
    for key, release in releases.items():
        release.wait_condition("Failed")
        code, name, text = CLASSES[key][1]
        master = release.pod("master")
        ended = terminated(release, master)
        assert ended["exitCode"] == code, (key, ended)
        cells = status_terminations(release)[master]
        assert cells[2:4] == [str(code), name], (key, cells)
        if text is None:  # killed: the reason says why; the message is the log's tail
            assert ended["reason"] == "OOMKilled", (key, ended)
            continue
        line = ended["message"].strip()
        assert line.startswith("[rank 0] error: ") and text in line and "(fix: " in line, \
            (key, ended)
        assert cells[6] == line, (key, cells)
    described = cluster.kubectl("describe", "pod", releases["config"].pod("master"), "-n",
                                releases["config"].namespace).stdout
    assert "train.epochs" in described, described
    for release in releases.values():
        cluster.kubectl("delete", "namespace", release.namespace, "--wait=false")
