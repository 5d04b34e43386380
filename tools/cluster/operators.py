"""The Kubeflow training operator v1, run for real against the cluster (controllers.py says
how a controller runs on the host).

Its CRDs, RBAC and validating webhook configuration come from the standalone overlay of the
module version it is built from (`go mod download` names the folder), as `kubectl apply -k`
renders it. Only the PyTorchJob controller is enabled.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tools.cluster import api
from tools.cluster.builds import module_dir
from tools.cluster.configs import HELPER_IMAGE
from tools.cluster.controllers import HostController, Port
from tools.cluster.layout import REPO, TRAINING_OPERATOR_MODULE, Paths

MODULE = "github.com/kubeflow/training-operator"
HEALTH = "127.0.0.1:8091"
INIT_TEMPLATE = REPO / "k8s" / "operator" / "pytorch-init-container.yaml"
OPERATOR = HostController(
    name="training-operator", namespace="kubeflow", service_account="training-operator",
    service="training-operator", secret="training-operator-webhook-cert",
    webhooks=("validating/validator.training-operator.kubeflow.org",),
    ports=(Port("webhook-server", 443, 9443),), health=HEALTH)


def source() -> Path:
    return module_dir(MODULE, TRAINING_OPERATOR_MODULE)


def manifests(paths: Paths, kubectl: Path, source: Path) -> list[dict[str, Any]]:
    """The release's standalone overlay as `kubectl apply -k` makes it (CRDs, RBAC, webhook
    configuration, the empty webhook-cert Secret its rotator fills)."""
    rendered = api.kubectl(paths, kubectl, "kustomize",
                           str(source / "manifests" / "overlays" / "standalone")).stdout
    return [d for d in yaml.safe_load_all(rendered) if d]


def arguments(paths: Paths) -> list[str]:
    """The operator's flags: only the PyTorchJob controller; the init container of k8s/operator
    (Pod Security `restricted`) with an image the cluster has."""
    return ["--kubeconfig", str(OPERATOR.kubeconfig(paths)), "--enable-scheme=pytorchjob",
            "--metrics-bind-address", "127.0.0.1:8090", "--health-probe-bind-address", HEALTH,
            "--webhook-server-port", str(OPERATOR.ports[0].host),
            "--pytorch-init-container-template-file", str(INIT_TEMPLATE),
            "--pytorch-init-container-image", HELPER_IMAGE]
