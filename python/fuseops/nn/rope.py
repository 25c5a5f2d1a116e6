"""fuseops.nn rotary position embedding: ``RotaryEmbedding`` (and its plain-torch
counterpart ``TorchRotaryEmbedding``)."""

from __future__ import annotations

from typing import Optional

import torch

from ..ops.rope import rope, rope_cache, rope_reference
from ._replace import _replaces


class TorchRotaryEmbedding(torch.nn.Module):
    """Rotary position embedding in plain torch, as Hugging Face writes it
    (``q * cos + rotate_half(q) * sin``, ``fuseops.reference.rope``), with
    its cos/sin cache: ``forward(query, key, positions)`` returns the rotated
    ``(query, key)`` (the query alone when key is None). This is the module a
    model builds to be plain torch and still be found by ``replace_modules``,
    which swaps it for ``RotaryEmbedding``.

    The cache (``fuseops.rope_cache``, float32 ``[max_pos, rotary_dim]``) is
    held as non-persistent buffers ``cos_cached`` and ``sin_cached``: it
    follows ``.to(device)`` and stays out of ``state_dict``. A position at or
    beyond the cache grows it to at least twice its length (``grow=True``,
    reading ``positions.max()``, a device sync on CUDA) or, with
    ``grow=False``, is an error."""

    cos_cached: torch.Tensor
    sin_cached: torch.Tensor

    def __init__(
        self,
        rotary_dim: int,
        max_position_embeddings: int = 2048,
        base: float = 10000.0,
        scaling: Optional[str] = None,
        factor: float = 1.0,
        interleaved: bool = False,
        grow: bool = True,
        device=None,
    ) -> None:
        super().__init__()
        self.rotary_dim = rotary_dim
        self.base = base
        self.scaling = scaling
        self.factor = factor
        self.interleaved = interleaved
        self.grow = grow
        cos, sin = self._cache(max_position_embeddings, device)
        self.register_buffer("cos_cached", cos, persistent=False)
        self.register_buffer("sin_cached", sin, persistent=False)

    def _cache(self, max_pos: int, device):
        return rope_cache(
            self.rotary_dim,
            max_pos,
            self.base,
            self.scaling,
            self.factor,
            interleaved=self.interleaved,
            device=device,
        )

    def _grow_for(self, positions: torch.Tensor) -> None:
        if self.grow and positions.numel() > 0:
            needed = int(positions.max()) + 1
            if needed > self.cos_cached.shape[0]:
                self.cos_cached, self.sin_cached = self._cache(
                    max(needed, 2 * self.cos_cached.shape[0]), self.cos_cached.device
                )

    def forward(self, query: torch.Tensor, key: Optional[torch.Tensor], positions: torch.Tensor):
        self._grow_for(positions)
        return rope_reference(
            query, key, self.cos_cached, self.sin_cached, positions, self.interleaved
        )

    def extra_repr(self) -> str:
        return (
            f"rotary_dim={self.rotary_dim}, max_pos={self.cos_cached.shape[0]}, "
            f"base={self.base}, scaling={self.scaling!r}, factor={self.factor}, "
            f"interleaved={self.interleaved}"
        )


@_replaces(TorchRotaryEmbedding)
class RotaryEmbedding(TorchRotaryEmbedding):
    """Rotary position embedding by ``fuseops.rope``: ``TorchRotaryEmbedding``
    (same constructor, cache and forward) with the rotation of query and key
    fused into one op, forward and backward."""

    def forward(self, query: torch.Tensor, key: Optional[torch.Tensor], positions: torch.Tensor):
        self._grow_for(positions)
        return rope(query, key, self.cos_cached, self.sin_cached, positions, self.interleaved)
