"""One rank's life: what it opened is closed before it leaves the group, as the outcome allows."""

from __future__ import annotations

from typing import Any

import pytest

from trainer.config import JobConfig
from trainer.errors import ConfigError, Preempted, RankLost
from trainer.placement import DistContext
from trainer.ranks import lifecycle


@pytest.fixture
def left(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    events: list[Any] = []

    def teardown(ctx: DistContext, completed: bool = True) -> None:
        events.append(("teardown", completed))

    monkeypatch.setattr(lifecycle, "teardown", teardown)
    return events


def _live(events: list[Any], raised: BaseException | None = None,
          completed: bool = False) -> None:
    with lifecycle.rank_life(JobConfig()) as rank:
        rank.close_at_exit(lambda: events.append("first registered"))
        rank.close_at_exit(lambda: events.append("last registered"))
        rank.completed = completed
        if raised is not None:
            raise raised


def test_a_completed_rank_closes_in_reverse_then_keeps_the_group(left: list[Any]) -> None:
    _live(left, completed=True)
    assert left == ["last registered", "first registered", ("teardown", True)]


def test_an_agreed_stop_keeps_the_group_like_a_completed_run(left: list[Any]) -> None:
    with pytest.raises(Preempted):
        _live(left, Preempted("stopped", "restart"))
    assert left[-1] == ("teardown", True)


def test_an_error_of_ours_destroys_the_group_after_closing(left: list[Any]) -> None:
    with pytest.raises(ConfigError):
        _live(left, ConfigError("bad", "fix"))
    assert left == ["last registered", "first registered", ("teardown", False)]


def test_a_lost_rank_or_the_users_exception_leaves_the_group_to_the_exit(
        left: list[Any]) -> None:
    with pytest.raises(RankLost):
        _live(left, RankLost("peer gone", "restart"))
    with pytest.raises(ZeroDivisionError):
        _live(left, ZeroDivisionError("raised in this file: the user's code"))
    assert ("teardown", False) not in left and ("teardown", True) not in left
    assert left == ["last registered", "first registered"] * 2

