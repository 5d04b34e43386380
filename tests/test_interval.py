"""A log interval's totals and rank 0's steps.jsonl."""

from __future__ import annotations

import errno
import json
import math
import os
from pathlib import Path

import pytest
import torch

from trainer.errors import OutputError
from trainer.loop.interval_stats import Interval, StepLog


def test_totals_sum_tensor_and_int_counts_in_one_read() -> None:
    interval = Interval(torch.device("cpu"))
    for loss, correct, count in [(0.5, torch.tensor(3), 4), (1.5, torch.tensor(2), 4)]:
        interval.losses.append(torch.tensor(loss))
        interval.correct.add(correct)
        interval.count.append(count)
    interval.grad_norm = torch.tensor(2.5, dtype=torch.float64)
    assert interval.totals() == ([0.5, 1.5], 5.0, 8.0, 2.5)


def test_epoch_losses_are_the_current_epochs_steps_once_each() -> None:
    interval = Interval(torch.device("cpu"))
    interval.losses += [torch.tensor(0.5), torch.tensor(0.25)]
    assert interval.epoch_losses() == [0.5, 0.25]  # the epoch ends inside the interval
    interval.losses.append(torch.tensor(2.0))
    assert interval.epoch_losses() == [2.0]
    assert interval.epoch_losses() == []
    assert interval.totals()[0] == [0.5, 0.25, 2.0]  # the interval itself still has them all


def test_step_log_lines_are_json_and_a_second_run_appends(tmp_path: Path) -> None:
    path = tmp_path / "out" / "steps.jsonl"
    first = StepLog(path)
    first.append(3, [0, 0, 1], [0.25, 1e-05, 2.0 / 3.0])  # an interval spanning two epochs
    first.close()
    second = StepLog(path)  # a resumed run adds to the same file
    second.append(4, [1], [math.pi])
    second.close()
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows == [{"step": 1, "epoch": 0, "loss": 0.25}, {"step": 2, "epoch": 0, "loss": 1e-05},
                    {"step": 3, "epoch": 1, "loss": 2.0 / 3.0}, {"step": 4, "epoch": 1,
                                                                  "loss": math.pi}]


def test_a_fresh_step_log_counts_only_ascii_digits_in_the_names_it_moves_aside(
        tmp_path: Path) -> None:
    path = tmp_path / "steps.jsonl"
    path.write_text('{"step": 1}\n')
    (tmp_path / "steps.².jsonl").write_text("a user's file\n")
    log = StepLog(path, fresh=True)
    log.append(1, [0], [0.5])
    log.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "steps.1.jsonl", "steps.jsonl", "steps.².jsonl"]
    assert (tmp_path / "steps.1.jsonl").read_text() == '{"step": 1}\n'


def test_a_steps_file_that_cannot_be_moved_aside_is_an_output_error_and_stays(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "steps.jsonl"
    path.write_text('{"step": 1}\n')

    def refuse(src: object, dst: object) -> None:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(src))

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OutputError, match=r"^output\.dir: steps\.jsonl could not be written in "
                       r".* \(Permission denied\); what the run wrote before is kept \(fix: "):
        StepLog(path, fresh=True).append(1, [0], [0.5])
    assert [p.name for p in tmp_path.iterdir()] == ["steps.jsonl"]
    assert path.read_text() == '{"step": 1}\n'
