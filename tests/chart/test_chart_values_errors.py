"""Bad values fail `helm template` (Helm 3 and Helm 4) with a message naming the offending key,
and the install notes tell the user how to follow the job."""

from __future__ import annotations

import pytest

from .chartlib import CHART, NAMESPACE, RELEASE, run_helm

BAD_VALUES = {
    # case: (helm arguments, text the error must contain)
    "negative-workers": (["--set", "worker.replicas=-1"], "replicas"),
    "gpus-as-string": (["--set-string", "gpusPerReplica=8"], "gpusPerReplica"),
    "unknown-top-level-key": (["--set", "workers=3"], "workers"),
    "unknown-nested-key": (["--set", "metrics.podMonitor.enable=true"], "enable"),
    "bad-clean-pod-policy": (["--set", "runPolicy.cleanPodPolicy=Sometimes"], "cleanPodPolicy"),
    "bad-restart-policy": (["--set", "restartPolicy=Always"], "restartPolicy"),
    "unknown-trainer-config-key": (["--set", "trainerConfig.train.epoch=3"], "epoch"),
    "trainer-config-wrong-type": (["--set-string", "trainerConfig.train.epochs=3"], "epochs"),
    # names and limits from trainer/config.py's field metadata (tools/chart_schema.py)
    "trainer-config-unknown-optimizer": (["--set", "trainerConfig.optim.name=adamx"], "name"),
    "trainer-config-zero-epochs": (["--set", "trainerConfig.train.epochs=0"], "epochs"),
    "trainer-config-unknown-precision": (["--set", "trainerConfig.train.precision=fp8"],
                                         "precision"),
    "bad-pull-policy": (["--set", "image.pullPolicy=Sometimes"], "pullPolicy"),
    "port-out-of-range": (["--set", "metrics.port=70000"], "port"),
    "bad-quantity": (["--set", "shm.sizeLimit=lots"], "sizeLimit"),
    "elastic-without-workers": (
        ["--set", "elastic.enabled=true", "--set", "worker.replicas=0"],
        "worker.replicas",
    ),
    "elastic-min-above-max": (
        [
            "--set",
            "elastic.enabled=true",
            "--set",
            "elastic.minNodes=4",
            "--set",
            "elastic.maxNodes=2",
        ],
        "elastic.minNodes",
    ),
    "job-name-not-dns-1035": (["--set", "fullnameOverride=9lives"], "fullnameOverride"),
    # a PVC name is a DNS-1123 subdomain; Kubernetes would refuse the pod only at install time
    "existing-claim-not-dns-1123": (["--set", "persistence.data.existingClaim=My_Claim"],
                                    "existingClaim"),
    "existing-claim-too-long": (["--set", f"persistence.outputs.existingClaim={'a' * 254}"],
                                "existingClaim"),
    "unknown-spread-mode": (["--set", "spreadAcrossNodes=always"], "spreadAcrossNodes"),
    "negative-node-loss-toleration": (["--set", "nodeLossToleranceSeconds=-5"],
                                      "nodeLossToleranceSeconds"),
    # Kubernetes refuses these pods when the operator creates them: the job would sit without
    # pods, the refusal only in an event
    "cpu-limit-below-the-default-request": (["--set", "resources.limits.cpu=1500m"],
                                            "resources.limits.cpu"),
    "memory-request-above-limit": (["--set", "resources.requests.memory=17Gi"],
                                   "resources.limits.memory"),
    "gpu-request-not-its-limit": (["--set", "gpusPerReplica=2",
                                   "--set", "resources.requests.nvidia\\.com/gpu=1"],
                                  "nvidia.com/gpu"),
    "toleration-exists-with-a-value": (["--set", "tolerations[0].key=a", "--set",
                                        "tolerations[0].operator=Exists",
                                        "--set", "tolerations[0].value=x"], "tolerations[0]"),
    "toleration-seconds-without-no-execute": (["--set", "tolerations[0].key=a", "--set",
                                               "tolerations[0].tolerationSeconds=5"],
                                              "tolerations[0]"),
    "toleration-operator-misspelt": (["--set", "tolerations[0].key=a", "--set",
                                      "tolerations[0].operator=Exist"], "operator"),
    # the rendezvous store and the metrics server would fight over the port at run time
    "master-port-is-the-metrics-port": (["--set", "masterPort=9310"], "metrics.port"),
    # more that Kubernetes refuses (tests/cluster/test_chart_pod_rules.py asks the API server)
    "toleration-key-not-a-label-name": (["--set", "tolerations[0].key=a b!",
                                         "--set", "tolerations[0].operator=Exists"],
                                        "tolerations.0.key"),
    "toleration-value-not-a-label-value": (["--set", "tolerations[0].key=a",
                                            "--set", "tolerations[0].value=x y!"],
                                           "tolerations.0.value"),
    "toleration-seconds-above-int64": (["--set", "tolerations[0].key=a",
                                        "--set", "tolerations[0].effect=NoExecute",
                                        "--set-json",
                                        "tolerations[0].tolerationSeconds=9223372036854775808"],
                                       "tolerationSeconds"),
    # 1e19 wrapped to -2**63 in the rendered toleration: evicted at once, the opposite
    "node-loss-toleration-above-int64": (["--set-json", "nodeLossToleranceSeconds=1e19"],
                                         "nodeLossToleranceSeconds"),
    "resource-name-without-a-domain": (["--set", "resources.limits.foo=1"],
                                       "resources.limits.foo"),
    # E is exa (10**18), not an exponent of nothing
    "memory-request-of-an-exabyte": (["--set-string", "resources.requests.memory=1E"],
                                     "resources.limits.memory"),
    "zero-long-alert-window": (["--set-string",
                                "metrics.prometheusRule.alerts.lossExploding.window=0"],
                               "lossExploding.window"),
    "storage-class-not-dns-1123": (["--set",
                                    "persistence.checkpoints.create.storageClassName=Fast_SSD"],
                                   "storageClassName"),
    # the trainer refuses it only when its pods start
    "trainer-config-one-beta": (["--set-json", "trainerConfig.optim.betas=[0.9]"], "betas"),
}

# The same quantity in two notations: equal, so within the limit.
EQUAL_QUANTITIES = {
    "decimal-and-milli": ["--set", "resources.requests.cpu=0.5",
                          "--set", "resources.limits.cpu=500m"],
    "binary-and-bytes": ["--set", "resources.requests.memory=16Gi",
                         "--set", "resources.limits.memory=17179869184"],
    "exponent-and-plain": ["--set", "resources.requests.cpu=20e-1",
                           "--set", "resources.limits.cpu=2"],
    "kilo-and-plain": ["--set-string", "resources.requests.cpu=0.004k",
                       "--set", "resources.limits.cpu=4"],
}


# Values Kubernetes accepts, near the refused ones above: they render.
ACCEPTED = {
    "memory-limit-of-an-exabyte": ["--set-string", "resources.limits.memory=1E"],
    "memory-limit-of-an-exbibyte": ["--set-string", "resources.limits.memory=1Ei"],
    "resource-name-with-a-domain": ["--set-json", 'resources.limits={"example.com/foo": 1}'],
    "hugepages": ["--set", "resources.limits.hugepages-2Mi=1Gi",
                  "--set", "resources.requests.hugepages-2Mi=1Gi"],
    "toleration-with-a-prefixed-key": ["--set", "tolerations[0].key=example.com/a_b-c.d",
                                       "--set", "tolerations[0].value=x.y_z-1"],
    "alert-window-of-30s": ["--set-string",
                            "metrics.prometheusRule.alerts.lossExploding.window=30s"],
    "storage-class-a-dns-subdomain": ["--set", "persistence.checkpoints.create.enabled=true",
                                      "--set", "persistence.checkpoints.create.storageClassName="
                                               "fast-ssd.example.com"],
}


@pytest.mark.parametrize("which", ["helm3", "helm4"])
@pytest.mark.parametrize("case", sorted(ACCEPTED))
def test_values_kubernetes_accepts_render(helms: dict[str, str], which: str, case: str) -> None:
    proc = run_helm(helms[which], "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
                    *ACCEPTED[case])
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("which", ["helm3", "helm4"])
def test_the_longest_node_loss_toleration_renders_as_given(helms: dict[str, str],
                                                          which: str) -> None:
    proc = run_helm(helms[which], "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
                    "--set", "nodeLossToleranceSeconds=9223372036854775807")
    assert proc.returncode == 0, proc.stderr
    assert "tolerationSeconds: 9223372036854775807" in proc.stdout


@pytest.mark.parametrize("which", ["helm3", "helm4"])
@pytest.mark.parametrize("case", sorted(BAD_VALUES))
def test_bad_values_fail_with_a_message_naming_the_key(
    helms: dict[str, str], which: str, case: str
) -> None:
    args, key = BAD_VALUES[case]
    proc = run_helm(helms[which], "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *args)
    assert proc.returncode != 0, f"{case} rendered:\n{proc.stdout[:500]}"
    # Helm 3 names a value tolerations.0.key, Helm 4 /tolerations/0/key
    assert key in proc.stderr or key.replace(".", "/") in proc.stderr, proc.stderr


@pytest.mark.parametrize("case", sorted(EQUAL_QUANTITIES))
def test_a_request_equal_to_its_limit_in_another_notation_renders(helm4: str, case: str) -> None:
    proc = run_helm(helm4, "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
                    *EQUAL_QUANTITIES[case])
    assert proc.returncode == 0, proc.stderr


def test_notes_tell_how_to_watch_read_logs_by_rank_and_reach_metrics(helm4: str) -> None:
    proc = run_helm(
        helm4,
        "install",
        RELEASE,
        str(CHART),
        "--namespace",
        NAMESPACE,
        "--dry-run=client",
        "--set",
        "worker.replicas=3",
        "--set",
        "gpusPerReplica=8",
    )
    assert proc.returncode == 0, proc.stderr
    notes = proc.stdout.split("NOTES:", 1)[1]
    job = "mytrain-ddp-trainer"
    assert f"kubectl -n {NAMESPACE} get pytorchjob {job} -w" in notes
    assert f"kubectl -n {NAMESPACE} logs -f {job}-master-0" in notes
    assert f"kubectl -n {NAMESPACE} logs -f {job}-worker-0" in notes
    assert "world size 32" in notes
    assert f"kubectl -n {NAMESPACE} port-forward pod/{job}-master-0 9310:metrics" in notes
    assert 'Grafana folder "ddp-trainer"' in notes
