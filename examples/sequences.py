"""What the Hugging Face examples train: a tiny BERT, built from its config (nothing to download),
classifying synthetic token sequences.

Four classes; a sequence is random tokens with its class's marker token
planted in about a quarter of its positions, drawn from a seed, so every
rank builds the same dataset and a held-out set shows what was learnt.
"""

import torch
from transformers import BertConfig, BertForSequenceClassification

CLASSES = 4
LENGTH = 16
VOCAB = 64  # tokens 0..CLASSES-1 are the markers


class SyntheticSequences(torch.utils.data.Dataset):
    """``size`` samples, each ``{"input_ids": LENGTH tokens, "labels": its class}``."""

    def __init__(self, size: int, seed: int = 0, draw: int = 1):
        generator = torch.Generator().manual_seed(seed * 7919 + draw)
        self.labels = torch.randint(0, CLASSES, (size,), generator=generator)
        self.ids = torch.randint(CLASSES, VOCAB, (size, LENGTH), generator=generator)
        marked = torch.rand(size, LENGTH, generator=generator) < 0.25
        self.ids[marked] = self.labels.unsqueeze(1).expand(-1, LENGTH)[marked]
        self.seed = seed

    def heldout(self, size: int = 2000) -> "SyntheticSequences":
        return SyntheticSequences(size, self.seed, draw=2)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "labels": self.labels[index]}


def tiny_bert() -> BertForSequenceClassification:
    """Two layers of width 32: about 50k parameters."""
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=LENGTH,
        num_labels=CLASSES,
    )
    return BertForSequenceClassification(config)


@torch.no_grad()
def accuracy(model, data: SyntheticSequences) -> float:
    """The share of ``data`` ``model`` classifies right."""
    model.eval()
    device = next(model.parameters()).device
    logits = model(input_ids=data.ids.to(device)).logits
    return (logits.argmax(-1).cpu() == data.labels).float().mean().item()
