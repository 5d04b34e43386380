"""Connecting to the cluster like kubectl does, and turning API failures into one-line errors.

``kubernetes`` and ``kubeflow-training`` are imported here, inside functions, and nowhere at
module level: the ``k8s`` extra is optional.

Which client does what:

- ``TrainingClient`` (kubeflow-training) reads, lists, patches and deletes PyTorchJobs and finds
  a job's pods by the operator's labels; it returns typed models, so the rest of the package
  never parses raw JSON. We hand it our own ``Configuration`` so that ``--kubeconfig``,
  ``--context`` and ``KUBECONFIG`` are honoured exactly as kubectl does (its own loader would
  set a process-global default and ignore an explicit context's namespace).
- ``CustomObjectsApi`` lists PyTorchJobs across all namespaces (``-A``) and asks API discovery
  whether the CRD is served: TrainingClient has no call for either.
- ``CoreV1Api`` streams pod logs: ``TrainingClient.get_job_logs`` prints to stdout itself,
  skips pending pods silently and returns only after every stream ends, which rules out a
  rank prefix, ``--follow`` of all ranks interleaved, and per-pod error notes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.errors import TrainerError
from trainer.jobs.errors import (
    INSTALL_OPERATOR,
    AccessDenied,
    ApiFailed,
    ClientMissing,
    ClusterUnreachable,
    CrdNotInstalled,
    JobNotFound,
    KubeconfigError,
)

GROUP = "kubeflow.org"
VERSION = "v1"
PLURAL = "pytorchjobs"
KIND = "PyTorchJob"
CONTAINER = "pytorch"  # the operator requires the training container to have this name

LABEL_JOB = "training.kubeflow.org/job-name"
LABEL_TYPE = "training.kubeflow.org/replica-type"
LABEL_INDEX = "training.kubeflow.org/replica-index"

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@dataclass(frozen=True)
class Target:
    """Where to connect, as given on the command line (None = kubectl's default)."""

    kubeconfig: str | None = None
    context: str | None = None
    namespace: str | None = None
    request_timeout: float = 30.0


def require_client() -> None:
    """Fail with the install hint when the ``k8s`` extra is missing."""
    for module in ("kubernetes", "kubeflow.training"):
        try:
            __import__(module)
        except ImportError:
            raise ClientMissing(module.replace(".", "-")) from None


@dataclass
class Cluster:
    """An authenticated connection to one cluster and the namespace commands act in."""

    namespace: str
    server: str
    context: str
    timeout: float
    api_client: Any
    training: Any  # kubeflow.training.TrainingClient
    core: Any  # kubernetes.client.CoreV1Api
    custom: Any  # kubernetes.client.CustomObjectsApi

    @contextmanager
    def errors(self, action: str, job: str | None = None) -> Iterator[None]:
        """Translate whatever the clients raise into one JobsError naming problem and fix."""
        try:
            yield
        except TrainerError:
            raise
        except Exception as exc:  # noqa: BLE001 - classified below, re-raised if unknown
            translated = self.translate(exc, action, job)
            if translated is None:
                raise
            raise translated from exc

    def translate(self, exc: BaseException, action: str, job: str | None) -> TrainerError | None:
        from kubernetes.client.exceptions import ApiException

        chain = list(_exception_chain(exc))
        for err in chain:
            if isinstance(err, ApiException):
                return self._api_error(err, action, job)
        for err in chain:
            if _is_connection_error(err):
                return ClusterUnreachable(
                    f"cannot reach the Kubernetes API server {self.server} (context "
                    f"{self.context!r}) to {action}: {_connection_reason(err)}",
                    "check the cluster is up and `kubectl cluster-info` works, or pick "
                    "another cluster with --context/--kubeconfig",
                )
        return None

    def _api_error(self, err: Any, action: str, job: str | None) -> TrainerError:
        status = int(err.status or 0)
        if status == 404:
            if not self.crd_installed():
                return CrdNotInstalled(
                    f"the cluster at {self.server} does not serve {PLURAL}.{GROUP}/{VERSION} "
                    f"(the PyTorchJob CRD is not installed)",
                    INSTALL_OPERATOR,
                )
            if job is not None:
                return JobNotFound(
                    f'pytorchjob "{job}" not found in namespace "{self.namespace}"',
                    "find it with `kubectl get pytorchjobs -A` and pass its -n/--namespace",
                )
        if status == 401:
            return AccessDenied(
                f"the API server {self.server} rejected the credentials of context "
                f"{self.context!r} to {action}",
                "log in again (refresh the token or certificate in your kubeconfig)",
            )
        if status == 403:
            return AccessDenied(
                f"not allowed to {action} in namespace {self.namespace!r}: "
                f"{_status_message(err)}",
                "ask for RBAC on pytorchjobs.kubeflow.org (get, list, patch, delete) and "
                "pods, pods/log (get, list), or use another --namespace",
            )
        return ApiFailed(
            f"the API server answered {status} {err.reason} to {action}: {_status_message(err)}",
            "retry; run with --debug for the full response",
        )

    def crd_installed(self) -> bool:
        """Ask API discovery whether pytorchjobs.kubeflow.org/v1 is served."""
        from kubernetes.client.exceptions import ApiException

        try:
            resources = self.custom.get_api_resources(
                GROUP, VERSION, _request_timeout=self.timeout
            )
        except ApiException as exc:
            # Anything but 404 leaves the question open: let the original error speak.
            return bool(exc.status != 404)
        return any(r.name == PLURAL for r in (resources.resources or []))


def connect(target: Target) -> Cluster:
    """Load credentials like kubectl: --kubeconfig, else $KUBECONFIG, else ~/.kube/config,
    else the pod's service account; the namespace from -n, else the context, else default."""
    require_client()
    import urllib3
    from kubeflow.training import TrainingClient
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    configuration = client.Configuration()
    path = target.kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
    paths = [Path(p).expanduser() for p in path.split(os.pathsep) if p]
    in_cluster = bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    if not target.kubeconfig and not any(p.is_file() for p in paths) and in_cluster:
        config.load_incluster_config(client_configuration=configuration)
        context = "in-cluster"
        namespace = target.namespace or _service_account_namespace()
    else:
        missing = [str(p) for p in paths if not p.is_file()]
        if missing and len(missing) == len(paths):
            raise KubeconfigError(
                f"no kubeconfig at {', '.join(missing)}",
                "pass --kubeconfig FILE, set KUBECONFIG, or run inside a pod with a service "
                "account",
            )
        joined = os.pathsep.join(str(p) for p in paths if p.is_file())
        try:
            contexts, active = config.list_kube_config_contexts(config_file=joined)
        except ConfigException as exc:
            raise KubeconfigError(
                f"kubeconfig {joined} has no usable context: {_first_line(exc)}",
                "fix the file, or pass another one with --kubeconfig",
            ) from None
        names = [c["name"] for c in contexts]
        if target.context and target.context not in names:
            raise KubeconfigError(
                f"context {target.context!r} is not in kubeconfig {joined}",
                f"use one of: {', '.join(names) or '(none)'}",
            )
        try:
            config.load_kube_config(
                config_file=joined,
                context=target.context,
                client_configuration=configuration,
                persist_config=False,
            )
        except ConfigException as exc:
            raise KubeconfigError(
                f"kubeconfig {joined} is not usable: {_first_line(exc)}",
                "fix the file, or pick another context with --context",
            ) from None
        context = target.context or (active or {}).get("name", "")
        chosen = next((c for c in contexts if c["name"] == context), None)
        context_ns = ((chosen or {}).get("context") or {}).get("namespace")
        namespace = target.namespace or context_ns or "default"

    # One retry (for a pooled connection the server closed), not urllib3's three: an
    # unreachable server fails within about two timeouts. Its retry warnings would be noise
    # before our one-line error.
    configuration.retries = 1
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
    api_client = client.ApiClient(configuration)
    training = TrainingClient(client_configuration=configuration, namespace=namespace)
    # TrainingClient bounds its calls by waiting on a worker thread, which leaves the request
    # hanging behind it; a socket timeout on both connection pools ends it for real.
    # (`logs --follow` overrides the read timeout per request: logs may be quiet for long.)
    for rest in (api_client.rest_client, training.custom_api.api_client.rest_client):
        rest.pool_manager.connection_pool_kw["timeout"] = urllib3.Timeout(
            connect=target.request_timeout, read=target.request_timeout
        )
    return Cluster(
        namespace=namespace,
        server=str(configuration.host),
        context=context,
        timeout=target.request_timeout,
        api_client=api_client,
        training=training,
        core=client.CoreV1Api(api_client),
        custom=client.CustomObjectsApi(api_client),
    )


def _service_account_namespace() -> str:
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"


def _exception_chain(exc: BaseException) -> Iterator[BaseException]:
    # TrainingClient re-raises everything as RuntimeError/TimeoutError; the original error
    # survives only as __cause__ (ApiException) or __context__ (urllib3 errors).
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _is_connection_error(err: BaseException) -> bool:
    import multiprocessing

    import urllib3.exceptions

    return isinstance(
        err,
        urllib3.exceptions.HTTPError | OSError | TimeoutError | multiprocessing.TimeoutError,
    )


def _connection_reason(err: BaseException) -> str:
    # urllib3 nests the socket error in a long repr; keep the part a person acts on.
    import re

    text = str(getattr(err, "reason", None) or err)
    errno = re.search(r"\[Errno -?\d+\] ([^\"')]+)", text)
    if errno:
        return errno.group(1).strip()
    if "timed out" in text.lower() or isinstance(err, TimeoutError):
        return "no answer (timed out)"
    return _first_line(text)[:200]


def _status_message(err: Any) -> str:
    import json

    try:
        body = json.loads(err.body)
        return str(body.get("message") or err.reason)
    except (TypeError, ValueError, AttributeError):
        return _first_line(err.body or err.reason)


def _first_line(value: object) -> str:
    text = str(value).strip()
    return text.splitlines()[0] if text else type(value).__name__
