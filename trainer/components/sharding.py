"""FSDP2 (``train.strategy: fsdp``): parameters, gradients and optimizer state sharded over
the ranks, block by block.

Each block (a module of a class named by ``train.fsdp_wrap``, by default a ``transformers``
model's ``_no_split_modules`` or our built-in models' layers) is one ``fully_shard`` unit,
then the root takes the rest: a block's full parameters exist only while it runs. What the
loop needs beyond DDP's contract lives here: gradient sync off on the non-final micro-batches
of an accumulation, the clipping norm as a plain tensor, full parameters for validation (every
rank must take part in every all-gather, and a rank whose shard of the validation set is only
padding runs no forward), and the model and optimizer state gathered into one full state dict
on rank 0 for a checkpoint, loaded back on any world size.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from trainer import plugins
from trainer.errors import ConfigError

DEFAULT_BLOCKS: tuple[type[nn.Module], ...] = (nn.Linear, nn.Conv2d)
"""Blocks of models without ``_no_split_modules`` (our built-in MLP, CNN and MyModel): each
layer with parameters is its own unit."""


def check(strategy: str, precision: str, compile_: bool) -> None:
    """What FSDP cannot do here, refused before the rendezvous with one line."""
    if strategy != "fsdp":
        return
    if precision == "fp16":
        raise ConfigError("train.precision 'fp16' is not supported with train.strategy "
                          "'fsdp' (its loss scaler does not unscale sharded gradients here)",
                          "use --set train.precision=bf16, or --strategy ddp for fp16")
    if compile_:
        raise ConfigError("train.compile is not supported with train.strategy 'fsdp' in "
                          "this trainer yet", "set train.compile=false, or use --strategy ddp")


def block_classes(model: nn.Module, names: list[str]) -> tuple[type[nn.Module], ...]:
    """The classes whose modules become FSDP units: `names` (class names found in `model`,
    or import paths), else the model's ``_no_split_modules`` (transformers), else
    :data:`DEFAULT_BLOCKS`."""
    by_name = {type(m).__name__: type(m) for m in model.modules()}
    if not names:
        no_split = getattr(model, "_no_split_modules", None) or []
        found = tuple(by_name[n] for n in no_split if n in by_name)
        return found or DEFAULT_BLOCKS
    classes: list[type[nn.Module]] = []
    for name in names:
        if plugins.is_import_path(name):
            cls = plugins.load(name, "train.fsdp_wrap")
        elif name in by_name:
            cls = by_name[name]
        else:
            raise ConfigError(f"train.fsdp_wrap: the model has no module of class {name!r} "
                              f"(its classes: {', '.join(sorted(by_name))})",
                              "name a class of the model's blocks, or an import path")
        if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
            raise ConfigError(f"train.fsdp_wrap: {name!r} is not an nn.Module class",
                              "name a module class of the model's blocks")
        classes.append(cls)
    return tuple(classes)


def shard(model: nn.Module, names: list[str], precision: str) -> nn.Module:
    """``fully_shard`` each block of `model`, then the root (in place; `model` is returned,
    now an FSDPModule)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if precision == "bf16" else MixedPrecisionPolicy())
    classes = block_classes(model, names)
    blocks = [m for m in model.modules() if m is not model and isinstance(m, classes)
              and any(True for _ in m.parameters())]
    # Innermost first: a block nested in another is its own unit, the outer takes the rest.
    for block in reversed(blocks):
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model


def is_sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def _units(model: nn.Module) -> list[Any]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


@contextlib.contextmanager
def no_sync(model: nn.Module, comm: contextlib.AbstractContextManager[None]) -> Iterator[None]:
    """A non-final micro-batch: gradients accumulate unsharded, not reduce-scattered (FSDP2's
    ``no_sync``); its forward still all-gathers, hence `comm`."""
    model.set_requires_gradient_sync(False)  # type: ignore[operator]
    try:
        with comm:
            yield
    finally:
        model.set_requires_gradient_sync(True)  # type: ignore[operator]


def plain_norm(norm: torch.Tensor) -> torch.Tensor:
    """``clip_grad_norm_``'s result on DTensor gradients is a DTensor: its full value (the
    same total norm DDP computes)."""
    full = getattr(norm, "full_tensor", None)
    return full() if full is not None else norm


@contextlib.contextmanager
def full_params(model: nn.Module) -> Iterator[None]:
    """Every unit's full parameters held for the block (a collective on entry and exit; no
    collective inside): a rank may run fewer forwards than another, as validation does."""
    if not is_sharded(model):
        yield
        return
    units = _units(model)
    for unit in units:
        unit.unshard()
        unit.set_reshard_after_forward(False, recurse=False)
    try:
        yield
    finally:
        for unit in units:
            unit.set_reshard_after_forward(True, recurse=False)
            unit.reshard()


def gather_state(model: nn.Module, optimizer: torch.optim.Optimizer
                 ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The full model and optimizer state dicts on rank 0 (in host memory; empty on the other
    ranks). A collective: every rank calls it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    return get_state_dict(model, optimizer,
                          options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_state(model: nn.Module, optimizer: torch.optim.Optimizer, model_state: dict[str, Any],
               optimizer_state: dict[str, Any]) -> None:
    """Full state dicts (every rank holds them) into the sharded model and optimizer: each
    rank keeps its own shard, whatever the world size that saved them."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    set_state_dict(model, optimizer, model_state_dict=model_state,
                   optim_state_dict=optimizer_state,
                   options=StateDictOptions(full_state_dict=True))
