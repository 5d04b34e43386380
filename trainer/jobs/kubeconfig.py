"""A kubeconfig file checked before the Kubernetes client reads it: the client fails on a file
that is not a kubeconfig with a TypeError or a YAML reader error naming neither the file nor
what is wrong in it."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

import yaml

from trainer.config_yaml import yaml_problem
from trainer.errors import first_line, missing
from trainer.jobs.errors import KubeconfigError

SECTIONS = ("clusters", "contexts", "users")
FIX = "pass a kubeconfig (kubectl config view --raw writes one) with --kubeconfig or KUBECONFIG"


def check_kubeconfig(path: Path) -> None:
    """Raise KubeconfigError naming `path` and its problem unless it is readable YAML of a
    mapping whose clusters, contexts and users (where present) are lists of named entries."""
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise KubeconfigError(f"kubeconfig {path} cannot be read ({exc.strerror})",
                              "chmod it (u+r), or run as a user who can read it") from None
    except UnicodeDecodeError as exc:
        byte = f"0x{exc.object[exc.start]:02x} at offset {exc.start}"
        raise KubeconfigError(f"kubeconfig {path} is not UTF-8 text (byte {byte})", FIX) from None
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise KubeconfigError(f"kubeconfig {path} is not valid YAML: {yaml_problem(exc)}",
                              FIX) from None
    if loaded is None:
        return  # empty: the client treats it as no configuration, as kubectl does
    if not isinstance(loaded, dict):
        raise KubeconfigError(f"kubeconfig {path} is not a kubeconfig: a {type(loaded).__name__}"
                              f", not a mapping of {', '.join(SECTIONS)}", FIX)
    for section in SECTIONS:
        entries = loaded.get(section)
        if entries is not None and not (isinstance(entries, list) and all(
                isinstance(e, dict) and isinstance(e.get("name"), str) for e in entries)):
            raise KubeconfigError(f"kubeconfig {path}: {section} is not a list of entries "
                                  "with a name", FIX)


def absent(path: Path) -> str:
    """`path`, and why it is no file when that is not that it does not exist (a link loop)."""
    why = missing(path, "")[0]
    return str(path) if why == "does not exist" else f"{path} ({why})"


def reason(exc: BaseException) -> str:
    """A ConfigException's text; another exception's type too (a bare KeyError is a key)."""
    text = first_line(exc, 200, empty="(no message)")
    return text if type(exc).__name__ == "ConfigException" else f"{type(exc).__name__}: {text}"


def check_exec_plugin(paths: list[Path], user: str) -> None:
    """Raise KubeconfigError naming the exec credential plugin of `user` (the first entry of
    that name in `paths`, as kubectl merges them) when its command is not found: the client
    only logs the OSError and goes on without credentials, so the error that followed blamed
    the API server."""
    for path in paths:
        with contextlib.suppress(OSError, UnicodeDecodeError, yaml.YAMLError, AttributeError):
            loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
            entry = next((e for e in (loaded or {}).get("users") or []
                          if isinstance(e, dict) and e.get("name") == user), None)
            if entry is None:
                continue
            plugin = (entry.get("user") or {}).get("exec") or {}
            command = plugin.get("command") if isinstance(plugin, dict) else None
            if not isinstance(command, str) or not command:
                return
            # kubectl runs a command with a path separator relative to the kubeconfig's folder
            found = (os.access(path.parent / command, os.X_OK) if os.sep in command
                     else shutil.which(command) is not None)
            if found:
                return
            hint = plugin.get("installHint")
            raise KubeconfigError(
                f"kubeconfig {path}: user {user!r} gets its credentials from the exec plugin "
                f"{command!r}, which is not found{'' if os.sep in command else ' on PATH'}",
                (f"{first_line(hint, 200)}; or " if isinstance(hint, str) and hint.strip()
                 else "install it, or ") + "fix users[].user.exec.command there")
        return
