"""Errors of the job commands: one line that names the problem and the fix."""

from __future__ import annotations

from trainer.errors import TrainerError

# Exit codes of `jobs wait` (documented in docs/jobs.md). Every TrainerError exits with 2.
EXIT_SUCCEEDED = 0
EXIT_FAILED = 1
EXIT_ERROR = TrainerError.exit_code
EXIT_TIMEOUT = 3

class JobsError(TrainerError):
    """A job command could not do what was asked."""


class ClientMissing(JobsError):
    """The optional ``k8s`` extra is not installed."""

    def __init__(self, missing: str) -> None:
        super().__init__(
            f"the job commands need the Python package {missing!r}, which is not installed",
            # ddp-trainer is not published on a package index: the extra installs from a clone
            "from the clone, pip install -e '.[k8s]' (or pip install 'kubernetes>=30.1' into "
            "the environment ddp-trainer runs in)",
        )


class BadArgument(JobsError):
    """A flag of a job command has a value it cannot use."""


class KubeconfigError(JobsError):
    """No usable kubeconfig or context."""


class ClusterUnreachable(JobsError):
    """The API server did not answer."""


class AccessDenied(JobsError):
    """The API server refused the credentials or the RBAC permissions."""


class CrdNotInstalled(JobsError):
    """No CRD of the kinds asked for (PyTorchJob, TrainJob) is served by this cluster."""


class JobNotFound(JobsError):
    """No job of that name (and kind) in the namespace."""


class AmbiguousJob(JobsError):
    """A PyTorchJob and a TrainJob share the name: the user must pick one with --kind."""


class ApiFailed(JobsError):
    """The API server answered with an unexpected error."""


class PrometheusError(JobsError):
    """Prometheus could not be queried."""
