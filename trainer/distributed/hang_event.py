"""The hang verdict as a Kubernetes Warning Event on the job (reason ``RankHung``), where
``kubectl describe pytorchjob`` (or ``trainjob``) and ``ddp-trainer jobs status`` show it.

In a pod of the chart only: it gives the job's kind and name (``DDP_TRAINER_JOB_KIND``,
``DDP_TRAINER_JOB_NAME``), the pod's namespace and uid, and, with ``serviceAccount.create``, a
Role that may create events and get the job (docs/distributed.md, "Hangs"). Standard library
only: one GET of the job (its uid, which ``kubectl describe`` matches events by) and one POST,
each bounded by :data:`TIMEOUT_SECONDS`; a failure is a warning, never a second error.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
"""The automounted token's folder; the chart projects one into ``DDP_TRAINER_API_ACCOUNT``."""
TIMEOUT_SECONDS = 5.0
REASON = "RankHung"
MAX_MESSAGE = 1024
"""The API server keeps event messages up to 1 KiB (longer ones are cut with a warning)."""
KINDS = {"PyTorchJob": ("kubeflow.org", "v1", "pytorchjobs"),
         "TrainJob": ("trainer.kubeflow.org", "v1alpha1", "trainjobs")}


def _api() -> tuple[str, ssl.SSLContext, str] | None:
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get(
        "KUBERNETES_SERVICE_PORT", "443")
    account = Path(os.environ.get("DDP_TRAINER_API_ACCOUNT") or ACCOUNT)
    token_file, ca = account / "token", account / "ca.crt"
    if not host or not token_file.is_file() or not ca.is_file():
        return None
    host = f"[{host}]" if ":" in host else host
    return (f"https://{host}:{port}", ssl.create_default_context(cafile=str(ca)),
            token_file.read_text().strip())


def _call(url: str, context: ssl.SSLContext, token: str, body: dict[str, Any] | None = None
          ) -> dict[str, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode() if body is not None else None,
        method="POST" if body is not None else "GET",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS,  # noqa: S310 - https
                                context=context) as response:
        found: dict[str, Any] = json.loads(response.read() or b"{}")
        return found


def event(line: str, kind: str, job: str, namespace: str, uid: str, pod: str, node: str,
          now: dt.datetime) -> dict[str, Any]:
    """The Event object (core/v1) for `line` on the job."""
    group, version, _ = KINDS[kind]
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1", "kind": "Event",
        # named as the kubelet names its events: the object's name and a unique hex suffix
        "metadata": {"name": f"{job}.{int(now.timestamp() * 1e9):x}", "namespace": namespace},
        "involvedObject": {"apiVersion": f"{group}/{version}", "kind": kind, "name": job,
                           "namespace": namespace, **({"uid": uid} if uid else {})},
        "type": "Warning", "reason": REASON, "message": line[:MAX_MESSAGE],
        "source": {"component": "ddp-trainer", **({"host": node} if node else {})},
        "reportingComponent": "ddp-trainer", "reportingInstance": pod,
        "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
    }


def post(line: str) -> bool:
    """Post `line` as a Warning Event on this pod's job; whether it was posted."""
    kind, job = os.environ.get("DDP_TRAINER_JOB_KIND", ""), os.environ.get(
        "DDP_TRAINER_JOB_NAME", "")
    namespace = os.environ.get("POD_NAMESPACE", "")
    api = _api()
    if kind not in KINDS or not job or not namespace or api is None:
        return False
    base, context, token = api
    group, version, plural = KINDS[kind]
    uid = ""
    try:
        found = _call(f"{base}/apis/{group}/{version}/namespaces/{namespace}/{plural}/{job}",
                      context, token)
        uid = str(found.get("metadata", {}).get("uid", ""))
    except (OSError, urllib.error.URLError, ValueError) as err:
        log.warning("hang watchdog: cannot read %s %s for its uid (%s); the event is posted "
                    "without it", kind, job, err)
    body = event(line, kind, job, namespace, uid, os.environ.get("POD_NAME", ""),
                 os.environ.get("NODE_NAME", ""), dt.datetime.now(dt.timezone.utc))
    try:
        _call(f"{base}/api/v1/namespaces/{namespace}/events", context, token, body)
    except (OSError, urllib.error.URLError, ValueError) as err:
        log.warning("hang watchdog: the Warning event on %s %s was not posted (%s); the "
                    "verdict is in the pods' termination messages", kind, job, err)
        return False
    return True
