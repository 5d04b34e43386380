"""Serving: one HTTP endpoint per host, fed by one process or by every local rank.

Modes (chosen by :func:`trainer.metrics.build_metrics` in each rank):

* launcher: ``ddp-trainer run`` calls :func:`start_launcher_exporter` before spawning the
  local ranks. It creates an empty multiprocess directory, serves a
  ``MultiProcessCollector`` over it on the metrics port and hands the ranks
  :data:`ENV_DIR` (and ``PROMETHEUS_MULTIPROC_DIR``). The ranks write their values into
  per-process mmap files there and never bind the port.
* single: ``ddp-trainer train`` alone (one process per pod): the rank serves its own registry.
* torchrun: ``ddp-trainer train`` under plain ``torchrun`` with several local ranks: they
  share a directory named after their common parent (the torchrun agent) and local rank 0
  serves it, so the host still has one endpoint with every local rank.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server, values
from prometheus_client.multiprocess import MultiProcessCollector

from trainer.config import MetricsConfig
from trainer.errors import ConfigError

ENV_DIR = "DDP_TRAINER_METRICS_DIR"
"""Set by the launcher for its ranks: the multiprocess directory the launcher serves."""

ENV_OFF = "DDP_TRAINER_METRICS_OFF"
"""Set to ``1`` by a launcher whose metrics are off (``--metrics-port 0``): its ranks export
nothing, whatever their own config says (a user script builds its config itself)."""

PROMETHEUS_ENV_DIR = "PROMETHEUS_MULTIPROC_DIR"
"""prometheus_client's own switch; also set so that it picks mmap values at import."""


WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class MetricsPortInUse(ConfigError):
    """The metrics endpoint could not bind its address."""


class HttpEndpoint:
    """A running ``/metrics`` endpoint; :meth:`close` frees the port."""

    def __init__(self, server: WSGIServer, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread
        self.port = int(server.server_address[1])
        self._lock = threading.Lock()
        self._awaiting: dict[threading.Event, int] = {}  # scrapes each still waits for
        app = server.get_app()
        if app is not None:  # wsgiref looks it up for each request: from here on, noted
            server.set_app(self._noting_scrapes(app))

    def notify_after_scrapes(self, event: threading.Event, count: int = 1) -> bool:
        """Set `event` once `count` scrapes that began after this call have been sent in full:
        they carried every value written before the call (a linger's final values). True: it
        will (`count` >= 1)."""
        if count < 1:
            return False
        with self._lock:
            self._awaiting[event] = count
        return True

    def _noting_scrapes(self, app: WsgiApp) -> WsgiApp:
        def noted(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            with self._lock:  # before the values are collected: they are the final ones
                awaiting = tuple(self._awaiting)
            # prometheus_client serves the values on any path of a GET but the browser's icon
            if (not awaiting or environ.get("REQUEST_METHOD") != "GET"
                    or environ.get("PATH_INFO") == "/favicon.ico"):
                return app(environ, start_response)
            statuses: list[str] = []

            def start(status: str, *rest: Any) -> Any:
                statuses.append(status)
                return start_response(status, *rest)

            def sent() -> None:
                if not (statuses and statuses[-1].startswith("200")):
                    return
                with self._lock:
                    for event in awaiting:
                        if event in self._awaiting:  # not yet counted out by a scrape beside
                            self._awaiting[event] -= 1
                            if self._awaiting[event] == 0:
                                del self._awaiting[event]
                                event.set()

            return _SentThen(app(environ, start), sent)

        return noted

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class _SentThen:
    """A WSGI body that calls `then` once its last chunk has been written to the client
    (wsgiref asks for the next chunk only after writing the one before)."""

    def __init__(self, body: Iterable[bytes], then: Callable[[], None]) -> None:
        self._body, self._then = body, then

    def __len__(self) -> int:
        return len(self._body)  # type: ignore[arg-type]  # one chunk keeps its Content-Length

    def __iter__(self) -> Iterator[bytes]:
        yield from self._body
        self._then()

    def close(self) -> None:
        close = getattr(self._body, "close", None)
        if close is not None:
            close()


def serve(registry: CollectorRegistry, cfg: MetricsConfig) -> HttpEndpoint:
    """Serve `registry` on ``cfg.bind_address:cfg.port`` or raise one clear ConfigError."""
    where = f"{cfg.bind_address}:{cfg.port}"
    try:
        server, thread = start_http_server(cfg.port, addr=cfg.bind_address, registry=registry)
    except OSError as err:
        if err.errno == errno.EADDRINUSE:
            raise MetricsPortInUse(
                f"metrics port {where} is already in use",
                "stop the other process, pass another --metrics-port, "
                "or --metrics-port 0 to disable metrics",
            ) from err
        if err.errno in (errno.EACCES, errno.EPERM):
            raise MetricsPortInUse(
                f"no permission to bind the metrics port {where}",
                "use a --metrics-port above 1023",
            ) from err
        raise MetricsPortInUse(
            f"cannot bind the metrics endpoint {where}: {err.strerror or err}",
            "check --metrics-bind-address (an address of this host, or 0.0.0.0)",
        ) from err
    return HttpEndpoint(server, thread)


def enable_multiprocess_values(directory: Path) -> None:
    """Make prometheus_client in this process write values to mmap files in `directory`.

    prometheus_client decides at import time, from ``PROMETHEUS_MULTIPROC_DIR``, whether
    values live in memory or in mmap files. A rank may have imported it before the
    launcher's environment was applied (multiprocessing spawn imports the entrypoint's
    modules first), so switch explicitly. Must run before the first metric is created.
    """
    os.environ[PROMETHEUS_ENV_DIR] = str(directory)
    if not getattr(values.ValueClass, "_multiprocess", False):
        values.ValueClass = values.MultiProcessValue()  # type: ignore[no-untyped-call]


def counted_for_rank(directory: Path, metric: str, rank: int) -> float:
    """Sum of counter `metric` (``_total`` sample) over every process file of `rank`."""
    files = [str(p) for p in directory.glob("counter_*.db")]
    total = 0.0
    for family in MultiProcessCollector.merge(files, accumulate=False):  # type: ignore[no-untyped-call]
        if family.name != metric:
            continue
        for sample in family.samples:
            if sample.name == f"{metric}_total" and sample.labels.get("rank") == str(rank):
                total += sample.value
    return total


def torchrun_dir(port: int) -> Path:
    """Directory shared by the local ranks of one plain-torchrun agent.

    All local ranks are children of the same agent process, so its pid (plus the run id
    and the port) names a directory that is common to them, survives worker restarts
    (counters stay monotonic) and differs between agents.
    """
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "none").replace(os.sep, "_")
    root = Path(tempfile.gettempdir())
    return root / f"ddp-trainer-metrics-{os.getppid()}-{run_id}-{port}"


def multiprocess_registry(directory: Path) -> CollectorRegistry:
    """A registry that exposes everything written to `directory` by any process."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))  # type: ignore[no-untyped-call]
    return registry


class LauncherExporter:
    """The launcher's endpoint; merge :attr:`env` into every local rank's environment."""

    def __init__(
        self,
        env: dict[str, str],
        endpoint: HttpEndpoint | None = None,
        directory: Path | None = None,
    ) -> None:
        self.env = env
        self._endpoint = endpoint
        self._directory = directory

    @property
    def port(self) -> int:
        """The bound port (0 when metrics are off)."""
        return self._endpoint.port if self._endpoint is not None else 0

    def notify_after_scrapes(self, event: threading.Event, count: int = 1) -> bool:
        """Set `event` once `count` scrapes that began after this call have been sent (call it
        once the ranks have exited: every value is final). False when metrics are off."""
        return self._endpoint is not None and self._endpoint.notify_after_scrapes(event, count)

    def close(self) -> None:
        """Stop serving and delete the value files (call after the ranks exited)."""
        if self._endpoint is not None:
            self._endpoint.close()
            self._endpoint = None
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None


def start_launcher_exporter(cfg: MetricsConfig, nproc_per_node: int) -> LauncherExporter:
    """Serve every local rank's metrics from the launcher process on ``cfg.port``.

    Returns an exporter whose ``env`` tells the ranks to write into its directory instead
    of binding the port. ``cfg.port == 0`` returns an exporter that serves nothing and whose
    env turns the ranks' metrics off (:data:`ENV_OFF`).
    The directory is fresh (mkdtemp), so no values of an earlier run leak in; it lives as
    long as the launcher, so counters of ranks restarted by the elastic agent continue.
    """
    if nproc_per_node < 1:
        raise ConfigError(
            f"nproc_per_node must be >= 1, got {nproc_per_node}", "pass --nproc-per-node 1 or more"
        )
    if cfg.port == 0:
        return LauncherExporter(env={ENV_OFF: "1"})
    directory = Path(tempfile.mkdtemp(prefix="ddp-trainer-metrics-"))
    try:
        endpoint = serve(multiprocess_registry(directory), cfg)
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    env = {ENV_DIR: str(directory), PROMETHEUS_ENV_DIR: str(directory)}
    return LauncherExporter(env=env, endpoint=endpoint, directory=directory)
