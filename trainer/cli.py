"""Command line: ``ddp-trainer train | run | evaluate | export | jobs``.

Each config flag is a shortcut for one config field and takes its help text from that
field's docstring in :mod:`trainer.config`, so the help can never drift from the config.
"""

from __future__ import annotations

import argparse
import ast
import functools
import inspect
import logging
import os
import pathlib
import sys
import typing
import warnings
from collections.abc import Sequence
from typing import Any, NoReturn

from trainer import __version__, termination
from trainer.config import DistConfig, JobConfig
from trainer.config_load import build_config, check_timeout
from trainer.distributed.preemption import stopped_while_starting
from trainer.distributed.threads import users_omp
from trainer.errors import AgreedStop, RankLost, TrainerError, missing
from trainer.export.command import register as register_export
from trainer.ranks.handoff import config_from_text, config_text
from trainer.ranks.parent import die_with_launcher

# flag -> (section, key): a shortcut for one config field; its type and help are the field's.
CONFIG_FLAGS: dict[str, tuple[str, str]] = {
    "--dataset": ("data", "dataset"),
    "--val-fraction": ("data", "val_fraction"),
    "--model": ("model", "name"),
    "--step": ("train", "step"),
    "--lr": ("optim", "lr"),
    "--epochs": ("train", "epochs"),
    "--max-steps": ("train", "max_steps"),
    "--batch-size": ("train", "batch_size"),
    "--seed": ("train", "seed"),
    "--strategy": ("train", "strategy"),
    "--sampler": ("train", "sampler"),
    "--log-every": ("train", "log_every"),
    "--device": ("train", "device"),
    "--checkpoint-dir": ("checkpoint", "dir"),
    "--checkpoint-every": ("checkpoint", "every"),
    "--timeout": ("dist", "timeout_seconds"),
    "--metrics-port": ("metrics", "port"),
    "--metrics-bind-address": ("metrics", "bind_address"),
    "--output-dir": ("output", "dir"),
}


def flag_type(section: str, key: str) -> type:
    """The config field's type (every flag's field is a str, int or float)."""
    hint = typing.get_type_hints(type(getattr(JobConfig(), section)))[key]
    assert hint in (str, int, float), (section, key, hint)
    return hint  # type: ignore[no-any-return]


@functools.cache
def field_docs() -> dict[tuple[str, str], str]:
    """(section, field) -> the docstring under that field in trainer/config.py."""
    import trainer.config as config_module

    tree = ast.parse(inspect.getsource(config_module))
    section_of = {type(getattr(JobConfig(), name)).__name__: name
                  for name in JobConfig.__dataclass_fields__}
    docs: dict[tuple[str, str], str] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in section_of:
            body = node.body
            for stmt, nxt in zip(body, body[1:], strict=False):
                if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                        and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)):
                    text = " ".join(str(nxt.value.value).split())
                    docs[(section_of[node.name], stmt.target.id)] = text.replace("%", "%%")
    return docs


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")


def _add_config_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE",
                   help="YAML config file (sections as in docs/configuration.md); flags "
                        "override it")
    docs, defaults = field_docs(), JobConfig()
    for flag, (section, key) in CONFIG_FLAGS.items():
        typ, default = flag_type(section, key), getattr(getattr(defaults, section), key)
        shown = "none" if default == "" else str(default).replace("%", "%%")
        p.add_argument(flag, type=typ, default=None, metavar=typ.__name__.upper(),
                       help=f"{docs[(section, key)]} [{section}.{key}; default {shown}]")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override any config field, e.g. --set model.hidden_sizes=[256,128]")
    _add_common(p)


def _add_oversubscribe(p: argparse.ArgumentParser) -> None:
    p.add_argument("--oversubscribe", action="store_true",
                   help="start --nproc-per-node ranks even when they are more than the GPUs "
                        "here, or more than 4 per CPU core (refused without it)")


def _flag_value(ns: argparse.Namespace, flag: str) -> Any:
    return getattr(ns, flag.lstrip("-").replace("-", "_"))


def cli_overrides(ns: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """The `--set` values and the flags' values, as two layers: the flags win, but each `--set`
    value is type-checked even when a flag replaces it."""
    from trainer.config_load import parse_set

    flags: dict[str, Any] = {}
    for flag, (section, key) in CONFIG_FLAGS.items():
        value = _flag_value(ns, flag)
        if value is not None:
            flags.setdefault(section, {})[key] = value
    return parse_set(ns.set), flags


def _overridden(ns: argparse.Namespace) -> list[tuple[str, str]]:
    """(flag, --set item) pairs that set the same key; the flag wins."""
    keys = {f"{section}.{key}": flag for flag, (section, key) in CONFIG_FLAGS.items()
            if _flag_value(ns, flag) is not None}
    return [(keys[name], item) for item in ns.set
            if (name := item.partition("=")[0].strip()) in keys]


def _config(ns: argparse.Namespace) -> JobConfig:
    """The validated config; then one warning line per `--set` a flag overrides with another
    value."""
    from trainer.config_load import merge, parse_set

    cfg = build_config(ns.config, *cli_overrides(ns))
    for flag, item in _overridden(ns):
        section, key = CONFIG_FLAGS[flag]
        value = _flag_value(ns, flag)
        by_set = getattr(getattr(merge(JobConfig(), parse_set([item]), "--set"), section), key)
        if by_set != value:
            logging.getLogger(__name__).warning("%s %s overrides --set %s (flags win over --set)",
                                                flag, value, item)
    return cfg


def cmd_train(ns: argparse.Namespace) -> int:
    cfg = _config(ns)  # before torch's import (1.5 s of CPU): bad input is answered at once
    from trainer.ranks import runner

    runner.train(cfg)
    return 0


def cmd_rank(ns: argparse.Namespace) -> int:
    """One rank of `run` (without a script): train with the launcher's config."""
    from trainer.ranks import runner

    runner.train(config_from_text(ns.config_text))
    return 0


# Flags the launcher itself reads when it runs a user script (the script reads its own).
LAUNCHER_FLAGS = ("--metrics-port", "--metrics-bind-address", "--timeout")
LAUNCHER_SECTIONS = ("metrics", "dist")
"""`--set` sections the launcher reads in script mode (its endpoint, linger and timeouts)."""


def cmd_run(ns: argparse.Namespace) -> int:
    # Validated once here, so that a bad flag fails before any rank starts, and before torch's
    # import (1.5 s of CPU), which the modules below make.
    cfg = _config(ns)
    from trainer.build import check_config
    from trainer.components import storage
    from trainer.distributed.preemption import linger
    from trainer.metrics import start_launcher_exporter
    from trainer.ranks.launcher import check_nproc, check_script, launch
    from trainer.ranks.outputs import check_output_dir

    # a script picks its own device, as `auto` does
    check_nproc(ns.nproc_per_node, ns.oversubscribe, "auto" if ns.script else cfg.train.device)
    if ns.max_restarts < 0:
        raise TrainerError(f"--max-restarts {ns.max_restarts} < 0", "use 0 or more")
    if ns.script:
        foreign_sets = [item for item in ns.set
                        if item.partition(".")[0].strip() not in LAUNCHER_SECTIONS]
        extra = [f for f in CONFIG_FLAGS if _flag_value(ns, f) is not None
                 and f not in LAUNCHER_FLAGS] + (["--config"] if ns.config else []) + [
                     f"--set {item}" for item in foreign_sets]
        if extra:
            raise TrainerError(f"run {ns.script}: {', '.join(extra)} would be ignored (a script "
                               "builds its own config)",
                               "pass them to your script after its name, or drop them; only "
                               f"{', '.join(LAUNCHER_FLAGS)} and --set "
                               f"{'/'.join(LAUNCHER_SECTIONS)}.* are read by the launcher")
        if not os.path.isfile(ns.script):
            why, fix = missing(ns.script, "pass the path of a Python file that calls "
                               "trainer.fit()")
            raise TrainerError(f"script {ns.script} {why}", fix)
        check_script(ns.script)
        rank_argv = ["script", ns.script, *ns.script_args]
    else:
        check_config(cfg)  # import paths resolve, files exist; the ranks load the data
        check_output_dir(cfg.output.dir, create=True)  # once here, not once per rank
        storage.check(cfg.checkpoint.dir, "checkpoint dir")  # an s3:// one: reachable, writable
        rank_argv = ["rank", config_text(cfg), *(["--debug"] if ns.debug else [])]
    exporter = start_launcher_exporter(cfg.metrics, ns.nproc_per_node)
    code: int | None = None
    try:
        code = launch(rank_argv, ns.nproc_per_node, ns.max_restarts, cfg.dist.timeout_seconds,
                      exporter.env, ns.debug)
        return code
    finally:
        # The ranks are gone, their values stay: after a completed run until a scrape has read
        # them; after a failed one the whole bound, as its values feed alerts (docs/metrics.md).
        linger(cfg.metrics.linger_seconds, exporter.port,
               exporter.notify_after_scrapes if code == 0 else None, cfg.metrics.linger_scrapes)
        exporter.close()


def cmd_script(ns: argparse.Namespace) -> int:
    """One rank of a user script (what `run SCRIPT` starts on every rank)."""
    import runpy

    script = os.path.abspath(ns.path)
    sys.argv = [script, *ns.args]
    sys.path.insert(0, os.path.dirname(script))  # as `python script.py` does
    runpy.run_path(script, run_name="__main__")
    return 0


def cmd_evaluate(ns: argparse.Namespace) -> int:
    from trainer.components import storage

    storage.refuse(ns.checkpoint, "--checkpoint")
    if ns.timeout is not None:
        check_timeout("--timeout", ns.timeout, "use a number of seconds, e.g. 600")
    from trainer.ranks import runner

    if ns.as_rank or ns.nproc_per_node == 1:
        runner.evaluate_checkpoint(ns.checkpoint, ns.dataset, ns.output_dir,
                                   timeout_seconds=ns.timeout)
        return 0
    from trainer.components import checkpoint
    from trainer.ranks.launcher import check_nproc, launch
    from trainer.ranks.outputs import check_output_dir

    check_nproc(ns.nproc_per_node, ns.oversubscribe, "auto")
    check_output_dir(ns.output_dir, create=True)  # once here, not once per rank
    # every rank scores the same file, chosen once (a directory's newest checkpoint)
    ns.checkpoint = str(checkpoint.resolve(pathlib.Path(ns.checkpoint)))
    timeout = ns.timeout if ns.timeout is not None else DistConfig().timeout_seconds
    argv = ["evaluate", "--as-rank", "--checkpoint", ns.checkpoint, "--output-dir",
            ns.output_dir, "--timeout", str(timeout),
            *(["--dataset", ns.dataset] if ns.dataset else []), *(["--debug"] if ns.debug else [])]
    return launch(argv, ns.nproc_per_node, 0, timeout, {}, ns.debug)


class OneLineParser(argparse.ArgumentParser):
    """argparse, except that a usage error is one line with the fix (its subcommands' parsers
    are of this class too)."""

    def error(self, message: str) -> NoReturn:
        line = (f"error: {' '.join(message.split())} (fix: see '{self.prog} --help' for the "
                "full usage)")
        termination.write(line)
        self.exit(2, line + "\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="ddp-trainer",
        description="Distributed PyTorch training with exact distributed sampling and "
                    "evaluation. Precedence: flags > --set > --config file > defaults.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("train", help="train as one rank (under torchrun, in a pod, or alone)")
    _add_config_flags(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("run", help="launch N local ranks on this machine and train")
    _add_config_flags(p)
    p.add_argument("--nproc-per-node", type=int, default=2, metavar="N",
                   help="ranks to start on this machine (default 2; one per GPU on GPU nodes)")
    _add_oversubscribe(p)
    p.add_argument("--max-restarts", type=int, default=0, metavar="K",
                   help="restart all ranks up to K times after a rank fails; they resume from "
                        "the newest checkpoint (default 0)")
    p.add_argument("script", nargs="?", default=None, metavar="SCRIPT.py",
                   help="run this Python script on every rank instead of the built-in "
                        "training (like torchrun); it calls trainer.fit()")
    p.add_argument("script_args", nargs=argparse.REMAINDER, metavar="ARGS",
                   help="arguments of the script")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("rank")  # one rank of `run`; hidden from the help
    p.add_argument("config_text")
    _add_common(p)
    p.set_defaults(func=cmd_rank)

    p = sub.add_parser("script")  # one rank of `run SCRIPT`; hidden from the help
    p.add_argument("path")
    p.add_argument("args", nargs=argparse.REMAINDER)
    _add_common(p)
    p.set_defaults(func=cmd_script)

    p = sub.add_parser("evaluate", help="exact validation accuracy of a checkpoint")
    p.add_argument("--checkpoint", required=True, metavar="PATH",
                   help="a ckpt-*.pt file, a ckpt-*.dcp folder (FSDP's shards), or a checkpoint "
                   "directory (its newest valid one)")
    p.add_argument("--nproc-per-node", type=int, default=1, metavar="N",
                   help="ranks to evaluate with (accuracy and counts are identical for any N; the "
                        "loss, a mean of per-batch losses, to float32 rounding)")
    _add_oversubscribe(p)
    p.add_argument("--dataset", default=None,
                   help="dataset to score (default: the checkpoint's); its validation split")
    p.add_argument("--output-dir", default="outputs", help="where eval.json goes")
    p.add_argument("--timeout", type=float, default=None, metavar="FLOAT",
                   help="timeout of the rendezvous and every collective, in seconds "
                        "(default: the checkpoint's dist.timeout_seconds)")
    p.add_argument("--as-rank", action="store_true", help=argparse.SUPPRESS)
    _add_common(p)
    p.set_defaults(func=cmd_evaluate)
    register_export(sub)

    try:
        from trainer.jobs.cli import register
    except ImportError:  # the jobs package is optional at import time
        pass
    else:
        register(sub)
    return parser


def setup_logging(debug: bool) -> None:
    rank = os.environ.get("RANK")
    prefix = f"[rank {rank}] " if rank is not None else ""
    # Every rank logs warnings; only rank 0 logs progress, so N ranks don't print N copies.
    level = logging.DEBUG if debug else (logging.INFO if rank in (None, "0") else logging.WARNING)
    logging.basicConfig(level=level, format=f"{prefix}%(levelname)s %(message)s",
                        stream=sys.stderr, force=True)
    logging.captureWarnings(True)
    if not debug:
        warnings.filterwarnings("ignore", category=FutureWarning)


def _group_kept() -> bool:
    return bool((dist := sys.modules.get("torch.distributed")) and dist.is_available()
                and dist.is_initialized())


def _exit_now(code: int) -> None:
    """End the process without finalizers; everything worth keeping is already written."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    die_with_launcher()  # first: a launcher killed from now on takes this rank with it
    with stopped_while_starting():
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    debug = bool(getattr(ns, "debug", False))
    setup_logging(debug)
    try:
        if ns.command in ("train", "run", "evaluate"):
            users_omp()  # before torch's import: libgomp reads it then and warns on its own
        code: int = ns.func(ns)
        if _group_kept():
            # A completed rank leaves without gloo's C++ teardown (see distributed.teardown).
            _exit_now(code)
        return code
    except TrainerError as err:
        if debug:
            raise
        rank = os.environ.get("RANK")
        prefix = f"[rank {rank}] " if rank is not None else ""
        # the launcher prints a bad-input line once for every rank that agrees
        termination.report(f"{prefix}error: {err}", not isinstance(err, (RankLost, AgreedStop)))
        if isinstance(err, RankLost) or _group_kept():
            # A broken group's destructors may block on the dead peer or abort; a kept one
            # (preempted together) is left as after a completed run.
            _exit_now(err.exit_code)
        return err.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception as err:
        if debug:
            raise
        from trainer import usercode

        exit_code = usercode.report(err)  # the user's model, dataset, step or script raised
        if exit_code is None:
            raise  # ours: the traceback is the report
        _exit_now(exit_code)  # before a peer reports this rank's exit as a lost rank
        return exit_code
