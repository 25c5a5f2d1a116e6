"""fuseops.decode_attention (opcheck, compilers, Meta, pybind and every CPU
build are in test_conformance.py, fed by fuseops/ops/decode_attention.py's
samples).

Compared with fuseops.reference.decode_attention, attention in float64
with the key/value heads repeated for their query heads. The op computes
scores, softmax and the weighted sum in float32 (float64 for float64
inputs): softmax-weighted means of values of magnitude ~1 carry a few
float32 roundings per term (1e-5 relative covers sums of ~10^4 terms), and
a bfloat16/float16 result one rounding more (2^-8, 2^-11 relative; 1e-2 and
2e-3 leave margin for the inputs' own rounding in the scores).
"""

from __future__ import annotations

import math

import pytest
import torch

import fuseops
from fuseops import reference

from support.errors import expect_error_mentions
from support.params import DTYPES

TOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}


def qkv(b, hq, hkv, q_len, keys, dim, dtype, device, v_dim=None, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def t(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype).to(device)

    return t(b, hq, q_len, dim), t(b, hkv, keys, dim), t(b, hkv, keys, v_dim or dim)


def assert_close(got, want, dtype):
    torch.testing.assert_close(got.double(), want.double(), rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "shape",
    [
        (1, 32, 8, 1, 1024, 128),  # a Llama-3-8B decode step
        (4, 16, 4, 1, 300, 64),
        (1, 12, 12, 1, 77, 80),  # no grouping
        (2, 8, 1, 3, 50, 32),  # multi-query, three new tokens
        (1, 4, 2, 1, 5000, 16),  # a long cache split across threads
    ],
)
def test_matches_float64_reference(dtype, shape, device):
    q, k, v = qkv(*shape, dtype, device)
    got = fuseops.decode_attention(q, k, v)
    assert got.dtype == dtype and got.shape == q.shape
    assert_close(got, reference.decode_attention(q, k, v), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "dims",
    [(32, 24), (2, 80)],  # values wider than a key block of key rows: its buffer's other use
)
def test_causal_mask_and_softcap(dtype, dims, device):
    dim, v_dim = dims
    q, k, v = qkv(2, 8, 2, 6, 20, dim, dtype, device, v_dim=v_dim)
    gen = torch.Generator().manual_seed(1)
    mask = (torch.rand(2, 1, 6, 20, generator=gen) > 0.3).to(device)
    for kwargs in (
        dict(is_causal=True),
        dict(attn_mask=mask),
        dict(attn_mask=mask, is_causal=True, softcap=2.0, scale=0.7),
    ):
        got = fuseops.decode_attention(q, k, v, **kwargs)
        assert_close(got, reference.decode_attention(q, k, v, **kwargs), dtype)


def test_agrees_with_sdpa_where_rows_see_keys(device):
    # torch's attention on the same inputs (bottom-right causal alignment is
    # SDPA's top-left one when the query covers the whole cache).
    q, k, v = qkv(2, 8, 2, 9, 9, 16, torch.float32, device)
    got = fuseops.decode_attention(q, k, v, is_causal=True)
    want = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=True, enable_gqa=True
    )
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_static_cache_mask_hides_unwritten_slots(device):
    # A static cache holds garbage (here Inf and NaN) past the tokens
    # written; the mask hides them and they are never read.
    q, k, v = qkv(1, 4, 2, 1, 16, 8, torch.float32, device)
    k[:, :, 10:] = math.inf
    v[:, :, 10:] = math.nan
    mask = torch.zeros(1, 1, 1, 16, dtype=torch.bool, device=device)
    mask[..., :10] = True
    got = fuseops.decode_attention(q, k, v, mask)
    want = fuseops.decode_attention(q, k[:, :, :10], v[:, :, :10])
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert got.isfinite().all()


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_rows_see_masked_prefixes_of_their_own(kind, device):
    # A static cache decoding several tokens per row: the rows of one block
    # (the 4 query heads of a key/value head, times 3 positions) see
    # prefixes of different lengths, one row with a hidden run inside its
    # prefix, and a batch entry sees only 5 keys. The keys no row of a batch
    # entry sees hold Inf and NaN, as unwritten slots may; the keys are
    # long enough to be split across tasks, some of which see nothing.
    q, k, v = qkv(2, 8, 2, 3, 1200, 16, torch.float32, device)
    visible = torch.zeros(2, 1, 3, 1200, dtype=torch.bool, device=device)
    for b, lengths in enumerate([[700, 701, 300], [5, 3, 1]]):
        for i, n in enumerate(lengths):
            visible[b, 0, i, :n] = True
    visible[0, 0, 0, 100:200] = False
    gen = torch.Generator().manual_seed(2)
    bias = torch.rand(visible.shape, generator=gen, dtype=torch.float64).to(device) - 0.5
    mask = visible if kind == "bool" else bias.float().masked_fill(~visible, -math.inf)
    want = reference.decode_attention(q, k, v, mask)
    unseen = ~visible.any(dim=2, keepdim=True).transpose(2, 3)  # [B, 1, S, 1]
    k_garbage = k.masked_fill(unseen, math.inf)
    v_garbage = v.masked_fill(unseen, math.nan)
    got = fuseops.decode_attention(q, k_garbage, v_garbage, mask)
    assert_close(got, want, torch.float32)


def test_special_rows(device):
    q, k, v = qkv(1, 2, 1, 3, 4, 8, torch.float32, device)
    mask = torch.zeros(1, 1, 3, 4, device=device)
    mask[:, :, 0] = -math.inf  # row 0 sees nothing: zeros
    got = fuseops.decode_attention(q, k, v, mask)
    assert (got[:, :, 0] == 0).all()
    k_nan = k.clone()
    k_nan[:, :, 2] = math.nan  # a NaN score in every row
    assert fuseops.decode_attention(q, k_nan, v).isnan().all()


def test_refuses_gradients_and_bad_arguments(device):
    q, k, v = qkv(1, 4, 2, 1, 5, 8, torch.float32, device)
    op = "fuseops::decode_attention"
    expect_error_mentions(
        lambda: fuseops.decode_attention(q.clone().requires_grad_(), k, v), [op, "inference op"]
    )
    with torch.no_grad():
        fuseops.decode_attention(q.clone().requires_grad_(), k, v)
    expect_error_mentions(
        lambda: fuseops.decode_attention(q, k[:, :1].expand(1, 3, 5, 8), v), [op, "multiple"]
    )
    expect_error_mentions(lambda: fuseops.decode_attention(q, k, v.double()), [op, "'value'"])
    expect_error_mentions(
        lambda: fuseops.decode_attention(q, k, v, torch.ones(3, 5, device=device)),
        [op, "'attn_mask'", "broadcastable"],
    )
    expect_error_mentions(
        lambda: fuseops.decode_attention(q, k, v, scale=math.inf), [op, "'scale'"]
    )


def test_compiles_without_graph_breaks(device):
    q, k, v = qkv(1, 4, 2, 1, 12, 8, torch.float32, device)
    mask = torch.ones(1, 1, 1, 12, dtype=torch.bool, device=device)
    compiled = torch.compile(
        lambda q, k, v, m: fuseops.decode_attention(q, k, v, m) * 2, fullgraph=True
    )
    torch.testing.assert_close(compiled(q, k, v, mask), 2 * fuseops.decode_attention(q, k, v))
