"""The chart's TrainJob mode on the real cluster with the real Kubeflow Trainer v2.3.0 and JobSet
v0.12.0 (tools/cluster/trainer_v2.py): installed into a namespace that enforces `restricted`, the
TrainJob completes, rank 0's log agrees exactly with `ddp-trainer evaluate`, rank 0's progress
reaches `status.trainerStatus` through Trainer's real status server (KEP-2779), and its ranks
are scraped through prometheus-operator (tests/cluster/monitoring.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from tests.cluster import monitoring
from tests.cluster.helm import CHART, HELM4, Release, helm, release_name
from tests.cluster.jobs import KEEP_RESULTS, SHORT, TRAINJOB, finished
from tests.cluster.kube import STATE, Cluster, merged, restart_process

# Long enough (about 15 s of training) for several of rank 0's reports, one every 5 s.
# Served the whole linger after training (not only until the first scrape of the final values):
# the PodMonitor may reach Prometheus only then, and the checks below need a rate window.
REPORTED = {"trainerConfig": {"train": {"epochs": 100}, "metrics": {"linger_scrapes": 0}}}


def trainer_status(release: Release) -> dict[str, Any]:
    job = release.cluster.get("trainjob", release.job, release.namespace)
    status: dict[str, Any] = job.get("status", {}).get("trainerStatus") or {}
    return status


def watch_progress(release: Release, timeout: float = 600) -> list[dict[str, Any]]:
    """Every distinct trainerStatus seen until the TrainJob has a terminal condition."""
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = release.cluster.get("trainjob", release.job, release.namespace)
        status = job.get("status", {})
        current = status.get("trainerStatus")
        if current and (not seen or current != seen[-1]):
            seen.append(current)
        if any(c["type"] in ("Complete", "Failed") and c["status"] == "True"
               for c in status.get("conditions", [])):
            return seen
        time.sleep(0.5)
    raise AssertionError(f"{release.job} did not end in {timeout} s; statuses: {seen}")


def pod_monitor(release: Release, tmp: Path) -> dict[str, Any]:
    """The chart's PodMonitor for the release's values (prometheus-operator is not on this
    cluster yet, so it is rendered rather than installed)."""
    values = tmp / "podmonitor-values.json"
    values.write_text(json.dumps(merged(release.values,
                                        {"metrics": {"podMonitor": {"enabled": True}}})))
    rendered = helm(HELM4, "template", release.name, str(CHART), "-n", release.namespace,
                    "-f", str(STATE / "values-local.yaml"), "-f", str(values),
                    "--show-only", "templates/podmonitor.yaml", cluster=release.cluster).stdout
    found: dict[str, Any] = yaml.safe_load(rendered)
    return found


def sanitized(label: str) -> str:
    """A pod label as Prometheus' Kubernetes discovery names it: __meta_kubernetes_pod_label_*."""
    return "__meta_kubernetes_pod_label_" + "".join(
        ch if ch.isalnum() or ch == "_" else "_" for ch in label)


def test_default_runtime_completes_under_restricted_with_live_trainer_status(
        cluster: Cluster, chart_ref: str, tmp_path: Path) -> None:
    ns = cluster.namespace("trainjob")
    release = Release(cluster, release_name(), ns, merged(KEEP_RESULTS, TRAINJOB, REPORTED))
    release.install(chart_ref, tmp=tmp_path)
    # trainerStatus is watched from the start while the PodMonitor's scraping is checked.
    with ThreadPoolExecutor(1) as pool:
        watched = pool.submit(watch_progress, release)
        selector = monitoring.assert_scraped_while_running(release)
        statuses = watched.result()
    found = finished(release)
    found.assert_agrees()
    assert found.summary["world_size"] == 2
    monitoring.assert_final_values_scraped(selector, found.summary)
    # KEP-2779 through the real status server: progress rose to 100 while the job ran, with
    # an ETA, and the last report carries the final numbers exactly as the trainer formats them.
    progress = [s["progressPercentage"] for s in statuses if "progressPercentage" in s]
    print("trainerStatus progress seen:", progress)
    assert progress == sorted(progress) and progress[-1] == 100 and progress[0] < 100
    assert any("estimatedRemainingSeconds" in s for s in statuses[:-1])
    final = {m["name"]: m["value"] for m in statuses[-1]["metrics"]}
    assert final["val_accuracy"] == f"{found.summary['val_accuracy']:.6g}"
    assert final["step"] == str(found.summary["steps"])
    # The PodMonitor's selection and relabelling read labels the real controllers set.
    monitor = pod_monitor(release, tmp_path)
    pods = cluster.kubectl("get", "pods", "-n", ns, "-l",
                           f"jobset.sigs.k8s.io/jobset-name={release.job}", "-o",
                           "json").stdout
    items = yaml.safe_load(pods)["items"]
    indexes = []
    for pod in items:
        labels = pod["metadata"]["labels"]
        assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
        discovered = {sanitized(k): v for k, v in labels.items()}
        endpoint = monitor["spec"]["podMetricsEndpoints"][0]
        for relabel in endpoint["relabelings"]:
            for source in relabel.get("sourceLabels", []):
                if source.startswith("__meta_kubernetes_pod_label_"):
                    assert source in discovered, (source, sorted(labels))
        assert discovered[sanitized("jobset.sigs.k8s.io/jobset-name")] == release.job
        assert discovered[sanitized("jobset.sigs.k8s.io/replicatedjob-name")] == "node"
        indexes.append(discovered[sanitized("batch.kubernetes.io/job-completion-index")])
        (node,) = [c for c in pod["spec"]["containers"] if c["name"] == "node"]
        assert 29500 in [p["containerPort"] for p in node.get("ports", [])]
    assert sorted(indexes) == ["0", "1"]  # the node ranks, one pod each


def test_create_runtime_installs_and_upgrades_with_helm(
        cluster: Cluster, chart_ref: str, tmp_path: Path) -> None:
    ns = cluster.namespace("runtime")
    release = Release(cluster, release_name(), ns,
                      merged(KEEP_RESULTS, TRAINJOB, SHORT, {"trainJob": {"createRuntime": True}}))
    # A plain resource, the runtime came after the TrainJob and Trainer's webhook refused the
    # install ("specified trainingRuntime must be created before the TrainJob is created").
    release.install(chart_ref, tmp=tmp_path)
    runtime = cluster.get("trainingruntime", release.job, ns)
    job = cluster.get("trainjob", release.job, ns)
    assert job["spec"]["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org",
                                         "kind": "TrainingRuntime", "name": release.job}
    release.values = merged(release.values, {"commonLabels": {"upgraded": "yes"}})
    release.upgrade(chart_ref, tmp=tmp_path)
    assert cluster.get("trainjob", release.job, ns)["metadata"]["labels"]["upgraded"] == "yes"
    assert cluster.get("trainingruntime", release.job, ns)["metadata"]["uid"] == \
        runtime["metadata"]["uid"]
    finished(release).assert_agrees()


def test_two_processes_per_node_run_as_world_size_4(
        cluster: Cluster, chart_ref: str, tmp_path: Path, advertised_gpus: None) -> None:
    ns = cluster.namespace("tjtwo")
    release = Release(cluster, release_name(), ns, merged(
        KEEP_RESULTS, TRAINJOB, SHORT,
        {"gpusPerReplica": 2, "resources": {"limits": {"cpu": "2"}}}))
    release.install(chart_ref, tmp=tmp_path)
    found = finished(release)
    assert found.summary["world_size"] == 4
    found.assert_agrees()
    # The node's 2-core limit (resourcesPerNode) shared by its 2 processes.
    assert "threads: 1 per rank (cpu limit 2 / 2 ranks)" in found.done.string
    job = cluster.get("trainjob", release.job, ns)
    assert job["spec"]["trainer"]["numProcPerNode"] == 2



@contextmanager
def trainer_feature_gate(gate: str, enabled: bool) -> Iterator[None]:
    """Trainer restarted with a feature gate set in its configuration file (as its Helm
    values set it on a cluster), and restarted as it was after."""
    config = STATE / "config" / "trainer-controller-manager.yaml"
    before = config.read_text()
    settings = yaml.safe_load(before)
    settings.setdefault("featureGates", {})[gate] = enabled
    config.write_text(yaml.safe_dump(settings, sort_keys=False))
    restart_process("trainer-controller-manager")
    try:
        yield
    finally:
        config.write_text(before)
        restart_process("trainer-controller-manager")


def test_with_the_status_gate_off_nothing_is_sent_and_the_job_completes(
        cluster: Cluster, chart_ref: str, tmp_path: Path) -> None:
    # A cluster that has not enabled KEP-2779 (TrainJobStatus is alpha in v2.3.0): Trainer
    # gives the pods no status server to report to, the trainer sends nothing and warns of
    # nothing, and the TrainJob completes without a trainerStatus.
    with trainer_feature_gate("TrainJobStatus", False):
        ns = cluster.namespace("gateoff")
        release = Release(cluster, release_name(), ns, merged(KEEP_RESULTS, TRAINJOB, SHORT))
        release.install(chart_ref, tmp=tmp_path)
        found = finished(release)
    found.assert_agrees()
    assert "trainerStatus" not in cluster.get("trainjob", release.job, ns).get("status", {})
    pod = cluster.get("pod", release.rank0_pod(), ns)
    (node,) = [c for c in pod["spec"]["containers"] if c["name"] == "node"]
    assert not [e["name"] for e in node.get("env", []) if e["name"].startswith("KUBEFLOW_")]
    log = cluster.logs(release.rank0_pod(), ns)
    assert "trainjob status" not in log, log[-2000:]  # with the gate on: "reporting progress to"
