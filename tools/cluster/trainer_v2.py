"""Kubeflow Trainer v2 and JobSet, the version Trainer's go.mod pins, run for real against the
cluster (controllers.py says how a controller runs on the host).

Both come from the module versions tools/cluster/trainer-v2-operator/go.mod pins: JobSet's release
manifests are its module's config/default, Trainer's its manager overlay less the line that
fetches JobSet's from a URL (JobSet is installed from its module instead). Trainer runs with the
TrainJobStatus feature gate on, so its status server (KEP-2779, port 10443) takes the progress
the trainer pods send; its `torch-distributed` ClusterTrainingRuntime is the module's.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import yaml

from tools.cluster import api
from tools.cluster.builds import module_dir
from tools.cluster.controllers import HostController, Port
from tools.cluster.layout import TRAINER_V2_MODULE, Paths

TRAINER_MODULE = "github.com/kubeflow/trainer/v2"
JOBSET_MODULE = "sigs.k8s.io/jobset"
STATUS_PORT = 10443

JOBSET = HostController(
    name="jobset-controller", namespace="jobset-system",
    service_account="jobset-controller-manager", service="jobset-webhook-service",
    secret="jobset-webhook-server-cert",
    webhooks=("validating/jobset-validating-webhook-configuration",
              "mutating/jobset-mutating-webhook-configuration"),
    ports=(Port("https", 443, 9445),), health="127.0.0.1:8093")
TRAINER = HostController(
    name="trainer-controller-manager", namespace="kubeflow-system",
    service_account="kubeflow-trainer-controller-manager",
    service="kubeflow-trainer-controller-manager", secret="kubeflow-trainer-webhook-cert",
    webhooks=("validating/validator.trainer.kubeflow.org",
              "mutating/defaulter.trainer.kubeflow.org"),
    # The pods call the status server by the Service's DNS name: headless, so DNS answers the
    # host's address (no ClusterIP in between).
    ports=(Port("webhook-server", 443, 9444), Port("status-server", STATUS_PORT, STATUS_PORT)),
    health="127.0.0.1:8092", headless=True)


def jobset_manifests(paths: Paths, kubectl: Path) -> list[dict[str, Any]]:
    source = module_dir(JOBSET_MODULE, TRAINER_V2_MODULE)
    rendered = api.kubectl(paths, kubectl, "kustomize", str(source / "config" / "default"))
    return [d for d in yaml.safe_load_all(rendered.stdout) if d]


def trainer_manifests(paths: Paths, kubectl: Path) -> list[dict[str, Any]]:
    source = module_dir(TRAINER_MODULE, TRAINER_V2_MODULE) / "manifests"
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "manifests"
        shutil.copytree(source, copy)
        overlay = copy / "overlays" / "manager" / "kustomization.yaml"
        overlay.chmod(0o644)  # the module cache is read-only
        overlay.write_text("\n".join(line for line in overlay.read_text().splitlines()
                                     if "third-party/jobset" not in line) + "\n")
        rendered = api.kubectl(paths, kubectl, "kustomize", str(overlay.parent)).stdout
    return [d for d in yaml.safe_load_all(rendered) if d]


def runtimes() -> list[dict[str, Any]]:
    """The ClusterTrainingRuntime `torch-distributed` of the same release."""
    path = (module_dir(TRAINER_MODULE, TRAINER_V2_MODULE) / "manifests" / "base" / "runtimes"
            / "torch_distributed.yaml")
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _manager(webhook: Port, health: str) -> dict[str, Any]:
    return {"webhook": {"port": webhook.host}, "health": {"healthProbeBindAddress": health},
            # One replica: no leader to elect, so a restarted process need not wait out the
            # lease; no metrics server (nothing scrapes it here).
            "leaderElection": {"leaderElect": False}, "metrics": {"bindAddress": "0"}}


def write_configs(paths: Paths) -> None:
    """Each manager's configuration file: the release's, with the ports of this host."""
    trainer = {"apiVersion": "config.trainer.kubeflow.org/v1alpha1", "kind": "Configuration",
               **_manager(TRAINER.ports[0], TRAINER.health),
               "certManagement": {"enable": True, "webhookServiceName": TRAINER.service,
                                  "webhookSecretName": TRAINER.secret},
               "statusServer": {"port": STATUS_PORT},
               "featureGates": {"TrainJobStatus": True}}
    jobset = {"apiVersion": "config.jobset.x-k8s.io/v1alpha1", "kind": "Configuration",
              **_manager(JOBSET.ports[0], JOBSET.health),
              "internalCertManagement": {"enable": True, "webhookServiceName": JOBSET.service,
                                         "webhookSecretName": JOBSET.secret}}
    paths.config.mkdir(parents=True, exist_ok=True)
    for controller, config in ((TRAINER, trainer), (JOBSET, jobset)):
        config_path(paths, controller).write_text(yaml.safe_dump(config, sort_keys=False))


def config_path(paths: Paths, controller: HostController) -> Path:
    return paths.config / f"{controller.name}.yaml"


def arguments(paths: Paths, controller: HostController) -> list[str]:
    return ["--kubeconfig", str(controller.kubeconfig(paths)),
            "--config", str(config_path(paths, controller))]
