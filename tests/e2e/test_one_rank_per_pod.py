"""1 Master + 1 Worker, one `ddp-trainer train` rank per pod: the chart's defaults (CPU),
played with the operator's env and scraped by a real Prometheus (the `default_run` fixture
of conftest.py; the restart scenarios compare against the same run)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.e2e.harness.image import BuiltImage
from tests.e2e.harness.podman import Podman
from tests.e2e.scenario import NAMESPACE, Run, checkpoints, evaluate
from tests.e2e.scrape import dashboard_query, last_value, ranks_of, series, target_labels


def test_both_pods_train_to_the_end(default_run: Run) -> None:
    run = default_run
    assert run.outcome.phase == "Succeeded", f"{run.outcome}\n{run.logs}"
    assert list(run.outcome.exits.values()) == [[0], [0]] and run.outcome.restarts == 0
    result = run.summary
    assert (result["world_size"], result["epochs"], result["steps"]) == (2, 10, 120)
    assert result["resumed_from_step"] is None


def test_summary_accuracy_equals_evaluate_of_the_final_checkpoint(
        default_run: Run, podman: Podman, image: BuiltImage, tmp_path: Path) -> None:
    result = default_run.summary
    final = checkpoints(default_run.job)[-1]
    assert final.name == f"ckpt-{result['steps']:09d}.pt"
    scored = evaluate(podman, image, default_run.job, final, tmp_path / "eval")
    assert (scored["correct"], scored["total"]) == (result["val_correct"], result["val_total"])
    assert scored["accuracy"] == result["val_accuracy"]


def test_each_pod_ran_as_the_chart_and_the_operator_say(default_run: Run,
                                                         podman: Podman) -> None:
    for pod in default_run.job.pods:
        info = json.loads(podman.run("container", "inspect", pod.container).stdout)[0]
        env = dict(e.split("=", 1) for e in info["Config"]["Env"])
        (container,) = pod.replica.manifest["spec"]["containers"]
        given = {e["name"]: e["value"] for e in container["env"] if "value" in e}
        assert {k: env[k] for k in given} == given  # the chart's and the operator's env
        assert (env["POD_NAME"], env["POD_NAMESPACE"]) == (pod.name, NAMESPACE)
        assert info["Config"]["User"] == "10001:10001"
        assert info["HostConfig"]["ReadonlyRootfs"] is True
        assert "no-new-privileges" in info["HostConfig"]["SecurityOpt"]
        assert info["Config"]["Hostname"] == pod.name
        assert info["Config"]["Entrypoint"] == "ddp-trainer"  # the pod's command
        assert info["Config"]["Cmd"][:2] == ["train", "--config"]  # and its args


def test_prometheus_scrapes_every_pod_with_the_podmonitor_labels(default_run: Run) -> None:
    run = default_run
    assert run.prometheus is not None
    labels = target_labels(run.job, run.prometheus)
    assert set(labels) == {p.name for p in run.job.pods}
    for pod in run.job.pods:
        assert labels[pod.name] == {
            "namespace": NAMESPACE, "pod": pod.name, "container": "pytorch",
            "endpoint": "metrics", "job": f"{NAMESPACE}/{run.job.name}",
            "pytorchjob": run.job.name, "replica_type": pod.replica.rtype.lower(),
            "replica_index": str(pod.replica.index)}


def test_dashboard_per_rank_queries_return_one_series_per_global_rank(default_run: Run) -> None:
    run = default_run
    assert run.prometheus is not None
    loss = series(run.prometheus, dashboard_query("Train loss per rank", run.job), run.window)
    assert ranks_of(loss) == ["0", "1"]
    accuracy = series(run.prometheus, dashboard_query("Accuracy per rank and global", run.job),
                      run.window)
    assert ranks_of(accuracy, split="train") == ranks_of(accuracy, split="val") == ["0", "1"]


def test_dashboard_global_accuracy_is_exactly_the_summarys(default_run: Run) -> None:
    run = default_run
    assert run.prometheus is not None
    query = dashboard_query("Validation accuracy (global)", run.job)
    scraped = last_value(series(run.prometheus, query, run.window))
    final = run.summary["val_accuracy"]
    assert scraped == final, (
        f"Prometheus last saw global accuracy {scraped!r}, the run ended at {final!r}: the "
        "final validation's value was never scraped (the endpoint closed with the pod)")
