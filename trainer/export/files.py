"""Writing an export directory (layout: :mod:`trainer.export`), all at once or not at all.

The files are written into a temporary directory beside `out`, fsynced, and renamed into
place; an existing `out` (replaced only when asked) is renamed aside first and deleted only
after the new one is in place, so a failure at any point leaves either the old export or the
new one, never a mixture and never nothing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainer import __version__
from trainer.components import storage
from trainer.components.durable import fsync_path, sha256_of
from trainer.config import CONFIG_VERSION, JobConfig
from trainer.errors import ConfigError, OutputError

log = logging.getLogger(__name__)

META = "ddp-trainer.json"
FORMAT = "ddp-trainer-model"
FORMAT_VERSION = 1
WEIGHTS = {"safetensors": "model.safetensors", "torch": "model.pt"}
"""--format -> the file of the plain state_dict."""


def is_transformers(model: nn.Module | None) -> bool:
    """Whether `model` is a Hugging Face ``PreTrainedModel`` (transformers is not imported for
    this: a model of it was built only if it already is)."""
    module = sys.modules.get("transformers")
    base = getattr(module, "PreTrainedModel", None) if module is not None else None
    return model is not None and base is not None and isinstance(model, base)


def plain_state(state: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """`state` as safetensors takes it: CPU tensors, contiguous, none sharing memory with
    another (tied weights are copied)."""
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for key, value in state.items():
        if not isinstance(value, torch.Tensor):
            continue
        tensor = value.detach().to("cpu").contiguous()
        pointer = tensor.untyped_storage().data_ptr()
        if pointer in seen and tensor.numel():
            tensor = tensor.clone()
        seen.add(tensor.untyped_storage().data_ptr())
        out[key] = tensor
    return out


def check_out(out: str | Path, force: bool) -> None:
    """Refuse an `out` that holds something, unless `force`: checked before any work."""
    if not str(out):  # Path("") would be the current directory
        raise ConfigError("--out is empty", "name the directory to write, e.g. --out model")
    out = Path(out)
    if force or not (out.exists() or out.is_symlink()):
        return
    if out.is_dir() and not any(out.iterdir()):
        return
    what = "a non-empty directory" if out.is_dir() else "a file"
    raise ConfigError(f"--out {out} is {what}; it is kept",
                      "pass another --out, or --force to replace it")


def _umask() -> int:
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def _save_pretrained(model: nn.Module, where: Path, class_names: Sequence[str],
                     state: Mapping[str, Any]) -> None:
    """``save_pretrained`` of `state` (the full weights: a sharded model's own are pieces)
    with the class names as the config's labels (then put back)."""
    config: Any = getattr(model, "config", None)
    saved = (getattr(config, "id2label", None), getattr(config, "label2id", None))
    named = bool(class_names) and len(class_names) == getattr(config, "num_labels", -1)
    if named:
        config.id2label = dict(enumerate(class_names))
        config.label2id = {name: i for i, name in enumerate(class_names)}
    hf_logging = sys.modules["transformers"].utils.logging
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a bar per save in a training log says nothing
    try:
        model.save_pretrained(str(where), state_dict=dict(state))  # type: ignore[operator]
    finally:
        if bars:
            hf_logging.enable_progress_bar()
        if named:
            config.id2label, config.label2id = saved


def _write_weights(state: dict[str, torch.Tensor], where: Path, fmt: str) -> None:
    if fmt == "torch":
        torch.save(state, where)
        return
    from safetensors.torch import save_file

    save_file(state, str(where), metadata={"format": "pt"})


def write_export(out: Path, state: Mapping[str, Any], meta: dict[str, Any], *,
                 model: nn.Module | None = None, fmt: str = "safetensors",
                 force: bool = False) -> Path:
    """Write the export directory `out`: the weights (by `model`'s ``save_pretrained`` when it
    is a transformers model), and `meta` with the weights' name and SHA-256 as ``META``."""
    check_out(out, force)
    parent = out.parent
    tmp: Path | None = None
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=parent, prefix=f".{out.name}.tmp-"))
        umask = _umask()
        tmp.chmod(0o777 & ~umask)  # mkdtemp's 0700 would hide the model from other readers
        hf = is_transformers(model)
        if hf:
            assert model is not None
            _save_pretrained(model, tmp, meta.get("class_names") or (), state)
        weights = WEIGHTS[fmt]
        if not hf or fmt != "safetensors":  # save_pretrained wrote model.safetensors
            _write_weights(plain_state(state), tmp / weights, fmt)
        meta = {"format": FORMAT, "format_version": FORMAT_VERSION, "weights": weights,
                "sha256": sha256_of(tmp / weights), "transformers": hf,
                "trainer_version": __version__, **meta}
        (tmp / META).write_text(json.dumps(meta, indent=2, default=str) + "\n",
                                encoding="utf-8")
        for path in tmp.iterdir():
            if path.is_file():
                path.chmod(0o666 & ~umask)
                fsync_path(path)
        fsync_path(tmp)
        _swap(tmp, out)
    except OSError as exc:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise OutputError(f"the model could not be exported to {out} ({exc.strerror}); "
                          "nothing there was changed",
                          f"free space there (df -h {parent}) or fix its permissions") from None
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _swap(tmp: Path, out: Path) -> None:
    """Rename `tmp` to `out`; what `out` held is deleted only once the new one is there."""
    old: Path | None = None
    if out.exists() or out.is_symlink():
        old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.old-")) / out.name
        os.replace(out, old)
    try:
        os.replace(tmp, out)
    except OSError:
        if old is not None:
            os.replace(old, out)
            old.parent.rmdir()
        raise
    fsync_path(out.parent)
    if old is not None:
        with contextlib.suppress(OSError):
            if old.is_dir() and not old.is_symlink():
                shutil.rmtree(old)
            else:
                old.unlink()
            old.parent.rmdir()


def describe(cfg: JobConfig | Mapping[str, Any], *, step: int | None, epoch: int | None,
             class_names: Sequence[str] | None, num_classes: int | None,
             sample_shape: Sequence[int] | None, objects: Mapping[str, str] | None,
             source: str, config_version: int = CONFIG_VERSION,
             **extra: Any) -> dict[str, Any]:
    """The model's description that ``META`` keeps beside the weights."""
    config = cfg.to_dict() if isinstance(cfg, JobConfig) else dict(cfg)
    return {"class_names": list(class_names) if class_names else None,
            "num_classes": num_classes,
            "sample_shape": list(sample_shape) if sample_shape is not None else None,
            "step": step, "epoch": epoch, "source": source, **extra,
            "objects": dict(objects or {}), "config_version": config_version,
            "config": config}


def export_run(cfg: JobConfig, model: nn.Module, *, num_classes: int | None,
               sample_shape: Sequence[int] | None, class_names: Sequence[str] | None,
               objects: Mapping[str, str], summary: Mapping[str, Any],
               state: Mapping[str, Any] | None = None) -> Path:
    """The trained model (its weights `state`, by default its own) into
    ``<output.dir>/model`` at the end of a run (rank 0), replacing the previous run's."""
    meta = describe(cfg, step=summary.get("steps"), epoch=summary.get("epochs"),
                    class_names=class_names, num_classes=num_classes,
                    sample_shape=sample_shape, objects=objects,
                    source="the training run that wrote summary.json",
                    val_accuracy=summary.get("val_accuracy"),
                    train_loss=summary.get("train_loss"))
    out = write_export(storage.local_dir(cfg.output.dir) / "model",
                       model.state_dict() if state is None else state, meta, model=model,
                       force=True)
    log.info("model exported -> %s (load it with safetensors, or trainer.load_checkpoint)",
             storage.shown(cfg.output.dir, out))
    return out
