"""rope_cache_attention: a decode step's attention against a static
key/value cache in one call (rotary embedding of the new query and key,
the key and value written into the cache, attention up to each new token)."""

from __future__ import annotations

from typing import Optional

import torch

from .decode_attention import decode_attention_reference
from .rope import rope_reference


def rope_cache_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    cache_length: torch.Tensor,
    attn_mask: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
    softcap: float = 0.0,
    interleaved: bool = False,
) -> torch.Tensor:
    """The attention of ``L`` new tokens against a static cache, in one call.

    ``query [B, Hq, L, D]``, ``key [B, Hkv, L, D]``, ``value [B, Hkv, L, Dv]``
    are the new tokens' projections (Hugging Face's layout, any strides);
    ``cos``, ``sin`` their rotary rows ``[B, L, R]`` (Hugging Face's
    ``position_embeddings``; ``R`` even, at most ``D``; ``interleaved``
    selects GPT-J pairs over ``rotate_half``'s). With ``p =
    cache_length`` (an int64 tensor of one element, Hugging Face's
    ``StaticLayer.cumulative_length``), the op

    - rotates ``key`` and writes it into ``key_cache[:, :, p:p + L]``
      (``[B, Hkv, S, D]``), and ``value`` into ``value_cache[:, :, p:p + L]``;
    - returns ``fuseops.decode_attention`` of the rotated query against the
      cache's first ``p + L`` slots, query ``i`` seeing keys ``j <= p + i``
      and, with ``attn_mask`` (bool or additive, broadcastable to ``[B, Hq,
      L, S]`` or ``[B, Hq, L, p + L]``), those the mask allows: ``[B, Hq,
      L, Dv]``;
    - advances ``cache_length`` by ``L``.

    Slots past ``p + L`` are never read. ``p + L > S`` raises before
    anything is written; so do caches that overlap each other or an input.
    The rotation is ``fuseops.rope``'s (float32, one rounding to the cache's
    dtype); the attention ``fuseops.decode_attention``'s. Inference op: it
    raises if a gradient would be recorded.
    """
    return torch.ops.fuseops.rope_cache_attention(
        query,
        key,
        value,
        cos,
        sin,
        key_cache,
        value_cache,
        cache_length,
        attn_mask,
        scale,
        softcap,
        interleaved,
    )


def rope_cache_attention_reference(
    query,
    key,
    value,
    cos,
    sin,
    key_cache,
    value_cache,
    cache_length,
    attn_mask=None,
    scale=None,
    softcap=0.0,
    interleaved=False,
):
    position, new = int(cache_length), query.shape[2]
    keys = position + new
    # rope_reference takes [..., tokens, heads, head_dim] and cos [..., tokens, R].
    rotated_query, rotated_key = rope_reference(
        query.transpose(1, 2), key.transpose(1, 2), cos, sin, interleaved=interleaved
    )
    with torch.no_grad():
        key_cache[:, :, position:keys] = rotated_key.transpose(1, 2)
        value_cache[:, :, position:keys] = value
        cache_length += new
    mask = attn_mask
    if mask is not None and mask.dim() > 0 and mask.shape[-1] != 1:
        mask = mask[..., :keys]
    return decode_attention_reference(
        rotated_query.transpose(1, 2),
        key_cache[:, :, :keys],
        value_cache[:, :, :keys],
        mask,
        True,
        scale,
        softcap,
    )


NOT_EXPORTED = {
    ("rope_cache_attention",): "it writes its cache arguments in place (an exported graph "
    "takes the cache as an input and returns the updated one; export decode_attention with "
    "the cache update written out instead)",
}


__all__ = ["rope_cache_attention"]
