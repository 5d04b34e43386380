"""Command line of the job commands: ``ddp-trainer jobs ...`` and the ``kubectl-ddp`` plugin.

``register(subparsers)`` adds ``jobs`` to the trainer's CLI; ``kubectl_main`` is the console
script ``kubectl-ddp``, which kubectl runs for ``kubectl ddp ...``. Both offer the same
sub-commands. Importing this module does not import ``kubernetes``.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable
from typing import Any

from trainer.errors import TrainerError
from trainer.jobs import arguments, commands
from trainer.jobs.errors import EXIT_ERROR, EXIT_FAILED, EXIT_SUCCEEDED, EXIT_TIMEOUT
from trainer.jobs.kinds import CHOICES

DESCRIPTION = (
    "Manage PyTorchJobs (kubeflow.org/v1, training operator v1.9) and TrainJobs "
    "(trainer.kubeflow.org/v1alpha1, Kubeflow Trainer v2): list, status with per-rank metrics, "
    "logs of all ranks, wait, delete, suspend and resume. Both kinds by default (--kind). "
    "Connects like kubectl (--kubeconfig, $KUBECONFIG, ~/.kube/config or the pod's service "
    "account)."
)
WAIT_EPILOG = (
    f"exit codes: {EXIT_SUCCEEDED} Succeeded, {EXIT_FAILED} Failed, {EXIT_ERROR} error (cluster "
    f"unreachable, job or CRD not found, bad arguments), {EXIT_TIMEOUT} timed out"
)


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``jobs`` sub-command (with its own sub-commands) to the trainer's CLI.

    Each leaf sets ``func``: it takes the Namespace and returns the exit code, raising
    TrainerError for problems.
    """
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "jobs", help="manage PyTorchJobs and TrainJobs on Kubernetes", description=DESCRIPTION
    )
    add_commands(parser)
    return parser


def kubectl_main(argv: list[str] | None = None) -> int:
    """Entry point of ``kubectl-ddp``: ``kubectl ddp status NAME`` and the like."""
    parser = argparse.ArgumentParser(prog="kubectl ddp", description=DESCRIPTION)
    add_commands(parser)
    args = parser.parse_args(argv)
    return run(args)


def run(args: argparse.Namespace) -> int:
    """Run the chosen command; print a TrainerError as ``error: problem (fix: ...)``."""
    try:
        return int(args.func(args))
    except TrainerError as exc:
        if getattr(args, "debug", False):
            traceback.print_exc()
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code


def add_commands(parser: argparse.ArgumentParser) -> None:
    common = _common_flags()
    sub = parser.add_subparsers(dest="jobs_command", metavar="COMMAND", required=True)

    def add(name: str, func: Callable[[argparse.Namespace], int], help_: str,
            epilog: str | None = None) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_, epilog=epilog, parents=[common])
        p.set_defaults(func=_command(func))
        return p

    p = add("list", commands.cmd_list,
            "list jobs: name (and kind), state, age, replicas, GPUs")
    p.add_argument("-A", "--all-namespaces", action="store_true",
                   help="list the jobs of every namespace")

    p = add("status", commands.cmd_status,
            "show a job's conditions, replicas and pods (node, restarts), and a TrainJob's "
            "reported progress; with --prometheus also the latest loss, accuracy and samples/s "
            "of each rank and the slowest rank")
    _name(p)
    p.add_argument("--prometheus", metavar="URL",
                   help="Prometheus base URL, e.g. http://127.0.0.1:9090 after a port-forward")
    p.add_argument("--rate-window", default="1m", metavar="DURATION",
                   help="window of rate(trainer_samples_total[...]) (default: %(default)s)")

    p = add("logs", commands.cmd_logs,
            "print the logs of all ranks, merged by time, each line prefixed with [rank N]")
    _name(p)
    p.add_argument("--rank", type=int, metavar="N",
                   help="only the pod that runs training rank N (with one rank per pod: "
                        "master-0 is 0, worker-i is i+1)")
    p.add_argument("-f", "--follow", action="store_true",
                   help="stream the logs until the pods end (Ctrl-C stops)")
    p.add_argument("--tail", type=int, metavar="LINES",
                   help="only the last LINES lines of each pod")

    p = add("wait", commands.cmd_wait, "wait until a job Succeeded or Failed", WAIT_EPILOG)
    _name(p)
    p.add_argument("--timeout", default="0", metavar="DURATION",
                   help='give up after this long, e.g. "90s", "30m", "2h"; 0 (default) waits '
                        "forever")
    p.add_argument("--poll-interval", type=float, default=5.0, metavar="SECONDS",
                   help="seconds between checks (default: %(default)s)")

    p = add("fetch", commands.cmd_fetch,
            "copy a job's outputs (summary.json, steps.jsonl, the exported model/) "
            "into a local folder, from its bucket (storage.s3) or its outputs claim")
    _name(p)
    p.add_argument("--to", required=True, metavar="DIR", help="the local folder to fill")

    p = add("delete", commands.cmd_delete, "delete a job (the controller removes its pods)")
    _name(p)
    p = add("suspend", commands.cmd_suspend,
            "suspend a job: the controller deletes its pods, keeping the job")
    _name(p)
    p = add("resume", commands.cmd_resume,
            "resume a suspended job: the controller recreates its pods")
    _name(p)


def _command(
    func: Callable[[argparse.Namespace], int],
) -> Callable[[argparse.Namespace], int]:
    # The flags are checked before the command sends anything, whichever CLI parsed them
    # (`ddp-trainer jobs` or `kubectl ddp`). Ctrl-C ends `logs -f` and `wait` normally: exit
    # 130 like a shell, no traceback.
    def call(args: argparse.Namespace) -> int:
        arguments.check(args)
        try:
            return func(args)
        except KeyboardInterrupt:
            print(file=sys.stderr)
            return 130

    call.__name__ = func.__name__
    call.__doc__ = func.__doc__
    return call


def _name(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the job's name (PyTorchJob or TrainJob)")


def _common_flags() -> argparse.ArgumentParser:
    # kubectl's flag names, so the same muscle memory works for both tools.
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("cluster")
    group.add_argument("--kubeconfig", metavar="FILE",
                       help="kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
    group.add_argument("--context", help="kubeconfig context (default: the current context)")
    group.add_argument("-n", "--namespace",
                       help="namespace (default: the context's namespace, else 'default')")
    group.add_argument("--request-timeout", type=float, default=30.0, metavar="SECONDS",
                       help="timeout of each API request (default: %(default)s)")
    group.add_argument("--kind", choices=sorted(CHOICES), default="all",
                       help="which job kind: pytorchjob, trainjob, or all (default: both "
                            "kinds the cluster serves)")
    # SUPPRESS: never overwrite a --debug that the trainer's top-level parser already set.
    group.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="print tracebacks of errors")
    return common
