"""Generated English-like text, tokenized byte by byte: nothing is downloaded or shipped.

The corpus is sentences from a small grammar ("the old dog saw a red ball near the house."),
drawn with a seeded generator, joined and encoded as UTF-8 bytes; token id = byte value (a
vocabulary of 256, no merges, no unknown token). The bytes are cut into windows of `seq_len`
tokens, each a sample ``{"input_ids": (seq_len,) int64}``: the built-in `lm` step predicts
each byte from the ones before it (labels are the ids).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

VOCAB_SIZE = 256
"""Byte-level: every byte is a token."""

DETERMINERS = ("the", "a", "my", "your", "one", "that")
ADJECTIVES = ("old", "small", "red", "quiet", "happy", "green", "tall", "bright")
NOUNS = ("dog", "cat", "bird", "house", "river", "tree", "ball", "child", "garden", "boat")
VERBS = ("saw", "found", "liked", "followed", "painted", "carried", "watched", "heard")
PLACES = ("near", "behind", "under", "beside", "across")


def encode(text: str) -> list[int]:
    """Token ids of `text`: its UTF-8 bytes."""
    return list(text.encode("utf-8"))


def decode(ids: list[int] | Tensor) -> str:
    """`encode` undone (bytes that are no valid UTF-8 are replaced)."""
    values = ids.tolist() if isinstance(ids, Tensor) else ids
    return bytes(values).decode("utf-8", errors="replace")


def _phrase(rng: np.random.Generator) -> str:
    words = [str(rng.choice(DETERMINERS))]
    if rng.integers(2):
        words.append(str(rng.choice(ADJECTIVES)))
    words.append(str(rng.choice(NOUNS)))
    return " ".join(words)


def sentence(rng: np.random.Generator) -> str:
    """One sentence: subject, verb, object, and sometimes a place."""
    words = [_phrase(rng), str(rng.choice(VERBS)), _phrase(rng)]
    if rng.integers(2):
        words += [str(rng.choice(PLACES)), _phrase(rng)]
    text = " ".join(words)
    return text[0].upper() + text[1:] + "."


def corpus(n_bytes: int, seed: int = 0) -> str:
    """At least `n_bytes` of generated sentences, one per line."""
    rng = np.random.default_rng(seed)
    lines: list[str] = []
    size = 0
    while size < n_bytes:
        lines.append(sentence(rng))
        size += len(lines[-1]) + 1
    return "\n".join(lines) + "\n"


class ByteTextDataset(Dataset[dict[str, Tensor]]):
    """`samples` windows of `seq_len` byte tokens cut from one generated corpus."""

    vocab_size = VOCAB_SIZE

    def __init__(self, samples: int = 2048, seq_len: int = 64, seed: int = 0) -> None:
        ids = encode(corpus(samples * seq_len, seed))[: samples * seq_len]
        self.input_ids = torch.tensor(ids, dtype=torch.long).view(samples, seq_len)

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        return {"input_ids": self.input_ids[index]}
