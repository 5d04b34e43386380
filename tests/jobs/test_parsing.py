"""Small pure pieces: durations, kubelet timestamps, log line splitting, node ranks."""

from __future__ import annotations

import pytest

from trainer.jobs.arguments import parse_duration
from trainer.jobs.errors import JobsError
from trainer.jobs.logs import iter_lines, split_timestamp
from trainer.jobs.views import PodView, rank_pods


@pytest.mark.parametrize(("text", "seconds"), [
    ("0", 0.0), ("90", 90.0), ("90s", 90.0), ("15m", 900.0), ("2h", 7200.0),
    ("1h30m", 5400.0), ("1.5s", 1.5), ("250ms", 0.25)])
def test_durations_are_read_like_kubectl(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "soon", "5 m", "1d", "m5", "5m-"])
def test_malformed_durations_are_rejected(text: str) -> None:
    with pytest.raises(JobsError, match="is not a duration"):
        parse_duration(text)


def test_kubelet_timestamps_order_by_value_not_by_text() -> None:
    # RFC 3339 with trimmed nanoseconds: ".5" is later than ".123456789" though shorter.
    early, text = split_timestamp("2026-01-01T12:00:00.123456789Z step 1")
    late, _ = split_timestamp("2026-01-01T12:00:00.5Z step 2")
    assert text == "step 1"
    assert early < late
    assert split_timestamp("no stamp here") == ((0, 0), "no stamp here")


def test_log_lines_survive_chunks_split_mid_line_and_mid_character() -> None:
    data = "loss=1.0 ✓\nloss=0.9\npartial".encode()
    chunks = [data[i:i + 3] for i in range(0, len(data), 3)]
    assert list(iter_lines(chunks)) == ["loss=1.0 ✓", "loss=0.9", "partial"]


def pod(replica_type: str, index: int) -> PodView:
    return PodView(name=f"j-{replica_type}-{index}", replica_type=replica_type,
                   replica_index=index, phase="Running", node="n", restarts=0, ready=True)


def test_node_ranks_follow_the_operator_master_first_then_workers() -> None:
    ranked = rank_pods([pod("worker", 1), pod("master", 0), pod("worker", 0)])
    assert [(p.name, p.node_rank, p.rank_label) for p in ranked] == [
        ("j-master-0", 0, "0"), ("j-worker-0", 1, "1"), ("j-worker-1", 2, "2")]


def test_node_ranks_of_a_job_without_master_start_at_worker_zero() -> None:
    ranked = rank_pods([pod("worker", 1), pod("worker", 0)])
    assert [(p.name, p.node_rank) for p in ranked] == [("j-worker-0", 0), ("j-worker-1", 1)]


def test_pods_with_several_ranks_cover_consecutive_global_ranks() -> None:
    ranked = rank_pods([pod("master", 0), pod("worker", 0), pod("worker", 1)], ranks_per_pod=4)
    assert [p.rank_label for p in ranked] == ["0-3", "4-7", "8-11"]
    assert 5 in ranked[1].ranks and 8 not in ranked[1].ranks


def test_prometheus_selectors_keep_the_two_kinds_apart() -> None:
    from trainer.jobs.prom import selector

    # A PyTorchJob's series from PodMonitors older than job_kind have none: "" matches them.
    assert selector("a", "ns") == 'pytorchjob="a",namespace="ns",job_kind=~"PyTorchJob|"'
    assert selector("a", "ns", "TrainJob") == 'pytorchjob="a",namespace="ns",job_kind="TrainJob"'
    assert selector('x"y', "ns") .startswith('pytorchjob="x\\"y"')


def test_a_log_line_that_already_names_its_rank_is_prefixed_once() -> None:
    from trainer.jobs.logs import Line

    assert Line("[rank 1] ", "[rank 1] INFO epoch 0").shown() == "[rank 1] INFO epoch 0"
    assert Line("[rank 1] ", "INFO epoch 0").shown() == "[rank 1] INFO epoch 0"
    assert Line("[ranks 2-3] ", "[rank 3] INFO x").shown() == "[ranks 2-3] [rank 3] INFO x"
