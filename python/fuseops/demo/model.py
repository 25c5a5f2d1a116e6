"""The demo's model: a Llama-style decoder in plain torch (fuseops' Torch*
stand-ins included), and the call that swaps fuseops into it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

import fuseops

from ..nn import SwiGLUMLP, TorchLinearCrossEntropyLoss, TorchRotaryEmbedding


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    seq_len: int = 128
    eps: float = 1e-5

    @property
    def ffn_hidden(self) -> int:
        # Llama's 8/3 * d_model, rounded up to a multiple of 16.
        return 16 * math.ceil(8 * self.d_model / 3 / 16)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.n_heads = config.n_heads
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model, bias=False)
        self.out = nn.Linear(config.d_model, config.d_model, bias=False)
        # Plain torch (Hugging Face's rotate_half formula); replace_modules
        # swaps it for fuseops.nn.RotaryEmbedding.
        self.rotary = TorchRotaryEmbedding(
            config.d_model // config.n_heads, max_position_embeddings=config.seq_len
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, d = x.shape
        # q, k, v: strided [batch, seq, heads, head_dim] views of one projection.
        q, k, v = self.qkv(x).view(batch, seq, 3, self.n_heads, -1).unbind(2)
        q, k = self.rotary(q, k, torch.arange(seq, device=x.device))
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        return self.out(y.transpose(1, 2).reshape(batch, seq, d))


class Block(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.attn_norm = nn.RMSNorm(config.d_model, eps=config.eps)
        self.attn = Attention(config)
        self.mlp_norm = nn.RMSNorm(config.d_model, eps=config.eps)
        self.mlp = SwiGLUMLP(config.d_model, config.ffn_hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class TinyLlama(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        nn.init.normal_(self.embed.weight, std=0.02)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = nn.RMSNorm(config.d_model, eps=config.eps)
        # The LM head's projection and loss (plain torch; replace_modules
        # swaps in fuseops.nn.LinearCrossEntropyLoss, which never forms the
        # [tokens, vocab] logits).
        self.loss = TorchLinearCrossEntropyLoss()

    def forward(self, tokens: torch.Tensor, targets: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The logits, or with `targets` the mean next-token loss."""
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        hidden = self.norm(x)
        # The output projection is tied to the embedding.
        if targets is None:
            return F.linear(hidden, self.embed.weight)
        return self.loss(hidden, self.embed.weight, targets)


def use_fuseops(model: nn.Module) -> list[dict]:
    """Swaps fuseops into `model` in place with `fuseops.nn.replace_modules`.
    Returns what was replaced, as dicts of name, old and new."""
    return [
        {"name": r.name, "old": r.old, "new": f"fuseops.nn.{r.new}"}
        for r in fuseops.nn.replace_modules(model)
    ]
