"""The chart on the real cluster with the real training operator v1.9.4: released with
`make release` to the cluster's OCI registry and installed from there with Helm 4 (and from the
folder with Helm 3) into a namespace that enforces `restricted`, its PyTorchJob runs to
Succeeded, and the numbers agree exactly with `ddp-trainer evaluate` of the final checkpoint;
one or two ranks per pod, and elastic."""

from __future__ import annotations

from pathlib import Path

from tests.cluster import monitoring
from tests.cluster.helm import CHART, HELM3, REGISTRY, Release, release_name
from tests.cluster.jobs import KEEP_RESULTS, SHORT, finished, uid, wait_until
from tests.cluster.kube import Cluster, merged
from tools.imagebuild.image import package_version


def test_helm4_install_from_the_registry_runs_to_succeeded_under_restricted(
        cluster: Cluster, chart_ref: str, tmp_path: Path) -> None:
    ns = cluster.namespace("pytorchjob")
    # The image `make release` pushed, under the chart's default tag (its appVersion).
    # Trained and served long enough to be seen: the PodMonitor reaches Prometheus through a
    # config reload (about 15-25 s apart here), then a rate needs two scrapes; the default run
    # (10 epochs) served for 30 s at 15 s scrapes was once gone before that (a CI run). The
    # whole 30 s: not only until the first scrape of the final values (linger_scrapes 0).
    release = Release(cluster, release_name(), ns, merged(
        KEEP_RESULTS, monitoring.FAST_SCRAPES, {"image": {"tag": ""}, "trainerConfig": {
            "train": {"epochs": 100}, "metrics": {"linger_seconds": 30, "linger_scrapes": 0}}}))
    release.install(chart_ref, tmp=tmp_path)
    # The operator's Worker init container ran, admitted under `restricted` (read while the
    # job runs: cleanPodPolicy Running deletes a Worker still running when the Master ends).
    worker = release.pod("worker")
    wait_until(lambda: uid(release, "worker") is not None, "the operator's Worker pod")
    cluster.wait(f"pod/{worker}", "jsonpath={.status.initContainerStatuses[0].state.terminated"
                 ".exitCode}=0", ns)
    (init,) = cluster.get("pod", worker, ns)["spec"]["initContainers"]
    assert init["name"] == "init-pytorch"
    assert init["securityContext"]["runAsNonRoot"] is True
    # The chart's PodMonitor, through prometheus-operator, while the ranks run and linger.
    selector = monitoring.assert_scraped_while_running(release)
    found = finished(release)
    assert found.summary["world_size"] == 2
    found.assert_agrees()
    monitoring.assert_final_values_scraped(selector, found.summary)
    image = cluster.get("pod", release.pod("master"), ns)["spec"]["containers"][0]["image"]
    assert image == f"{REGISTRY}/ddp-trainer:{package_version()}"


def test_helm3_install_from_the_chart_folder_runs_to_succeeded(
        cluster: Cluster, tmp_path: Path) -> None:
    ns = cluster.namespace("helm3")
    # A CPU limit of 1 core per pod: its one rank runs 1 thread (torch's default: the node's 2).
    release = Release(cluster, release_name(), ns,
                      merged(KEEP_RESULTS, SHORT, {"resources": {"limits": {"cpu": "1"}}}))
    release.install(str(CHART), binary=HELM3, tmp=tmp_path)
    found = finished(release)
    found.assert_agrees()
    assert "threads: 1 per rank (cpu limit 1 / 1 rank)" in found.done.string


def test_two_ranks_per_pod_run_as_world_size_4(
        cluster: Cluster, chart_ref: str, tmp_path: Path, advertised_gpus: None) -> None:
    ns = cluster.namespace("twoperpod")
    release = Release(cluster, release_name(), ns, merged(
        KEEP_RESULTS, SHORT, {"gpusPerReplica": 2, "resources": {"limits": {"cpu": "2"}}}))
    release.install(chart_ref, tmp=tmp_path)
    found = finished(release)
    assert found.summary["world_size"] == 4
    found.assert_agrees()
    # The pod's 2 cores shared by its 2 ranks (torch's default: 2 threads each).
    assert "threads: 1 per rank (cpu limit 2 / 2 ranks)" in found.done.string
    master = cluster.get("pod", release.pod("master"), ns)
    assert master["spec"]["containers"][0]["args"][:3] == ["run", "--nproc-per-node", "2"]


def test_elastic_with_one_worker_runs_to_succeeded(
        cluster: Cluster, chart_ref: str, tmp_path: Path) -> None:
    ns = cluster.namespace("elastic")
    release = Release(cluster, release_name(), ns,
                      merged(KEEP_RESULTS, SHORT, {"elastic": {"enabled": True}}))
    release.install(chart_ref, tmp=tmp_path)
    found = finished(release)
    assert found.summary["world_size"] == 2
    found.assert_agrees()
    job = cluster.get("pytorchjob", release.job, ns)
    assert job["spec"]["elasticPolicy"]["rdzvBackend"] == "c10d"
