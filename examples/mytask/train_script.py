"""Your own training script on ddp-trainer's Python API.

    python train_script.py --epochs 2                                   # one process
    ddp-trainer run --nproc-per-node 2 train_script.py --epochs 2       # two ranks, one endpoint
"""

from __future__ import annotations

import argparse

import torch
from mytask.shapes import ShapesDataset, TinyConvNet

import trainer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--output-dir", default="outputs")
    parser.add_argument("--checkpoint-dir", default="")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    # The model is built here, before fit(): seed its initialisation so every run (and every
    # rank; DDP then broadcasts rank 0's weights anyway) starts from the same one.
    torch.manual_seed(args.seed)
    dataset = ShapesDataset(samples=1200, seed=3)
    model = TinyConvNet(ShapesDataset.num_classes, ShapesDataset.sample_shape, width=8)
    summary = trainer.fit(
        {"train": {"epochs": args.epochs, "batch_size": 32, "seed": args.seed},
         "output": {"dir": args.output_dir},
         "checkpoint": {"dir": args.checkpoint_dir}},
        model=model, dataset=dataset)
    print(f"val accuracy {summary['val_accuracy']:.4f}")


if __name__ == "__main__":
    main()
