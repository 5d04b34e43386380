"""User-facing errors: one line that names the problem and the fix."""

from __future__ import annotations


class TrainerError(Exception):
    """An error caused by input or environment, reported without a traceback.

    The CLI prints ``error: <problem> (fix: <fix>)`` and exits with :attr:`exit_code`;
    ``--debug`` adds the traceback.
    """

    exit_code = 2

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(f"{problem} (fix: {fix})")
        self.problem = problem
        self.fix = fix


class ConfigError(TrainerError):
    """A configuration value is invalid."""


class DataError(TrainerError):
    """A dataset is missing, unreadable or inconsistent."""


class TrainingDiverged(TrainerError):
    """The loss became NaN or infinite."""

    exit_code = 3


class CheckpointError(TrainerError):
    """No checkpoint could be written or read."""
