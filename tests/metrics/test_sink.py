"""Unit tests: logged keys become the documented series of a fresh CollectorRegistry."""

from __future__ import annotations

import math
import socket

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest

from tests.metrics.helpers import promtool_check_metrics, scrape
from tests.support.prometheus import free_port
from trainer.config import MetricsConfig
from trainer.errors import ConfigError
from trainer.metrics import (
    MetricsPortInUse,
    MetricValue,
    NullSink,
    PrometheusSink,
    RunInfo,
    build_metrics,
)
from trainer.metrics.families import TrainerMetrics


def run_info(rank: int = 0, device: str = "cpu", world_size: int = 2) -> RunInfo:
    return RunInfo(
        rank=rank,
        local_rank=rank,
        world_size=world_size,
        local_world_size=1,
        backend="gloo",
        strategy="ddp",
        model="mlp",
        dataset="digits",
        device=device,
        version="9.9.9",
    )


def get(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def fresh(rank: int = 0, device: str = "cpu") -> tuple[TrainerMetrics, CollectorRegistry]:
    registry = CollectorRegistry()
    return TrainerMetrics(registry, run_info(rank, device)), registry


def test_every_series_exists_at_zero_before_the_first_log() -> None:
    _, reg = fresh(rank=1)
    for split in ("train", "val"):
        assert get(reg, "trainer_loss", rank="1", split=split) == 0.0
        assert get(reg, "trainer_accuracy_ratio", rank="1", split=split) == 0.0
    for name in (
        "trainer_steps_total",
        "trainer_samples_total",
        "trainer_data_wait_seconds_total",
        "trainer_forward_seconds_total",
        "trainer_cpu_throttled_seconds_total",
        "trainer_restarts_total",
        "trainer_step_duration_seconds_count",
        "trainer_learning_rate",
        "trainer_grad_norm",
        "trainer_skipped_steps_total",
        "trainer_epoch",
        "trainer_progress_ratio",
        "trainer_last_step_timestamp_seconds",
        "trainer_resumed_step",
    ):
        assert get(reg, name, rank="1") == 0.0, name
    assert get(reg, "trainer_world_size", rank="1") == 2.0
    start = get(reg, "trainer_start_timestamp_seconds", rank="1")
    assert start is not None and start > 1.7e9
    info = {
        "rank": "1",
        "local_rank": "1",
        "version": "9.9.9",
        "backend": "gloo",
        "strategy": "ddp",
        "model": "mlp",
        "dataset": "digits",
        "device": "cpu",
    }
    assert get(reg, "trainer_info", **info) == 1.0


def test_rank0_only_series_are_absent_on_other_ranks_and_present_on_rank0() -> None:
    _, reg1 = fresh(rank=1)
    _, reg0 = fresh(rank=0)
    for name, labels in (
        ("trainer_last_checkpoint_timestamp_seconds", {}),
        ("trainer_global_loss", {"split": "val"}),
        ("trainer_global_accuracy_ratio", {"split": "val"}),
    ):
        assert get(reg1, name, rank="1", **labels) is None, name
        assert get(reg0, name, rank="0", **labels) == 0.0, name


def test_train_interval_log_sets_gauges_and_accumulates_counters() -> None:
    m, reg = fresh()
    interval: dict[str, MetricValue] = {
        "train/loss": 0.75,
        "train/accuracy": 0.5,
        "train/steps": 10,
        "train/samples": 320,
        "train/step_seconds": [0.004] * 8 + [0.2, 3.0],
        "train/data_wait_seconds": 0.125,
        "train/forward_seconds": 0.5,
        "train/cpu_throttled_seconds": 0.25,
        "train/lr": 0.05,
        "train/grad_norm": 3.5,
        "train/skipped_steps": 2,
        "train/epoch": 1,
        "train/progress_ratio": 0.25,
        "train/last_step_timestamp": 1_800_000_000.5,
    }
    m.update(interval)
    m.update({**interval, "train/loss": 0.5})
    assert get(reg, "trainer_loss", rank="0", split="train") == 0.5
    assert get(reg, "trainer_accuracy_ratio", rank="0", split="train") == 0.5
    assert get(reg, "trainer_steps_total", rank="0") == 20
    assert get(reg, "trainer_samples_total", rank="0") == 640
    assert get(reg, "trainer_data_wait_seconds_total", rank="0") == 0.25
    assert get(reg, "trainer_forward_seconds_total", rank="0") == 1.0
    assert get(reg, "trainer_cpu_throttled_seconds_total", rank="0") == 0.5
    assert get(reg, "trainer_learning_rate", rank="0") == 0.05
    assert get(reg, "trainer_grad_norm", rank="0") == 3.5
    assert get(reg, "trainer_skipped_steps_total", rank="0") == 4
    assert get(reg, "trainer_epoch", rank="0") == 1
    assert get(reg, "trainer_progress_ratio", rank="0") == 0.25
    assert get(reg, "trainer_last_step_timestamp_seconds", rank="0") == 1_800_000_000.5
    assert get(reg, "trainer_step_duration_seconds_count", rank="0") == 20
    assert get(reg, "trainer_step_duration_seconds_sum", rank="0") == pytest.approx(6.464)
    assert get(reg, "trainer_step_duration_seconds_bucket", rank="0", le="0.005") == 16
    assert get(reg, "trainer_step_duration_seconds_bucket", rank="0", le="0.25") == 18
    assert get(reg, "trainer_step_duration_seconds_bucket", rank="0", le="2.5") == 18
    assert get(reg, "trainer_step_duration_seconds_bucket", rank="0", le="+Inf") == 20


def test_the_queue_keys_set_the_queue_gauges() -> None:
    m, reg = fresh()
    m.update({"queue/wait_seconds": 184.0, "queue/evictions": 3, "queue/preemptions": 1})
    assert get(reg, "trainer_queue_wait_seconds", rank="0") == 184.0
    assert get(reg, "trainer_queue_evictions", rank="0") == 3
    assert get(reg, "trainer_queue_preemptions", rank="0") == 1


def test_validation_sets_per_rank_and_exact_global_values() -> None:
    m, reg = fresh(rank=0)
    m.update(
        {
            "val/loss": 0.3,
            "val/accuracy": 0.9,
            "val/correct": 90,
            "val/total": 100,
            "val/global_loss": 0.35,
            "val/global_accuracy": 0.875,
            "val/global_correct": 175,
            "val/global_total": 200,
        }
    )
    assert get(reg, "trainer_loss", rank="0", split="val") == 0.3
    assert get(reg, "trainer_accuracy_ratio", rank="0", split="val") == 0.9
    assert get(reg, "trainer_global_loss", rank="0", split="val") == 0.35
    assert get(reg, "trainer_global_accuracy_ratio", rank="0", split="val") == 0.875
    # A validation leaves the train series alone.
    assert get(reg, "trainer_loss", rank="0", split="train") == 0.0


def test_checkpoint_resume_and_cuda_memory_keys() -> None:
    m, reg = fresh(rank=0, device="cuda:0")
    m.update(
        {
            "checkpoint/last_timestamp": 1_800_000_100.0,
            "run/resumed_step": 400,
            "cuda/memory_allocated_bytes": 2.5e9,
            "cuda/max_memory_allocated_bytes": 3e9,
        }
    )
    assert get(reg, "trainer_last_checkpoint_timestamp_seconds", rank="0") == 1_800_000_100.0
    assert get(reg, "trainer_resumed_step", rank="0") == 400
    assert get(reg, "trainer_cuda_memory_allocated_bytes", rank="0") == 2.5e9
    assert get(reg, "trainer_cuda_memory_max_allocated_bytes", rank="0") == 3e9


def test_the_durable_checkpoint_step_is_set_and_failed_saves_are_counted_on_rank0_only() -> None:
    m, reg = fresh(rank=0)
    assert get(reg, "trainer_checkpoint_durable_step", rank="0") == 0.0
    assert get(reg, "trainer_checkpoint_failed_saves_total", rank="0") == 0.0
    m.update({"checkpoint/durable_step": 40.0})
    m.update({"checkpoint/failed_saves": 1.0})
    m.update({"checkpoint/failed_saves": 1.0})
    assert get(reg, "trainer_checkpoint_durable_step", rank="0") == 40.0
    assert get(reg, "trainer_checkpoint_failed_saves_total", rank="0") == 2.0
    _, reg1 = fresh(rank=1)
    assert get(reg1, "trainer_checkpoint_durable_step", rank="1") is None
    assert get(reg1, "trainer_checkpoint_failed_saves_total", rank="1") is None


def test_cuda_memory_series_exist_only_on_cuda_devices() -> None:
    _, cpu = fresh(device="cpu")
    _, cuda = fresh(device="cuda")
    assert get(cpu, "trainer_cuda_memory_allocated_bytes", rank="0") is None
    assert get(cuda, "trainer_cuda_memory_allocated_bytes", rank="0") == 0.0


def test_restarts_counter_follows_the_absolute_count() -> None:
    m, reg = fresh()
    for logged, expected in ((0, 0.0), (2, 2.0), (2, 2.0), (3, 3.0), (1, 3.0)):
        m.update({"run/restarts": logged})
        assert get(reg, "trainer_restarts_total", rank="0") == expected


def test_unknown_keys_and_malformed_values_are_skipped_without_raising(
    caplog: pytest.LogCaptureFixture,
) -> None:
    m, reg = fresh()
    m.update(
        {
            "train/future_key": 1.0,
            "train/loss": "not a number",  # type: ignore[dict-item]
            "train/steps": -5,
            "train/samples": math.nan,
            "train/accuracy": 0.25,
        }
    )
    assert get(reg, "trainer_loss", rank="0", split="train") == 0.0
    assert get(reg, "trainer_steps_total", rank="0") == 0.0
    assert get(reg, "trainer_samples_total", rank="0") == 0.0
    assert get(reg, "trainer_accuracy_ratio", rank="0", split="train") == 0.25
    warned = [r.getMessage() for r in caplog.records]
    assert any("train/loss" in w for w in warned)
    assert any("train/steps" in w for w in warned)
    assert not any("future_key" in w for w in warned)


def test_nan_and_inf_loss_are_exported_so_alerts_can_fire() -> None:
    m, reg = fresh()
    m.update({"train/loss": math.nan})
    assert math.isnan(get(reg, "trainer_loss", rank="0", split="train") or 0.0)
    m.update({"train/loss": math.inf})
    assert get(reg, "trainer_loss", rank="0", split="train") == math.inf


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=10_000), max_size=20))
def test_steps_total_is_the_sum_of_logged_increments(increments: list[int]) -> None:
    m, reg = fresh()
    for inc in increments:
        m.update({"train/steps": inc, "train/step_seconds": [0.01] * min(inc, 3)})
    assert get(reg, "trainer_steps_total", rank="0") == sum(increments)
    assert get(reg, "trainer_step_duration_seconds_count", rank="0") == sum(
        min(i, 3) for i in increments
    )


def test_exposition_passes_promtool_check_metrics() -> None:
    m, reg = fresh(rank=0, device="cuda:0")
    m.update({"train/loss": 1.0, "train/step_seconds": [0.1], "run/restarts": 1})
    result = promtool_check_metrics(generate_latest(reg).decode())
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "" and result.stderr.strip() == ""


# -- build_metrics in one process (no launcher) ----------------------------------------


def test_port_zero_gives_a_no_op_sink_that_binds_nothing() -> None:
    registry = CollectorRegistry()
    sink = build_metrics(MetricsConfig(port=0), run_info(), registry)
    assert isinstance(sink, NullSink)
    sink.log({"train/loss": 1.0}, 1)
    sink.close()
    assert list(registry.collect()) == []


def test_single_process_rank_serves_its_registry_and_frees_the_port_on_close() -> None:
    port = free_port()
    registry = CollectorRegistry()
    sink = build_metrics(MetricsConfig(port=port, bind_address="127.0.0.1"), run_info(), registry)
    assert isinstance(sink, PrometheusSink)
    try:
        sink.log({"train/loss": 2.25, "train/steps": 3}, 3)
        text = scrape(port)
        assert 'trainer_loss{rank="0",split="train"} 2.25' in text
        assert 'trainer_steps_total{rank="0"} 3.0' in text
    finally:
        sink.close()
    with socket.socket() as s:
        # SO_REUSEADDR ignores the scrape's TIME_WAIT but not a listening socket.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))  # raises EADDRINUSE if the endpoint still listened


def test_build_metrics_never_touches_the_global_registry() -> None:
    before = set(REGISTRY._names_to_collectors)
    sink = build_metrics(
        MetricsConfig(port=free_port(), bind_address="127.0.0.1"), run_info(rank=3)
    )
    sink.close()
    assert set(REGISTRY._names_to_collectors) == before


def test_port_in_use_raises_one_line_config_error_with_a_fix() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(MetricsPortInUse) as info:
            build_metrics(MetricsConfig(port=port, bind_address="127.0.0.1"), run_info())
    err = info.value
    assert isinstance(err, ConfigError)
    assert f"127.0.0.1:{port} is already in use" in err.problem
    assert "--metrics-port" in err.fix
    assert "\n" not in str(err)


def test_unusable_bind_address_raises_config_error_naming_the_flag() -> None:
    with pytest.raises(MetricsPortInUse) as info:
        build_metrics(MetricsConfig(port=free_port(), bind_address="203.0.113.7"), run_info())
    assert "203.0.113.7" in info.value.problem
    assert "--metrics-bind-address" in info.value.fix
