"""A kubeconfig's exec credential plugin answers within ``--request-timeout``, or is one line.

The ``kubernetes`` client runs the plugin (``users[].user.exec``: ``aws eks get-token``,
``gke-gcloud-auth-plugin``, ...) with no time limit, when the kubeconfig is loaded and again
when its credential expires: one that never returned (waiting on a network, a prompt) made
``ddp-trainer jobs`` wait for ever. The client catches every ``Exception`` of the plugin's run
and only logs it, so the timeout travels as :class:`PluginSilent`, a ``BaseException``, up to
the caller that turns it into a :class:`~trainer.jobs.errors.KubeconfigError`.
"""

from __future__ import annotations

import contextlib
import subprocess
import types
from typing import Any

from trainer.jobs.errors import KubeconfigError


class PluginSilent(BaseException):
    """The plugin gave no answer in time (see the module's docstring for why not Exception)."""

    def __init__(self, command: str, seconds: float) -> None:
        super().__init__(command, seconds)
        self.error = KubeconfigError(
            f"the kubeconfig's exec credential plugin {command!r} gave no answer within "
            f"{seconds:g} s (--request-timeout)",
            f"run {command!r} by hand to see what it waits for (a login, a network), log in "
            "again, or raise --request-timeout")


def bound(seconds: float) -> None:
    """From now on, the client's exec plugins run at most `seconds` each."""
    from kubernetes.config import exec_provider

    class Bounded(subprocess.Popen):  # type: ignore[type-arg]
        def communicate(self, input: Any = None, timeout: float | None = None) -> Any:  # noqa: A002
            try:
                return super().communicate(input, seconds if timeout is None else timeout)
            except subprocess.TimeoutExpired:
                self.kill()  # a child it started may keep the pipes open: not read again
                for pipe in (self.stdout, self.stderr):
                    if pipe is not None:
                        with contextlib.suppress(OSError):
                            pipe.close()
                self.wait()
                args = self.args if isinstance(self.args, list) else [self.args]
                raise PluginSilent(str(args[0]), seconds) from None

    exec_provider.subprocess = types.SimpleNamespace(  # type: ignore[assignment, attr-defined, unused-ignore]
        Popen=Bounded, PIPE=subprocess.PIPE)
