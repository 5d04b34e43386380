"""The trained model out of ddp-trainer, in files that load without this package.

An export directory (``ddp-trainer export --out PATH``; ``<output.dir>/model`` at the end of
a run with ``output.export``) holds:

- ``model.safetensors``: the model's plain ``state_dict`` (``--format torch``: ``model.pt``, a
  ``torch.save`` of it); a ``transformers`` model is written by its own ``save_pretrained``
  (``config.json`` + ``model.safetensors``), so ``AutoModel...from_pretrained(PATH)`` loads it;
- ``ddp-trainer.json``: the class names, the training config, the step and the weights'
  SHA-256, which :func:`trainer.load_checkpoint` verifies.

:mod:`.files` writes it (atomically), :mod:`.loading` reads it and checkpoints back,
:mod:`.command` is ``ddp-trainer export``.
"""
