"""``ddp-trainer export --checkpoint DIR|FILE --out PATH [--format safetensors|torch]``.

Imports nothing heavy at module level: the CLI registers this command without importing torch.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

FORMATS = ("safetensors", "torch")


def register(sub: Any) -> None:
    """Add ``export`` to the CLI's subcommands (`sub`: argparse's subparsers action)."""
    p = sub.add_parser("export", help="write a checkpoint's model in files that load without "
                                      "ddp-trainer (safetensors, transformers)")
    p.add_argument("--checkpoint", required=True, metavar="PATH",
                   help="a ckpt-*.pt file, a ckpt-*.dcp folder (FSDP's shards), or a checkpoint "
                   "directory (its newest valid one)")
    p.add_argument("--out", required=True, metavar="PATH",
                   help="the directory to write (an existing non-empty one only with --force)")
    p.add_argument("--format", choices=FORMATS, default="safetensors",
                   help="the plain state_dict as model.safetensors (default) or as model.pt "
                        "(torch.save); a transformers model is also written by save_pretrained")
    p.add_argument("--force", action="store_true",
                   help="replace an existing --out (atomically: the old one stays until the "
                        "new one is complete)")
    p.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    p.set_defaults(func=cmd_export)


def cmd_export(ns: argparse.Namespace) -> int:
    from trainer.components import storage
    from trainer.export.files import check_out

    storage.refuse(ns.checkpoint, "--checkpoint")
    storage.refuse(ns.out, "--out")
    check_out(ns.out, ns.force)  # before reading a checkpoint of any size
    written = export_checkpoint(ns.checkpoint, Path(ns.out), ns.format, ns.force)
    files = ", ".join(sorted(p.name for p in written.iterdir()))
    print(f"exported -> {written} ({files})")
    return 0


def export_checkpoint(path: str | Path, out: Path, fmt: str = "safetensors",
                      force: bool = False) -> Path:
    """Export the model of the checkpoint (file, directory or export) at `path` into `out`."""
    from trainer.errors import TrainerError
    from trainer.export.files import describe, write_export
    from trainer.export.loading import load_checkpoint

    loaded = load_checkpoint(path)
    meta = loaded.metadata
    model = None
    num_classes, shape = meta.get("num_classes"), meta.get("sample_shape")
    try:
        num_classes, shape = loaded.shapes()
        model = loaded.build_model()  # to know whether it is a transformers model
    except TrainerError as err:
        # the plain state_dict needs no model: e.g. the dataset is not on this machine
        log.warning("the model is not rebuilt (%s): writing its state_dict alone", err.problem)
    described = describe(loaded.config, step=meta.get("step"), epoch=meta.get("epoch"),
                         class_names=meta.get("class_names"), num_classes=num_classes,
                         sample_shape=shape, objects=meta.get("objects"),
                         source=str(meta["source"]), source_sha256=meta.get("sha256"),
                         train_loss=meta.get("train_loss"))
    return write_export(out, loaded.model_state, described, model=model, fmt=fmt, force=force)
