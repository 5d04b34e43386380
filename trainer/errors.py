"""User-facing errors: one line that names the problem and the fix."""

from __future__ import annotations

import errno
import os
import signal


def first_line(value: object, limit: int = 300, empty: str | None = None) -> str:
    """The first line of an error's (or any value's) text, for a one-line message: at most
    `limit` characters; `empty` (default: the value's type name) when there is no text."""
    text = str(value).strip()
    if not text:
        return type(value).__name__ if empty is None else empty
    return text.splitlines()[0][:limit]


LONGEST = 1000
"""Characters of a problem or a fix an error line shows: a value quoted whole (a 50 MB
`model.name`) made a 52 MB line."""


def _one_line(text: str) -> str:
    """`text` with its line breaks escaped (user input, a key or a path, quoted in a message
    cannot break the promised single line), its middle cut when it is longer than
    :data:`LONGEST`: the start names the problem, the end closes what it quotes."""
    text = text.replace("\r", "\\r").replace("\n", "\\n")
    if len(text) <= LONGEST:
        return text
    return f"{text[:LONGEST - 300]}... ({len(text)} characters, cut) ...{text[-200:]}"


USER_CODE_EXIT = 5
"""Exit status of a rank whose user code (model, dataset, step, script) raised: see
:mod:`trainer.usercode`."""


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


class UserCodeError(TrainerError):
    """The user's script cannot run at all (it does not compile): found by the launcher before
    any rank starts, so it is reported like the user code errors of a rank."""

    exit_code = USER_CODE_EXIT


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


HUNG_EXIT = 128 + int(signal.SIGALRM)
"""142: the hang watchdog's alarm (trainer.distributed.watchdog): no rank made progress for its
deadline. In the 128-255 range that the training operator's ExitCode policy retries: the job
restarts from its last checkpoint."""
HUNG_AGAIN_EXIT = 6
"""A hang at the very place (rank, phase, step, line) of an earlier one of this run: permanent
for the ExitCode policy (1-127), since a restart would hang there again."""


class OutputError(TrainerError):
    """An output file (summary.json, eval.json) could not be written: a full disk at the end of
    a run. What was written before (checkpoints, steps.jsonl, the earlier file) is kept."""


class CheckpointError(TrainerError):
    """No checkpoint could be written or read."""


class StorageError(TrainerError):
    """The object store of an ``s3://`` checkpoint.dir or output.dir cannot be reached, or
    refused a request (credentials, a missing bucket): exit 2, as any environment the user
    named that cannot be used."""


UNSAVED_EXIT = 128 + 75
"""203: the final or SIGTERM checkpoint could not be uploaded to its object store within
``checkpoint.upload_retries`` / ``upload_deadline_seconds``. 75 is sysexits.h's EX_TEMPFAIL (a
store that may come back); 128 + it lies in the 128-255 range the training operator's ExitCode
policy retries, above every signal's 128 + N: the job restarts from its last durable checkpoint."""


class CheckpointUnsaved(AgreedStop):
    """The checkpoint that ends a run (its last step, or a SIGTERM) is not durable in its store;
    the last durable one is named, and kept. Rank 0's verdict, shared: every rank leaves with
    it at the same point, the group intact."""

    exit_code = UNSAVED_EXIT


LOOP = "is a symlink loop (a link that leads back to itself)"


def missing(path: str | os.PathLike[str], fix: str) -> tuple[str, str]:
    """(why, fix) for a path that was named but cannot be used: it ``does not exist`` (with
    `fix`), ``is a symlink loop``, is behind a folder the user may not enter, or holds a NUL
    (``Path.exists()`` is False for all of them, and "does not exist" sends the user looking for a
    file that is there)."""
    try:
        os.stat(path)
    except ValueError:  # "embedded null byte": no file name holds one
        return "contains a NUL character (\\0), which no file name can", "remove it from the path"
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return LOOP, ("point the link at the real file or directory (ls -l shows where it "
                          "leads), or pass the real path")
        if exc.errno in (errno.EACCES, errno.EPERM):
            return ("cannot be reached: permission denied on a folder above it",
                    "chmod that folder (a+x), or run as a user who may enter it")
        return "does not exist", fix
    return "is not a regular file", fix


KILLED_EXIT = 128 + int(signal.SIGKILL)
"""A process killed by SIGKILL: the out-of-memory killer, or a kill from outside."""


def exit_class(code: int, reason: str = "") -> str:
    """What a rank's (or a container's) exit code means, as ``jobs status`` names it; `reason`
    is the container runtime's (``OOMKilled`` for the kernel's out-of-memory kill)."""
    if code == KILLED_EXIT:
        return "OOM-killed" if reason == "OOMKilled" else "killed"
    classes = {0: "completed", TrainerError.exit_code: "config",
               TrainingDiverged.exit_code: "diverged", RankLost.exit_code: "lost peer",
               USER_CODE_EXIT: "user code", Preempted.exit_code: "preempted",
               HUNG_EXIT: "hung", HUNG_AGAIN_EXIT: "hung again", UNSAVED_EXIT: "unsaved"}
    return classes.get(code, "OOM-killed" if reason == "OOMKilled" else "error")
