"""Sharded checkpoints of FSDP runs: each rank writes its own shard (torch.distributed.checkpoint).

Layout: a directory ``ckpt-<step>.dcp`` holding DCP's files (``__<rank>_0.distcp`` per rank and
``.metadata``), ``train.pt`` (everything but the model and the optimizer: step, sampler
position, RNG, config, ..., in the single-file format with its checksummed header) and
``COMPLETE``, written last: the size and SHA-256 of every other file.

A save writes into ``.ckpt-<step>.dcp.tmp`` (a name no listing matches), every file fsynced
(DCP's ``sync_files``). DCP's coordinator (rank 0) writes ``.metadata`` only after every rank
reported its shard written; rank 0 then writes ``train.pt`` and ``COMPLETE``, fsyncs the
folder and renames it to ``ckpt-<step>.dcp``, then fsyncs the checkpoint directory. So a
listed checkpoint was complete, and one whose ``COMPLETE`` is missing or disagrees with a file
(a shard removed, truncated or changed) is torn: never resumed from, moved aside like a bad
single file (:mod:`trainer.components.checkpoint`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainer.components import durable
from trainer.errors import CheckpointError

log = logging.getLogger(__name__)

SUFFIX = ".dcp"
MARKER = "COMPLETE"
TRAIN = "train.pt"
_TMP = re.compile(r"^\.ckpt-\d{9}\.dcp\.tmp$")


def is_checkpoint(path: Path) -> bool:
    """`path` names a sharded checkpoint (complete or not)."""
    return path.name.endswith(SUFFIX) and path.is_dir()


def final_path(directory: Path, step: int) -> Path:
    return directory / f"ckpt-{step:09d}{SUFFIX}"


def tmp_path(directory: Path, step: int) -> Path:
    return directory / f".ckpt-{step:09d}{SUFFIX}.tmp"


def drop_unfinished(directory: Path) -> None:
    """Delete the folders of saves that never completed (a rank killed mid-save), with a
    warning: nothing in them is resumed from, and a later save of their step starts clean."""
    if not directory.is_dir():
        return
    for path in directory.iterdir():
        if _TMP.match(path.name) and path.is_dir():
            log.warning("discarding unfinished sharded checkpoint %s (a save that did not "
                        "complete)", path.name)
            shutil.rmtree(path, ignore_errors=True)


def problem_of(path: Path) -> str | None:
    """Why the sharded checkpoint `path` is not complete and intact, or None when it is."""
    try:
        listed = json.loads((path / MARKER).read_text())["files"]
    except FileNotFoundError:
        return f"{path} is torn (no {MARKER} marker: its save did not complete)"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"{path}/{MARKER} is unreadable ({exc})"
    if TRAIN not in listed or ".metadata" not in listed:
        return f"{path}/{MARKER} lists no {TRAIN} or .metadata"
    for name, (size, sha) in sorted(listed.items()):
        file = path / name
        try:
            actual = file.stat().st_size
        except OSError:
            return f"{path} is torn ({name} is missing)"
        if actual != size:
            return f"{path} is torn ({name} has {actual} of {size} bytes)"
        if durable.sha256_of(file) != sha:
            return f"{path} is corrupt ({name} fails its checksum)"
    return None


def finish(tmp: Path, final: Path, train_file: bytes) -> None:
    """Rank 0, once DCP's save returned (every shard and ``.metadata`` durable): write
    ``train.pt`` and the marker, then publish the folder under its final name."""
    (tmp / TRAIN).write_bytes(train_file)
    files = {p.name: [p.stat().st_size, durable.sha256_of(p)] for p in sorted(tmp.iterdir())
             if p.is_file() and p.name != MARKER}
    for name in files:
        durable.fsync_path(tmp / name)
    marker = tmp / f".{MARKER}.tmp"
    with marker.open("w") as fh:
        json.dump({"files": files}, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(marker, tmp / MARKER)
    durable.fsync_path(tmp)
    if final.exists():  # the same step saved again (a SIGTERM right after a step's save)
        shutil.rmtree(final)
    os.replace(tmp, final)
    durable.fsync_path(final.parent)


def writer(path: Path) -> Any:
    from torch.distributed.checkpoint.filesystem import FileSystemWriter

    return FileSystemWriter(str(path), sync_files=True)


def sharded_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """This rank's shards of the model and optimizer state (DTensors), as DCP saves them."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optimizer": optimizer_state}


def load_into(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Each rank reads its own shard of the model and optimizer from `path`, whatever the
    world size that saved it (DCP reshards). A collective."""
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.state_dict import set_state_dict
    from torch.distributed.checkpoint.state_dict_loader import load

    state = sharded_state(model, optimizer)
    try:
        load(state, storage_reader=FileSystemReader(str(path)))
    except CheckpointException as exc:  # a BaseException: one line for the resume check
        raise RuntimeError(str(exc).splitlines()[0] if str(exc) else "DCP load failed") from None
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optimizer"])


def with_shards(state: dict[str, Any], path: Path) -> dict[str, Any]:
    """A sharded checkpoint's ``train.pt`` state completed with its full model and optimizer
    state read from every shard (no process group: ``evaluate``, ``export``, a DDP run
    resuming it): the same dict a single-file checkpoint holds."""
    if not state.get("shards"):
        return state
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    from trainer.components.sharding import by_index

    full: dict[str, Any] = {}
    try:
        _load_state_dict(full, storage_reader=FileSystemReader(str(path)),
                         planner=_EmptyStateDictLoadPlanner(),  # type: ignore[no-untyped-call]
                         no_dist=True)
    except BaseException as exc:  # noqa: BLE001 - DCP's CheckpointException is a BaseException
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        raise CheckpointError(f"{path} cannot be read ({type(exc).__name__})",
                              "delete it; the previous checkpoint is used") from None
    out = {k: v for k, v in state.items() if k != "shards"}
    out["model"] = full.get("model", {})
    out["optimizer"] = by_index(full.get("optimizer", {}))
    return out


def all_see(directory: Path, is_main: bool) -> bool:
    """Whether every rank sees rank 0's `directory` (shared storage: a PVC, NFS; not the
    chart's per-pod emptyDir): a file rank 0 creates must exist for all. A collective."""
    import torch.distributed as dist

    name = [f".shared-probe-{os.getpid()}" if is_main else None]
    if is_main:
        (directory / str(name[0])).touch()
    dist.broadcast_object_list(name, src=0)
    seen: list[Any] = [None] * dist.get_world_size()
    # each rank looks in its own checkpoint dir: the same path names another volume per pod
    dist.all_gather_object(seen, (directory / str(name[0])).exists())
    if is_main:
        (directory / str(name[0])).unlink(missing_ok=True)
    return all(seen)


class ShardedWriter:
    """Saves sharded checkpoints: every rank writes its shard, rank 0 completes the folder
    (:func:`finish`) on `background` (the single-file writer's thread, so saves stay in order).

    With `async_save`, DCP copies each rank's shard to host memory and writes it on its own
    thread over a process group of its own (gloo), so the training's collectives never meet
    the save's; the save returns after the copy. At most one save is in flight."""

    def __init__(self, async_save: bool) -> None:
        self.async_save = async_save
        self._group: Any = None
        self._pending: Any = None

    def save(self, directory: Path, step: int, model: nn.Module,
             optimizer: torch.optim.Optimizer, train_file: bytes | None, background: Any,
             after: Any) -> Path:
        """A collective. `train_file` (rank 0's; None elsewhere): ``train.pt``'s bytes;
        `after(final)` runs on rank 0 once the checkpoint is published (rotation, upload)."""
        import torch.distributed as dist
        from torch.distributed.checkpoint.state_dict_saver import async_save, save

        self.wait()
        background.wait()
        tmp, final = tmp_path(directory, step), final_path(directory, step)
        state = sharded_state(model, optimizer)
        if self.async_save:
            if self._group is None:
                self._group = dist.new_group(backend="gloo")
            future: Any = async_save(state, storage_writer=writer(tmp),
                                     process_group=self._group)
        else:
            save(state, storage_writer=writer(tmp))
            future = None
        if train_file is None:
            self._pending = future
            return final

        def complete() -> Path:
            if future is not None:
                future.result()
            try:
                finish(tmp, final, train_file)
            except OSError as exc:
                raise CheckpointError(
                    f"could not write checkpoint {final} ({exc.strerror}); earlier "
                    "checkpoints are kept",
                    "free disk space or fix permissions of --checkpoint-dir") from None
            after(final)
            return final

        background.run(complete)
        if future is None:
            background.wait()
        return final

    def wait(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()
