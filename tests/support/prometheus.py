"""A real Prometheus server for tests: static scrape config, free port, own TSDB.

Usage::

    with PrometheusServer(["127.0.0.1:9310"], labels={"namespace": "ns"}) as prom:
        prom.wait_for('up == 1', timeout=30)
        rows = prom.query('trainer_loss{rank="0"}')   # [{"metric": {...}, "value": [t, "1.2"]}]

The binary is taken from PATH (``make tools`` installs it); a missing binary raises
:class:`PrometheusNotInstalled` so the test fails with that message instead of skipping.
The API (constructor arguments, ``url``, ``query``, ``wait_for``, ``query_range``,
``targets_status``, ``alerts``, ``stop``) is shared with other suites: keep it backwards compatible.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

__all__ = [
    "PrometheusError",
    "PrometheusNotInstalled",
    "PrometheusServer",
    "free_port",
    "require_binary",
]


class PrometheusError(RuntimeError):
    """Prometheus failed to start, or the HTTP API answered with an error."""


class PrometheusNotInstalled(PrometheusError):
    """`prometheus` or `promtool` is not on PATH."""


def require_binary(name: str) -> str:
    """Absolute path of `name` (``prometheus`` or ``promtool``) or a clear error."""
    path = shutil.which(name)
    if path is None:
        raise PrometheusNotInstalled(
            f"{name} not found on PATH; run `make tools` (it runs tools/install-prometheus.sh)"
        )
    return path


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the caller retries if it gets taken)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class PrometheusServer:
    """Runs ``prometheus`` scraping `targets` until :meth:`stop` (or the ``with`` exit).

    targets: ``host:port`` strings, scraped at ``/metrics`` (``metrics_path`` to change).
    rule_files: Prometheus rules files loaded as they are (alerts, recording rules).
    scrape_interval: also the rule evaluation interval unless ``evaluation_interval`` is set.
    labels: extra target labels attached to every scraped series, e.g. the
    ``namespace``/``pytorchjob`` labels a Kubernetes PodMonitor would add.
    job: the ``job`` label of the scrape config.
    """

    def __init__(
        self,
        targets: Sequence[str],
        rule_files: Sequence[Path] | None = None,
        scrape_interval: str = "1s",
        *,
        labels: Mapping[str, str] | None = None,
        job: str = "test",
        metrics_path: str = "/metrics",
        evaluation_interval: str | None = None,
        startup_timeout: float = 30.0,
    ) -> None:
        self.targets = list(targets)
        self.rule_files = [Path(p).resolve() for p in (rule_files or [])]
        self.scrape_interval = scrape_interval
        self.evaluation_interval = evaluation_interval or scrape_interval
        self.labels = dict(labels or {})
        self.job = job
        self.metrics_path = metrics_path
        self.startup_timeout = startup_timeout
        self.port = 0
        self.url = ""
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_path: Path | None = None

    # -- lifecycle ---------------------------------------------------------------------

    def __enter__(self) -> PrometheusServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        binary = require_binary("prometheus")
        self._tmp = tempfile.TemporaryDirectory(prefix="prometheus-test-")
        root = Path(self._tmp.name)
        config = root / "prometheus.yml"
        config.write_text(yaml.safe_dump(self._config()))
        self._log_path = root / "prometheus.log"
        # Another process may grab the free port between probing and binding: retry.
        last_error = ""
        for _ in range(3):
            self.port = free_port()
            self.url = f"http://127.0.0.1:{self.port}"
            storage = root / f"data-{self.port}"
            with self._log_path.open("ab") as log:
                self._proc = subprocess.Popen(
                    [
                        binary,
                        f"--config.file={config}",
                        f"--storage.tsdb.path={storage}",
                        f"--web.listen-address=127.0.0.1:{self.port}",
                        "--web.enable-lifecycle",
                        "--log.level=warn",
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=root,
                )
            if self._wait_ready():
                return
            last_error = self.log_tail()
            self._kill()
        self.stop()
        raise PrometheusError(f"prometheus did not become ready; log tail:\n{last_error}")

    def stop(self) -> None:
        self._kill()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def _config(self) -> dict[str, Any]:
        static: dict[str, Any] = {"targets": self.targets}
        if self.labels:
            static["labels"] = self.labels
        return {
            "global": {
                "scrape_interval": self.scrape_interval,
                "scrape_timeout": self.scrape_interval,
                "evaluation_interval": self.evaluation_interval,
            },
            "rule_files": [str(p) for p in self.rule_files],
            "scrape_configs": [
                {
                    "job_name": self.job,
                    "metrics_path": self.metrics_path,
                    "static_configs": [static],
                }
            ],
        }

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        return True
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)
        return False

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the server's log, for failure messages."""
        if self._log_path is None or not self._log_path.exists():
            return ""
        return "\n".join(self._log_path.read_text(errors="replace").splitlines()[-lines:])

    # -- HTTP API ----------------------------------------------------------------------

    def api(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        """GET ``/api/v1/<path>``; returns ``data`` or raises PrometheusError."""
        if not self.url:
            raise PrometheusError("server not started")
        query = urllib.parse.urlencode(params or {})
        url = f"{self.url}/api/v1/{path}" + (f"?{query}" if query else "")
        try:
            with urllib.request.urlopen(url, timeout=30) as resp:
                body = json.loads(resp.read())
        except urllib.error.HTTPError as err:  # 400/422/503 carry a JSON error body
            try:
                body = json.loads(err.read())
            except ValueError:
                raise PrometheusError(f"GET {url}: HTTP {err.code}") from err
        if body.get("status") != "success":
            raise PrometheusError(
                f"GET {url}: {body.get('errorType', '?')}: {body.get('error', body)}"
            )
        return body["data"]

    def query(self, expr: str, time_: float | None = None) -> list[dict[str, Any]]:
        """Instant query; returns the result rows (vector: ``{"metric", "value"}``).

        A scalar or string result is returned as one row ``{"metric": {}, "value": [t, v]}``.
        """
        params = {"query": expr}
        if time_ is not None:
            params["time"] = repr(time_)
        data = self.api("query", params)
        result = data["result"]
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": result}]
        return list(result)

    def query_range(
        self, expr: str, start: float, end: float, step: str = "1s"
    ) -> list[dict[str, Any]]:
        """Range query; returns matrix rows ``{"metric", "values"}``."""
        data = self.api(
            "query_range", {"query": expr, "start": repr(start), "end": repr(end), "step": step}
        )
        return list(data["result"])

    def wait_for(
        self, expr: str, timeout: float = 30.0, interval: float = 0.5
    ) -> list[dict[str, Any]]:
        """Poll `expr` until it returns at least one row; return the rows.

        Raises TimeoutError naming the expression (and the scrape targets' health) when
        nothing comes back in `timeout` seconds. Query errors are raised immediately.
        """
        deadline = time.monotonic() + timeout
        while True:
            rows = self.query(expr)
            if rows:
                return rows
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"no result for {expr!r} after {timeout}s; targets: {self._target_health()}"
                )
            time.sleep(interval)

    def targets_status(self) -> list[dict[str, Any]]:
        """Active scrape targets (``health``, ``lastError``, ``labels``, ...)."""
        return list(self.api("targets")["activeTargets"])

    def alerts(self) -> list[dict[str, Any]]:
        """Alerts currently pending or firing."""
        return list(self.api("alerts")["alerts"])

    def _target_health(self) -> str:
        try:
            return ", ".join(
                f"{t['scrapeUrl']}={t['health']}"
                + (f" ({t['lastError']})" if t.get("lastError") else "")
                for t in self.targets_status()
            )
        except PrometheusError as err:
            return str(err)
