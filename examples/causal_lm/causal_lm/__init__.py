"""Example user package for ddp-trainer: a `transformers` causal LM fine-tuned on generated text."""
