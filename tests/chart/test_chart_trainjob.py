"""`apiKind: TrainJob`: the chart renders a Kubeflow Trainer v2.3 TrainJob (and, when asked, its
own TrainingRuntime) that is valid against the vendored v2.3.0 CRDs (lint and Helm 3 = Helm 4:
test_chart_validity.py), gives the pod the controller builds everything the PyTorchJob mode's
pod has, is scraped into the same series labels, and refuses what v2 cannot express with a
message naming the value.
The controller itself cannot run here: `trainjob_pod` models how it builds the pod (chartlib)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from .chartlib import (
    CHART,
    NAMESPACE,
    RELEASE,
    TRAINJOB_VALUE_SETS,
    VALUES_DIR,
    as_pod,
    crd_errors,
    find,
    k8s_errors,
    one,
    render,
    run_helm,
    trainer_container,
    trainjob_pod,
)

CONFIG = "/etc/ddp-trainer/config.yaml"
KINDS = {"ConfigMap", "ServiceAccount", "PersistentVolumeClaim", "NetworkPolicy", "Role",
         "RoleBinding", "TrainJob", "TrainingRuntime", "PodMonitor", "PrometheusRule"}


def node(pod: dict[str, Any]) -> dict[str, Any]:
    (container,) = [c for c in pod["spec"]["containers"] if c["name"] == "node"]
    return container


@pytest.mark.parametrize("value_set", TRAINJOB_VALUE_SETS)
def test_custom_resources_match_the_v2_3_crds_strictly(helm4: str, value_set: str) -> None:
    docs = render(helm4, value_set)
    assert {d["kind"] for d in docs} <= KINDS
    assert find(docs, "PyTorchJob") == []
    custom = [d for d in docs if d["kind"] in {"TrainJob", "TrainingRuntime", "PodMonitor",
                                               "PrometheusRule"}]
    errors = {f"{d['kind']}/{d['metadata']['name']}": crd_errors(d) for d in custom}
    assert {k: v for k, v in errors.items() if v} == {}


DOMAIN_PREFIXED_PATH = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9/\-._~%!$&'()*+,;=:]+$")


@pytest.mark.parametrize("value_set", [v for v in TRAINJOB_VALUE_SETS if v != "trainjob/runtime"])
def test_runtime_patch_passes_the_controllers_admission_checks(helm4: str, value_set: str) -> None:
    """kubeflow/trainer v2.3.0 pkg/runtime/framework/plugins/jobset/jobset.go:175-209 and the
    torch plugin's reserved variables (plugins/torch/torch.go:65-77), against the runtime the
    patch targets (the vendored torch-distributed one)."""
    import yaml

    from .chartlib import TORCH_DISTRIBUTED

    runtime = yaml.safe_load(TORCH_DISTRIBUTED.read_text())
    containers = {r["name"]: {c["name"] for c in r["template"]["spec"]["template"]["spec"]
                              ["containers"]}
                  for r in runtime["spec"]["template"]["spec"]["replicatedJobs"]}
    job = one(render(helm4, value_set), "TrainJob")
    (patch,) = job["spec"]["runtimePatches"]
    assert DOMAIN_PREFIXED_PATH.match(patch["manager"]), patch["manager"]
    for rjob in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]:
        assert rjob["name"] in containers
        for c in rjob["template"]["spec"]["template"]["spec"]["containers"]:
            assert c["name"] in containers[rjob["name"]]
            assert "env" not in c  # the controller refuses env patches of `node`
    reserved = {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR",
                "PET_MASTER_PORT"}
    assert reserved.isdisjoint(e["name"] for e in job["spec"]["trainer"]["env"])


def test_crd_validation_rejects_an_unknown_trainer_field_and_a_wrong_type(helm4: str) -> None:
    job = one(render(helm4, "trainjob/defaults"), "TrainJob")
    job["spec"]["trainer"]["numNode"] = 2
    job["spec"]["trainer"]["numProcPerNode"] = "1"
    job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"][
        "replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["priorityClassName"] = "x"
    errors = "\n".join(crd_errors(job))
    assert "numNode" in errors and "numProcPerNode" in errors
    assert "priorityClassName" in errors  # a runtime patch may not carry it


@pytest.mark.parametrize("k8s_version", ["1.27.0", "1.35.0"])
@pytest.mark.parametrize("value_set", TRAINJOB_VALUE_SETS)
def test_the_pod_the_controller_builds_and_builtin_objects_match_kubernetes(
        helm4: str, value_set: str, k8s_version: str) -> None:
    docs = render(helm4, value_set)
    objects = [d for d in docs if d["kind"] in {"ConfigMap", "ServiceAccount",
                                                "PersistentVolumeClaim", "NetworkPolicy"}]
    objects.append(trainjob_pod(docs))
    objects += [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": d["metadata"]}
                for d in docs if d["kind"] in {"TrainJob", "TrainingRuntime"}]
    errors = {f"{o['kind']}/{o['metadata']['name']}": k8s_errors(o, k8s_version)
              for o in objects}
    assert {k: v for k, v in errors.items() if v} == {}


def test_issue_example_sets_nodes_procs_and_gpus_per_node(helm4: str) -> None:
    job = one(render(helm4, "trainjob/gpu-3x8"), "TrainJob")
    trainer = job["spec"]["trainer"]
    assert trainer["numNodes"] == 4
    assert trainer["numProcPerNode"] == 8
    assert trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == 8
    assert trainer["command"] == ["ddp-trainer"]
    assert trainer["args"] == ["run", "--nproc-per-node", "8", "--config", CONFIG]
    assert job["spec"]["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org",
                                         "kind": "ClusterTrainingRuntime",
                                         "name": "torch-distributed"}


@pytest.mark.parametrize("gpus", [0, 1])
def test_one_rank_per_node_still_runs_the_launcher(helm4: str, gpus: int) -> None:
    # Trainer v2 sets only PET_*; `ddp-trainer train` would need RANK and WORLD_SIZE.
    job = one(render(helm4, "trainjob/defaults", (f"gpusPerReplica={gpus}",)), "TrainJob")
    trainer = job["spec"]["trainer"]
    assert trainer["numProcPerNode"] == 1
    assert trainer["args"][:3] == ["run", "--nproc-per-node", "1"]
    assert ("nvidia.com/gpu" in trainer["resourcesPerNode"]["limits"]) == bool(gpus)


def test_the_pod_has_everything_the_pytorchjob_modes_pod_has(helm4: str) -> None:
    """Same values, both kinds: the TrainJob's pod equals the PyTorchJob Master's pod in all
    but the container name, the ports and the variables each controller adds."""
    values = ("trainjob/everything",)
    v2 = trainjob_pod(render(helm4, *values))
    sets = ("apiKind=PyTorchJob", "trainJob.runtimeRef.kind=ClusterTrainingRuntime")
    v1 = as_pod(one(render(helm4, *values, sets), "PyTorchJob"), "Master")
    for field in ("serviceAccountName", "terminationGracePeriodSeconds", "securityContext",
                  "nodeSelector", "affinity", "tolerations", "imagePullSecrets", "volumes"):
        assert v2["spec"][field] == v1["spec"][field], field
    c1, c2 = trainer_container(v1), node(v2)
    for field in ("image", "command", "securityContext", "volumeMounts", "resources"):
        assert c2[field] == c1[field], field
    assert c2["args"] == c1["args"]  # `run --nproc-per-node 8`, as the PyTorchJob with 8 GPUs
    env1, env2 = ({e["name"]: e for e in c["env"]} for c in (c1, c2))
    # the job the hang watchdog's Event goes to: each kind's own, by its controller's pod label
    assert env1.pop("DDP_TRAINER_JOB_KIND")["value"] == "PyTorchJob"
    assert env2.pop("DDP_TRAINER_JOB_KIND")["value"] == "TrainJob"
    label = {e: env.pop("DDP_TRAINER_JOB_NAME")["valueFrom"]["fieldRef"]["fieldPath"]
             for e, env in (("v1", env1), ("v2", env2))}
    assert label == {"v1": "metadata.labels['training.kubeflow.org/job-name']",
                     "v2": "metadata.labels['jobset.sigs.k8s.io/jobset-name']"}
    assert env1.items() <= env2.items()
    for key in ("team", "app.kubernetes.io/name", "app.kubernetes.io/instance"):
        assert v2["metadata"]["labels"][key] == v1["metadata"]["labels"][key]
    assert v2["metadata"]["annotations"]["example.com/owner"] == "ml-platform"
    assert v2["metadata"]["annotations"]["prometheus.io/port"] == "9400"
    job = one(render(helm4, *values), "TrainJob")
    assert job["spec"]["suspend"] is True and job["spec"]["activeDeadlineSeconds"] == 172800
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a-queue"
    assert job["spec"]["runtimeRef"]["kind"] == "TrainingRuntime"
    assert job["spec"]["runtimeRef"]["name"] == "team-torch"


def test_pet_variables_form_the_world_the_launcher_expects(helm4: str) -> None:
    pod = trainjob_pod(render(helm4, "trainjob/gpu-3x8"), node_rank=2)
    env = {e["name"]: e.get("value") for e in node(pod)["env"]}
    assert env["PET_NNODES"] == "4" and env["PET_NPROC_PER_NODE"] == "8"
    assert env["PET_MASTER_ADDR"] == "mytrain-ddp-trainer-node-0-0.mytrain-ddp-trainer"
    assert env["PET_MASTER_PORT"] == "29500"
    assert node(pod)["args"][:3] == ["run", "--nproc-per-node", env["PET_NPROC_PER_NODE"]]


def test_create_runtime_renders_a_training_runtime_with_the_whole_pod(helm4: str) -> None:
    docs = render(helm4, "trainjob/runtime")
    job = one(docs, "TrainJob")
    runtime = one(docs, "TrainingRuntime")
    name = job["metadata"]["name"]
    assert job["spec"]["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org",
                                         "kind": "TrainingRuntime", "name": name}
    assert "runtimePatches" not in job["spec"]
    assert runtime["metadata"]["name"] == name
    assert runtime["spec"]["mlPolicy"] == {"numNodes": 2, "torch": {}}
    (rjob,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    assert rjob["name"] == "node"
    assert rjob["template"]["metadata"]["labels"] == {
        "trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
    assert rjob["template"]["spec"]["backoffLimit"] == 5
    pod = trainjob_pod(docs)
    assert node(pod)["terminationMessagePolicy"] == "FallbackToLogsOnError"
    spec = pod["spec"]
    assert spec["priorityClassName"] == "training-high"
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["schedulerName"] == "default-scheduler"
    assert spec["restartPolicy"] == "Never"
    assert spec["automountServiceAccountToken"] is False
    assert node(pod)["imagePullPolicy"] == "Always"
    assert node(pod)["envFrom"] == [{"configMapRef": {"name": "nccl-env"}}]
    assert {"name": "metrics", "containerPort": 9310, "protocol": "TCP"} in node(pod)["ports"]


# --- monitoring: the same series labels for both kinds --------------------------------------


def relabel(rules: list[dict[str, Any]], labels: dict[str, str]) -> dict[str, str] | None:
    """Prometheus' relabelling (keep and replace; anchored regexes), None when dropped."""
    out = dict(labels)
    for rule in rules:
        value = rule.get("separator", ";").join(out.get(s, "") for s in
                                                 rule.get("sourceLabels", []))
        match = re.fullmatch(rule.get("regex", "(.*)"), value)
        action = rule.get("action", "replace")
        if action == "keep":
            if not match:
                return None
        elif action == "replace" and match:
            # Prometheus' $1 / ${1}, as Python's \g<1>.
            template = re.sub(r"\$\{?(\d+)\}?", r"\\g<\1>", rule.get("replacement", "$1"))
            result = match.expand(template)
            if result:
                out[rule["targetLabel"]] = result
            else:
                out.pop(rule["targetLabel"], None)
    return {k: v for k, v in out.items() if not k.startswith("__meta_")}


def targets(pod: dict[str, Any], ip: str) -> list[dict[str, str]]:
    """Prometheus' pod discovery: one target per declared container port."""
    labels = {"__meta_kubernetes_pod_ip": ip}
    for key, value in pod["metadata"]["labels"].items():
        labels["__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)] = value
    out = []
    for container in pod["spec"]["containers"]:
        for port in container.get("ports", []):
            out.append({**labels, "__address__": f"{ip}:{port['containerPort']}",
                        "__meta_kubernetes_pod_container_name": container["name"],
                        "__meta_kubernetes_pod_container_port_number": str(port["containerPort"]),
                        "__meta_kubernetes_pod_container_port_name": port.get("name", "")})
    return out


def scraped(monitor: dict[str, Any], pod: dict[str, Any], ip: str) -> list[dict[str, str]]:
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    selected = []
    for target in targets(pod, ip):
        if "port" in endpoint and target["__meta_kubernetes_pod_container_port_name"] != \
                endpoint["port"]:
            continue  # the operator keeps only the named port
        result = relabel(endpoint["relabelings"], target)
        if result is not None:
            selected.append(result)
    return selected


@pytest.mark.parametrize("value_set", ["trainjob/defaults", "trainjob/runtime",
                                       "trainjob/everything"])
@pytest.mark.parametrize("ip", ["10.1.2.3", "fd00::1:2"])
def test_pod_monitor_scrapes_one_target_per_node_into_the_pytorchjob_series_labels(
        helm4: str, value_set: str, ip: str) -> None:
    docs = render(helm4, value_set)
    monitor = one(docs, "PodMonitor")
    pod = trainjob_pod(docs, node_rank=1)
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    metrics_port = 9400 if value_set.endswith("everything") else 9310
    address = f"[{ip}]:{metrics_port}" if ":" in ip else f"{ip}:{metrics_port}"
    name = one(docs, "TrainJob")["metadata"]["name"]
    assert scraped(monitor, pod, ip) == [{"__address__": address, "pytorchjob": name,
                                          "replica_type": "node", "replica_index": "1",
                                          "job_kind": "TrainJob"}]
    # The PyTorchJob mode yields the same label names, so dashboard and alerts serve both.
    v1_docs = render(helm4, sets=("worker.replicas=1",))
    v1 = as_pod(one(v1_docs, "PyTorchJob"), "Worker")
    v1["metadata"]["labels"].update({"training.kubeflow.org/job-name": name,
                                     "training.kubeflow.org/replica-type": "worker",
                                     "training.kubeflow.org/replica-index": "0"})
    (v1_target,) = scraped(one(v1_docs, "PodMonitor"), v1, "10.9.9.9")
    assert set(v1_target) == {"__address__", "pytorchjob", "replica_type", "replica_index",
                              "job_kind"}
    assert v1_target["job_kind"] == "PyTorchJob"


def test_network_policy_opens_the_metrics_port_by_number_and_the_status_server(
        helm4: str) -> None:
    docs = render(helm4, "trainjob/everything")
    policy = one(docs, "NetworkPolicy")["spec"]
    pod = trainjob_pod(docs)
    assert policy["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert policy["ingress"][1]["ports"] == [{"protocol": "TCP", "port": 9400}]
    status = [r for r in policy["egress"] if {"protocol": "TCP", "port": 10443} in
              r.get("ports", [])]
    assert status and status[0]["to"][0]["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "kubeflow-system"}}


def test_notes_tell_how_to_watch_progress_and_read_logs(helm4: str) -> None:
    proc = run_helm(helm4, "install", RELEASE, str(CHART), "--namespace", NAMESPACE,
                    "--dry-run=client", "-f", str(VALUES_DIR / "trainjob/gpu-3x8.yaml"))
    assert proc.returncode == 0, proc.stderr
    notes = proc.stdout.split("NOTES:", 1)[1]
    job = "mytrain-ddp-trainer"
    assert f"TrainJob {NAMESPACE}/{job}" in notes and "world size 32" in notes
    assert f"kubectl -n {NAMESPACE} get trainjob {job} -o jsonpath='{{.status.trainerStatus}}'" \
        in notes
    assert f"logs -f -c node -l jobset.sigs.k8s.io/jobset-name={job}," \
           "batch.kubernetes.io/job-completion-index=0" in notes
    assert 'job_kind="TrainJob"' in notes


# --- what v2 cannot express fails, naming the value ----------------------------------------

BAD = {
    # case: (helm --set arguments, text the error must contain)
    "elastic": (["elastic.enabled=true"], "elastic.enabled"),
    "volcano": (["scheduling.volcano.enabled=true"], "scheduling.volcano.enabled"),
    "master-port": (["masterPort=29400"], "masterPort"),
    "metrics-on-rendezvous-port": (["metrics.port=29500"], "metrics.port"),
    "clean-pod-policy": (["runPolicy.cleanPodPolicy=All"], "runPolicy.cleanPodPolicy"),
    "ttl": (["runPolicy.ttlSecondsAfterFinished=60"], "runPolicy.ttlSecondsAfterFinished"),
    "exit-code": (["restartPolicy=ExitCode"], "restartPolicy"),
    "reserved-env": (["env[0].name=PET_NNODES", "env[0].value=3"], "PET_NNODES"),
    "priority-class": (["priorityClassName=high"], "priorityClassName"),
    "runtime-class": (["runtimeClassName=nvidia"], "runtimeClassName"),
    "scheduler": (["schedulerName=volcano"], "schedulerName"),
    "env-from": (["envFrom[0].configMapRef.name=x"], "envFrom"),
    "pull-policy": (["image.pullPolicy=Always"], "image.pullPolicy"),
    "never": (["restartPolicy=Never"], "restartPolicy"),
    "backoff": (["runPolicy.backoffLimit=9"], "runPolicy.backoffLimit"),
    "foreign-sa-token": (["serviceAccount.create=false"],
                         "serviceAccount.automountServiceAccountToken"),
    "runtime-ref-with-create": (["trainJob.createRuntime=true",
                                 "trainJob.runtimeRef.name=mine"], "trainJob.runtimeRef"),
    "bad-api-kind": (["apiKind=MPIJob"], "apiKind"),
    "bad-runtime-kind": (["trainJob.runtimeRef.kind=Runtime"], "kind"),
}


@pytest.mark.parametrize("which", ["helm3", "helm4"])
@pytest.mark.parametrize("case", sorted(BAD))
def test_values_v2_cannot_express_fail_naming_the_value(
        helms: dict[str, str], which: str, case: str) -> None:
    sets, key = BAD[case]
    args = ["--set", "apiKind=TrainJob"]
    for s in sets:
        args += ["--set", s]
    proc = run_helm(helms[which], "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
                    *args)
    assert proc.returncode != 0, f"{case} rendered:\n{proc.stdout[:400]}"
    assert key in proc.stderr, proc.stderr


@pytest.mark.parametrize("case", ["priority-class", "pull-policy", "never", "backoff",
                                  "env-from", "foreign-sa-token"])
def test_the_same_values_render_with_the_charts_own_runtime(helm4: str, case: str) -> None:
    sets = ("apiKind=TrainJob", "trainJob.createRuntime=true", *BAD[case][0])
    docs = render(helm4, sets=sets)
    assert crd_errors(one(docs, "TrainingRuntime")) == []
