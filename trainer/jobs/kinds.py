"""The two job kinds the commands manage, and what differs between them.

- ``PyTorchJob`` (``kubeflow.org/v1``, training operator v1.9): the operator labels each pod
  ``training.kubeflow.org/{job-name,replica-type,replica-index}``; the training container is
  ``pytorch``; suspend is ``spec.runPolicy.suspend``.
- ``TrainJob`` (``trainer.kubeflow.org/v1alpha1``, Kubeflow Trainer v2): the controller builds a
  JobSet named after the TrainJob (kubeflow/trainer v2.3.0
  pkg/runtime/framework/plugins/jobset/jobset.go:413), whose controller labels every pod
  ``jobset.sigs.k8s.io/jobset-name`` and ``jobset.sigs.k8s.io/replicatedjob-name``
  (kubernetes-sigs/jobset v0.12.0 pkg/controllers/jobset_controller.go:1020-1022, applied to the
  pod template at :950). The trainer nodes are the indexed Job of the replicated job ``node``
  (trainer v2.3.0 pkg/constants/constants.go:69) and the Job controller labels each pod with its
  ``batch.kubernetes.io/job-completion-index``, which the torch plugin passes on as
  ``PET_NODE_RANK`` (pkg/runtime/framework/plugins/torch/torch.go:152-156). The training
  container is ``node``; suspend is ``spec.suspend``.

The Kubeflow SDK (``kubeflow.trainer.TrainerClient``, kubeflow 0.5.0) is not used for TrainJobs:
its ``list_jobs``/``get_job`` fetch the referenced runtime for every job and fail the whole call
when that runtime is gone, unreadable (RBAC on clusterTrainingRuntimes) or when any object does
not fit its pydantic models (kubeflow/trainer/backends/kubernetes/backend.py:379-446, :673), and
it cannot suspend or resume. The plain API returns exactly what the CRD admits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

INSTALL_OPERATOR = (
    'install the Kubeflow training operator v1.9: kubectl apply --server-side -k '
    '"github.com/kubeflow/training-operator.git/manifests/overlays/standalone?ref=v1.9.4"'
)
INSTALL_TRAINER = (
    'install Kubeflow Trainer v2: kubectl apply --server-side -k '
    '"github.com/kubeflow/trainer.git/manifests/overlays/manager?ref=v2.3.0"'
)

# PyTorchJob pod labels (training operator v1.9).
LABEL_JOB = "training.kubeflow.org/job-name"
LABEL_TYPE = "training.kubeflow.org/replica-type"
LABEL_INDEX = "training.kubeflow.org/replica-index"
# TrainJob pod labels (JobSet v0.12 and the batch Job controller; see the module docstring).
LABEL_JOBSET = "jobset.sigs.k8s.io/jobset-name"
LABEL_RJOB = "jobset.sigs.k8s.io/replicatedjob-name"
LABEL_COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
TRAINER_RJOB = "node"


@dataclass(frozen=True)
class Kind:
    """One job kind: where its objects live and how its pods are found."""

    name: str  # "PyTorchJob"
    group: str
    version: str
    plural: str
    container: str  # the training container of every pod
    install: str  # the fix when the CRD is missing

    @property
    def singular(self) -> str:
        return self.name.lower()

    @property
    def resource(self) -> str:
        """As kubectl names it: ``pytorchjobs.kubeflow.org/v1``."""
        return f"{self.plural}.{self.group}/{self.version}"

    def pod_selector(self, job: str) -> str:
        if self is TRAINJOB:
            return f"{LABEL_JOBSET}={job},{LABEL_RJOB}={TRAINER_RJOB}"
        return f"{LABEL_JOB}={job}"

    def suspend_patch(self, suspend: bool) -> dict[str, Any]:
        if self is TRAINJOB:
            return {"spec": {"suspend": suspend}}
        return {"spec": {"runPolicy": {"suspend": suspend}}}


PYTORCHJOB = Kind("PyTorchJob", "kubeflow.org", "v1", "pytorchjobs", "pytorch", INSTALL_OPERATOR)
TRAINJOB = Kind("TrainJob", "trainer.kubeflow.org", "v1alpha1", "trainjobs", "node",
                INSTALL_TRAINER)
KINDS = (PYTORCHJOB, TRAINJOB)
CHOICES = {"pytorchjob": (PYTORCHJOB,), "trainjob": (TRAINJOB,), "all": KINDS}


def kind_of(obj: dict[str, Any]) -> Kind:
    return TRAINJOB if obj.get("kind") == TRAINJOB.name else PYTORCHJOB


def names(kinds: tuple[Kind, ...]) -> str:
    """"pytorchjob" or "pytorchjob or trainjob", for messages."""
    return " or ".join(k.singular for k in kinds)
