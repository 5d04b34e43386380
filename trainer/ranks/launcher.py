"""`ddp-trainer run`: start N local ranks with torch's elastic agent (what torchrun does).

Outside a cluster the agent rendezvouses on localhost (torchrun's ``--standalone``). Inside a
PyTorchJob pod the training operator sets ``PET_NNODES``, ``PET_NODE_RANK``,
``PET_MASTER_ADDR`` and ``PET_MASTER_PORT`` (and ``PET_RDZV_*`` for elastic jobs); torchrun's
own argument parser reads exactly those, so we reuse it rather than re-implement it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time
import uuid
from collections.abc import Mapping

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
from torch.distributed.launcher.api import elastic_launch
from torch.distributed.run import config_from_args, parse_args

from trainer import termination, usercode
from trainer.distributed import threads
from trainer.errors import (
    HUNG_AGAIN_EXIT,
    HUNG_EXIT,
    USER_CODE_EXIT,
    Preempted,
    RankLost,
    TrainerError,
    UserCodeError,
    first_line,
)
from trainer.ranks import parent
from trainer.ranks.rank_lines import print_deferred

log = logging.getLogger(__name__)

CLUSTER_ENV = ("PET_NNODES", "PET_MASTER_ADDR", "PET_RDZV_ENDPOINT")

RANKS_PER_CORE = 4
"""Most local CPU ranks per usable core without ``--oversubscribe``: a few per core still test
DDP on a laptop (3 ranks on 2 cores run in the tests); beyond that each rank gets a sliver of a
core and costs ~250 MB of memory for nothing (a million asked for ran the machine out of
memory after 35 ranks, 8 GB)."""

MAX_LOCAL_RANKS = 1024
"""Most local ranks, even with ``--oversubscribe``: above a 256-core machine's 4 per core; a
million asked for built a million rank environments before failing."""

STOP_GRACE_SECONDS = 10.0
"""How long ranks left behind by a failed launcher get to leave on SIGTERM before SIGKILL."""


def check_nproc(nproc: int, oversubscribe: bool, device: str) -> None:
    """Refuse a number of local ranks this machine cannot run on `device` (train.device): more
    than one per GPU (NCCL refuses two ranks on one GPU) or more than RANKS_PER_CORE per usable
    core, unless `oversubscribe`; more than MAX_LOCAL_RANKS in any case."""
    import torch

    if nproc < 1:
        raise TrainerError(f"--nproc-per-node {nproc} < 1", "use 1 or more")
    if nproc > MAX_LOCAL_RANKS:
        raise TrainerError(f"--nproc-per-node {nproc} is more than {MAX_LOCAL_RANKS}, the most "
                           "ranks one machine runs (--oversubscribe does not lift it)",
                           f"use --nproc-per-node {MAX_LOCAL_RANKS} or fewer; more ranks run on "
                           "more nodes")
    if oversubscribe:
        return
    if device == "cuda" or (device == "auto" and torch.cuda.is_available()):
        gpus = torch.cuda.device_count()
        if nproc > gpus:
            raise TrainerError(f"--nproc-per-node {nproc} is more than the {gpus} GPUs here "
                               "(one rank per GPU)", f"use --nproc-per-node {gpus} or fewer, "
                               "or pass --oversubscribe to share GPUs anyway")
        return
    cores = len(os.sched_getaffinity(0))
    if nproc > RANKS_PER_CORE * cores:
        raise TrainerError(f"--nproc-per-node {nproc} is more than {RANKS_PER_CORE} ranks per "
                           f"CPU core ({cores} cores usable here)",
                           f"use --nproc-per-node {RANKS_PER_CORE * cores} or fewer, or pass "
                           "--oversubscribe to start them anyway")


def _children() -> list[int]:
    """The pids of this process's children (from /proc: the agent may have lost the handles of
    the ranks it started when it failed while starting the others)."""
    me, pids = os.getpid(), []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    stat = f.read()
                if int(stat.rpartition(b")")[2].split()[1]) == me:  # field 4: ppid
                    pids.append(int(entry.name))
    return pids


def _signal_group(pid: int, sig: signal.Signals) -> None:
    """`sig` to the rank and its DataLoader workers (the agent starts each rank as the leader of
    a session of its own)."""
    with contextlib.suppress(OSError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


def stop_ranks() -> int:
    """SIGTERM every rank still running, SIGKILL those left after STOP_GRACE_SECONDS, reap
    them; return how many there were."""
    pids = _children()
    for pid in pids:
        _signal_group(pid, signal.SIGTERM)
    running, deadline = set(pids), time.monotonic() + STOP_GRACE_SECONDS
    while running:
        for pid in list(running):
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0] == 0:
                    continue
            running.discard(pid)
        if running and time.monotonic() > deadline:
            for pid in running:
                _signal_group(pid, signal.SIGKILL)
            deadline = float("inf")
        time.sleep(0.05)
    return len(pids)


def _launcher_argv(nproc: int, max_restarts: int, timeout_seconds: float) -> list[str]:
    argv = ["--nproc-per-node", str(nproc), "--max-restarts", str(max_restarts)]
    if not any(os.environ.get(k) for k in CLUSTER_ENV):
        # torchrun --standalone: c10d store on a free localhost port, fresh run id
        argv += ["--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0",
                 "--rdzv-id", uuid.uuid4().hex]
    if not os.environ.get("PET_RDZV_CONF"):  # an elastic PyTorchJob's own settings win
        argv += ["--rdzv-conf", f"timeout={int(timeout_seconds)}"]
    return argv


def exit_code_of(err: ChildFailedError) -> int:
    """The exit code of the cause: a rank whose user code raised (the others only saw it
    vanish), else the rank that failed first (the others' failures follow from it); a rank
    stopped by SIGTERM or SIGINT maps to 128 + N, as a shell reports it, one killed by any
    other signal (SIGKILL: the OOM killer, kill -9) to a lost rank's 4."""
    _, failure = cause(err)
    code = failure.exitcode
    if code < 0 and -code not in _STOPPED:  # killed (OOM, kill -9): the run lost a rank
        return RankLost.exit_code
    return 128 - code if code < 0 else code


_STOPPED = frozenset({int(signal.SIGTERM), int(signal.SIGINT)})
"""Signals that stop a rank as asked (a preemption, Ctrl-C): 128 + N, as a shell reports it."""


_FOLLOWS = frozenset({RankLost.exit_code, Preempted.exit_code, -int(signal.SIGTERM)})
"""Exits that follow another rank's: it vanished (4), or the agent stopped this one (SIGTERM)."""


def cause(err: ChildFailedError) -> tuple[int, ProcessFailure]:
    """(global rank, failure) of the rank whose failure caused the others': a rank whose user
    code raised, else the first to fail of its own accord, else the first to fail."""
    def order(item: tuple[int, ProcessFailure]) -> tuple[bool, bool, float, int]:
        rank, failure = item
        # torch's own "first failure" compares whole seconds and picks rank 0 on a tie: a rank
        # stopped because rank 1 exited 2 was reported as the cause (exit 143) in a loaded CI.
        when = termination.time_of(failure.error_file_data)
        return (failure.exitcode != USER_CODE_EXIT, failure.exitcode in _FOLLOWS,
                failure.timestamp if when is None else when, rank)
    return min(err.failures.items(), key=order)


def report_user_code(err: ChildFailedError) -> None:
    """One line naming the rank whose user code raised, from its error file (written by
    :func:`trainer.usercode.record`); nothing when no rank's user code raised."""
    rank, failure = cause(err)
    if failure.exitcode != USER_CODE_EXIT:
        return
    line = failure.message if isinstance(failure.message, str) and \
        failure.message.startswith(f"rank {rank}: user code raised") else \
        f"rank {rank}: user code raised (its own error line above names the exception)"
    print(f"error: {line}; the other ranks stopped because of it (fix: {usercode.FIX})",
          file=sys.stderr)


def check_script(path: str) -> None:
    """Fail before any rank starts when `path` is not a Python script that compiles: a data file
    (a .npz, a .csv) is bad input (exit 2), a syntax error is the user's code (exit 5)."""
    try:
        with open(path, "rb") as f:
            source = f.read()
    except OSError as exc:
        raise TrainerError(f"script {path} cannot be read ({exc.strerror})",
                           "chmod it (a+r), or run as a user who can read it") from None
    shebang = source[:2] == b"#!" and b"python" in source.partition(b"\n")[0]
    if not (path.endswith(".py") or shebang):
        raise TrainerError(f"script {path} is not a Python file (its name does not end in .py "
                           "and it has no python #! line)",
                           "pass the Python script that calls trainer.fit(); a data file goes "
                           "to --dataset")
    try:
        compile(source, path, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:  # ValueError: null bytes (Python 3.11)
        where = f" at {path}:{exc.lineno}" if isinstance(exc, SyntaxError) and exc.lineno else ""
        message = exc.msg if isinstance(exc, SyntaxError) else str(exc)
        raise UserCodeError(f"script {path} does not compile: {type(exc).__name__}: "
                            f"{first_line(message, 200)}{where}",
                            "fix that line of your script") from None


def launch(rank_argv: list[str], nproc: int, max_restarts: int, timeout_seconds: float,
           env: Mapping[str, str], debug: bool = False) -> int:
    """Run ``python -m trainer <rank_argv>`` as `nproc` local ranks; return an exit code."""
    if not debug:
        # The agent logs a multi-line error table per failed rank; the rank itself has already
        # printed the one-line cause, so keep only the agent's restart warnings.
        logging.getLogger("torch.distributed.elastic.multiprocessing.api").setLevel(
            logging.CRITICAL)
        logging.getLogger("torch.distributed.elastic.multiprocessing.errors").setLevel(
            logging.CRITICAL)
    argv = [*_launcher_argv(nproc, max_restarts, timeout_seconds), "--module", "trainer",
            *rank_argv]
    args = parse_args(argv)  # type: ignore[no-untyped-call]
    # Share the pod's CPU instead of oversubscribing it (torchrun would force 1 thread and warn).
    threads.for_launcher(nproc)
    config, cmd, cmd_args = config_from_args(args)
    os.environ.update(env)
    # One termination message for the container, the launcher's: its ranks record their
    # lines for it in their error files instead of racing for the file.
    message, os.environ[termination.ENV] = termination.target(), ""
    os.environ[parent.ENV] = str(os.getpid())  # the ranks die with this process
    # The ranks leave their bad-input lines to this process, which prints each once; not when
    # ranks restart: the lines of an attempt that was restarted would never be printed.
    os.environ.pop(termination.DEFERRED_ENV, None)
    if max_restarts == 0:
        os.environ[termination.DEFERRED_ENV] = "1"
    # SIGTERM (pod eviction) goes to the agent; it forwards it to the ranks, which checkpoint
    # and exit (docs/checkpoints.md).
    try:
        elastic_launch(config, cmd)(*cmd_args)
    except ChildFailedError as err:
        print_deferred(err)
        report_user_code(err)
        hung = exit_code_of(err) in (HUNG_EXIT, HUNG_AGAIN_EXIT)
        if hung or termination.line_of(cause(err)[1].error_file_data) is None:
            # a hung rank leaves its verdict to the launcher, to print it once; a killed
            # rank could say nothing
            print(cause_line(err), file=sys.stderr)
        termination.write(cause_line(err), message)
        return exit_code_of(err)
    except SignalException as err:  # SIGTERM/SIGINT to the agent: it stopped the ranks
        termination.write(f"error: stopped by {signal.Signals(err.sigval).name}, as a "
                          "preemption or eviction stops a pod; the ranks were stopped (fix: "
                          "nothing to fix: restarting resumes from the newest checkpoint)",
                          message)
        return 128 + int(err.sigval)
    except BaseException as err:  # the agent's own failures (rendezvous, starting a rank, ...)
        # The agent stops its ranks only once all have started: one failing to start (fork
        # out of memory) left the others running after the launcher exited.
        stopped = stop_ranks()
        if debug or not isinstance(err, Exception):
            raise
        text = f"{type(err).__name__}: {first_line(err, 200)}"
        line = (f"error: launcher failed: {text}; the {stopped} ranks it had started were stopped "
                "(fix: rerun with --debug for details; if a rank could not start, use fewer "
                "--nproc-per-node)")
        print(line, file=sys.stderr)
        termination.write(line, message)
        return 1
    return 0


def cause_line(err: ChildFailedError) -> str:
    """The cause rank's own error line (see :func:`trainer.termination.record`), or one naming
    how it ended when it left none (killed by a signal: the OOM killer, SIGKILL)."""
    rank, failure = cause(err)
    line = termination.line_of(failure.error_file_data)
    if line is not None:
        return line
    code = exit_code_of(err)
    how = (f"was killed by {failure.signal_name()}"
           if failure.exitcode < 0 else f"exited with {code} without an error line")
    lost = "; the run lost it" if code == RankLost.exit_code else ""
    return (f"error: rank {rank} {how}{lost} (exit {code}) (fix: its log shows its last words; "
            "a SIGKILL is often the out-of-memory killer: raise the memory limit or lower "
            "train.batch_size)")
