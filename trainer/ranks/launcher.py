"""`ddp-trainer run`: start N local ranks with torch's elastic agent (what torchrun does).

Outside a cluster the agent rendezvouses on localhost (torchrun's ``--standalone``). Inside a
PyTorchJob pod the training operator sets ``PET_NNODES``, ``PET_NODE_RANK``,
``PET_MASTER_ADDR`` and ``PET_MASTER_PORT`` (and ``PET_RDZV_*`` for elastic jobs); torchrun's
own argument parser reads exactly those, so we reuse it rather than re-implement it.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import uuid
from collections.abc import Mapping

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
from torch.distributed.launcher.api import elastic_launch
from torch.distributed.run import config_from_args, parse_args

from trainer import termination
from trainer.errors import USER_CODE_EXIT
from trainer.ranks import usercode

log = logging.getLogger(__name__)

CLUSTER_ENV = ("PET_NNODES", "PET_MASTER_ADDR", "PET_RDZV_ENDPOINT")


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
    killed by signal N maps to 128 + N, as a shell reports it."""
    _, failure = cause(err)
    code = failure.exitcode
    return 128 - code if code < 0 else code


def cause(err: ChildFailedError) -> tuple[int, ProcessFailure]:
    """(global rank, failure) of the rank whose failure caused the others'."""
    raised = sorted((rank, f) for rank, f in err.failures.items()
                    if f.exitcode == USER_CODE_EXIT)
    return raised[0] if raised else err.get_first_failure()


def report_user_code(err: ChildFailedError) -> None:
    """One line naming the rank whose user code raised, from its error file (written by
    :func:`trainer.ranks.usercode.record`); nothing when no rank's user code raised."""
    rank, failure = cause(err)
    if failure.exitcode != USER_CODE_EXIT:
        return
    line = failure.message if isinstance(failure.message, str) and \
        failure.message.startswith(f"rank {rank}: user code raised") else \
        f"rank {rank}: user code raised (its own error line above names the exception)"
    print(f"error: {line}; the other ranks stopped because of it (fix: {usercode.FIX})",
          file=sys.stderr)


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
    # Share the cores instead of oversubscribing them (torchrun would force 1 thread and warn).
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    config, cmd, cmd_args = config_from_args(args)
    os.environ.update(env)
    # One termination message for the container, the launcher's: its ranks record their
    # lines for it in their error files instead of racing for the file.
    message, os.environ[termination.ENV] = termination.target(), ""
    # SIGTERM (pod eviction) goes to the agent; it forwards it to the ranks, which checkpoint
    # and exit (see Recovery in the README).
    try:
        elastic_launch(config, cmd)(*cmd_args)
    except ChildFailedError as err:
        report_user_code(err)
        termination.write(cause_line(err), message)
        return exit_code_of(err)
    except SignalException as err:  # SIGTERM/SIGINT to the agent: it stopped the ranks
        termination.write(f"error: stopped by {signal.Signals(err.sigval).name}, as a "
                          "preemption or eviction stops a pod; the ranks were stopped (fix: "
                          "nothing to fix: restarting resumes from the newest checkpoint)",
                          message)
        return 128 + int(err.sigval)
    except Exception as err:  # noqa: BLE001 - the agent's own failures (rendezvous, ...)
        if debug:
            raise
        line = f"error: launcher failed: {err} (fix: rerun with --debug for details)"
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
    return (f"error: rank {rank} {how} (exit {code}) (fix: its log shows its last words; "
            "a SIGKILL is often the out-of-memory killer: raise the memory limit or lower "
            "train.batch_size)")
