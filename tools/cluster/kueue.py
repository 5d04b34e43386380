"""Kueue, the version tools/cluster/kueue/go.mod pins, run for real against the cluster
(controllers.py says how a controller runs on the host; docs/queues.md how jobs use it).

Its CRDs, RBAC, webhook configurations and the empty webhook-certificate Secret its rotator
fills are the module's config/default as `kubectl kustomize` renders it, less the webhooks of
the job kinds it does not queue here and the visibility API server's APIService and Service:
the on-demand visibility API is off here (an aggregated API whose server is not reachable
would break every client's discovery, Helm's included), so the pending position is read from
the Workload's conditions instead.

The Configuration enables the three job kinds the chart makes (PyTorchJob, TrainJob and the
JobSet a TrainJob becomes) and waitForPodsReady with a timeout short enough for tests: an
admitted job whose pods are not all Ready after WAIT_FOR_PODS_READY_SECONDS is evicted and
requeued, not left holding part of its quota.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tools.cluster import api
from tools.cluster.builds import module_dir
from tools.cluster.controllers import HostController, Port
from tools.cluster.layout import KUEUE_MODULE, Paths

MODULE = "sigs.k8s.io/kueue"
FRAMEWORKS = ("kubeflow.org/pytorchjob", "trainer.kubeflow.org/trainjob", "jobset.x-k8s.io/jobset")
WAIT_FOR_PODS_READY_SECONDS = 120
"""Long enough for the test cluster's pods to pull from its local registry and start (~20 s);
short enough that tests/cluster/test_kueue.py sees an eviction within minutes."""
REQUEUE_BACKOFF_SECONDS = (10, 60)  # base and cap of the requeue backoff after an eviction

KUEUE = HostController(
    name="kueue", namespace="kueue-system", service_account="kueue-controller-manager",
    service="kueue-webhook-service", secret="kueue-webhook-server-cert",
    webhooks=("validating/kueue-validating-webhook-configuration",
              "mutating/kueue-mutating-webhook-configuration"),
    ports=(Port("https", 443, 9446),), health="127.0.0.1:8095")

_DROPPED = ("APIService", "Deployment")


# What the FRAMEWORKS' webhooks and Kueue's own (its CRDs') admit: group -> resources.
ADMITTED = {"kueue.x-k8s.io": None, "kubeflow.org": {"pytorchjobs"},
            "trainer.kubeflow.org": {"trainjobs"}, "jobset.x-k8s.io": {"jobsets"}}


def manifests(paths: Paths, kubectl: Path) -> list[dict[str, Any]]:
    source = module_dir(MODULE, KUEUE_MODULE)
    rendered = api.kubectl(paths, kubectl, "kustomize", str(source / "config" / "default"))
    return [only_our_webhooks(d) for d in yaml.safe_load_all(rendered.stdout) if d and keep(d)]


def only_our_webhooks(obj: dict[str, Any]) -> dict[str, Any]:
    """A webhook configuration less the webhooks of the integrations left off (pods, Jobs,
    Deployments, Ray, ...): Kueue answers those with a no-op, but their `failurePolicy: Fail`
    would make every pod's and Job's creation in the cluster fail while Kueue is down."""
    if not obj["kind"].endswith("WebhookConfiguration"):
        return obj
    return {**obj, "webhooks": [w for w in obj["webhooks"] if all(_ours(r) for r in w["rules"])]}


def _ours(rule: dict[str, Any]) -> bool:
    for group in rule["apiGroups"]:
        if group not in ADMITTED:
            return False
        wanted = ADMITTED[group]
        if wanted is not None and not {r.split("/")[0] for r in rule["resources"]} <= wanted:
            return False
    return True


def keep(obj: dict[str, Any]) -> bool:
    """Not the visibility server's APIService and Services, nor the metrics Service (nothing
    scrapes it here)."""
    if obj["kind"] in _DROPPED:
        return False
    return not (obj["kind"] == "Service" and obj["metadata"]["name"] != KUEUE.service)


def configuration() -> dict[str, Any]:
    """The release's controller_manager_config.yaml with this host's ports, the chart's job
    kinds and waitForPodsReady on."""
    base, cap = REQUEUE_BACKOFF_SECONDS
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
        "namespace": KUEUE.namespace,
        "health": {"healthProbeBindAddress": KUEUE.health},
        "metrics": {"bindAddress": "0"},
        "webhook": {"port": KUEUE.ports[0].host},
        # One replica: no lease to wait out after a restart.
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": True, "webhookServiceName": KUEUE.service,
                                   "webhookSecretName": KUEUE.secret},
        # Only jobs that name a queue are Kueue's: the cluster's other tests run unqueued.
        "manageJobsWithoutQueueName": False,
        "waitForPodsReady": {
            "timeout": f"{WAIT_FOR_PODS_READY_SECONDS}s", "blockAdmission": False,
            "requeuingStrategy": {"timestamp": "Eviction", "backoffBaseSeconds": base,
                                  "backoffMaxSeconds": cap}},
        "featureGates": {"VisibilityOnDemand": False},
        "integrations": {"frameworks": list(FRAMEWORKS)},
    }


def write_config(paths: Paths) -> None:
    paths.config.mkdir(parents=True, exist_ok=True)
    config_path(paths).write_text(yaml.safe_dump(configuration(), sort_keys=False))


def config_path(paths: Paths) -> Path:
    return paths.config / f"{KUEUE.name}.yaml"


def arguments(paths: Paths) -> list[str]:
    return ["--kubeconfig", str(KUEUE.kubeconfig(paths)), "--config", str(config_path(paths))]
