"""Whether a checkpoint can be resumed (or scored) with the current configuration.

A checkpoint written for another model or optimizer is refused with one line naming the
differing config keys and the fix, never a ``load_state_dict`` traceback: that is what a user
meets who changes ``model.hidden_sizes`` and restarts with the same ``--checkpoint-dir``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from trainer.config import saved_config
from trainer.errors import CheckpointError, first_line

TRAINING_KEYS = ("config", "model", "optimizer", "epoch", "step", "sampler", "rng_cpu",
                 "global_batch", "epoch_loss_sum", "epoch_loss_count", "train_loss",
                 "world_size")
"""What every training checkpoint holds (see :class:`trainer.loop.state.TrainingState`)."""

SHAPING_KEYS = (("model", None), ("optim", "name"), ("data", "dataset"),
                ("data", "num_classes"))
"""Config keys that shape the saved state: every model key, the optimizer's kind, the data
(its sample shape and classes size the model)."""


def training_state(state: object, where: str, needed: tuple[str, ...] = TRAINING_KEYS
                   ) -> dict[str, Any]:
    """`state` if it is a training checkpoint's dict with the `needed` keys, else one line."""
    missing = [key for key in needed if not isinstance(state, dict) or key not in state]
    if missing or not isinstance(state, dict) or not isinstance(state.get("config"), dict):
        raise CheckpointError(
            f"{where} has a checkpoint header but is not a ddp-trainer training checkpoint "
            f"(missing {', '.join(missing) or 'a config mapping'})",
            "pass a ckpt-*.pt written by ddp-trainer train, or a --checkpoint-dir")
    return state


def differing_keys(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """The SHAPING_KEYS whose values differ, as `section.key: saved -> current`."""
    out: list[str] = []
    for section, key in SHAPING_KEYS:
        old, new = saved.get(section), current.get(section)
        if not isinstance(old, dict) or not isinstance(new, dict):
            continue
        for name in [key] if key is not None else sorted(new):
            if name in old and old[name] != new.get(name):
                out.append(f"{section}.{name}: {old[name]!r} -> {new.get(name)!r}")
    return out


def refuse(where: str, differing: list[str], detail: str) -> CheckpointError:
    what = "; ".join(differing) if differing else first_line(detail, 160)
    return CheckpointError(
        f"checkpoint {where} was written for another model or optimizer configuration ({what})",
        "pass another --checkpoint-dir to start afresh, or resume with the config it was "
        "written with")


def load_checked(state: dict[str, Any], current: Mapping[str, Any], where: str,
                 load: Callable[[dict[str, Any]], None]) -> None:
    """`load(state)` after checking that `state` was written for the `current` config: the
    optimizer's kind must match and the state must load; CheckpointError otherwise."""
    differing = differing_keys(saved_config(state, f"checkpoint {where}"), current)
    if any(item.startswith("optim.name:") for item in differing):
        raise refuse(where, differing, "")
    try:
        load(state)
    except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as exc:
        raise refuse(where, differing, f"{type(exc).__name__}: {exc}") from None
