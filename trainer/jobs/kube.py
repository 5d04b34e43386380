"""Connecting to the cluster like kubectl does, and turning API failures into one-line errors.

``kubernetes`` is imported here, inside functions, and nowhere at module level: the ``k8s``
extra is optional.

Which client does what:

- ``CustomObjectsApi`` reads, lists, merge-patches and deletes PyTorchJobs and TrainJobs as plain
  JSON, and asks API discovery whether a CRD is served. kubeflow-training's ``TrainingClient``
  is not used: it deserialises every PyTorchJob into typed models that are stricter than the
  CRD (a job without the optional ``spec.runPolicy`` made ``list`` fail with
  "Failed to list PyTorchJobs"), and the Kubeflow SDK's ``TrainerClient`` has the same problem
  for TrainJobs (see :mod:`trainer.jobs.kinds`). :mod:`trainer.jobs.views` reads only the
  fields it needs and tolerates every other shape the CRDs admit.
- ``CoreV1Api`` lists a job's pods by their labels and streams pod logs.

Our own ``Configuration`` is loaded so that ``--kubeconfig``, ``--context`` and ``KUBECONFIG``
are honoured exactly as kubectl does, without touching the process-global default.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.errors import TrainerError, first_line
from trainer.jobs import exec_plugin
from trainer.jobs.errors import (
    AccessDenied,
    ApiFailed,
    ClientMissing,
    ClusterUnreachable,
    CrdNotInstalled,
    JobNotFound,
    KubeconfigError,
)
from trainer.jobs.kinds import KINDS, Kind
from trainer.jobs.kubeconfig import absent, check_exec_plugin, check_kubeconfig, reason

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
    try:
        __import__("kubernetes")
    except ImportError:
        raise ClientMissing("kubernetes") from None


@dataclass
class Cluster:
    """An authenticated connection to one cluster and the namespace commands act in."""

    namespace: str
    server: str
    context: str
    timeout: float
    api_client: Any
    core: Any  # kubernetes.client.CoreV1Api
    custom: Any  # kubernetes.client.CustomObjectsApi

    @property
    def request_timeout(self) -> tuple[float, float]:
        # (connect, read): the client ignores a plain float (kubernetes/client/rest.py
        # honours only an int or a 2-tuple) and then waits forever.
        return (self.timeout, self.timeout)

    # -- the job objects, as plain JSON ------------------------------------------------------

    def get(self, kind: Kind, name: str) -> dict[str, Any]:
        obj: dict[str, Any] = self.custom.get_namespaced_custom_object(
            kind.group, kind.version, self.namespace, kind.plural, name,
            _request_timeout=self.request_timeout)
        return obj

    def list_jobs(self, kind: Kind, all_namespaces: bool) -> list[dict[str, Any]]:
        if all_namespaces:
            raw = self.custom.list_cluster_custom_object(
                kind.group, kind.version, kind.plural, _request_timeout=self.request_timeout)
        else:
            raw = self.custom.list_namespaced_custom_object(
                kind.group, kind.version, self.namespace, kind.plural,
                _request_timeout=self.request_timeout)
        return [dict(item) for item in raw.get("items") or []]

    def delete(self, kind: Kind, name: str) -> None:
        self.custom.delete_namespaced_custom_object(
            kind.group, kind.version, self.namespace, kind.plural, name,
            _request_timeout=self.request_timeout)

    def merge_patch(self, kind: Kind, name: str, patch: dict[str, Any]) -> None:
        # The client sends a dict body of a custom-object PATCH as application/merge-patch+json.
        self.custom.patch_namespaced_custom_object(
            kind.group, kind.version, self.namespace, kind.plural, name, patch,
            _request_timeout=self.request_timeout)

    def pods(self, selector: str, all_namespaces: bool = False) -> list[Any]:
        if all_namespaces:
            result = self.core.list_pod_for_all_namespaces(
                label_selector=selector, _request_timeout=self.request_timeout)
        else:
            result = self.core.list_namespaced_pod(
                self.namespace, label_selector=selector, _request_timeout=self.request_timeout)
        return list(result.items or [])

    # -- errors ------------------------------------------------------------------------------

    @contextmanager
    def errors(self, action: str, kind: Kind | None = None,
               job: str | None = None) -> Iterator[None]:
        """Translate whatever the clients raise into one JobsError naming problem and fix."""
        try:
            yield
        except TrainerError:
            raise
        except exec_plugin.PluginSilent as exc:  # refreshing an expired credential
            raise exc.error from None
        except Exception as exc:  # noqa: BLE001 - classified below, re-raised if unknown
            translated = self.translate(exc, action, kind, job)
            raise (translated or self.unexpected(exc, action)) from exc

    def unexpected(self, exc: BaseException, action: str) -> TrainerError:
        """An answer the clients could not read (a discovery document without `namespaced`,
        an object of the wrong shape, a body that is not JSON): one line, not a traceback."""
        return ApiFailed(
            f"unexpected answer from the API server {self.server} (context {self.context!r}) "
            f"to {action}: {type(exc).__name__}: {_unreadable(exc)}",
            "check that the server is a Kubernetes API server and the CRD's version is the one "
            "expected (`kubectl get --raw /apis`); rerun with --debug for the traceback",
        )

    def translate(self, exc: BaseException, action: str, kind: Kind | None,
                  job: str | None) -> TrainerError | None:
        from kubernetes.client.exceptions import ApiException

        chain = list(_exception_chain(exc))
        for err in chain:
            if isinstance(err, ApiException):
                return self._api_error(err, action, kind, job)
        for err in chain:
            if _is_connection_error(err):
                return ClusterUnreachable(
                    f"cannot reach the Kubernetes API server {self.server} (context "
                    f"{self.context!r}) to {action}: {_connection_reason(err)}",
                    "check the cluster is up and `kubectl cluster-info` works, or pick "
                    "another cluster with --context/--kubeconfig",
                )
        return None

    def _api_error(self, err: Any, action: str, kind: Kind | None,
                   job: str | None) -> TrainerError:
        status = int(err.status or 0)
        if status == 404 and kind is not None:
            if not self.crd_installed(kind):
                return crd_missing(self.server, (kind,))
            if job is not None:
                return job_not_found(job, self.namespace, (kind,))
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
                f"ask for RBAC on {_rbac_resources(kind)} (get, list, patch, delete) and "
                "pods, pods/log (get, list), or use another --namespace",
            )
        if status == 422:  # a schema, a webhook or a ValidatingAdmissionPolicy said no
            return ApiFailed(
                f"the API server refused to {action} as invalid: {_status_message(err)}",
                "the message names the rule (an admission policy or webhook of the cluster, or "
                "the CRD's schema); ask the cluster's admin if the rule is theirs",
            )
        if status == 409:
            return ApiFailed(
                f"the API server answered 409 Conflict to {action}: {_status_message(err)}",
                "the job changed meanwhile: run the command again",
            )
        return ApiFailed(
            f"the API server answered {status} {err.reason} to {action}: {_status_message(err)}",
            "retry; run with --debug for the full response",
        )

    def crd_installed(self, kind: Kind) -> bool:
        """Ask API discovery whether the kind's group/version serves its plural."""
        from kubernetes.client.exceptions import ApiException

        try:
            resources = self.custom.get_api_resources(
                kind.group, kind.version, _request_timeout=self.request_timeout
            )
        except ApiException as exc:
            # Anything but 404 leaves the question open: let the original error speak.
            return bool(exc.status != 404)
        return any(r.name == kind.plural for r in (resources.resources or []))

    def served(self, kinds: tuple[Kind, ...]) -> tuple[Kind, ...]:
        """The kinds whose CRD this cluster serves; CrdNotInstalled when none is."""
        with self.errors("discover the served job kinds"):
            served = tuple(k for k in kinds if self.crd_installed(k))
        if not served:
            raise crd_missing(self.server, kinds)
        return served


def crd_missing(server: str, kinds: tuple[Kind, ...]) -> CrdNotInstalled:
    if len(kinds) == 1:
        problem = (f"the cluster at {server} does not serve {kinds[0].resource} "
                   f"(the {kinds[0].name} CRD is not installed)")
    else:
        problem = (f"the cluster at {server} serves neither "
                   f"{' nor '.join(k.resource for k in kinds)} "
                   f"(no {' or '.join(k.name for k in kinds)} CRD is installed)")
    return CrdNotInstalled(problem, "; or ".join(k.install for k in kinds))


def job_not_found(name: str, namespace: str, kinds: tuple[Kind, ...]) -> JobNotFound:
    what = " or ".join(k.singular for k in kinds)
    plurals = ",".join(k.plural for k in kinds)
    return JobNotFound(
        f'{what} "{name}" not found in namespace "{namespace}"',
        f"find it with `kubectl get {plurals} -A` and pass its -n/--namespace",
    )


def _rbac_resources(kind: Kind | None) -> str:
    return " and ".join(f"{k.plural}.{k.group}" for k in ((kind,) if kind else KINDS))


def connect(target: Target) -> Cluster:
    """Load credentials like kubectl: --kubeconfig, else $KUBECONFIG, else ~/.kube/config,
    else the pod's service account; the namespace from -n, else the context, else default."""
    require_client()
    import urllib3
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    # kubernetes >= 37 ships type hints but not on these config loaders (older releases have
    # none): the ignores cover both.
    configuration = client.Configuration()
    path = target.kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
    paths = [Path(p).expanduser() for p in path.split(os.pathsep) if p]
    in_cluster = bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    if not target.kubeconfig and not any(p.is_file() for p in paths) and in_cluster:
        config.load_incluster_config(  # type: ignore[no-untyped-call, unused-ignore]
            client_configuration=configuration
        )
        context = "in-cluster"
        namespace = target.namespace or _service_account_namespace()
    else:
        missing = [absent(p) for p in paths if not p.is_file()]
        if missing and len(missing) == len(paths):
            raise KubeconfigError(
                f"no kubeconfig at {', '.join(missing)}",
                "pass --kubeconfig FILE, set KUBECONFIG, or run inside a pod with a service "
                "account",
            )
        for found in (p for p in paths if p.is_file()):
            check_kubeconfig(found)
        joined = os.pathsep.join(str(p) for p in paths if p.is_file())
        try:
            contexts, active = config.list_kube_config_contexts(  # type: ignore[no-untyped-call, unused-ignore]
                config_file=joined
            )
        except (ConfigException, TypeError, KeyError, AttributeError, ValueError) as exc:
            # the client's errors on an entry of the wrong shape check_kubeconfig lets through
            raise KubeconfigError(
                f"kubeconfig {joined} has no usable context: {reason(exc)}",
                "fix the file, or pass another one with --kubeconfig",
            ) from None
        names = [c["name"] for c in contexts]
        if target.context and target.context not in names:
            raise KubeconfigError(
                f"context {target.context!r} is not in kubeconfig {joined}",
                f"use one of: {', '.join(names) or '(none)'}",
            )
        context = target.context or (active or {}).get("name", "")
        chosen = next((c for c in contexts if c["name"] == context), None)
        check_exec_plugin([p for p in paths if p.is_file()],
                          str(((chosen or {}).get("context") or {}).get("user", "")))
        exec_plugin.bound(target.request_timeout)
        try:
            config.load_kube_config(  # type: ignore[no-untyped-call, unused-ignore]
                config_file=joined,
                context=target.context,
                client_configuration=configuration,
                persist_config=False,
            )
        except exec_plugin.PluginSilent as exc:
            raise exc.error from None
        except (ConfigException, TypeError, KeyError, AttributeError, ValueError) as exc:
            raise KubeconfigError(
                f"kubeconfig {joined} is not usable: {reason(exc)}",
                "fix the file, or pick another context with --context",
            ) from None
        context_ns = ((chosen or {}).get("context") or {}).get("namespace")
        namespace = target.namespace or context_ns or "default"

    # One retry (for a pooled connection the server closed), not urllib3's three: an
    # unreachable server fails within about two timeouts. Its retry warnings would be noise
    # before our one-line error.
    configuration.retries = 1
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
    api_client = client.ApiClient(configuration)
    # A socket timeout on the pool for requests sent without a per-request timeout.
    api_client.rest_client.pool_manager.connection_pool_kw["timeout"] = urllib3.Timeout(
        connect=target.request_timeout, read=target.request_timeout
    )
    return Cluster(
        namespace=namespace,
        server=str(configuration.host),
        context=context,
        timeout=target.request_timeout,
        api_client=api_client,
        core=client.CoreV1Api(api_client),
        custom=client.CustomObjectsApi(api_client),
    )


def _unreadable(exc: BaseException) -> str:
    """What did not fit: a pydantic ValidationError's fields (the client's models), else the
    first line of the error."""
    fields = getattr(exc, "errors", None)
    if callable(fields):
        try:
            return "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
                             for e in fields())[:200] or first_line(exc, 200)
        except (TypeError, KeyError, AttributeError, ValueError):
            pass
    return first_line(exc, 200, empty="(no message)")


def _service_account_namespace() -> str:
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"


def _exception_chain(exc: BaseException) -> Iterator[BaseException]:
    # The client wraps socket errors in urllib3's; the cause survives as __cause__/__context__.
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
    return first_line(text, 200)


def _status_message(err: Any) -> str:
    import json

    try:
        body = json.loads(err.body)
        return str(body.get("message") or err.reason)
    except (TypeError, ValueError, AttributeError):
        return first_line(err.body or err.reason)
