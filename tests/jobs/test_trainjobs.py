"""TrainJobs (Kubeflow Trainer v2) through the same commands, against an emulator that serves
both CRDs: list with a KIND column, status with the reported trainerStatus, logs of the `node`
containers by rank, wait, delete, suspend and resume via spec.suspend, and --kind."""

from __future__ import annotations

import threading

from tests.jobs.cluster import T0, TRAINJOB_PATH, FakeCluster, condition, node_pod, trainjob


def table(out: str) -> dict[str, list[str]]:
    rows = [line.split() for line in out.splitlines()]
    return {row[0]: row for row in rows[1:]}


def test_list_shows_both_kinds_with_a_kind_column(ddp2) -> None:
    result = ddp2("list")
    assert result.code == 0, result.err
    assert result.out.splitlines()[0].split() == ["NAME", "KIND", "STATE", "AGE", "REPLICAS",
                                                  "GPUS"]
    rows = table(result.out)
    assert rows["mnist"][1:3] == ["PyTorchJob", "Running"]
    # llm: 2 running node pods of 2 nodes, 2 nodes x 4 GPUs.
    assert rows["llm"][1:3] == ["TrainJob", "Running"] and rows["llm"][4:] == ["2/2", "8"]
    assert rows["tuned"][1:3] == ["TrainJob", "Succeeded"]  # condition Complete


def test_kind_flag_lists_one_kind_without_the_kind_column(ddp2) -> None:
    result = ddp2("list", "--kind", "trainjob", "-A")
    assert result.code == 0, result.err
    assert result.out.splitlines()[0].split() == ["NAMESPACE", "NAME", "STATE", "AGE",
                                                  "REPLICAS", "GPUS"]
    rows = {row[1]: row for row in (line.split() for line in result.out.splitlines()[1:])}
    assert set(rows) == {"llm", "tuned", "probe"}
    assert rows["probe"][2:3] + rows["probe"][4:] == ["Pending", "0/?", "0"]  # runtime decides


def test_status_shows_reported_progress_metrics_runtime_and_node_ranks(ddp2) -> None:
    result = ddp2("status", "llm")
    assert result.code == 0, result.err
    out = result.out
    assert "Kind:        TrainJob" in out
    assert "State:       Running" in out
    assert "Runtime:     ClusterTrainingRuntime/torch-distributed" in out
    assert "Progress:    42%, about 12m left" in out
    metrics = table(out.split("Trainer metrics:")[1].split("Replicas:")[0])
    assert metrics["train_loss"] == ["train_loss", "0.4121"]
    assert metrics["val_accuracy"] == ["val_accuracy", "0.9361"]
    replicas = out.split("Replicas:")[1].split("Conditions:")[0]
    assert ["node", "2", "2", "0", "0", "4"] in [line.split() for line in replicas.splitlines()]
    section = out.split("Pods:")[1].split("Warnings:")[0]
    pods = [line.split() for line in section.splitlines()[2:]]
    # RANKS NAME TYPE PHASE READY RESTARTS NODE AGE: completion index = node rank.
    assert [(p[0], p[1], p[2], p[6]) for p in pods] == [
        ("0-3", "llm-node-0-0-x0z9", "node-0", "gpu-node-4"),
        ("4-7", "llm-node-0-1-x1z9", "node-1", "gpu-node-5")]


def test_status_of_a_trainjob_without_trainer_status_says_how_to_get_it(ddp2) -> None:
    result = ddp2("status", "tuned")
    assert result.code == 0, result.err
    assert "State:       Succeeded" in result.out
    assert "--feature-gates=TrainJobStatus=true" in result.out


def test_logs_merge_node_containers_by_time_with_rank_ranges(ddp2) -> None:
    result = ddp2("logs", "llm")
    assert result.code == 0, result.err
    assert result.out.splitlines() == [
        "[ranks 0-3] INFO world_size=8",
        "[ranks 4-7] INFO node 1 joined",
        "[ranks 0-3] INFO step 10 loss=2.01",
        "[ranks 4-7] [rank 5] WARNING slow",
    ]
    assert ddp2("logs", "llm", "--rank", "6").out.splitlines() == [
        "[ranks 4-7] INFO node 1 joined", "[ranks 4-7] [rank 5] WARNING slow"]


def test_wait_exits_0_when_the_trainjob_completes(ddp2, cluster_v2: FakeCluster,
                                                  first_poll: threading.Event) -> None:
    def controller_finishes() -> None:
        assert first_poll.wait(30), "wait never read the trainjob"  # it has seen it Running
        cluster_v2.patch_job("training", "llm", {"status": {"conditions": [
            condition("Complete", "AllJobsCompleted", "jobset completed successfully", T0)]}},
            path=TRAINJOB_PATH)

    threading.Thread(target=controller_finishes, daemon=True).start()
    result = ddp2("wait", "llm", "--poll-interval", "0.1", "--timeout", "30s")
    assert result.code == 0, result.err
    assert result.out.splitlines() == ["trainjob/llm Running", "trainjob/llm Succeeded"]


def test_wait_exits_1_with_the_reason_when_a_trainjob_fails(ddp2, cluster_v2: FakeCluster) -> None:
    cluster_v2.add_job(trainjob("oom", state="Failed"))
    result = ddp2("wait", "oom")
    assert result.code == 1
    assert result.out.splitlines() == ["trainjob/oom Failed"]
    assert "FailedJobs: jobset failed due to one or more job failures" in result.err


def test_suspend_and_resume_toggle_spec_suspend(ddp2, cluster_v2: FakeCluster) -> None:
    result = ddp2("suspend", "llm")
    assert result.code == 0, result.err
    assert result.out.strip() == "trainjob.trainer.kubeflow.org/llm suspended"
    obj = cluster_v2.job("training", "llm", path=TRAINJOB_PATH)
    assert obj["spec"]["suspend"] is True
    assert obj["spec"]["runtimeRef"]["name"] == "torch-distributed"  # one field patched
    assert "runPolicy" not in obj["spec"]
    assert "Suspended:   yes" in ddp2("status", "llm").out
    result = ddp2("resume", "llm")
    assert result.out.strip() == "trainjob.trainer.kubeflow.org/llm resumed"
    assert cluster_v2.job("training", "llm", path=TRAINJOB_PATH)["spec"]["suspend"] is False


def test_delete_removes_the_trainjob(ddp2, cluster_v2: FakeCluster) -> None:
    result = ddp2("delete", "tuned")
    assert result.code == 0, result.err
    assert result.out.strip() == 'trainjob.trainer.kubeflow.org "tuned" deleted'
    assert cluster_v2.job("training", "tuned", path=TRAINJOB_PATH) is None


def test_a_name_used_by_both_kinds_asks_for_kind(ddp2, cluster_v2: FakeCluster) -> None:
    cluster_v2.add_job(trainjob("mnist", nodes=1))
    cluster_v2.add_pod(node_pod("mnist", 0))
    result = ddp2("status", "mnist")
    assert result.code == 2
    assert 'both a pytorchjob and a trainjob are called "mnist"' in result.err
    assert "--kind pytorchjob or --kind trainjob" in result.err
    assert "Kind:        TrainJob" in ddp2("status", "mnist", "--kind", "trainjob").out
    assert "Kind:        PyTorchJob" in ddp2("status", "mnist", "--kind", "pytorchjob").out


def test_a_missing_name_names_both_kinds(ddp2) -> None:
    result = ddp2("status", "nope")
    assert result.code == 2
    assert 'pytorchjob or trainjob "nope" not found in namespace "training"' in result.err
    assert "kubectl get pytorchjobs,trainjobs -A" in result.err
