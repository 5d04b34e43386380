"""A stand-in for Kubeflow Trainer v2's TrainJob status server, over real HTTPS on 127.0.0.1.

The real one runs inside the Trainer controller (kubeflow/trainer v2.3.0 pkg/statusserver), which
cannot run here; this one does what the trainer can observe of it, at its HTTP boundary: TLS with
a certificate from a CA that `make_ca` creates with openssl at test time, POST only on
``/apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs/{name}/status``, a bearer token
compared with the expected one (403 otherwise), the body validated against the
``status.trainerStatus`` schema of the vendored v2.3.0 TrainJob CRD (422 otherwise), 200 with the
parsed payload on success and a ``metav1.Status`` JSON on every error, as server.go:152-228 does.
"""

from __future__ import annotations

import datetime as dt
import http.server
import json
import shutil
import ssl
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.chart.chartlib import load_crd_schema, structural_to_jsonschema

NAMESPACE = "training"
JOB = "mytrain"
PATH = f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{NAMESPACE}/trainjobs/{JOB}/status"


@dataclass(frozen=True)
class Pki:
    ca_cert: Path
    server_cert: Path
    server_key: Path


def make_ca(directory: Path, name: str = "ca") -> Pki:
    """A self-signed CA and a server certificate for 127.0.0.1/localhost signed by it."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("openssl not found: install it (Debian package `openssl`)", pytrace=False)
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = directory / f"{name}.key", directory / f"{name}.crt"
    key, csr, cert = (directory / f"{name}-server.{ext}" for ext in ("key", "csr", "crt"))
    ext = directory / f"{name}-server.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                   "extendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n")

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True, timeout=60)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run("req", "-x509", *ec, "-keyout", str(ca_key), "-out", str(ca_cert), "-days", "2",
        "-subj", f"/CN=test {name}", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    run("req", *ec, "-keyout", str(key), "-out", str(csr), "-subj", "/CN=127.0.0.1")
    run("x509", "-req", "-in", str(csr), "-CA", str(ca_cert), "-CAkey", str(ca_key),
        "-CAcreateserial", "-out", str(cert), "-days", "2", "-extfile", str(ext))
    return Pki(ca_cert, cert, key)


def trainer_status_validator() -> Any:
    import jsonschema

    schema = load_crd_schema("trainer.kubeflow.org_trainjobs.yaml", "v1alpha1")
    status = structural_to_jsonschema(schema["properties"]["status"]["properties"]
                                      ["trainerStatus"])
    status["required"] = ["lastUpdatedTime"]  # the CRD's CEL rule has(self.lastUpdatedTime)
    body = {"type": "object", "additionalProperties": False, "required": ["trainerStatus"],
            "properties": {"trainerStatus": status}}
    return jsonschema.Draft7Validator(body, format_checker=jsonschema.FormatChecker())


@dataclass
class Received:
    at: float  # time.monotonic() on arrival
    body: dict[str, Any]
    token: str


@dataclass
class StatusServer:
    """Use as a context manager; `token` is what it accepts, `answer` forces an HTTP code."""

    pki: Pki
    token: str = "token-1"
    answer: int | None = None
    hang: float = 0.0  # seconds to sit on each request before answering
    received: list[Received] = field(default_factory=list)
    rejected: list[tuple[int, str]] = field(default_factory=list)
    port: int = 0

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}{PATH}"

    def __enter__(self) -> StatusServer:
        validator = trainer_status_validator()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                length = int(self.headers.get("Content-Length", 0))
                raw = self.rfile.read(length)
                if server.hang:
                    time.sleep(server.hang)
                token = self.headers.get("Authorization", "").removeprefix("Bearer ")
                if self.path != PATH:
                    return self.fail(404, "NotFound", "Not found")
                if token != server.token:
                    return self.fail(403, "Forbidden", "Forbidden")
                if server.answer is not None:
                    return self.fail(server.answer, "InternalError", "Internal error")
                try:
                    body = json.loads(raw)
                except ValueError:
                    return self.fail(422, "Invalid", "Invalid payload")
                errors = [e.message for e in validator.iter_errors(body)]
                stamp = str(body.get("trainerStatus", {}).get("lastUpdatedTime", ""))
                if not stamp.endswith("Z") or dt.datetime.fromisoformat(stamp[:-1]).tzinfo:
                    errors.append(f"lastUpdatedTime {stamp!r} is not RFC 3339 UTC")
                if errors:
                    return self.fail(422, "Invalid", "; ".join(errors))
                server.received.append(Received(time.monotonic(), body, token))
                self.reply(200, body)

            def do_GET(self) -> None:  # noqa: N802
                self.fail(404, "NotFound", "Not found")  # only POST is routed

            def fail(self, code: int, reason: str, message: str) -> None:
                server.rejected.append((code, message))
                self.reply(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                  "message": message, "reason": reason, "code": code})

            def reply(self, code: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.pki.server_cert, self.pki.server_key)
        self._httpd.socket = context.wrap_socket(self._httpd.socket, server_side=True)
        self.port = int(self._httpd.server_address[1])
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(10)

    def wait_for(self, count: int, timeout: float = 30.0) -> None:
        """Block until `count` updates arrived (the reporter sends from its own thread)."""
        deadline = time.monotonic() + timeout
        while len(self.received) < count:
            assert time.monotonic() < deadline, (self.received, self.rejected)
            time.sleep(0.02)
