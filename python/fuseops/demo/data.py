"""The demo's data: the characters of a standard-library module's source,
cut into the batches of every training step."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch


def corpus() -> tuple[str, str]:
    """(text, where it came from): the source of a standard-library module,
    which every Python installation ships, restricted to ASCII."""
    import argparse as source_module

    with open(source_module.__file__, encoding="utf-8") as f:
        text = f.read()
    text = "".join(ch for ch in text if ch == "\n" or 32 <= ord(ch) < 127)
    return text, f"{source_module.__file__} (Python {sys.version.split()[0]})"


@dataclass(frozen=True)
class Batches:
    tokens: torch.Tensor  # (steps, batch, seq_len + 1)
    vocab: list


def make_batches(text: str, steps: int, batch_size: int, seq_len: int, seed: int) -> Batches:
    vocab = sorted(set(text))
    index = {ch: i for i, ch in enumerate(vocab)}
    data = torch.tensor([index[ch] for ch in text], dtype=torch.long)
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(data) - seq_len - 1, (steps, batch_size), generator=gen)
    offsets = torch.arange(seq_len + 1)
    return Batches(tokens=data[starts[..., None] + offsets], vocab=vocab)
