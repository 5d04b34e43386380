"""An example user package for ddp-trainer: your own model, dataset and step by import path.

* :mod:`mytask.shapes`: a vision-style task (generated shape images, a small conv net, and a
  custom step with label smoothing);
* :mod:`mytask.text`: a Hugging Face ``transformers`` sequence classifier built from a tiny
  config (no weights download) on a generated sentiment set.
"""
