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
import logging
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainer import plugins
from trainer.errors import ConfigError

log = logging.getLogger(__name__)

DEFAULT_BLOCKS: tuple[type[nn.Module], ...] = (nn.Linear, nn.Conv2d)
"""Blocks of models without ``_no_split_modules`` (our built-in MLP, CNN and MyModel): each
layer with parameters is its own unit."""


def check(strategy: str, precision: str, wrap: list[str]) -> None:
    """What FSDP cannot do here, refused before the rendezvous with one line."""
    if strategy != "fsdp":
        if wrap:
            raise ConfigError(f"train.fsdp_wrap is set but train.strategy is {strategy!r}: "
                              "the classes would not be sharded",
                              "add --strategy fsdp, or drop train.fsdp_wrap")
        return
    if precision == "fp16":
        raise ConfigError("train.precision 'fp16' is not supported with train.strategy "
                          "'fsdp' (its loss scaler does not unscale sharded gradients here)",
                          "use --set train.precision=bf16, or --strategy ddp for fp16")


def block_classes(model: nn.Module, names: list[str]) -> tuple[type[nn.Module], ...]:
    """The classes whose modules become FSDP units: `names` (class names found in `model`,
    or import paths), else the model's ``_no_split_modules`` (transformers), else
    :data:`DEFAULT_BLOCKS`."""
    by_name = {type(m).__name__: type(m) for m in model.modules()}
    if not names:
        no_split = getattr(model, "_no_split_modules", None) or []
        found = tuple(by_name[n] for n in sorted(no_split) if n in by_name)
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
    # fully_shard keeps each rank's own slice of its local weights: rank 0's are broadcast
    # first, as DDP's constructor does, so a model initialised differently per rank (a user's
    # unseeded init) is still one model.
    for tensor in [*model.parameters(), *model.buffers()]:
        dist.broadcast(tensor.detach(), src=0)
    names_of_blocks = sorted({type(b).__name__ for b in blocks})  # before FSDP renames them
    # Innermost first: a block nested in another is its own unit, the outer takes the rest.
    for block in reversed(blocks):
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    held = local_numels(model)
    log.info("fsdp: %d units (%s and the root); parameters held per rank: %s of %d",
             len(blocks) + 1, ", ".join(names_of_blocks),
             " + ".join(str(n) for n in held), sum(p.numel() for p in model.parameters()))
    return model


def local_numels(model: nn.Module) -> list[int]:
    """Each rank's number of parameter elements held after sharding (a collective)."""
    mine = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel()
               for p in model.parameters())
    held: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(held, mine)
    return [int(n) for n in held]


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
            # Training's setting back: the root keeps its parameters from forward to backward
            # (FSDP's own choice for it), every other unit reshards after its forward.
            unit.set_reshard_after_forward(unit is not model, recurse=False)
            unit.reshard()


def gather_state(model: nn.Module, optimizer: torch.optim.Optimizer
                 ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The full model and optimizer state dicts on rank 0 (in host memory; empty on the other
    ranks). A collective: every rank calls it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    model_state, optimizer_state = get_state_dict(
        model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return model_state, by_index(optimizer_state)


def full_model_state(model: nn.Module) -> dict[str, Any]:
    """The model's full weights, gathered on the CPU of rank 0 (empty elsewhere): a
    collective, every rank calls it (the export of an FSDP run)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return dict(get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)))


def load_state(model: nn.Module, optimizer: torch.optim.Optimizer, model_state: dict[str, Any],
               optimizer_state: dict[str, Any]) -> None:
    """Full state dicts (every rank holds them) into the sharded model and optimizer: each
    rank keeps its own shard, whatever the world size that saved them."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    set_state_dict(model, optimizer, model_state_dict=model_state,
                   optim_state_dict=by_name(optimizer_state, model, optimizer),
                   options=StateDictOptions(full_state_dict=True))


def by_index(state: dict[str, Any]) -> dict[str, Any]:
    """A full optimizer state keyed by parameter name (torch.distributed.checkpoint's) keyed
    by index instead, as ``Optimizer.state_dict()`` keys it: the checkpoint of an FSDP run is
    then a DDP run's, and either resumes the other."""
    if not state:
        return state
    index = {name: i for i, name in
             enumerate(name for group in state["param_groups"] for name in group["params"])}
    return {"state": {index[name]: value for name, value in state["state"].items()},
            "param_groups": [{**group, "params": [index[name] for name in group["params"]]}
                             for group in state["param_groups"]]}


def by_name(state: dict[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer
            ) -> dict[str, Any]:
    """:func:`by_index` undone: index i names the i-th parameter of `optimizer`'s groups."""
    names = {id(p): name for name, p in model.named_parameters()}
    order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    return {"state": {order[i]: value for i, value in state["state"].items()},
            "param_groups": [{**group, "params": [order[i] for i in group["params"]]}
                             for group in state["param_groups"]]}
