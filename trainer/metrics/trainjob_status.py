"""Progress, ETA and metrics into ``TrainJob.status.trainerStatus`` (Kubeflow Trainer v2, KEP-2779).

With the controller's ``TrainJobStatus`` feature gate on, every trainer container gets
``KUBEFLOW_TRAINER_SERVER_URL`` (the HTTPS endpoint of this TrainJob's status),
``KUBEFLOW_TRAINER_SERVER_CA_CERT`` and ``KUBEFLOW_TRAINER_SERVER_TOKEN`` (file paths of a projected
volume; kubeflow/trainer v2.3.0 pkg/runtime/framework/plugins/trainjobstatus/trainjobstatus.go:41-
44, 111-131). Rank 0 POSTs ``{"trainerStatus": {...}}`` there with the token as a bearer token;
the server answers 200 or a ``metav1.Status`` JSON error (pkg/statusserver/server.go:152-228).

This is a metrics sink (``log``/``close``): ``log`` only records the latest values under a lock;
a daemon thread sends them, at most one request every ``min_interval`` seconds (5 s), including
the final 100 % one after ``run/completed``, which ``close`` waits for (bounded). A failed
request (timeout, TLS, connection, HTTP error, unreadable token) is logged once per kind and
counted in ``trainer_trainjob_status_requests_total{result}``; training never waits for it.

Why not the Kubeflow SDK's ``kubeflow.trainer.update_trainjob_status`` (kubeflow 0.5.0,
kubeflow/trainer/backends/kubernetes/utils.py:747-845): it caches the token for 300 s
(:704) where the projected JWT must be read fresh, drops the final update when it comes within
5 s of the previous one (:780), blocks its caller for up to its 5 s timeout, logs every failure,
keeps its state in module globals, and adds pydantic and kubeflow-trainer-api to the image.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import os
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from trainer.metrics.families import MetricValue

log = logging.getLogger(__name__)

ENV_URL = "KUBEFLOW_TRAINER_SERVER_URL"
ENV_CA_CERT = "KUBEFLOW_TRAINER_SERVER_CA_CERT"
ENV_TOKEN = "KUBEFLOW_TRAINER_SERVER_TOKEN"
ENV_VARS = (ENV_URL, ENV_CA_CERT, ENV_TOKEN)

MIN_INTERVAL_SECONDS = 5.0  # the controller asks clients for at most one update per 5 s
REQUEST_TIMEOUT_SECONDS = 5.0
# API limits (trainer v2.3.0 pkg/apis/trainer/v1alpha1/trainjob_types.go:568-604).
MAX_METRICS = 256
MAX_TEXT = 64
INT32_MAX = 2**31 - 1
RESULTS = ("ok", "timeout", "tls", "connection", "http", "token")

# Logged key -> reported metric name (names documented in docs/trainer-v2.md).
REPORTED = {
    "train/loss": "train_loss",
    "train/accuracy": "train_accuracy",
    "val/global_accuracy": "val_accuracy",
    "val/global_loss": "val_loss",
    "train/lr": "learning_rate",
    "train/epoch": "epoch",
}
NAMED = "val/global_metric/"
"""Prefix of the task's exact validation metrics (reported as val_<name>)."""
# Keys that change what is reported (run/restarts at start-up alone is not worth a request).
TRIGGERS = (*REPORTED, "train/progress_ratio", "train/samples", "run/completed")


@dataclass(frozen=True)
class StatusEndpoint:
    """Where and how to report: the three variables the controller injects."""

    url: str
    ca_file: Path
    token_file: Path

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> StatusEndpoint | None:
        """The endpoint when all three variables are set; None (and a warning when only some
        are) otherwise. A non-HTTPS URL is refused: the token must not travel in clear."""
        env = os.environ if env is None else env
        values = [env.get(name, "") for name in ENV_VARS]
        if not any(values):
            return None
        if not all(values):
            missing = [n for n, v in zip(ENV_VARS, values, strict=True) if not v]
            log.warning("trainjob status: %s not set; progress is not reported",
                        ", ".join(missing))
            return None
        url, ca_file, token_file = values
        if not url.startswith("https://"):
            log.warning("trainjob status: %s=%s is not an https:// URL; progress is not "
                        "reported", ENV_URL, url)
            return None
        return cls(url, Path(ca_file), Path(token_file))


class ReportFailed(Exception):
    """One request failed; ``result`` is one of RESULTS."""

    def __init__(self, result: str, detail: str) -> None:
        super().__init__(detail)
        self.result = result


class StatusClient:
    """One POST per call, standard library only; the token file is read for every request
    (the projected service-account token rotates)."""

    def __init__(self, endpoint: StatusEndpoint, timeout: float = REQUEST_TIMEOUT_SECONDS
                 ) -> None:
        self.endpoint = endpoint
        self.timeout = timeout

    def post(self, body: dict[str, Any]) -> None:
        try:
            token = self.endpoint.token_file.read_text().strip()
        except OSError as exc:
            raise ReportFailed("token", f"cannot read the token file: {exc}") from None
        if not token:
            raise ReportFailed("token", f"the token file {self.endpoint.token_file} is empty")
        request = urllib.request.Request(
            self.endpoint.url, data=json.dumps(body).encode(), method="POST",
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        try:
            # A fresh context per request: the CA file may be rotated along with the server's.
            context = ssl.create_default_context(cafile=str(self.endpoint.ca_file))
        except OSError as exc:  # missing, unreadable or not a certificate (ssl.SSLError)
            raise ReportFailed("tls", f"CA file {self.endpoint.ca_file}: {exc}") from None
        try:
            with urllib.request.urlopen(request, timeout=self.timeout,  # noqa: S310 - https
                                        context=context) as response:
                response.read()
        except urllib.error.HTTPError as exc:
            raise ReportFailed("http", f"HTTP {exc.code}: {_status_message(exc)}") from None
        except (ssl.SSLError, ssl.CertificateError) as exc:
            raise ReportFailed("tls", f"TLS: {exc}") from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, ssl.SSLError | ssl.CertificateError):
                raise ReportFailed("tls", f"TLS: {exc.reason}") from None
            if isinstance(exc.reason, TimeoutError):
                raise ReportFailed("timeout", f"no answer within {self.timeout:g}s") from None
            raise ReportFailed("connection", str(exc.reason)) from None
        except TimeoutError:
            raise ReportFailed("timeout", f"no answer within {self.timeout:g}s") from None
        except OSError as exc:  # connection reset mid-answer and the like
            raise ReportFailed("connection", str(exc)) from None


class StatusTracker:
    """The trainer status built from logged keys: progress, ETA, samples/s and the metrics."""

    def __init__(self, world_size: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.world_size = max(1, world_size)
        self.clock = clock
        self.values: dict[str, float] = {}
        self.ratio: float | None = None
        self.first: tuple[float, float] | None = None  # (time, ratio) of the first progress
        self.last: tuple[float, float] | None = None
        self.samples_rate: float | None = None
        self._samples_since: float | None = None
        self.step = 0
        self.completed = False

    def update(self, metrics: Mapping[str, MetricValue], step: int) -> bool:
        """Record what is reported; True when `metrics` held anything that is."""
        if not any(k in metrics for k in TRIGGERS):
            return False
        now = self.clock()
        self.step = max(self.step, step)
        for key, name in REPORTED.items():
            value = metrics.get(key)
            if isinstance(value, int | float):
                self.values[name] = float(value)
        for key, value in metrics.items():
            # The task's metrics (val_mae, val_perplexity, ...; val_accuracy is one already).
            if key.startswith(NAMED) and isinstance(value, int | float):
                self.values["val_" + key[len(NAMED):]] = float(value)
        ratio = metrics.get("train/progress_ratio")
        if isinstance(ratio, int | float) and math.isfinite(ratio):
            self.ratio = min(max(float(ratio), 0.0), 1.0)
            self.first = self.first or (now, self.ratio)
            self.last = (now, self.ratio)
        samples = metrics.get("train/samples")
        if isinstance(samples, int | float):
            # Rank 0's samples in the interval since its previous log, times the world size:
            # DDP ranks step in lockstep, so this is the whole job's throughput.
            if self._samples_since is not None and now > self._samples_since:
                self.samples_rate = float(samples) * self.world_size / (now - self._samples_since)
            self._samples_since = now
        if metrics.get("run/completed") == 1.0:
            self.completed = True
        return True

    @property
    def percentage(self) -> int | None:
        if self.completed:
            return 100
        if self.ratio is None:
            return None
        return min(99, int(self.ratio * 100))  # 100 only once the run has completed

    @property
    def remaining_seconds(self) -> int | None:
        if self.completed:
            return 0
        if self.first is None or self.last is None:
            return None
        (t0, r0), (t1, r1) = self.first, self.last
        if r1 <= r0 or t1 <= t0:
            return None
        return min(INT32_MAX, int(round((1.0 - r1) * (t1 - t0) / (r1 - r0))))

    def body(self, now: dt.datetime | None = None) -> dict[str, Any]:
        """The JSON body the status server expects (lastUpdatedTime is required)."""
        now = now or dt.datetime.now(dt.timezone.utc)
        values = dict(self.values)
        if self.samples_rate is not None:
            values["samples_per_second"] = self.samples_rate
        values["step"] = float(self.step)
        status: dict[str, Any] = {
            "metrics": [{"name": name, "value": _text(value)}
                        for name, value in list(values.items())[:MAX_METRICS]],
            "lastUpdatedTime": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        if self.percentage is not None:
            status["progressPercentage"] = self.percentage
        if self.remaining_seconds is not None:
            status["estimatedRemainingSeconds"] = self.remaining_seconds
        return {"trainerStatus": status}


class TrainJobStatusReporter:
    """The sink: ``log`` records, a daemon thread reports (see the module docstring)."""

    port = 0  # serves nothing (the sink protocol's port)

    def __init__(self, client: StatusClient, world_size: int,
                 registry: CollectorRegistry | None = None, rank: int = 0,
                 min_interval: float = MIN_INTERVAL_SECONDS) -> None:
        self.client = client
        self.min_interval = min_interval
        self.progress = StatusTracker(world_size)
        self.requests = Counter(
            "trainer_trainjob_status_requests", "Requests to the TrainJob status server "
            "(KUBEFLOW_TRAINER_SERVER_URL) by result", ["rank", "result"],
            registry=registry if registry is not None else CollectorRegistry())
        for result in RESULTS:
            self.requests.labels(str(rank), result)
        self._rank = str(rank)
        self._warned: set[str] = set()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._dirty = False
        self._closing = False
        self._last_sent: float | None = None
        self._thread = threading.Thread(target=self._run, name="trainjob-status", daemon=True)
        self._thread.start()

    def notify_after_scrapes(self, event: threading.Event, count: int = 1) -> bool:
        return False  # serves nothing, so nothing is scraped from it

    def log(self, metrics: Mapping[str, MetricValue], step: int) -> None:
        with self._lock:
            if self.progress.update(metrics, step):
                self._dirty = True
                self._wake.notify()

    def close(self) -> None:
        """Send what is pending (the final 100 % after run/completed) and stop; waits at most
        one interval plus one request timeout."""
        with self._lock:
            self._closing = True
            self._wake.notify()
        self._thread.join(self.min_interval + self.client.timeout + 1.0)

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._dirty and not self._closing:
                    self._wake.wait()
                if self._closing and not self._dirty:
                    return
                # Hold to the rate limit; on close keep waiting only for a completed run's
                # final report (an interrupted run leaves its last sent state).
                while not self._due() and (not self._closing or self.progress.completed):
                    self._wake.wait(self._wait_left())
                if not self._due():
                    return
                body = self.progress.body()
                self._dirty = False
                closing = self._closing
                self._last_sent = time.monotonic()
            self._send(body)
            if closing:
                return

    def _due(self) -> bool:
        return self._last_sent is None or self._wait_left() <= 0

    def _wait_left(self) -> float:
        assert self._last_sent is not None
        return self._last_sent + self.min_interval - time.monotonic()

    def _send(self, body: dict[str, Any]) -> None:
        try:
            self.client.post(body)
        except ReportFailed as exc:
            self.requests.labels(self._rank, exc.result).inc()
            if exc.result not in self._warned:
                self._warned.add(exc.result)
                log.warning("trainjob status: cannot report progress to %s (%s); training "
                            "continues, later failures of this kind are only counted",
                            self.client.endpoint.url, exc)
            return
        except Exception:  # noqa: BLE001 - a reporter bug must not end training either
            self.requests.labels(self._rank, "connection").inc()
            log.exception("trainjob status: unexpected error while reporting")
            return
        self.requests.labels(self._rank, "ok").inc()


def from_env(world_size: int, rank: int, registry: CollectorRegistry | None
             ) -> TrainJobStatusReporter | None:
    """The reporter of global rank 0 when the controller injected its variables, else None."""
    if rank != 0:
        return None
    endpoint = StatusEndpoint.from_env()
    if endpoint is None:
        return None
    log.info("trainjob status: reporting progress to %s", endpoint.url)
    return TrainJobStatusReporter(StatusClient(endpoint), world_size, registry, rank)


def _text(value: float) -> str:
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.6g}"[:MAX_TEXT]


def _status_message(exc: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(exc.read()).get("message") or exc.reason)
    except (ValueError, AttributeError, OSError):
        return str(exc.reason)
