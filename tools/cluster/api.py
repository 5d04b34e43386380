"""The least of an API client the bring-up needs: HTTPS GETs with the cluster's CA and a
client certificate, and kubectl for everything else."""

from __future__ import annotations

import json
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tools.cluster.layout import API_PORT, NODE_IP, Paths


def context(paths: Paths, user: str | None = "admin", verify: bool = True) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(paths.pki / "ca.crt"))
    if not verify:  # the components' own self-signed /healthz endpoints
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if user is not None:
        ctx.load_cert_chain(paths.pki / f"{user}.crt", paths.pki / f"{user}.key")
    return ctx


def ok(url: str, ctx: ssl.SSLContext | None = None, expect: bytes | None = None) -> bool:
    """Whether `url` answers 200 (and its body contains `expect`)."""
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=5) as answer:
            body = answer.read()
            return answer.status == 200 and (expect is None or expect in body)
    except (urllib.error.URLError, OSError, ssl.SSLError):
        return False


def get(paths: Paths, path: str) -> dict[str, Any]:
    url = f"https://{NODE_IP}:{API_PORT}{path}"
    with urllib.request.urlopen(url, context=context(paths), timeout=10) as answer:
        result: dict[str, Any] = json.load(answer)
        return result


def node_ready(paths: Paths, name: str) -> bool:
    try:
        node = get(paths, f"/api/v1/nodes/{name}")
    except (urllib.error.URLError, OSError):
        return False
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in node.get("status", {}).get("conditions", []))


def kubectl(paths: Paths, binary: Path, *args: str, stdin: str | None = None,
            check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(binary), "--kubeconfig", str(paths.kubeconfig), *args],
                          input=stdin, capture_output=True, text=True, timeout=120,
                          check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc
