"""`ddp-trainer jobs` on the chart's TrainJobs, run by the real Kubeflow Trainer v2.3.0 and JobSet:
list, status (runtime and trainerStatus), logs by rank, wait, delete; suspend really deletes the
pods, resume brings them back, and training resumes from the ReadWriteMany checkpoint claim to
exactly the uninterrupted run's numbers. And the Kubeflow SDK's TrainerClient (`kubeflow` 0.5.0)
lists, reads, waits on and reads the logs of the chart's TrainJob."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.cluster import sdk
from tests.cluster.helm import Release, release_name
from tests.cluster.jobs import (
    KEEP_RESULTS,
    MID_RUN,
    SHORT,
    TRAINJOB,
    assert_logs_by_rank,
    assert_same_as,
    finished,
    jobs,
    wait_for_checkpoints,
    wait_until,
    waited_by_the_cli,
)
from tests.cluster.kube import STATE, Cluster, merged

# 30 short epochs: the suspension comes after the second checkpoint, and the uninterrupted
# run beside it shares the two cores.
SUSPENDED: dict[str, Any] = {"trainerConfig": {
    "train": {"epochs": 30}, "checkpoint": {"every_seconds": 0},  # epoch-end checkpoints
    "dist": {"timeout_seconds": 60}, "metrics": {"linger_seconds": 0}}}


def trainjob(cluster: Cluster, prefix: str, *layers: dict[str, Any]) -> Release:
    return Release(cluster, release_name(), cluster.namespace(prefix),
                   merged(TRAINJOB, *layers))


def node_pods(release: Release) -> list[str]:
    out = release.cluster.kubectl(
        "get", "pods", "-n", release.namespace, "-l",
        f"jobset.sigs.k8s.io/jobset-name={release.job}",
        "-o", "jsonpath={.items[*].metadata.name}").stdout
    return out.split()


@pytest.fixture(scope="module")
def done(cluster: Cluster, chart_ref: str, tmp_path_factory: pytest.TempPathFactory) -> Release:
    """A chart TrainJob run to the end, waited for by `jobs wait`."""
    return waited_by_the_cli(trainjob(cluster, "tjcli", SHORT), chart_ref,
                             tmp_path_factory.mktemp("done"))


def test_list_status_and_logs_show_the_finished_trainjob(done: Release) -> None:
    ns = done.namespace
    listed = jobs("list", "-n", ns)
    assert listed.returncode == 0, listed.stderr
    (row,) = [line for line in listed.stdout.splitlines() if done.job in line]
    assert "Succeeded" in row.split() and "TrainJob" in row.split()
    status = jobs("status", done.job, "-n", ns)
    assert status.returncode == 0, status.stderr
    assert "ClusterTrainingRuntime/torch-distributed" in status.stdout, status.stdout
    assert "100" in status.stdout and "val_accuracy" in status.stdout, status.stdout
    for pod in node_pods(done):
        assert pod in status.stdout
    assert_logs_by_rank(done)
    only = jobs("logs", done.job, "-n", ns, "--rank", "1")
    assert only.returncode == 0 and "[rank 0]" not in only.stdout, only.stdout[-2000:]


def test_suspend_deletes_the_pods_and_resume_ends_as_uninterrupted(
        cluster: Cluster, chart_ref: str, tmp_path: Path) -> None:
    # The uninterrupted run and the suspended one side by side (same values, same seed).
    base = trainjob(cluster, "tjbase", SUSPENDED, KEEP_RESULTS)
    base.install(chart_ref, tmp=tmp_path)
    release = trainjob(cluster, "tjsuspend", SUSPENDED, KEEP_RESULTS)
    release.install(chart_ref, tmp=tmp_path)
    ns = release.namespace
    step = wait_for_checkpoints(release, MID_RUN)
    suspended = jobs("suspend", release.job, "-n", ns)
    assert suspended.returncode == 0, suspended.stderr
    wait_until(lambda: not node_pods(release), "the TrainJob's pods deleted by the suspension")
    listed = jobs("list", "-n", ns)
    assert "Suspended" in listed.stdout, listed.stdout
    resumed = jobs("resume", release.job, "-n", ns)
    assert resumed.returncode == 0, resumed.stderr
    waited = jobs("wait", release.job, "-n", ns, timeout=600)
    assert waited.returncode == 0, waited.stderr
    got = finished(release)
    assert_same_as(got, finished(base))
    assert got.summary["resumed_from_step"] >= step
    deleted = jobs("delete", release.job, "-n", ns)
    assert deleted.returncode == 0, deleted.stderr
    gone = cluster.kubectl("get", "trainjob", release.job, "-n", ns, check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr


TRAINER_SDK = """
from kubeflow.trainer import KubernetesBackendConfig, TrainerClient
client = TrainerClient(KubernetesBackendConfig(namespace=namespace, config_file=config))
listed = [job.name for job in client.list_jobs()]
job = client.get_job(name)
waited = client.wait_for_job_status(name, status={"Complete"}, timeout=60, polling_interval=1)
print(json.dumps({"listed": listed, "status": job.status, "nodes": job.num_nodes,
                  "runtime": job.runtime.name, "waited": waited.status,
                  "logs": list(client.get_job_logs(name))}))
"""


def test_the_kubeflow_trainer_sdk_reads_and_waits_on_the_charts_trainjob(done: Release) -> None:
    got = sdk.run(TRAINER_SDK, extra="trainer-sdk", config=str(STATE / "kubeconfig"),
                  namespace=done.namespace, name=done.job)
    assert done.job in got["listed"]
    assert (got["status"], got["waited"]) == ("Complete", "Complete")
    assert (got["nodes"], got["runtime"]) == (2, "torch-distributed")
    # Node 0's log: rank 0's lines, the last one the summary.
    assert any(line.startswith("[rank 0] INFO done:") for line in got["logs"]), got["logs"][-5:]
