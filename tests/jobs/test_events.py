"""`status` shows the Warning events of the job and of what it owns: why it has no pods (the
operator's FailedCreatePod), why a pod stays Pending (the scheduler's FailedScheduling), a
TrainJob's child Job that cannot make its pods; nothing of other jobs or of an earlier job of
the same name."""

from __future__ import annotations

import datetime as dt
import re

import kmock
import pytest

from tests.jobs.cluster import BATCH_JOBS, EVENTS, T0, FakeCluster, event, job
from trainer.jobs.events import SHOWN


def warnings(out: str) -> list[list[str]]:
    """The Warnings table's rows, cells split on the three spaces between columns."""
    lines = out.split("Warnings:\n")[1].splitlines()
    assert lines[0].split() == ["AGE", "OBJECT", "REASON", "COUNT", "MESSAGE"], lines
    return [re.split(r"\s{3,}", line.strip())[1:] for line in lines[1:]]  # without AGE


def later(seconds: int) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


NO_CLASS = ('Error creating: pods "refused-master-0" is forbidden: no PriorityClass with name '
            "gold was found")


def test_a_job_without_pods_shows_the_operators_refusal_and_nothing_else(
        ddp, cluster: FakeCluster) -> None:
    cluster.add_job(job("refused", workers=1, gpus=0, state="Created"))
    cluster.add(EVENTS, event("PyTorchJob", "refused", "FailedCreatePod", NO_CLASS, later(9),
                              count=3))
    # not this job's: a Normal event, another job's, and one from before the job was made
    # (an earlier job of the same name)
    cluster.add(EVENTS, event("PyTorchJob", "refused", "SuccessfulCreateService",
                              "Created service: refused-master-0", later(8), type_="Normal"))
    cluster.add(EVENTS, event("PyTorchJob", "refused-v2", "FailedCreatePod", "other job",
                              later(9)))
    cluster.add(EVENTS, event("Pod", "mnist-master-0", "BackOff", "other job's pod", later(9)))
    cluster.add(EVENTS, event("PyTorchJob", "refused", "FailedCreatePod", "the old job's",
                              T0 - dt.timedelta(hours=1)))
    result = ddp("status", "refused")
    assert result.code == 0, result.err
    assert "Pods:\n  <none>" in result.out
    assert warnings(result.out) == [["PyTorchJob/refused", "FailedCreatePod", "3", NO_CLASS]]


def test_pods_scheduling_failures_are_shown_with_their_count_newest_last(
        ddp, cluster: FakeCluster) -> None:
    unschedulable = ("0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 "
                     "nodes are available: 3 No preemption victims found for incoming pod.")
    # the scheduler writes through events.k8s.io: eventTime and series, no count
    cluster.add(EVENTS, event("Pod", "mnist-worker-1", "FailedScheduling", unschedulable,
                              later(50), count=4, series=True))
    cluster.add(EVENTS, event("Pod", "mnist-master-0", "BackOff",
                              "Back-off restarting failed container pytorch", later(40)))
    result = ddp("status", "mnist")
    assert result.code == 0, result.err
    assert warnings(result.out) == [
        ["Pod/mnist-master-0", "BackOff", "1", "Back-off restarting failed container pytorch"],
        ["Pod/mnist-worker-1", "FailedScheduling", "4", unschedulable]]


def test_only_the_newest_warnings_are_shown(ddp, cluster: FakeCluster) -> None:
    for n in range(SHOWN + 3):
        cluster.add(EVENTS, event("PyTorchJob", "mnist", f"Reason{n}", f"message {n}",
                                  later(60 + n)))
    shown = warnings(ddp("status", "mnist").out)
    assert [row[1] for row in shown] == [f"Reason{n}" for n in range(3, SHOWN + 3)]


def test_a_trainjobs_warnings_include_its_jobset_and_child_jobs(ddp2, cluster_v2) -> None:
    def batch_job(name: str, jobset: str) -> dict[str, object]:
        return {"apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": name, "namespace": "training",
                             "labels": {"jobset.sigs.k8s.io/jobset-name": jobset}}}

    cluster_v2.add(BATCH_JOBS, batch_job("llm-node-0", "llm"))
    cluster_v2.add(BATCH_JOBS, batch_job("llm-v2-node-0", "llm-v2"))
    quota = ('Error creating: pods "llm-node-0-0-abcde" is forbidden: exceeded quota: gpus, '
             "requested: requests.nvidia.com/gpu=4, used: requests.nvidia.com/gpu=8, "
             "limited: requests.nvidia.com/gpu=8")
    cluster_v2.add(EVENTS, event("Job", "llm-node-0", "FailedCreate", quota, later(30)))
    cluster_v2.add(EVENTS, event("JobSet", "llm", "FailedCreateJob", "jobset says", later(20)))
    cluster_v2.add(EVENTS, event("Job", "llm-v2-node-0", "FailedCreate", "other", later(30)))
    result = ddp2("status", "llm")
    assert result.code == 0, result.err
    assert warnings(result.out) == [["JobSet/llm", "FailedCreateJob", "1", "jobset says"],
                                    ["Job/llm-node-0", "FailedCreate", "1", quota]]


@pytest.mark.parametrize(("status", "reason", "note"), [
    (403, "Forbidden", "not shown: not allowed to list events in namespace 'training'"),
    (500, "InternalError", "not shown: the API server answered 500 Internal Server Error to "
                           "list the events of pytorchjob mnist: etcd is down"),
])
def test_events_that_cannot_be_read_are_named_after_the_rest_of_the_status(
        ddp, cluster: FakeCluster, status: int, reason: str, note: str) -> None:
    failed = kmock.KubernetesError(status=status, reason=reason,
                                   message='events is forbidden: User "dev" cannot list'
                                   if status == 403 else "etcd is down")
    cluster.call(lambda: cluster.k["list", EVENTS] << failed)
    result = ddp("status", "mnist")
    assert result.code == 0, result.err
    assert "State:       Running" in result.out
    assert f"Warnings:\n  <{note}>" in result.out, result.out


def test_a_job_with_no_warnings_says_none(ddp) -> None:
    result = ddp("status", "mnist")
    assert result.out.rstrip().endswith("Warnings:\n  <none>")
