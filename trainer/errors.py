"""User-facing errors: one line that names the problem and the fix."""

from __future__ import annotations

import signal


def first_line(value: object, limit: int = 300, empty: str | None = None) -> str:
    """The first line of an error's (or any value's) text, for a one-line message: at most
    `limit` characters; `empty` (default: the value's type name) when there is no text."""
    text = str(value).strip()
    if not text:
        return type(value).__name__ if empty is None else empty
    return text.splitlines()[0][:limit]


def _one_line(text: str) -> str:
    """`text` with its line breaks escaped: user input (a key, a path) quoted in a message
    cannot break the promised single line."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


USER_CODE_EXIT = 5
"""Exit status of a rank whose user code (model, dataset, step, script) raised: see
:mod:`trainer.ranks.usercode`."""


class TrainerError(Exception):
    """An error caused by input or environment, reported without a traceback.

    The CLI prints ``error: <problem> (fix: <fix>)`` and exits with :attr:`exit_code`;
    ``--debug`` adds the traceback.
    """

    exit_code = 2

    def __init__(self, problem: str, fix: str) -> None:
        problem, fix = _one_line(problem), _one_line(fix)
        super().__init__(f"{problem} (fix: {fix})")
        self.problem = problem
        self.fix = fix


class ConfigError(TrainerError):
    """A configuration value is invalid."""


class DataError(TrainerError):
    """A dataset is missing, unreadable or inconsistent."""


class AgreedStop(TrainerError):
    """Raised on every rank at the same step, by agreement (trainer.distributed.agreement): the
    process group is intact and the ranks leave it together."""


class TrainingDiverged(AgreedStop):
    """The loss became NaN or infinite on some rank."""

    exit_code = 3


class Preempted(AgreedStop):
    """SIGTERM (eviction, preemption): stopped at a step boundary after checkpointing."""

    # 128 + SIGTERM = 143: the training operator's ExitCode restart policy retries 128-255 and
    # treats 1-127 as permanent failures.
    exit_code = 128 + int(signal.SIGTERM)


class RankLost(TrainerError):
    """Another rank stopped responding or died; raised instead of hanging."""

    exit_code = 4


class CheckpointError(TrainerError):
    """No checkpoint could be written or read."""


KILLED_EXIT = 128 + int(signal.SIGKILL)
"""A process killed by SIGKILL: the out-of-memory killer, or a kill from outside."""


def exit_class(code: int, reason: str = "") -> str:
    """What a rank's (or a container's) exit code means, as ``jobs status`` names it; `reason`
    is the container runtime's (``OOMKilled`` for the kernel's out-of-memory kill)."""
    if code == KILLED_EXIT:
        return "OOM-killed" if reason == "OOMKilled" else "killed"
    classes = {0: "completed", TrainerError.exit_code: "config",
               TrainingDiverged.exit_code: "diverged", RankLost.exit_code: "lost peer",
               USER_CODE_EXIT: "user code", Preempted.exit_code: "preempted"}
    return classes.get(code, "OOM-killed" if reason == "OOMKilled" else "error")
