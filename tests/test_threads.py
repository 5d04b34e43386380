"""Each rank runs its share of the pod's CPU in threads (trainer/distributed/threads.py)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests.conftest import run_cli
from trainer.distributed import threads
from trainer.distributed.threads import LAUNCHER_ENV, LIMIT_ENV, REQUEST_ENV, decide
from trainer.errors import ConfigError

TINY = ["--dataset", "synthetic", "--epochs", "1", "--metrics-port", "0"]


def cgroup_v2(tmp_path: Path, line: str) -> Path:
    (tmp_path / "cpu.max").write_text(line + "\n")
    return tmp_path


def cgroup_v1(tmp_path: Path, quota_us: int, period_us: int) -> Path:
    folder = tmp_path / "cpu,cpuacct"
    folder.mkdir()
    (folder / "cpu.cfs_quota_us").write_text(f"{quota_us}\n")
    (folder / "cpu.cfs_period_us").write_text(f"{period_us}\n")
    return tmp_path


def test_the_configured_count_wins_over_omp_num_threads_and_the_pod(tmp_path: Path) -> None:
    env = {"OMP_NUM_THREADS": "3", LIMIT_ENV: "8000"}
    assert decide(3, 2, env, cgroup_v2(tmp_path, "400000 100000"), cores=8) == threads.Threads(
        3, "train.cpu_threads=3")


def test_a_users_omp_num_threads_wins_over_the_pods_cpu(tmp_path: Path) -> None:
    got = decide(0, 2, {"OMP_NUM_THREADS": "3", LIMIT_ENV: "8000"}, tmp_path, cores=8)
    assert got == threads.Threads(3, "OMP_NUM_THREADS=3")


def test_the_launchers_omp_num_threads_is_decided_again_from_the_pod(tmp_path: Path) -> None:
    env = {"OMP_NUM_THREADS": "7", LAUNCHER_ENV: "1", LIMIT_ENV: "4000"}
    assert decide(0, 2, env, tmp_path, cores=8) == threads.Threads(2, "cpu limit 4 / 2 ranks")


@pytest.mark.parametrize("value", ["0", "-1", "two", "1025", ",2"])
def test_a_malformed_omp_num_threads_is_a_config_error_naming_it(tmp_path: Path,
                                                                 value: str) -> None:
    with pytest.raises(ConfigError, match=f"OMP_NUM_THREADS='{value}'"):
        decide(0, 1, {"OMP_NUM_THREADS": value}, tmp_path)


def test_omp_num_threads_counts_its_first_value_as_libgomp_does(tmp_path: Path) -> None:
    assert decide(0, 1, {"OMP_NUM_THREADS": "2,1"}, tmp_path, cores=8) == threads.Threads(
        2, "OMP_NUM_THREADS=2")


@pytest.mark.parametrize(("configured", "env"), [
    (1000, {}), (0, {"OMP_NUM_THREADS": "1000"}), (0, {LIMIT_ENV: "1000000"})])
def test_no_source_gives_more_threads_than_the_usable_cores(
        tmp_path: Path, configured: int, env: dict[str, str]) -> None:
    got = decide(configured, 1, env, tmp_path, cores=2)
    assert got.count == 2 and got.reason.endswith(", capped at the 2 usable cores"), got


def test_the_usable_cores_are_the_affinity_at_most_the_cgroup_quota_rounded_up(
        tmp_path: Path) -> None:
    cores = len(os.sched_getaffinity(0))
    assert threads.usable_cores(tmp_path) == cores
    assert threads.usable_cores(cgroup_v2(tmp_path, "50000 100000")) == 1
    assert threads.usable_cores(cgroup_v2(tmp_path, f"{cores * 100000 + 1} 100000")) == cores


def test_the_cpu_limit_is_shared_by_the_ranks_of_the_pod(tmp_path: Path) -> None:
    env = {LIMIT_ENV: "2000", REQUEST_ENV: "500"}
    assert decide(0, 2, env, cgroup_v2(tmp_path, "800000 100000")) == threads.Threads(
        1, "cpu limit 2 / 2 ranks")


def test_the_cpu_request_counts_when_there_is_no_limit(tmp_path: Path) -> None:
    assert decide(0, 1, {REQUEST_ENV: "3500"}, tmp_path, cores=8) == threads.Threads(
        3, "cpu request 3.5 / 1 rank")


def test_a_share_under_one_core_still_runs_one_thread(tmp_path: Path) -> None:
    assert decide(0, 4, {LIMIT_ENV: "500"}, tmp_path).count == 1


def test_the_cgroup_v2_quota_counts_without_the_charts_variables(tmp_path: Path) -> None:
    assert decide(0, 2, {}, cgroup_v2(tmp_path, "600000 100000"), cores=8) == threads.Threads(
        3, "cgroup cpu quota 6 / 2 ranks")


def test_the_cgroup_v1_quota_counts_where_there_is_no_v2_file(tmp_path: Path) -> None:
    assert decide(0, 1, {}, cgroup_v1(tmp_path, 150000, 100000)) == threads.Threads(
        1, "cgroup cpu quota 1.5 / 1 rank")


def test_the_throttled_time_is_read_from_cgroup_v2_or_v1_cpu_stat(tmp_path: Path) -> None:
    v2, v1 = tmp_path / "v2", tmp_path / "v1"
    (v1 / "cpu,cpuacct").mkdir(parents=True)
    v2.mkdir()
    (v2 / "cpu.stat").write_text("usage_usec 9000000\nnr_throttled 40\nthrottled_usec 2500000\n")
    (v1 / "cpu,cpuacct" / "cpu.stat").write_text(
        "nr_periods 355\nnr_throttled 344\nthrottled_time 17612089120\n")
    assert threads.cgroup_throttled_seconds(v2) == 2.5
    assert threads.cgroup_throttled_seconds(v1) == pytest.approx(17.61208912)
    assert threads.cgroup_throttled_seconds(tmp_path / "none") == 0.0


@pytest.mark.parametrize("make", [lambda p: cgroup_v2(p, "max 100000"),
                                  lambda p: cgroup_v1(p, -1, 100000), lambda p: p])
def test_without_a_quota_the_cores_this_process_may_use_count(
        tmp_path: Path, make: Callable[[Path], Path]) -> None:
    cores = len(os.sched_getaffinity(0))
    assert decide(0, 1, {}, make(tmp_path)) == threads.Threads(cores, f"cores {cores} / 1 rank")


def test_apply_sets_torchs_threads_from_local_world_size(monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture
                                                         ) -> None:
    before = torch.get_num_threads()
    for name in ("OMP_NUM_THREADS", LAUNCHER_ENV, REQUEST_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(LIMIT_ENV, "6000")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    try:
        with caplog.at_level("INFO", logger="trainer.distributed.threads"):
            threads.apply(0, announce=True)
        assert torch.get_num_threads() == 2
        assert caplog.messages == ["threads: 2 per rank (cpu limit 6 / 3 ranks)"]
    finally:
        torch.set_num_threads(before)


def thread_lines(text: str) -> list[str]:
    return re.findall(r"threads: .*", text)


def test_train_alone_runs_the_pods_cpu_limit_in_threads(tmp_path: Path) -> None:
    proc = run_cli("train", *TINY, "--output-dir", str(tmp_path),
                   env={LIMIT_ENV: "1000", "OMP_NUM_THREADS": ""})
    assert proc.returncode == 0, proc.stderr
    assert thread_lines(proc.stderr) == ["threads: 1 per rank (cpu limit 1 / 1 rank)"]


def test_train_alone_honours_the_configured_count(tmp_path: Path) -> None:
    proc = run_cli("train", *TINY, "--output-dir", str(tmp_path), "--set",
                   "train.cpu_threads=1", env={LIMIT_ENV: "2000", "OMP_NUM_THREADS": "2"})
    assert proc.returncode == 0, proc.stderr
    assert thread_lines(proc.stderr) == ["threads: 1 per rank (train.cpu_threads=1)"]


def test_train_runs_a_thousand_threads_asked_for_on_the_usable_cores(tmp_path: Path) -> None:
    cores = len(os.sched_getaffinity(0))
    proc = run_cli("train", *TINY, "--output-dir", str(tmp_path),
                   env={"OMP_NUM_THREADS": "1000"})
    assert proc.returncode == 0, proc.stderr
    assert thread_lines(proc.stderr) == [
        f"threads: {cores} per rank (OMP_NUM_THREADS=1000, capped at the {cores} usable "
        f"core{'s' if cores > 1 else ''})"]


@pytest.mark.parametrize("command", ["train", "run", "evaluate"])
def test_a_bad_omp_num_threads_is_one_line_before_torch_and_any_rank(tmp_path: Path,
                                                                     command: str) -> None:
    args = ["--checkpoint", str(tmp_path)] if command == "evaluate" else [
        *TINY, "--output-dir", str(tmp_path)]
    proc = run_cli(command, *args, env={"OMP_NUM_THREADS": "abc"})
    assert proc.returncode == 2
    assert proc.stderr == ("error: OMP_NUM_THREADS='abc' is not a thread count in [1, 1024] "
                           "(fix: unset OMP_NUM_THREADS or set it to 1 or more, at most the "
                           "cores here)\n")


def test_a_thread_count_above_the_limit_is_refused_naming_it(tmp_path: Path) -> None:
    proc = run_cli("train", *TINY, "--set", "train.cpu_threads=1025")
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: train.cpu_threads: 1025 is outside "
                                  "[0, 1024] (fix: "), proc.stderr


def test_run_shares_the_pods_cpu_limit_between_its_ranks(tmp_path: Path) -> None:
    proc = run_cli("run", "--nproc-per-node", "2", *TINY, "--output-dir", str(tmp_path),
                   env={LIMIT_ENV: "4000", "OMP_NUM_THREADS": ""})
    assert proc.returncode == 0, proc.stderr
    assert thread_lines(proc.stderr) == ["threads: 2 per rank (cpu limit 4 / 2 ranks)"]


def test_run_keeps_a_users_omp_num_threads(tmp_path: Path) -> None:
    proc = run_cli("run", "--nproc-per-node", "2", *TINY, "--output-dir", str(tmp_path),
                   env={LIMIT_ENV: "4000", "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    assert thread_lines(proc.stderr) == ["threads: 1 per rank (OMP_NUM_THREADS=1)"]


def test_run_gives_a_user_script_its_share_too(tmp_path: Path) -> None:
    script = tmp_path / "show.py"
    script.write_text("import os, torch\n"
                      "print('rank', os.environ['RANK'], os.environ['OMP_NUM_THREADS'],\n"
                      "      torch.get_num_threads(), flush=True)\n")
    proc = run_cli("run", "--nproc-per-node", "2", "--metrics-port", "0", str(script),
                   env={LIMIT_ENV: "4000", "OMP_NUM_THREADS": ""})
    assert proc.returncode == 0, proc.stderr
    assert sorted(re.findall(r"rank (\d) (\d+) (\d+)", proc.stdout)) == [
        ("0", "2", "2"), ("1", "2", "2")], proc.stdout
