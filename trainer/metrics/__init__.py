"""Prometheus exporter behind ``log(metrics, step)`` / ``close()``.

The training loop imports only this package (never prometheus_client) and calls
:meth:`MetricsSink.log` at its log interval with Python floats, so exporting costs no
device synchronisation. Metric names: docs/metrics.md. Serving modes: :mod:`.serve`.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from prometheus_client import CollectorRegistry

from trainer.config import MetricsConfig
from trainer.metrics import trainjob_status
from trainer.metrics.families import MetricValue, RunInfo, TrainerMetrics
from trainer.metrics.serve import (
    ENV_DIR,
    ENV_OFF,
    PROMETHEUS_ENV_DIR,
    HttpEndpoint,
    LauncherExporter,
    MetricsPortInUse,
    counted_for_rank,
    enable_multiprocess_values,
    multiprocess_registry,
    serve,
    start_launcher_exporter,
    torchrun_dir,
)

__all__ = [
    "ENV_DIR",
    "ENV_OFF",
    "PROMETHEUS_ENV_DIR",
    "FanOut",
    "LauncherExporter",
    "MetricValue",
    "MetricsPortInUse",
    "MetricsSink",
    "NullSink",
    "PrometheusSink",
    "RunInfo",
    "build_metrics",
    "start_launcher_exporter",
]

log = logging.getLogger(__name__)


class MetricsSink(Protocol):
    @property
    def port(self) -> int:
        """Port this process serves on (0 when it serves nothing)."""
        ...

    def log(self, metrics: Mapping[str, MetricValue], step: int) -> None: ...

    def notify_after_scrapes(self, event: threading.Event, count: int = 1) -> bool:
        """Set `event` once `count` scrapes that began after this call have been served: they
        carried every value written before. False when no such scrape would carry all final
        values (nothing served here, or values of other processes that may still change)."""
        ...

    def close(self) -> None: ...


class NullSink:
    """Metrics disabled (``--metrics-port 0``)."""

    port = 0

    def log(self, metrics: Mapping[str, MetricValue], step: int) -> None:
        pass

    def notify_after_scrapes(self, event: threading.Event, count: int = 1) -> bool:
        return False

    def close(self) -> None:
        pass


class FanOut:
    """Several sinks behind one: the Prometheus sink and the TrainJob status reporter."""

    def __init__(self, *sinks: MetricsSink) -> None:
        self.sinks = sinks

    @property
    def port(self) -> int:
        """Port this process serves on: the first sink's (the Prometheus one); 0 if none."""
        return int(getattr(self.sinks[0], "port", 0)) if self.sinks else 0

    def log(self, metrics: Mapping[str, MetricValue], step: int) -> None:
        for sink in self.sinks:
            sink.log(metrics, step)

    def notify_after_scrapes(self, event: threading.Event, count: int = 1) -> bool:
        """The first sink's (the one that serves, as for :attr:`port`)."""
        return bool(self.sinks) and self.sinks[0].notify_after_scrapes(event, count)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


class PrometheusSink:
    """Updates this rank's families; serves them too when this process owns the port."""

    def __init__(
        self,
        metrics: TrainerMetrics,
        registry: CollectorRegistry,
        endpoint: HttpEndpoint | None = None,
        mode: str = "single",
        owned_dir: Path | None = None,
    ) -> None:
        self.metrics = metrics
        self.registry = registry
        self.mode = mode
        self._endpoint = endpoint
        self._owned_dir = owned_dir

    @property
    def port(self) -> int:
        """Port this process serves on (0 when another process serves our values)."""
        return self._endpoint.port if self._endpoint is not None else 0

    def log(self, metrics: Mapping[str, MetricValue], step: int) -> None:
        # `step` is deliberately unused: a step label would make series unbounded, and
        # the step count is exported as trainer_steps_total.
        self.metrics.update(metrics)

    def notify_after_scrapes(self, event: threading.Event, count: int = 1) -> bool:
        """Only when this process serves its own values alone (``single``): under plain
        torchrun the endpoint also serves the local ranks beside it, whose last values may
        still be unwritten when this one is done."""
        if self._endpoint is None or self.mode != "single":
            return False
        return self._endpoint.notify_after_scrapes(event, count)

    def close(self) -> None:
        if self._endpoint is not None:
            self._endpoint.close()
            self._endpoint = None
        if self._owned_dir is not None:
            # Under plain torchrun nobody else cleans up; siblings still writing keep their
            # (now unlinked) files open harmlessly until they exit.
            shutil.rmtree(self._owned_dir, ignore_errors=True)
            self._owned_dir = None


def build_metrics(
    cfg: MetricsConfig, info: RunInfo, registry: CollectorRegistry | None = None
) -> MetricsSink:
    """The metrics sink of one rank: Prometheus, plus on global rank 0 the TrainJob status
    reporter when the Trainer v2 controller set ``KUBEFLOW_TRAINER_SERVER_*``
    (:mod:`trainer.metrics.trainjob_status`; its request counter joins `registry`).
    """
    registry = registry if registry is not None else CollectorRegistry()
    sink = _prometheus_sink(cfg, info, registry)
    reporter = trainjob_status.from_env(info.world_size, info.rank, registry)
    return sink if reporter is None else FanOut(sink, reporter)


def _prometheus_sink(
    cfg: MetricsConfig, info: RunInfo, registry: CollectorRegistry
) -> MetricsSink:
    """The Prometheus sink of one rank (see :mod:`trainer.metrics.serve` for the modes).

    * ``cfg.port == 0``, or ``DDP_TRAINER_METRICS_OFF=1`` (a launcher with metrics off): a
      no-op sink.
    * ``DDP_TRAINER_METRICS_DIR`` set (by ``ddp-trainer run``): write values to that
      multiprocess directory; the launcher serves them.
    * otherwise, one local rank: serve `registry` on ``cfg.bind_address:cfg.port``.
    * otherwise (plain torchrun, several local ranks): share a directory per torchrun agent;
      local rank 0 serves it.

    `registry` defaults to a fresh one (never prometheus_client's global registry).
    Raises :class:`MetricsPortInUse` (a ConfigError) when the port cannot be bound.
    """
    if cfg.port == 0 or os.environ.get(ENV_OFF) == "1":
        return NullSink()

    launcher_dir = os.environ.get(ENV_DIR)
    if launcher_dir:
        directory = Path(launcher_dir)
        if not directory.is_dir():
            # The launcher has gone (or the variable leaked into an unrelated process):
            # exporting nowhere is better than failing the training run.
            log.warning("metrics: %s=%s is not a directory; metrics disabled", ENV_DIR, directory)
            return NullSink()
        return _multiprocess_sink(cfg, info, registry, directory, serves=False, mode="launcher")

    if info.local_world_size <= 1:
        metrics = TrainerMetrics(registry, info)
        return PrometheusSink(metrics, registry, serve(registry, cfg), mode="single")

    directory = torchrun_dir(cfg.port)
    directory.mkdir(parents=True, exist_ok=True)
    return _multiprocess_sink(
        cfg, info, registry, directory, serves=info.local_rank == 0, mode="torchrun"
    )


def _multiprocess_sink(
    cfg: MetricsConfig,
    info: RunInfo,
    registry: CollectorRegistry,
    directory: Path,
    *,
    serves: bool,
    mode: str,
) -> PrometheusSink:
    enable_multiprocess_values(directory)
    # Read before creating our own files: restarts already counted by dead predecessors.
    baseline = counted_for_rank(directory, "trainer_restarts", info.rank)
    metrics = TrainerMetrics(registry, info)
    metrics.set_restarts_baseline(baseline)
    endpoint = serve(multiprocess_registry(directory), cfg) if serves else None
    owned = directory if serves and mode == "torchrun" else None
    return PrometheusSink(metrics, registry, endpoint, mode=mode, owned_dir=owned)
