"""What the chart's values do to the rendered job: commands, GPUs, scheduling, storage,
monitoring, security. Rendered with the real Helm 4 binary (Helm 3 renders identically, see
test_chart_validity.py)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import yaml

from .chartlib import (
    CHART,
    NAMESPACE,
    RELEASE,
    REPO,
    VALUE_SETS,
    find,
    one,
    pod_templates,
    render,
    run_helm,
    trainer_container,
    trainjob_pod,
)

CONFIG_PATH = "/etc/ddp-trainer/config.yaml"
# Pod labels the training operator sets (docs/CONTRACTS.md) and the series labels they become.
OPERATOR_LABELS = {
    "training.kubeflow.org/job-name": "pytorchjob",
    "training.kubeflow.org/replica-type": "replica_type",
    "training.kubeflow.org/replica-index": "replica_index",
}
QUANTITY = re.compile(
    r"^[+]?(\d+(\.\d*)?|\.\d+)(([KMGTPE]i)|[numkMGTPE]|([eE][+-]?(\d+(\.\d*)?|\.\d+)))?$"
)
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
LABEL_NAME = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$"
)


def job_of(helm: str, value_set: str | None = None, sets: tuple[str, ...] = ()) -> dict:
    return one(render(helm, value_set, sets), "PyTorchJob")


# --- command, GPUs, replicas -------------------------------------------------------------


def test_issue_example_runs_launcher_with_one_rank_per_gpu(helm4: str) -> None:
    job = job_of(helm4, sets=("worker.replicas=3", "gpusPerReplica=8"))
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert specs["Master"]["replicas"] == 1
    assert specs["Worker"]["replicas"] == 3
    assert job["spec"]["nprocPerNode"] == "8"
    for template in pod_templates(job).values():
        c = trainer_container(template)
        assert c["command"] == ["ddp-trainer"]
        assert c["args"] == ["run", "--nproc-per-node", "8", "--config", CONFIG_PATH]
        assert c["resources"]["limits"]["nvidia.com/gpu"] == 8
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in template[
            "spec"
        ]["tolerations"]


@pytest.mark.parametrize("gpus", [0, 1])
def test_at_most_one_gpu_runs_a_single_rank_with_train(helm4: str, gpus: int) -> None:
    job = job_of(helm4, sets=(f"gpusPerReplica={gpus}",))
    assert job["spec"]["nprocPerNode"] == "1"
    for template in pod_templates(job).values():
        c = trainer_container(template)
        assert c["args"] == ["train", "--config", CONFIG_PATH]
        limits = c["resources"]["limits"]
        if gpus:
            assert limits["nvidia.com/gpu"] == 1
        else:
            assert "nvidia.com/gpu" not in limits
            tolerations = template["spec"].get("tolerations", [])
            assert all(t["key"] != "nvidia.com/gpu" for t in tolerations), tolerations


def test_cpu_only_value_set_requests_no_gpu_and_keeps_cpu_memory_limits(helm4: str) -> None:
    for template in pod_templates(job_of(helm4, "cpu-only")).values():
        res = trainer_container(template)["resources"]
        assert res == {
            "requests": {"cpu": "1", "memory": "2Gi"},
            "limits": {"cpu": "2", "memory": "4Gi"},
        }


def shm_size(template: dict) -> str:
    mounts, volumes = mounts_and_volumes(template)
    return volumes[mounts["/dev/shm"]["name"]]["emptyDir"]["sizeLimit"]


@pytest.mark.parametrize(("gpus", "ranks"), [(0, 1), (1, 1), (8, 8)])
def test_cpu_memory_and_shm_defaults_scale_with_the_gpus_per_replica(
        helm4: str, gpus: int, ranks: int) -> None:
    # One rank per GPU: an 8-GPU pod with one GPU's 2-4 CPUs gave each rank half a core.
    for template in pod_templates(job_of(helm4, sets=(f"gpusPerReplica={gpus}",))).values():
        res = trainer_container(template)["resources"]
        assert res["requests"] == {"cpu": str(2 * ranks), "memory": f"{8 * ranks}Gi"}
        assert {k: v for k, v in res["limits"].items() if k != "nvidia.com/gpu"} == {
            "cpu": str(4 * ranks), "memory": f"{16 * ranks}Gi"}
        assert shm_size(template) == f"{4 * ranks}Gi"
    node = trainjob_pod(render(helm4, "trainjob/defaults", sets=("gpusPerReplica=8",)))
    (container,) = [c for c in node["spec"]["containers"] if c["name"] == "node"]
    assert container["resources"]["requests"] == {"cpu": "16", "memory": "64Gi"}


def test_per_gpu_values_scale_exactly_and_explicit_resources_win(helm4: str) -> None:
    job = job_of(helm4, sets=("gpusPerReplica=3", "resources.perGpu.requests.cpu=0.5",
                              "resources.perGpu.limits.cpu=1500m",
                              "resources.perGpu.limits.memory=1.25Gi",
                              "resources.requests.memory=1Gi", "shm.perGpu=0.1Gi"))
    template = pod_templates(job)["Master"]
    res = trainer_container(template)["resources"]
    assert res["requests"] == {"cpu": "1.5", "memory": "1Gi"}
    assert res["limits"] == {"cpu": "4500m", "memory": "3.75Gi", "nvidia.com/gpu": 3}
    assert shm_size(template) == "0.3Gi"
    # the issue's 8-GPU value set gives its own quantities: they are used as given
    template = pod_templates(job_of(helm4, "gpu-3x8"))["Worker"]
    assert trainer_container(template)["resources"] == {
        "requests": {"cpu": "32", "memory": "256Gi"},
        "limits": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": 8}}
    assert shm_size(template) == "32Gi"


def test_a_scaled_request_above_an_explicit_limit_names_its_per_gpu_source(helm4: str) -> None:
    proc = run_helm(helm4, "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
                    "--set", "gpusPerReplica=8", "--set", "resources.limits.cpu=8")
    assert proc.returncode != 0
    assert "resources.requests.cpu (16: resources.perGpu.requests.cpu x 8)" in proc.stderr
    assert "resources.limits.cpu (8)" in proc.stderr


def test_every_trainer_container_falls_back_to_its_log_for_the_termination_message(
        helm4: str) -> None:
    # The trainer writes its error line to /dev/termination-log; a container killed before it
    # could (the OOM killer) still shows why in `kubectl describe pod`: its log's tail.
    for template in pod_templates(one(render(helm4), "PyTorchJob")).values():
        assert trainer_container(template)["terminationMessagePolicy"] == \
            "FallbackToLogsOnError"
        assert "terminationMessagePath" not in trainer_container(template)  # the default


def test_zero_workers_runs_the_master_alone(helm4: str) -> None:
    job = job_of(helm4, sets=("worker.replicas=0",))
    assert list(job["spec"]["pytorchReplicaSpecs"]) == ["Master"]


def test_extra_args_follow_the_config_flag(helm4: str) -> None:
    c = trainer_container(pod_templates(job_of(helm4, "everything"))["Master"])
    assert c["args"] == [
        "run",
        "--nproc-per-node",
        "8",
        "--config",
        CONFIG_PATH,
        "--log-every",
        "50",
    ]


def test_other_gpu_resource_names_are_requested_and_tolerated(helm4: str) -> None:
    job = job_of(helm4, sets=("gpuResourceName=amd.com/gpu", "gpusPerReplica=4"))
    template = pod_templates(job)["Master"]
    assert trainer_container(template)["resources"]["limits"]["amd.com/gpu"] == 4
    assert template["spec"]["tolerations"][0]["key"] == "amd.com/gpu"


def test_image_defaults_to_app_version_and_digest_wins_over_tag(helm4: str) -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    c = trainer_container(pod_templates(job_of(helm4))["Master"])
    assert c["image"] == f"ghcr.io/ddp-trainer/ddp-trainer:{chart['appVersion']}"
    digest = trainer_container(pod_templates(job_of(helm4, "everything"))["Master"])["image"]
    assert digest == "ghcr.io/ddp-trainer/ddp-trainer@sha256:" + "0123456789abcdef" * 4


# --- the trainer config ------------------------------------------------------------------


def rendered_config(helm: str, value_set: str | None = None, sets: tuple[str, ...] = ()) -> dict:
    docs = render(helm, value_set, sets)
    cms = [d for d in find(docs, "ConfigMap") if "config.yaml" in d.get("data", {})]
    assert len(cms) == 1
    return yaml.safe_load(cms[0]["data"]["config.yaml"])


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_trainer_accepts_the_rendered_config_file(
    helm4: str, value_set: str, tmp_path: Path
) -> None:
    sys.path.insert(0, str(REPO))
    from trainer.config_load import build_config

    cfg_file = tmp_path / "config.yaml"
    cfg_file.write_text(yaml.safe_dump(rendered_config(helm4, value_set)))
    cfg = build_config(str(cfg_file), {})
    assert cfg.checkpoint.dir == "/checkpoints"
    assert cfg.output.dir == "/outputs"
    values = yaml.safe_load((REPO / "tests/chart/values" / f"{value_set}.yaml").read_text()) or {}
    assert cfg.metrics.port == values.get("metrics", {}).get("port", 9310)


def test_chart_paths_and_metrics_port_override_trainer_config(helm4: str) -> None:
    cfg = rendered_config(
        helm4,
        sets=(
            "trainerConfig.checkpoint.dir=/elsewhere",
            "trainerConfig.metrics.port=1234",
            "metrics.port=9555",
        ),
    )
    assert cfg["checkpoint"]["dir"] == "/checkpoints"
    assert cfg["metrics"]["port"] == 9555
    job = job_of(helm4, sets=("metrics.port=9555",))
    ports = trainer_container(pod_templates(job)["Master"])["ports"]
    assert {"name": "metrics", "containerPort": 9555, "protocol": "TCP"} in ports


def test_config_file_is_mounted_where_the_command_reads_it(helm4: str) -> None:
    docs = render(helm4)
    cm = [d for d in find(docs, "ConfigMap") if "config.yaml" in d.get("data", {})][0]
    for template in pod_templates(one(docs, "PyTorchJob")).values():
        vols = {v["name"]: v for v in template["spec"]["volumes"]}
        mount = [m for m in trainer_container(template)["volumeMounts"] if m["name"] == "config"][0]
        assert vols["config"]["configMap"]["name"] == cm["metadata"]["name"]
        assert f"{mount['mountPath']}/config.yaml" == CONFIG_PATH
        assert mount["readOnly"] is True


def test_trainer_config_schema_lists_exactly_the_trainer_config_fields() -> None:
    sys.path.insert(0, str(REPO / "tools"))
    from chart_schema import trainer_config_sections

    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]["trainerConfig"]
    assert schema["additionalProperties"] is False
    assert schema["properties"] == trainer_config_sections(), (
        "trainer/config.py changed: run .venv/bin/python tools/chart_schema.py"
    )


# --- operator policies -------------------------------------------------------------------


def test_run_policy_defaults_free_gpus_of_finished_jobs(helm4: str) -> None:
    job = job_of(helm4)
    assert job["spec"]["runPolicy"] == {
        "cleanPodPolicy": "Running",
        "backoffLimit": 3,
        "suspend": False,
    }
    for spec in job["spec"]["pytorchReplicaSpecs"].values():
        assert spec["restartPolicy"] == "OnFailure"
        assert spec["template"]["spec"]["terminationGracePeriodSeconds"] == 120


def test_run_policy_values_reach_the_job(helm4: str) -> None:
    job = job_of(helm4, "kueue")
    assert job["spec"]["runPolicy"] == {
        "cleanPodPolicy": "Running",
        "backoffLimit": 3,
        "suspend": True,
        "ttlSecondsAfterFinished": 86400,
        "activeDeadlineSeconds": 172800,
    }


def test_exit_code_restart_policy_applies_to_every_replica(helm4: str) -> None:
    job = job_of(helm4, sets=("restartPolicy=ExitCode",))
    assert {s["restartPolicy"] for s in job["spec"]["pytorchReplicaSpecs"].values()} == {"ExitCode"}


def test_elastic_policy_rendezvous_on_master_and_launcher_everywhere(helm4: str) -> None:
    job = job_of(helm4, "elastic")
    name = job["metadata"]["name"]
    assert job["spec"]["elasticPolicy"] == {
        "minReplicas": 2,
        "maxReplicas": 4,
        "maxRestarts": 5,
        "rdzvBackend": "c10d",
        "rdzvHost": f"{name}-master-0",
        "rdzvPort": 23456,
        "rdzvId": name,
        "rdzvConf": [{"key": "join_timeout", "value": "600"}],
    }
    for template in pod_templates(job).values():
        assert trainer_container(template)["args"][:5] == [
            "run",
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "5",
        ]


def test_elastic_with_one_gpu_still_uses_the_launcher_and_defaults_to_all_nodes(helm4: str) -> None:
    job = job_of(helm4, sets=("elastic.enabled=true", "worker.replicas=2", "gpusPerReplica=1"))
    assert job["spec"]["elasticPolicy"]["minReplicas"] == 3
    assert job["spec"]["elasticPolicy"]["maxReplicas"] == 3
    assert trainer_container(pod_templates(job)["Worker"])["args"][:3] == [
        "run",
        "--nproc-per-node",
        "1",
    ]


def test_master_port_is_the_named_port_the_operator_uses(helm4: str) -> None:
    job = job_of(helm4, sets=("masterPort=29500",))
    for template in pod_templates(job).values():
        assert {
            "name": "pytorchjob-port",
            "containerPort": 29500,
            "protocol": "TCP",
        } in trainer_container(template)["ports"]


def test_volcano_gang_covers_every_replica(helm4: str) -> None:
    job = job_of(helm4, "volcano")
    assert job["spec"]["runPolicy"]["schedulingPolicy"] == {
        "minAvailable": 4,
        "queue": "research",
        "priorityClass": "high",
        "minResources": {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": "16"},
        "scheduleTimeoutSeconds": 600,
    }
    assert pod_templates(job)["Worker"]["spec"]["schedulerName"] == "volcano"


def test_kueue_queue_label_is_on_the_job(helm4: str) -> None:
    labels = job_of(helm4, "kueue")["metadata"]["labels"]
    assert labels["kueue.x-k8s.io/queue-name"] == "team-a-queue"
    assert labels["kueue.x-k8s.io/priority-class"] == "high-priority"
    assert "kueue.x-k8s.io/queue-name" not in job_of(helm4)["metadata"]["labels"]


QUEUED = ("scheduling.kueue.queueName=team-a", "scheduling.kueue.priorityClass=urgent")


@pytest.mark.parametrize("which", ["helm3", "helm4"])
def test_a_queued_job_is_created_suspended_with_its_queue_labels(
        helms: dict[str, str], which: str) -> None:
    # runPolicy.suspend is left at its default (false): the queue name alone suspends the job,
    # so no pod starts before Kueue admits the whole of it.
    pytorchjob = job_of(helms[which], sets=QUEUED)
    trainjob = one(render(helms[which], sets=(*QUEUED, "apiKind=TrainJob")), "TrainJob")
    for job in (pytorchjob, trainjob):
        labels = job["metadata"]["labels"]
        assert labels["kueue.x-k8s.io/queue-name"] == "team-a"
        assert labels["kueue.x-k8s.io/priority-class"] == "urgent"
    assert pytorchjob["spec"]["runPolicy"]["suspend"] is True
    assert trainjob["spec"]["suspend"] is True
    assert job_of(helms[which])["spec"]["runPolicy"]["suspend"] is False  # unqueued: runs
    assert one(render(helms[which], sets=("apiKind=TrainJob",)),
               "TrainJob")["spec"]["suspend"] is False


def test_a_queued_jobs_rank_may_list_workloads_to_export_its_time_queued(helm4: str) -> None:
    def rules_and_env(*sets: str) -> tuple[list[dict], dict[str, str]]:
        docs = render(helm4, sets=sets)
        role = one(docs, "Role")
        (container,) = [c for t in pod_templates(one(docs, "PyTorchJob")).values()
                        for c in t["spec"]["containers"]][:1]
        return role["rules"], {e["name"]: e.get("value", "") for e in container["env"]}

    rules, env = rules_and_env(*QUEUED)
    assert {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"],
            "verbs": ["list"]} in rules
    assert env["DDP_TRAINER_QUEUE"] == "team-a"
    rules, env = rules_and_env()
    assert all("kueue.x-k8s.io" not in r["apiGroups"] for r in rules)
    assert "DDP_TRAINER_QUEUE" not in env


def test_a_queue_name_that_is_no_label_value_is_refused(helm4: str) -> None:
    for value in ("scheduling.kueue.queueName=Team_A", "scheduling.kueue.priorityClass=-high"):
        proc = run_helm(helm4, "template", RELEASE, str(CHART), "--set", value)
        assert proc.returncode != 0, value
        assert "/scheduling/kueue/" in proc.stderr, proc.stderr


def test_scheduling_values_reach_every_pod(helm4: str) -> None:
    for template in pod_templates(job_of(helm4, "everything")).values():
        spec = template["spec"]
        assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
        assert spec["priorityClassName"] == "training-high"
        assert spec["runtimeClassName"] == "nvidia"
        assert spec["affinity"]["podAntiAffinity"]
        assert [t["key"] for t in spec["tolerations"]] == [
            "nvidia.com/gpu", "node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable",
            "dedicated"]
        assert spec["imagePullSecrets"] == [{"name": "regcred"}]
        assert template["metadata"]["labels"]["team"] == "ml"


# --- storage -----------------------------------------------------------------------------


def mounts_and_volumes(template: dict) -> tuple[dict, dict]:
    mounts = {m["mountPath"]: m for m in trainer_container(template)["volumeMounts"]}
    volumes = {v["name"]: v for v in template["spec"]["volumes"]}
    return mounts, volumes


def test_default_storage_is_pod_lifetime_emptydirs_and_memory_shm(helm4: str) -> None:
    docs = render(helm4)
    assert find(docs, "PersistentVolumeClaim") == []
    mounts, volumes = mounts_and_volumes(pod_templates(one(docs, "PyTorchJob"))["Master"])
    assert "/data" not in mounts
    assert volumes[mounts["/dev/shm"]["name"]]["emptyDir"] == {
        "medium": "Memory",
        "sizeLimit": "4Gi",
    }
    for path in ("/tmp", "/checkpoints", "/outputs"):
        assert "sizeLimit" in volumes[mounts[path]["name"]]["emptyDir"], path


def test_existing_and_created_claims_are_mounted(helm4: str) -> None:
    docs = render(helm4, "everything")
    pvcs = {p["metadata"]["name"]: p for p in find(docs, "PersistentVolumeClaim")}
    job = one(docs, "PyTorchJob")
    name = job["metadata"]["name"]
    assert set(pvcs) == {f"{name}-checkpoints", f"{name}-outputs"}
    assert pvcs[f"{name}-checkpoints"]["spec"] == {
        "accessModes": ["ReadWriteMany"],
        "storageClassName": "nfs",
        "resources": {"requests": {"storage": "100Gi"}},
    }
    assert pvcs[f"{name}-checkpoints"]["metadata"]["annotations"] == {
        "helm.sh/resource-policy": "keep"
    }
    for template in pod_templates(job).values():
        mounts, volumes = mounts_and_volumes(template)
        assert volumes[mounts["/data"]["name"]]["persistentVolumeClaim"] == {
            "claimName": "imagenet",
            "readOnly": True,
        }
        assert mounts["/data"]["readOnly"] is True
        assert (
            volumes[mounts["/checkpoints"]["name"]]["persistentVolumeClaim"]["claimName"]
            == f"{name}-checkpoints"
        )
        assert (
            volumes[mounts["/outputs"]["name"]]["persistentVolumeClaim"]["claimName"]
            == f"{name}-outputs"
        )
        assert "/cache" in mounts and volumes["cache"]["emptyDir"] == {"sizeLimit": "20Gi"}


# --- monitoring --------------------------------------------------------------------------


def prometheus_label_name(k8s_label: str) -> str:
    return "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", k8s_label)


@pytest.mark.parametrize("value_set", ["defaults", "everything"])
def test_pod_monitor_selects_this_jobs_pods_and_relabels_operator_labels(
    helm4: str, value_set: str
) -> None:
    docs = render(helm4, value_set)
    monitor = one(docs, "PodMonitor")
    job = one(docs, "PyTorchJob")
    for template in pod_templates(job).values():
        labels = template["metadata"]["labels"]
        assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert "metrics" in [p["name"] for p in trainer_container(template)["ports"]]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    relabel = {r["targetLabel"]: r.get("sourceLabels") for r in endpoint["relabelings"]}
    assert relabel == {
        **{target: [prometheus_label_name(label)] for label, target in OPERATOR_LABELS.items()},
        "job_kind": None,  # a constant, see below
    }
    (kind,) = [r for r in endpoint["relabelings"] if r["targetLabel"] == "job_kind"]
    assert kind["replacement"] == "PyTorchJob"


def test_pod_monitor_selector_does_not_match_another_release(helm4: str) -> None:
    mine = one(render(helm4), "PodMonitor")["spec"]["selector"]["matchLabels"]
    other = pod_templates(one(render(helm4, release="other"), "PyTorchJob"))["Master"]["metadata"][
        "labels"
    ]
    assert not mine.items() <= other.items()


def test_pod_monitor_carries_kube_prometheus_stack_release_label(helm4: str) -> None:
    assert (
        one(render(helm4), "PodMonitor")["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    )
    assert (
        one(render(helm4, "everything"), "PodMonitor")["metadata"]["labels"]["release"]
        == "prometheus"
    )


def test_dashboard_configmap_is_labelled_for_the_grafana_sidecar(helm4: str) -> None:
    dashboard_file = CHART / "files" / "dashboard.json"
    assert dashboard_file.is_file(), (
        "charts/ddp-trainer/files/dashboard.json is missing (metrics area)"
    )
    cm = [
        d
        for d in find(render(helm4, "everything"), "ConfigMap")
        if d["metadata"]["name"].endswith("-dashboard")
    ]
    assert len(cm) == 1
    assert cm[0]["metadata"]["namespace"] == "monitoring"
    assert cm[0]["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm[0]["metadata"]["annotations"] == {"grafana_folder": "ddp-trainer"}
    (payload,) = cm[0]["data"].values()
    assert json.loads(payload) == json.loads(dashboard_file.read_text())
    default = [
        d for d in find(render(helm4), "ConfigMap") if d["metadata"]["name"].endswith("-dashboard")
    ]
    assert default and default[0]["metadata"]["namespace"] == NAMESPACE


def test_the_alerts_file_is_the_chart_rules_rendered_with_the_defaults(helm4: str) -> None:
    sys.path.insert(0, str(REPO / "tools"))
    from alerts import ALERTS, generated

    rule = one(render(helm4), "PrometheusRule")
    assert ALERTS.read_text() == generated(helm4), "run .venv/bin/python tools/alerts.py"
    assert rule["spec"]["groups"] == yaml.safe_load(ALERTS.read_text())["groups"]


def test_alert_thresholds_and_durations_come_from_the_values(helm4: str) -> None:
    sets = ("metrics.prometheusRule.alerts.stalled.seconds=30",
            "metrics.prometheusRule.alerts.stalled.for=10s",
            "metrics.prometheusRule.alerts.lossExploding.factor=3",
            "metrics.prometheusRule.alerts.lossExploding.window=10m",
            "metrics.prometheusRule.alerts.lossExploding.resolution=5s",
            "metrics.prometheusRule.alerts.restarting.count=3")
    rule = one(render(helm4, sets=sets), "PrometheusRule")
    by_name = {r["alert"]: r for r in rule["spec"]["groups"][0]["rules"]}
    stalled, exploding = by_name["DDPTrainerTrainingStalled"], by_name["DDPTrainerLossExploding"]
    assert ") > 30\n" in stalled["expr"] and stalled["for"] == "10s"
    assert "> 3 * min_over_time(" in exploding["expr"] and "[10m:5s])" in exploding["expr"]
    assert "of the last 10m" in exploding["annotations"]["description"]
    assert by_name["DDPTrainerRestarting"]["expr"].rstrip().endswith(">= 3")


def test_a_malformed_alert_duration_fails_the_install(helm4: str) -> None:
    proc = run_helm(helm4, "template", RELEASE, str(CHART),
                    "--set", "metrics.prometheusRule.alerts.stalled.for=2 minutes")
    assert proc.returncode != 0
    assert "/metrics/prometheusRule/alerts/stalled/for" in proc.stderr, proc.stderr


def test_monitoring_off_renders_no_monitoring_objects(helm4: str) -> None:
    docs = render(helm4, "monitoring-off")
    assert find(docs, "PodMonitor") == [] and find(docs, "PrometheusRule") == []
    assert [d["metadata"]["name"] for d in find(docs, "ConfigMap")] == [
        "mytrain-ddp-trainer-config"
    ]
    annotations = pod_templates(one(docs, "PyTorchJob"))["Master"]["metadata"]["annotations"]
    assert not any(k.startswith("prometheus.io/") for k in annotations)


def test_scrape_annotations_point_at_the_metrics_port(helm4: str) -> None:
    annotations = pod_templates(job_of(helm4, "everything"))["Worker"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "9400"
    assert annotations["prometheus.io/path"] == "/metrics"


# --- security ----------------------------------------------------------------------------


@pytest.mark.parametrize("value_set", [v for v in VALUE_SETS if v != "rdma"])
def test_pods_meet_the_restricted_pod_security_standard(helm4: str, value_set: str) -> None:
    docs = render(helm4, value_set)
    for template in pod_templates(one(docs, "PyTorchJob")).values():
        spec = template["spec"]
        psc = spec["securityContext"]
        assert (
            psc["runAsNonRoot"] is True and psc["runAsUser"] == 10001 and psc["runAsGroup"] == 10001
        )
        assert psc["seccompProfile"] == {"type": "RuntimeDefault"}
        assert spec["automountServiceAccountToken"] is False
        assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC")
        assert not any("hostPath" in v for v in spec["volumes"])
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"] == {"drop": ["ALL"]}
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["runAsNonRoot"] is True
            writable = {m["mountPath"] for m in c["volumeMounts"] if not m.get("readOnly")}
            assert {"/tmp", "/checkpoints", "/outputs", "/dev/shm"} <= writable
    sa = one(docs, "ServiceAccount")
    assert sa["automountServiceAccountToken"] is False
    assert {
        t["spec"]["serviceAccountName"] for t in pod_templates(one(docs, "PyTorchJob")).values()
    } == {sa["metadata"]["name"]}


def test_rdma_opt_out_adds_only_ipc_lock_and_the_rdma_resource(helm4: str) -> None:
    for template in pod_templates(job_of(helm4, "rdma")).values():
        c = trainer_container(template)
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["resources"]["limits"]["rdma/rdma_shared_device_a"] == 1


def test_network_policy_admits_job_pods_and_the_monitoring_namespace_only(helm4: str) -> None:
    assert find(render(helm4), "NetworkPolicy") == []
    docs = render(helm4, "everything")
    policy = one(docs, "NetworkPolicy")["spec"]
    pod_labels = pod_templates(one(docs, "PyTorchJob"))["Worker"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    peers, scrape = policy["ingress"]
    assert "ports" not in peers  # rendezvous, store and NCCL use many ports
    assert peers["from"][0]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert scrape["ports"] == [{"protocol": "TCP", "port": "metrics"}]
    assert scrape["from"][0]["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "monitoring"}
    }
    egress_ports = [p["port"] for rule in policy["egress"] for p in rule.get("ports", [])]
    assert 53 in egress_ports and 443 in egress_ports


# --- general hygiene ---------------------------------------------------------------------


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_labels_and_quantities_are_well_formed(helm4: str, value_set: str) -> None:
    docs = render(helm4, value_set)
    metas = [d["metadata"] for d in docs]
    metas += [t["metadata"] for t in pod_templates(one(docs, "PyTorchJob")).values()]
    for meta in metas:
        for key, value in meta.get("labels", {}).items():
            assert LABEL_NAME.match(key) and len(key.split("/")[-1]) <= 63, key
            assert isinstance(value, str) and LABEL_VALUE.match(value) and len(value) <= 63, (
                key,
                value,
            )
    for template in pod_templates(one(docs, "PyTorchJob")).values():
        for section in trainer_container(template)["resources"].values():
            for name, qty in section.items():
                assert QUANTITY.match(str(qty)), (name, qty)
        for v in template["spec"]["volumes"]:
            if "emptyDir" in v and "sizeLimit" in v["emptyDir"]:
                assert QUANTITY.match(str(v["emptyDir"]["sizeLimit"])), v


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_every_object_has_the_standard_labels(helm4: str, value_set: str) -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    for d in render(helm4, value_set):
        labels = d["metadata"]["labels"]
        assert labels["helm.sh/chart"] == f"ddp-trainer-{chart['version']}"
        assert labels["app.kubernetes.io/name"] == "ddp-trainer"
        assert labels["app.kubernetes.io/instance"] == "mytrain"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["app.kubernetes.io/version"]
        assert d["metadata"]["namespace"] in {NAMESPACE, "monitoring"}


def test_common_labels_reach_every_object(helm4: str) -> None:
    assert all(
        d["metadata"]["labels"]["cost-center"] == "research" for d in render(helm4, "everything")
    )


def test_chart_app_version_is_the_trainer_version_and_image_is_ghcr(helm4: str) -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    init = (REPO / "trainer" / "__init__.py").read_text()
    (version,) = re.findall(r'^__version__ = "([^"]+)"', init, flags=re.M)
    assert chart["appVersion"] == version
    assert chart["apiVersion"] == "v2" and chart["kubeVersion"]
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["image"]["repository"] == "ghcr.io/ddp-trainer/ddp-trainer"


# --- threads ------------------------------------------------------------------------------


def cpu_env(container: dict) -> dict[str, dict]:
    return {e["name"]: e["valueFrom"]["resourceFieldRef"] for e in container["env"]
            if e["name"].startswith("DDP_TRAINER_CPU_")}


def test_the_containers_cpu_limit_and_request_reach_the_ranks_in_millicores(helm4: str) -> None:
    for pod, template in pod_templates(job_of(helm4)).items():
        assert cpu_env(trainer_container(template)) == {
            "DDP_TRAINER_CPU_LIMIT_MILLICORES": {"resource": "limits.cpu", "divisor": "1m"},
            "DDP_TRAINER_CPU_REQUEST_MILLICORES": {"resource": "requests.cpu", "divisor": "1m"},
        }, pod
    pod = trainjob_pod(render(helm4, "trainjob/defaults"))
    (node,) = [c for c in pod["spec"]["containers"] if c["name"] == "node"]
    assert set(cpu_env(node)) == {"DDP_TRAINER_CPU_LIMIT_MILLICORES",
                                  "DDP_TRAINER_CPU_REQUEST_MILLICORES"}


def test_an_unset_cpu_limit_is_not_passed_as_the_nodes_cpu(helm4: str) -> None:
    # The downward API would report the node's allocatable CPU for a missing limit.
    job = job_of(helm4, sets=("resources.perGpu.limits.cpu=null",))
    for template in pod_templates(job).values():
        assert list(cpu_env(trainer_container(template))) == [
            "DDP_TRAINER_CPU_REQUEST_MILLICORES"]


# --- nodes: spreading the pods, leaving a lost node -------------------------------------------

NODE_LOSS = ["node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"]
HOSTNAME_TERM = {"topologyKey": "kubernetes.io/hostname",
                 "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "ddp-trainer",
                                                   "app.kubernetes.io/instance": RELEASE}}}


def node_loss_tolerations(spec: dict) -> dict[str, int | None]:
    return {t["key"]: t.get("tolerationSeconds") for t in spec.get("tolerations", [])
            if t["key"] in NODE_LOSS and t["effect"] == "NoExecute"}


def test_every_pod_leaves_a_lost_node_after_60_s_by_default_or_the_value_set(
        helm4: str) -> None:
    for sets, want in (((), 60), (("nodeLossToleranceSeconds=5",), 5)):
        for template in pod_templates(job_of(helm4, sets=sets)).values():
            assert node_loss_tolerations(template["spec"]) == dict.fromkeys(NODE_LOSS, want)
        trainjob = trainjob_pod(render(helm4, sets=("apiKind=TrainJob", *sets)))
        assert node_loss_tolerations(trainjob["spec"]) == dict.fromkeys(NODE_LOSS, want)
    # null: the cluster's DefaultTolerationSeconds (300 s) decides, as for any pod
    for template in pod_templates(job_of(helm4, sets=("nodeLossToleranceSeconds=null",))).values():
        assert node_loss_tolerations(template["spec"]) == {}


def test_spread_across_nodes_adds_a_hostname_anti_affinity_term_to_the_affinity_value(
        helm4: str) -> None:
    for template in pod_templates(job_of(helm4)).values():
        assert "affinity" not in template["spec"]
    required = job_of(helm4, sets=("spreadAcrossNodes=required",))
    for template in pod_templates(required).values():
        anti = template["spec"]["affinity"]["podAntiAffinity"]
        assert anti == {"requiredDuringSchedulingIgnoredDuringExecution": [HOSTNAME_TERM]}
    # preferred, in a TrainJob, beside a user's own anti-affinity term (kept)
    own = {"topologyKey": "topology.kubernetes.io/zone",
           "labelSelector": {"matchLabels": {"team": "ml"}}}
    pod = trainjob_pod(render(helm4, sets=(
        "apiKind=TrainJob", "spreadAcrossNodes=preferred",
        "affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0]"
        ".topologyKey=topology.kubernetes.io/zone",
        "affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0]"
        ".labelSelector.matchLabels.team=ml")))
    anti = pod["spec"]["affinity"]["podAntiAffinity"]
    assert anti["requiredDuringSchedulingIgnoredDuringExecution"] == [own]
    assert anti["preferredDuringSchedulingIgnoredDuringExecution"] == [
        {"weight": 100, "podAffinityTerm": HOSTNAME_TERM}]
