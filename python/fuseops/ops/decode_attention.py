"""decode_attention: a few new query tokens against a key/value cache, with
grouped-query heads read in place (the attention of a decode step)."""

from __future__ import annotations

import math
from typing import Optional

import torch


def decode_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: Optional[torch.Tensor] = None,
    is_causal: bool = False,
    scale: Optional[float] = None,
    softcap: float = 0.0,
) -> torch.Tensor:
    """Attention of ``query [B, Hq, L, D]`` against ``key [B, Hkv, S, D]``
    and ``value [B, Hkv, S, Dv]`` (``Hq`` a multiple of ``Hkv``: each
    key/value head serves ``Hq // Hkv`` query heads, read once for all of
    them); returns ``[B, Hq, L, Dv]`` in the query's dtype.

    ``scores = scale * q . k`` (``scale`` default ``1 / sqrt(D)``), then
    ``softcap * tanh(scores / softcap)`` when ``softcap > 0``, then
    ``attn_mask`` (broadcastable to ``[B, Hq, L, S]``): bool (True: the key
    may be seen) or floating (added; ``-inf`` hides the key whatever its
    score); ``is_causal`` aligns the ``L`` queries with the last ``L`` keys
    (query ``i`` sees keys ``j <= S - L + i``, decoding with a cache), and
    combines with the mask. Computed in float32 (float64 for float64
    inputs). A row that sees no key returns zeros, where
    ``torch.nn.functional.scaled_dot_product_attention`` returns NaN.
    Inference op: it raises if a gradient would be recorded.
    """
    return torch.ops.fuseops.decode_attention(
        query, key, value, attn_mask, is_causal, scale, softcap
    )


def decode_attention_reference(
    query, key, value, attn_mask=None, is_causal=False, scale=None, softcap=0.0
):
    q_heads, q_len, dim = query.shape[1], query.shape[2], query.shape[3]
    group, keys = q_heads // key.shape[1], key.shape[2]
    math_dtype = torch.float64
    q = query.to(math_dtype)
    k = key.to(math_dtype).repeat_interleave(group, 1)
    v = value.to(math_dtype).repeat_interleave(group, 1)
    if scale is None:
        scale = 1.0 / math.sqrt(dim) if dim > 0 else 1.0
    s = (q * scale) @ k.transpose(-1, -2)
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    visible = torch.ones(s.shape, dtype=torch.bool, device=s.device)
    if is_causal:
        i = torch.arange(q_len, device=s.device).unsqueeze(1)
        j = torch.arange(keys, device=s.device).unsqueeze(0)
        visible = visible & (j <= i + (keys - q_len))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            visible = visible & attn_mask
        else:
            bias = attn_mask.to(math_dtype)
            visible = visible & (bias != -math.inf)
            s = s + bias
    s = s.masked_fill(~visible, -math.inf)
    p = torch.softmax(s, dim=-1)
    # Keys a row does not see are not read: their values do not count.
    out = (p.unsqueeze(-1) * v.unsqueeze(-3)).masked_fill(~visible.unsqueeze(-1), 0).sum(-2)
    out = out.masked_fill(~visible.any(-1, keepdim=True), 0)
    return out.to(query.dtype)


# --- export: ONNX, ExecuTorch and their test calls (fuseops/ops/_export.py) ---


def onnx_translations() -> dict:
    """decode_attention, decomposed: ONNX's ``Attention`` (opset 23) returns
    NaN, not zeros, for a row that sees no key."""
    from ._onnx import cast, dtype_of, ints, ir, op, opmath, scalar, static_dim

    def decode_attention_onnx(
        query, key, value, attn_mask=None, is_causal: bool = False, scale=None, softcap: float = 0.0
    ):
        """``fuseops::decode_attention``: a decomposition in float32 (float64
        for float64): each key/value head expanded to its query heads,
        ``MatMul``, the softcap (``Tanh``), the mask and causal limit
        (``Where``), ``Softmax``, rows that see no key set to zero, ``MatMul``
        with the values. Unlike the op, the graph multiplies the hidden keys'
        values by zero rather than skipping them (a NaN or Inf there would
        spread)."""
        dtype = dtype_of(query)
        ct = opmath(dtype)
        batch = static_dim(query, 0, "the batch")
        q_heads = static_dim(query, 1, "the query heads")
        q_len = static_dim(query, 2, "the query length")
        dim = static_dim(query, 3, "the head size")
        kv_heads = static_dim(key, 1, "the key/value heads")
        keys = static_dim(key, 2, "the key length")
        v_dim = static_dim(value, 3, "the value head size")
        group = q_heads // kv_heads

        def per_query_head(t, last: int):
            t = cast(t, ct)
            if group == 1:
                return t
            t = op.Expand(op.Unsqueeze(t, ints(2)), ints(batch, kv_heads, group, keys, last))
            return op.Reshape(t, ints(batch, q_heads, keys, last))

        k = per_query_head(key, dim)
        v = per_query_head(value, v_dim)
        if scale is None:
            scale = dim**-0.5 if dim > 0 else 1.0
        scores = op.MatMul(
            op.Mul(cast(query, ct), scalar(scale, ct)), op.Transpose(k, perm=[0, 1, 3, 2])
        )
        if softcap > 0:
            cap = scalar(softcap, ct)
            scores = op.Mul(op.Tanh(op.Div(scores, cap)), cap)
        visible = None
        if is_causal:
            rows = torch.arange(q_len).unsqueeze(1) + (keys - q_len)
            allowed = (torch.arange(keys).unsqueeze(0) <= rows).tolist()
            visible = op.Constant(value=ir.tensor(allowed, dtype=ir.DataType.BOOL))
        if attn_mask is not None:
            if attn_mask.dtype == ir.DataType.BOOL:
                seen = attn_mask
            else:
                bias = cast(attn_mask, ct)
                seen = op.Not(op.Equal(bias, scalar(float("-inf"), ct)))
                scores = op.Add(scores, bias)
            visible = seen if visible is None else op.And(visible, seen)
        if visible is not None:
            scores = op.Where(visible, scores, scalar(float("-inf"), ct))
        weights = op.Softmax(scores, axis=-1)
        if visible is not None:
            weights = op.Where(visible, weights, scalar(0.0, ct))
        return cast(op.MatMul(weights, v), dtype)

    return {torch.ops.fuseops.decode_attention.default: decode_attention_onnx}


def executorch_decompositions() -> dict:
    """decode_attention: key/value heads expanded to their query heads,
    ``matmul``, ``tanh`` for the softcap, ``where`` for the mask and the
    causal limit, ``softmax``; a row that sees no key gives zeros (the op's
    result, where ``scaled_dot_product_attention`` gives NaN)."""
    from ._executorch import opmath

    def decode_attention_decomposition(
        query, key, value, attn_mask=None, is_causal: bool = False, scale=None, softcap: float = 0.0
    ):
        """``fuseops::decode_attention`` in float32 (float64 for float64):
        each key/value head expanded to its query heads, ``matmul``, the
        softcap (``tanh``), the mask and causal limit (``where``),
        ``softmax``, rows that see no key set to zero, ``matmul`` with the
        values. Unlike the op, the graph multiplies the hidden keys' values by
        zero rather than skipping them (a NaN or Inf there would spread)."""
        dtype = query.dtype
        ct = opmath(dtype)
        batch, q_heads, q_len, dim = query.shape
        kv_heads, keys = key.shape[1], key.shape[2]
        group = q_heads // kv_heads

        def per_query_head(t):
            t = t.to(ct)
            if group == 1:
                return t
            last = t.shape[-1]
            t = t.unsqueeze(2).expand(batch, kv_heads, group, keys, last)
            return t.reshape(batch, q_heads, keys, last)

        k = per_query_head(key)
        v = per_query_head(value)
        if scale is None:
            scale = 1.0 / math.sqrt(dim) if dim > 0 else 1.0
        scores = (query.to(ct) * scale) @ k.transpose(-1, -2)
        if softcap > 0:
            scores = torch.tanh(scores / softcap) * softcap
        visible = None
        if is_causal:
            rows = torch.arange(q_len, device=query.device).unsqueeze(1) + (keys - q_len)
            visible = torch.arange(keys, device=query.device).unsqueeze(0) <= rows
        if attn_mask is not None:
            if attn_mask.dtype == torch.bool:
                seen = attn_mask
            else:
                bias = attn_mask.to(ct)
                seen = bias != -math.inf
                scores = scores + bias
            visible = seen if visible is None else visible & seen
        if visible is not None:
            scores = torch.where(visible, scores, torch.full_like(scores, -math.inf))
        weights = torch.softmax(scores, dim=-1)
        if visible is not None:
            weights = torch.where(visible, weights, torch.zeros_like(weights))
        return (weights @ v).to(dtype)

    return {torch.ops.fuseops.decode_attention.default: decode_attention_decomposition}


__all__ = ["decode_attention"]
