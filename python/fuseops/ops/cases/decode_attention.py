"""The test and bench cases of :mod:`fuseops.ops.decode_attention` (see
:mod:`fuseops.ops.cases`): kept out of ``import fuseops``."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .. import decode_attention as family
from ._sample import Sample, tensor

# --- bench: Llama-3-8B-like heads (32 query heads over 8 key/value heads,
# head size 128), one new token; rows = batch, hidden = cached tokens.
_Q_HEADS, _KV_HEADS, _HEAD_DIM = 32, 8, 128


@dataclass(frozen=True)
class _CacheTraffic:
    """Key and value caches read once; the query and output are negligible."""

    def bytes(self, rows: int, hidden: int, element_size: int) -> int:
        return 2 * rows * _KV_HEADS * hidden * _HEAD_DIM * element_size


def _query_and_cache(rows, hidden, dtype, device, gen):
    def t(*shape):
        return torch.randn(*shape, dtype=torch.float32, device=device, generator=gen).to(dtype)

    return (
        t(rows, _Q_HEADS, 1, _HEAD_DIM),
        t(rows, _KV_HEADS, hidden, _HEAD_DIM),
        t(rows, _KV_HEADS, hidden, _HEAD_DIM),
    )


def _sdpa_gqa_decode(query, key, value):
    # transformers' SDPA path for one new token with grouped heads: the
    # query heads of each key/value head packed as its query rows.
    b, heads, _, dim = query.shape
    packed = query.reshape(b, key.shape[1], heads // key.shape[1], dim)
    out = torch.nn.functional.scaled_dot_product_attention(packed, key, value)
    return out.reshape(b, heads, 1, value.shape[-1])


def _decode_step_options() -> dict:
    """The bench Case options of a decoding step over a key/value cache,
    decode_attention's and rope_cache_attention's rows alike: traffic of the
    caches, inference only (no out= form, no gradient), batch x cached
    tokens as the shapes."""
    from ._bench_case import Traffic

    return dict(
        forward_traffic=_CacheTraffic(),
        backward_traffic=Traffic(rows=0),
        has_out=False,
        differentiable=(),
        shapes={
            "quick": [(1, 1024)],
            "standard": [(1, 512), (1, 4096), (8, 1024)],
            "full": [(1, 512), (1, 4096), (1, 32768), (8, 1024), (8, 4096)],
        },
    )


def bench_cases():
    from ._bench_case import Case

    return [
        Case(
            "decode_attention",
            "decode_attention",
            "decode_attention",
            _query_and_cache,
            native=_sdpa_gqa_decode,
            native_label="SDPA, query heads packed per key/value head (HF's decode path)",
            description="one new token, 32/8 heads of 128, against a cache of `hidden` tokens",
            **_decode_step_options(),
        )
    ]


def samples(device) -> list[Sample]:
    op = torch.ops.fuseops.decode_attention.default

    def qkv(b, hq, hkv, q_len, keys, dim, v_dim=None, dtype=torch.float32, layout="contiguous"):
        return (
            tensor((b, hq, q_len, dim), dtype, device, layout),
            tensor((b, hkv, keys, dim), dtype, device, layout),
            tensor((b, hkv, keys, v_dim or dim), dtype, device, layout),
        )

    def call(args, mask=None, causal=False, scale=None, softcap=0.0, large=False):
        full = (*args, mask, causal, scale, softcap)
        return Sample(op, full, family.decode_attention, large=large)

    bool_mask = torch.rand(2, 1, 1, 9, device=device) > 0.4
    bool_mask[..., 0] = True
    float_mask = torch.zeros(1, 1, 3, 6, device=device)
    float_mask[..., 4:] = -math.inf
    result = [
        call(qkv(1, 4, 1, 1, 7, 8)),
        call(qkv(2, 4, 2, 1, 9, 16, dtype=torch.bfloat16), mask=bool_mask),
        call(qkv(1, 2, 2, 3, 6, 8, 5, dtype=torch.float16), mask=float_mask, scale=0.3),
        call(qkv(1, 6, 3, 4, 10, 8, dtype=torch.float64), causal=True, softcap=5.0),
        call(qkv(2, 4, 2, 2, 5, 8, layout="transposed")),
        call(qkv(1, 2, 1, 3, 2, 8), causal=True),  # a row that sees no key
        call(qkv(1, 2, 1, 1, 0, 8)),  # an empty cache
        call(qkv(0, 2, 1, 1, 4, 8)),
    ]
    # Every CPU build: a long cache (split across threads), a prefill-sized
    # causal block, odd sizes (vector tails).
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        result.append(call(qkv(1, 8, 2, 1, 1100, 67, 33, dtype=dtype), large=True))
    result.append(call(qkv(1, 4, 2, 40, 45, 16), causal=True, large=True))
    return result


def fuzz(d) -> Sample:
    """One random call for tests_py/test_fuzz.py (``d``: fuseops.ops._fuzz.Draw)."""
    kv_heads, group = d.int(1, 3), d.int(1, 3)
    b, q_len, keys, dim, v_dim = d.size(3), d.size(5), d.size(40), d.size(20), d.size(20)
    query = d.tensor((b, kv_heads * group, q_len, dim))
    key = d.tensor((b, kv_heads, keys, dim), query.dtype)
    value = d.tensor((b, kv_heads, keys, v_dim), query.dtype)
    mask = None
    kind = d.int(0, 2)
    gen = torch.Generator().manual_seed(d.int(0, 2**31 - 1))
    if kind == 1:
        mask = (torch.rand(b, 1, q_len, keys, generator=gen) > 0.3).to(d.device)
    elif kind == 2:
        bias = torch.randn(1, kv_heads * group, q_len, keys, generator=gen)
        mask = bias.masked_fill(bias < -1, -math.inf).to(d.device)
    softcap = d.choice((0.0, 0.0, 30.0))
    scale = d.choice((None, None, 0.5))
    return Sample(
        torch.ops.fuseops.decode_attention.default,
        (query, key, value, mask, d.flag(), scale, softcap),
        family.decode_attention,
    )


def export_cases() -> list:
    """The calls the export tests run (fuseops/ops/_export.py)."""
    from .._export import EXPORT_DTYPES, ExportCase
    from .._export import randn as t

    op = torch.ops.fuseops.decode_attention
    cases = [
        ExportCase(
            op.default,
            f"{dtype} 8/2 heads, one new token",
            (
                t(2, 8, 1, 16, dtype=dtype),
                t(2, 2, 20, 16, dtype=dtype),
                t(2, 2, 20, 16, dtype=dtype),
            ),
        )
        for dtype in EXPORT_DTYPES
    ]
    mask = torch.rand(1, 1, 3, 9) > 0.3
    mask[..., 0, :] = False  # a row that sees no key: zeros
    bias = torch.randn(1, 4, 3, 9).masked_fill(~mask, float("-inf"))
    cases += [
        ExportCase(
            op.default,
            "bool mask, softcap, scale",
            (t(1, 4, 3, 8), t(1, 2, 9, 8), t(1, 2, 9, 6), mask),
            lambda q, k, v, m: op(q, k, v, m, False, 0.4, 2.0),
        ),
        ExportCase(
            op.default,
            "additive mask and causal",
            (t(1, 4, 3, 8), t(1, 1, 9, 8), t(1, 1, 9, 8), bias),
            lambda q, k, v, m: op(q, k, v, m, True),
        ),
    ]
    return cases
