"""torch.compile: fail with one clear line when it cannot work here, never fall back.

dynamo's own fallback (``torch._dynamo.config.suppress_errors``) is off by default, so a
backend failure propagates from the first compiled call; it is turned into a ConfigError
(exit 2) here. It is raised in the first training step on every rank alike.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from trainer.errors import ConfigError, first_line

FIX = "set train.compile=false, or install a working C++ compiler (inductor needs one on CPU)"


def check_available() -> None:
    """Before the rendezvous: this Python and platform can run torch.compile at all."""
    from torch._dynamo.eval_frame import is_dynamo_supported

    if not is_dynamo_supported():
        raise ConfigError("train.compile: torch.compile is not supported by this Python or "
                          "platform", "set train.compile=false")


@contextlib.contextmanager
def compile_errors() -> Iterator[None]:
    from torch._dynamo.exc import TorchDynamoException

    try:
        yield
    except TorchDynamoException as exc:
        raise ConfigError(f"train.compile: torch.compile failed: {type(exc).__name__}: "
                          f"{first_line(exc, empty='')}", FIX) from exc
