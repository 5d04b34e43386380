"""list / status / logs / wait / delete / suspend / resume against the API emulator."""

from __future__ import annotations

import re
import threading
import time

from tests.jobs.cluster import T0, FakeCluster, PodLog, condition, pod


def test_list_shows_state_age_replicas_and_gpus_of_each_job(ddp) -> None:
    result = ddp("list")
    assert result.code == 0, result.err
    rows = [line.split() for line in result.out.splitlines()]
    assert rows[0] == ["NAME", "STATE", "AGE", "REPLICAS", "GPUS"]
    by_name = {row[0]: row for row in rows[1:]}
    assert set(by_name) == {"mnist", "done", "broken"}  # namespace "training" from the context
    assert by_name["mnist"][1:2] + by_name["mnist"][3:] == ["Running", "3/3", "6"]
    assert by_name["done"][1] == "Succeeded"
    assert by_name["broken"][1] == "Failed"
    assert by_name["mnist"][2].endswith(("d", "h", "m", "s"))  # an age, kubectl style


def test_list_all_namespaces_adds_a_namespace_column(ddp) -> None:
    result = ddp("list", "-A")
    assert result.code == 0, result.err
    rows = [line.split() for line in result.out.splitlines()]
    assert rows[0][:2] == ["NAMESPACE", "NAME"]
    assert rows[1][:3] == ["research", "sweep", "Running"]
    assert {row[1] for row in rows[1:]} == {"sweep", "mnist", "done", "broken"}


def test_list_of_an_empty_namespace_says_so(ddp) -> None:
    result = ddp("list", "-n", "empty")
    assert result.code == 0
    assert result.out == ""
    assert "No pytorchjobs in namespace 'empty'" in result.err


def test_namespace_flag_overrides_the_contexts_namespace(ddp) -> None:
    result = ddp("list", "--namespace", "research")
    assert result.code == 0, result.err
    assert [line.split()[0] for line in result.out.splitlines()[1:]] == ["sweep"]


def test_status_shows_conditions_replicas_and_pods_with_node_and_restarts(ddp) -> None:
    result = ddp("status", "mnist")
    assert result.code == 0, result.err
    out = result.out
    assert "State:       Running" in out
    assert "GPUs:        6" in out
    assert "PyTorchJobRunning" in out and "PyTorchJob training/mnist is running." in out
    section = out.split("Pods:")[1].split("Warnings:")[0]
    pods = {line.split()[1]: line.split() for line in section.splitlines()[2:]}
    # RANKS NAME TYPE PHASE READY RESTARTS NODE AGE
    assert pods["mnist-master-0"][0] == "0" and pods["mnist-master-0"][6] == "gpu-node-1"
    assert pods["mnist-worker-0"][0] == "1" and pods["mnist-worker-0"][6] == "gpu-node-2"
    assert pods["mnist-worker-1"][0] == "2"
    assert pods["mnist-worker-1"][5] == "2" and pods["mnist-worker-1"][6] == "gpu-node-3"
    replicas = out.split("Replicas:")[1].split("Conditions:")[0]
    assert ["Worker", "2", "2", "0", "0", "2"] in [line.split() for line in replicas.splitlines()]


def test_status_of_a_failed_job_shows_the_failure_reason(ddp) -> None:
    result = ddp("status", "broken")
    assert result.code == 0, result.err
    assert "State:       Failed" in result.out
    assert "is failed because 1 Worker replica(s) failed." in result.out


def test_logs_merge_all_ranks_by_time_with_a_rank_prefix(ddp) -> None:
    result = ddp("logs", "mnist")
    assert result.code == 0, result.err
    assert result.out.splitlines() == [
        "[rank 0] INFO world_size=3 backend=nccl",
        "[rank 1] INFO joined rendezvous",
        "[rank 2] INFO joined rendezvous",
        "[rank 0] INFO step 10 loss=2.01",
        "[rank 1] WARNING slow data loader",
        '[rank 2] INFO {"json": "looking"}',  # printed as written, not parsed as JSON
        "[rank 0] INFO step 20 loss=1.50",
    ]


def test_logs_of_one_rank_and_tail(ddp) -> None:
    assert ddp("logs", "mnist", "--rank", "1").out.splitlines() == [
        "[rank 1] INFO joined rendezvous", "[rank 1] WARNING slow data loader"]
    assert ddp("logs", "mnist", "--tail", "1").out.splitlines() == [
        "[rank 1] WARNING slow data loader", '[rank 2] INFO {"json": "looking"}',
        "[rank 0] INFO step 20 loss=1.50"]


def test_logs_of_an_unknown_rank_lists_the_ranks(ddp) -> None:
    result = ddp("logs", "mnist", "--rank", "7")
    assert result.code == 2
    assert "no pod with rank 7 (ranks: 0, 1, 2)" in result.err


def test_logs_follow_streams_every_rank_until_the_pods_end(ddp, cluster: FakeCluster) -> None:
    cluster.logs[("training", "mnist-worker-1")].follow_delay = 0.3  # a slower rank
    started = time.monotonic()
    result = ddp("logs", "mnist", "--follow")
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert sorted(lines) == sorted(ddp("logs", "mnist").out.splitlines())
    assert time.monotonic() - started >= 0.6  # it waited for the slow stream to end
    # Streams are interleaved as they arrive: the slow rank's last line comes last.
    assert lines[-1] == '[rank 2] INFO {"json": "looking"}'


def test_logs_note_pods_whose_container_is_still_starting(ddp, cluster: FakeCluster) -> None:
    from tests.jobs.cluster import job

    cluster.add_job(job("fresh", workers=1))
    cluster.add_pod(pod("fresh", "master", 0), PodLog([(T0, "INFO up")]))
    cluster.add_pod(pod("fresh", "worker", 0, phase="Pending", waiting="ContainerCreating"),
                    PodLog(waiting="ContainerCreating"))
    result = ddp("logs", "fresh")
    assert result.code == 0, result.err
    assert result.out.splitlines() == ["[rank 0] INFO up"]
    assert ('[rank 1] no log yet: container "pytorch" in pod "fresh-worker-0" is waiting to '
            "start: ContainerCreating") in result.err


def test_wait_exits_0_once_the_job_succeeds(ddp, cluster: FakeCluster,
                                            first_poll: threading.Event) -> None:
    def operator_finishes() -> None:
        assert first_poll.wait(30), "wait never read the job"  # it has seen it Running
        cluster.patch_job("training", "mnist", {"status": {"conditions": [
            condition("Created", "PyTorchJobCreated", "created", T0),
            condition("Running", "PyTorchJobRunning", "running", T0, status="False"),
            condition("Succeeded", "PyTorchJobSucceeded", "done", T0)]}})

    threading.Thread(target=operator_finishes, daemon=True).start()
    result = ddp("wait", "mnist", "--poll-interval", "0.1", "--timeout", "30s")
    assert result.code == 0, result.err
    assert result.out.splitlines() == ["pytorchjob/mnist Running", "pytorchjob/mnist Succeeded"]


def test_wait_exits_1_with_the_reason_when_the_job_fails(ddp) -> None:
    result = ddp("wait", "broken")
    assert result.code == 1
    assert result.out.splitlines() == ["pytorchjob/broken Failed"]
    assert "PyTorchJobFailed: PyTorchJob training/broken is failed" in result.err


def test_wait_exits_3_when_the_timeout_passes(ddp) -> None:
    started = time.monotonic()
    result = ddp("wait", "mnist", "--timeout", "1s", "--poll-interval", "0.2")
    assert result.code == 3
    assert 0.9 <= time.monotonic() - started < 10
    assert "timed out after 1s: pytorchjob/mnist is still Running" in result.err


def test_wait_with_a_malformed_timeout_is_a_usage_error(ddp) -> None:
    result = ddp("wait", "mnist", "--timeout", "soon")
    assert result.code == 2
    assert "--timeout 'soon' is not a duration" in result.err


def test_delete_removes_the_job(ddp, cluster: FakeCluster) -> None:
    result = ddp("delete", "done")
    assert result.code == 0, result.err
    assert result.out.strip() == 'pytorchjob.kubeflow.org "done" deleted'
    assert cluster.job("training", "done") is None
    assert "done" not in ddp("list").out


def test_suspend_then_resume_toggle_the_run_policy(ddp, cluster: FakeCluster) -> None:
    result = ddp("suspend", "mnist")
    assert result.code == 0, result.err
    assert result.out.strip() == "pytorchjob.kubeflow.org/mnist suspended"
    assert cluster.job("training", "mnist")["spec"]["runPolicy"]["suspend"] is True
    assert "Suspended:   yes" in ddp("status", "mnist").out
    # The rest of the spec is untouched: a merge patch of one field.
    assert cluster.job("training", "mnist")["spec"]["runPolicy"]["cleanPodPolicy"] == "None"

    assert ddp("suspend", "mnist").out.strip() == "pytorchjob.kubeflow.org/mnist already suspended"

    result = ddp("resume", "mnist")
    assert result.code == 0, result.err
    assert result.out.strip() == "pytorchjob.kubeflow.org/mnist resumed"
    assert cluster.job("training", "mnist")["spec"]["runPolicy"]["suspend"] is False


def test_suspending_a_finished_job_is_refused(ddp, cluster: FakeCluster) -> None:
    result = ddp("suspend", "done")
    assert result.code == 2
    assert "already Succeeded; it cannot be suspended" in result.err
    assert cluster.job("training", "done")["spec"]["runPolicy"]["suspend"] is False


def test_logs_of_pods_with_several_ranks_name_the_rank_range(ddp, cluster: FakeCluster) -> None:
    from tests.jobs.cluster import job

    big = job("big", workers=1, gpus=4)
    big["spec"]["nprocPerNode"] = "4"
    cluster.add_job(big)
    cluster.add_pod(pod("big", "master", 0), PodLog([(T0, "INFO step 1")]))
    cluster.add_pod(pod("big", "worker", 0), PodLog([(T0, "[rank 5] WARNING slow")]))
    result = ddp("logs", "big", "--rank", "5")
    assert result.code == 0, result.err
    assert result.out.splitlines() == ["[ranks 4-7] [rank 5] WARNING slow"]
    status = ddp("status", "big").out
    assert "Ranks/pod:   4" in status
    section = status.split("Pods:")[1].split("Warnings:")[0]
    assert [line.split()[0] for line in section.splitlines()[2:]] == [
        "0-3", "4-7"]


def ended(code: int, reason: str, message: str) -> dict[str, object]:
    """A container's terminated state as the kubelet reports it."""
    return {"exitCode": code, "reason": reason, "message": message,
            "startedAt": "2026-01-01T12:00:10Z", "finishedAt": "2026-01-01T12:01:00Z"}


def test_status_shows_each_pods_exit_class_and_termination_message(
        ddp, cluster: FakeCluster) -> None:
    from tests.jobs.cluster import job

    cluster.add_job(job("crashed", workers=2, gpus=0, state="Failed"))
    diverged = ("[rank 0] error: training loss became nan on rank 0 by step 12 (fix: lower "
                "--lr or check the data for extreme values)")
    cluster.add_pod(pod("crashed", "master", 0, phase="Failed",
                        terminated=ended(3, "Error", diverged + "\n")))
    # OOM-killed once (FallbackToLogsOnError: the log's tail), restarted, running again.
    cluster.add_pod(pod("crashed", "worker", 0, restarts=1, last_terminated=ended(
        137, "OOMKilled", "INFO epoch 1\nINFO step 40 loss=0.3\n")))
    cluster.add_pod(pod("crashed", "worker", 1, phase="Failed", terminated=ended(
        4, "Error", "[rank 2] error: rank 0 stopped responding (fix: see its log)")))
    result = ddp("status", "crashed")
    assert result.code == 0, result.err
    section = result.out.split("Terminated:\n")[1].split("Warnings:")[0].splitlines()
    assert section[0].split() == ["NAME", "PHASE", "EXIT", "CLASS", "RESTARTS", "WHEN",
                                  "MESSAGE"]
    # columns are three spaces apart; a cell (a class, a message) may hold single spaces
    rows = {cells[0]: cells for cells in (re.split(r"\s{3,}", line.strip())
                                          for line in section[1:])}
    assert rows == {
        "crashed-master-0": ["crashed-master-0", "Failed", "3", "diverged", "0", "now",
                             diverged],
        "crashed-worker-0": ["crashed-worker-0", "Running", "137", "OOM-killed", "1",
                             "last run", "INFO step 40 loss=0.3"],
        "crashed-worker-1": ["crashed-worker-1", "Failed", "4", "lost peer", "0", "now",
                             "[rank 2] error: rank 0 stopped responding (fix: see its log)"]}


def test_status_names_a_hung_job_once_from_the_watchdogs_verdict(
        ddp, cluster: FakeCluster) -> None:
    from tests.jobs.cluster import job

    cluster.add_job(job("stuck", workers=1, gpus=0, state="Running"))
    verdict = ("error: hang: rank 1 (pod stuck-worker-0 on node n2) has been in user code (the "
               "step: forward and loss) of step 20 for 181 s, at hangstep.py:8 in step; rank 0 "
               "waits for it in the backward pass and its gradient all-reduce of step 20 (fix: "
               "find why the code at hangstep.py:8 in step blocks)")
    for kind in ("master", "worker"):
        cluster.add_pod(pod("stuck", kind, 0, restarts=1,
                            last_terminated=ended(142, "Error", verdict + "\n")))
    out = ddp("status", "stuck").out
    hung = [line for line in out.splitlines() if line.startswith("Hung:")]
    assert hung == ["Hung:        rank 1 (pod stuck-worker-0 on node n2) has been in user code "
                    "(the step: forward and loss) of step 20 for 181 s, at hangstep.py:8 in step;"
                    " rank 0 waits for it in the backward pass and its gradient all-reduce of "
                    "step 20 (fix: find why the code at hangstep.py:8 in step blocks) (exit 142, "
                    "stuck-master-0, last run)"], out
    assert out.count("hung") >= 2  # each pod's class in the Terminated table


def test_status_of_pods_that_never_ended_has_no_terminated_section(ddp) -> None:
    result = ddp("status", "mnist")
    assert result.code == 0, result.err
    assert "Terminated:" not in result.out


def test_status_still_names_the_hang_once_the_resumed_run_has_completed(
        ddp, cluster: FakeCluster) -> None:
    # the pods' containers ended 0 after resuming; the hung attempt is their last state
    from tests.jobs.cluster import job

    cluster.add_job(job("resumed", workers=1, gpus=0, state="Succeeded"))
    verdict = "error: hang: rank 1 (pod resumed-worker-0 on node n2) has been in user code"
    for kind in ("master", "worker"):
        cluster.add_pod(pod("resumed", kind, 0, restarts=1, phase="Succeeded",
                            terminated=ended(0, "Completed", ""),
                            last_terminated=ended(142, "Error", verdict + "\n")))
    out = ddp("status", "resumed").out
    hung = [line for line in out.splitlines() if line.startswith("Hung:")]
    assert hung == ["Hung:        rank 1 (pod resumed-worker-0 on node n2) has been in user "
                    "code (exit 142, resumed-master-0, last run)"], out
