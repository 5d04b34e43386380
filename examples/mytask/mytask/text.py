"""Text example: a Hugging Face ``transformers`` BERT classifier from a tiny config.

The model is built from a ``BertConfig`` (random initialisation, no weights download) and
trained with its own loss: batches are mappings with ``input_ids``, ``attention_mask`` and
``labels``, so ddp-trainer's default step calls ``model(**batch)`` and uses ``output.loss``.
The sentences are generated from templates ("the film was not good" is negative), tokenized by
a word-level vocabulary defined here, so nothing is downloaded.

    ddp-trainer run --nproc-per-node 2 --dataset mytask.text:SentimentDataset \\
        --model mytask.text:tiny_bert
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

SUBJECTS = ("the film", "the movie", "this book", "the meal", "our trip", "the show",
            "the concert", "that game", "the hotel", "this phone")
POSITIVE = ("good", "great", "lovely", "wonderful", "excellent", "fun", "superb", "nice")
NEGATIVE = ("bad", "awful", "boring", "terrible", "dull", "poor", "horrible", "weak")
ADVERBS = ("really", "very", "quite", "truly", "rather")
PAD, CLS, UNK = "[PAD]", "[CLS]", "[UNK]"
WORDS = sorted({w for phrase in SUBJECTS for w in phrase.split()}
               | set(POSITIVE) | set(NEGATIVE) | set(ADVERBS) | {"was", "is", "not", "and"})
VOCAB = {w: i for i, w in enumerate([PAD, CLS, UNK, *WORDS])}
MAX_LEN = 12


def tokenize(sentence: str) -> tuple[list[int], list[int]]:
    """Word ids with a leading [CLS], padded to MAX_LEN, and the attention mask."""
    ids = [VOCAB[CLS]] + [VOCAB.get(w, VOCAB[UNK]) for w in sentence.split()][: MAX_LEN - 1]
    mask = [1] * len(ids) + [0] * (MAX_LEN - len(ids))
    return ids + [VOCAB[PAD]] * (MAX_LEN - len(ids)), mask


def sentence(rng: np.random.Generator) -> tuple[str, int]:
    """A templated review and its sentiment (1 positive); "not" flips it."""
    positive = bool(rng.integers(2))
    adjective = str(rng.choice(POSITIVE if positive else NEGATIVE))
    words = [str(rng.choice(SUBJECTS)), str(rng.choice(("was", "is")))]
    negated = bool(rng.integers(2))
    if negated:
        words.append("not")
    if rng.integers(2):
        words.append(str(rng.choice(ADVERBS)))
    words.append(adjective)
    return " ".join(words), int(positive != negated)


class SentimentDataset(Dataset[dict[str, Tensor]]):
    """`samples` generated reviews; each sample is a mapping of tensors with ``labels``."""

    num_classes = 2

    def __init__(self, samples: int = 2000, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        pairs = [sentence(rng) for _ in range(samples)]
        encoded = [tokenize(text) for text, _ in pairs]
        self.input_ids = torch.tensor([ids for ids, _ in encoded])
        self.attention_mask = torch.tensor([mask for _, mask in encoded])
        self.labels = torch.tensor([label for _, label in pairs])

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        return {"input_ids": self.input_ids[index], "attention_mask": self.attention_mask[index],
                "labels": self.labels[index]}


def tiny_bert(num_classes: int, hidden_size: int = 32, layers: int = 2, heads: int = 2) -> object:
    """``BertForSequenceClassification`` from a tiny config: random weights, nothing fetched."""
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(vocab_size=len(VOCAB), hidden_size=hidden_size, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=4 * hidden_size,
                        max_position_embeddings=MAX_LEN, num_labels=num_classes,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return BertForSequenceClassification(config)
