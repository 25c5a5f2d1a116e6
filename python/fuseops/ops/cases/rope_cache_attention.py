"""The test and bench cases of :mod:`fuseops.ops.rope_cache_attention`
(see :mod:`fuseops.ops.cases`): kept out of ``import fuseops``."""

from __future__ import annotations

import math

import torch

from .. import rope_cache_attention as family
from ._sample import Sample, tensor
from .decode_attention import _HEAD_DIM, _KV_HEADS, _Q_HEADS, _decode_step_options


def _rotary(b, q_len, rotary, dtype, device, interleaved=False, gen=None):
    """cos and sin rows [b, q_len, rotary] of random angles, in the layout
    Hugging Face builds (rotate_half: the frequencies twice; GPT-J: each
    frequency twice in a row)."""
    angles = torch.rand(b, q_len, rotary // 2, generator=gen, dtype=torch.float64) * 2 * math.pi
    if interleaved:
        angles = angles.repeat_interleave(2, dim=-1)
    else:
        angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype).to(device), angles.sin().to(dtype).to(device)


# --- bench: decode_attention's shapes (Llama-3-8B-like heads: 32 query
# heads over 8 key/value heads of 128, one new token; rows = batch, hidden =
# cached tokens) and traffic (the cached keys and values read once). Each
# timed call first sets the cache's length back to `hidden` (every row
# does), so that every call does the same step.


def _step_inputs(rows, hidden, dtype, device, gen):
    def t(*shape):
        return torch.randn(*shape, dtype=torch.float32, device=device, generator=gen).to(dtype)

    # The projections' outputs viewed as HF's attention views them.
    query = t(rows, 1, _Q_HEADS, _HEAD_DIM).transpose(1, 2)
    key = t(rows, 1, _KV_HEADS, _HEAD_DIM).transpose(1, 2)
    value = t(rows, 1, _KV_HEADS, _HEAD_DIM).transpose(1, 2)
    cos, sin = _rotary(rows, 1, _HEAD_DIM, dtype, device, gen=gen)
    slots = hidden + 16
    key_cache, value_cache = (
        t(rows, _KV_HEADS, slots, _HEAD_DIM),
        t(rows, _KV_HEADS, slots, _HEAD_DIM),
    )
    length = torch.tensor(hidden, device=device)
    return query, key, value, cos, sin, key_cache, value_cache, length


def _step(function):
    def step(query, key, value, cos, sin, key_cache, value_cache, length):
        length.fill_(key_cache.shape[2] - 16)
        return function(query, key, value, cos, sin, key_cache, value_cache, length)

    step.__name__ = function.__name__
    return step


def _hf_static_cache_step(query, key, value, cos, sin, key_cache, value_cache, length):
    # transformers' decode step with a StaticCache and SDPA: rotate_half
    # rotary in the model's dtype, the cache's index_copy_ at its length,
    # SDPA (grouped heads) over every slot of the cache with a mask.
    def rotate_half(x):
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    query, key = query * c + rotate_half(query) * s, key * c + rotate_half(key) * s
    position = torch.arange(key.shape[2], device=key.device) + length
    length.add_(key.shape[2])
    key_cache.index_copy_(2, position, key)
    value_cache.index_copy_(2, position, value)
    visible = (torch.arange(key_cache.shape[2], device=key.device) <= position[-1])[None]
    return torch.nn.functional.scaled_dot_product_attention(
        query, key_cache, value_cache, attn_mask=visible, enable_gqa=True
    )


def bench_cases():
    from ._bench_case import Case

    return [
        Case(
            "rope_cache_attention",
            _step(family.rope_cache_attention),
            _step(family.rope_cache_attention_reference),
            _step_inputs,
            native=_step(_hf_static_cache_step),
            native_label="HF's static-cache step: rotate_half, index_copy_, SDPA over the cache",
            description="one new token, 32/8 heads of 128, rotary, cache write and attention "
            "against a cache of `hidden` tokens",
            **_decode_step_options(),
        )
    ]


def samples(device) -> list[Sample]:
    op = torch.ops.fuseops.rope_cache_attention.default

    def call(
        b,
        hq,
        hkv,
        q_len,
        slots,
        position,
        dim,
        v_dim=None,
        rotary=None,
        dtype=torch.float32,
        layout="contiguous",
        mask=None,
        scale=None,
        softcap=0.0,
        interleaved=False,
        large=False,
    ):
        v_dim = v_dim or dim
        cos, sin = _rotary(b, q_len, rotary or dim, dtype, device, interleaved)
        args = (
            tensor((b, hq, q_len, dim), dtype, device, layout),
            tensor((b, hkv, q_len, dim), dtype, device, layout),
            tensor((b, hkv, q_len, v_dim), dtype, device, layout),
            cos,
            sin,
            tensor((b, hkv, slots, dim), dtype, device),
            tensor((b, hkv, slots, v_dim), dtype, device),
            torch.tensor(position, device=device),
            mask,
            scale,
            softcap,
            interleaved,
        )
        return Sample(op, args, family.rope_cache_attention, large=large)

    bool_mask = torch.rand(2, 1, 1, 12, device=device) > 0.4
    float_mask = torch.zeros(1, 1, 3, 9, device=device)
    float_mask[..., 1] = -math.inf
    result = [
        call(1, 4, 1, 1, 8, 3, 8),
        call(2, 4, 2, 1, 12, 5, 16, dtype=torch.bfloat16, layout="transposed", mask=bool_mask),
        call(1, 2, 2, 3, 9, 4, 8, 5, rotary=4, dtype=torch.float16, mask=float_mask, scale=0.3),
        call(1, 6, 3, 2, 10, 7, 8, dtype=torch.float64, softcap=5.0, interleaved=True),
        call(1, 2, 1, 1, 4, 0, 8),  # an empty cache: the new token sees itself
        call(1, 2, 1, 2, 6, 4, 8),  # the last slots
        call(0, 2, 1, 1, 4, 1, 8),
    ]
    # Every CPU build: a long cache (split across threads), odd sizes
    # (vector tails), several new tokens.
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        result.append(call(1, 8, 2, 1, 1200, 1100, 66, 33, rotary=64, dtype=dtype, large=True))
    result.append(call(2, 4, 2, 16, 80, 40, 16, large=True))
    return result


def fuzz(d) -> Sample:
    """One random call for tests_py/test_fuzz.py (``d``: fuseops.ops._fuzz.Draw)."""
    kv_heads, group = d.int(1, 3), d.int(1, 3)
    b, q_len, dim, v_dim = d.size(3), d.size(5), d.size(20), d.size(20)
    position = d.int(0, 12)
    slots = position + q_len + d.size(6)
    query = d.tensor((b, kv_heads * group, q_len, dim))
    dtype = query.dtype
    key = d.tensor((b, kv_heads, q_len, dim), dtype)
    value = d.tensor((b, kv_heads, q_len, v_dim), dtype)
    rotary = 2 * d.int(0, dim // 2)
    cos, sin = d.tensor((b, q_len, rotary), dtype), d.tensor((b, q_len, rotary), dtype)
    key_cache = d.tensor((b, kv_heads, slots, dim), dtype, writable=True)
    value_cache = d.tensor((b, kv_heads, slots, v_dim), dtype, writable=True)
    mask = None
    gen = torch.Generator().manual_seed(d.int(0, 2**31 - 1))
    kind = d.int(0, 2)
    if kind == 1:
        mask = (torch.rand(b, 1, q_len, slots, generator=gen) > 0.3).to(d.device)
    elif kind == 2:
        bias = torch.randn(1, kv_heads * group, q_len, slots, generator=gen)
        mask = bias.masked_fill(bias < -1, -math.inf).to(d.device)
    return Sample(
        torch.ops.fuseops.rope_cache_attention.default,
        (
            query,
            key,
            value,
            cos,
            sin,
            key_cache,
            value_cache,
            torch.tensor(position, device=d.device),
            mask,
            d.choice((None, None, 0.5)),
            d.choice((0.0, 0.0, 30.0)),
            d.flag(),
        ),
        family.rope_cache_attention,
    )
