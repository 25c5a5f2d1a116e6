"""fuseops.rope_cache_attention (opcheck, compilers, Meta, pybind and every
CPU build are in test_conformance.py, fed by
fuseops/ops/cases/rope_cache_attention.py's samples).

The op is fuseops.rope's rotation, a write into the cache and
fuseops.decode_attention over the cache up to the last new token: against
those three run one after the other it is bit for bit the same; against
fuseops.reference.rope_cache_attention (float64) within decode_attention's
tolerances (float32 sums of ~10^4 terms: 1e-5; one bfloat16/float16
rounding of the result and of the rotated query and keys: 1e-2, 2e-3); and
against transformers' own static-cache step.
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


def step_inputs(b, hq, hkv, q_len, slots, dim, dtype, device, rotary=None, seed=0):
    """A new step's query, key, value (HF's views of the projections),
    cos/sin rows and random caches."""
    gen = torch.Generator().manual_seed(seed)

    def t(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype).to(device)

    rotary = rotary or dim
    angles = torch.rand(b, q_len, rotary // 2, generator=gen, dtype=torch.float64) * 2 * math.pi
    angles = torch.cat((angles, angles), dim=-1)
    return dict(
        query=t(b, q_len, hq, dim).transpose(1, 2),
        key=t(b, q_len, hkv, dim).transpose(1, 2),
        value=t(b, q_len, hkv, dim).transpose(1, 2),
        cos=angles.cos().to(dtype).to(device),
        sin=angles.sin().to(dtype).to(device),
        key_cache=t(b, hkv, slots, dim),
        value_cache=t(b, hkv, slots, dim),
    )


def unfused(a, position, mask=None, **kwargs):
    """The same step from fuseops' separate ops, on copies of the caches."""
    key_cache, value_cache = a["key_cache"].clone(), a["value_cache"].clone()
    q_len = a["query"].shape[2]
    keys = position + q_len
    query, key = fuseops.apply_rotary_pos_emb(a["query"], a["key"], a["cos"], a["sin"])
    key_cache[:, :, position:keys] = key
    value_cache[:, :, position:keys] = a["value"]
    if mask is not None and mask.dim() > 0 and mask.shape[-1] != 1:
        mask = mask[..., :keys]
    out = fuseops.decode_attention(
        query, key_cache[:, :, :keys], value_cache[:, :, :keys], mask, True, **kwargs
    )
    return out, key_cache, value_cache


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "shape",
    [
        (1, 32, 8, 1, 1100, 1024, 128),  # a Llama-3-8B decode step
        (2, 8, 2, 1, 64, 30, 64),
        (1, 4, 4, 5, 40, 20, 16),  # no grouping, five new tokens (a speculative step)
        (1, 4, 2, 1, 9, 0, 16),  # the first token
    ],
)
def test_the_same_bits_as_rope_write_and_decode_attention(dtype, shape, device):
    b, hq, hkv, q_len, slots, position, dim = shape
    a = step_inputs(b, hq, hkv, q_len, slots, dim, dtype, device)
    want, want_k, want_v = unfused(a, position)
    length = torch.tensor(position, device=device)
    got = fuseops.rope_cache_attention(**a, cache_length=length)
    assert got.shape == (b, hq, q_len, dim) and got.dtype == dtype
    assert length.item() == position + q_len
    for g, w in ((got, want), (a["key_cache"], want_k), (a["value_cache"], want_v)):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_masks_partial_rotary_softcap_against_float64(dtype, device):
    b, hq, hkv, q_len, slots, position, dim = 2, 8, 2, 3, 24, 10, 16
    gen = torch.Generator().manual_seed(3)
    bool_mask = torch.rand(b, 1, q_len, slots, generator=gen) > 0.3
    bias = torch.randn(1, hq, q_len, slots, generator=gen).masked_fill(~bool_mask[:1], -math.inf)
    # Masks over the whole cache, over the keys up to the last new token,
    # additive, 0-d (broadcast to every key), none.
    scalar = torch.tensor(True)
    for mask in (bool_mask, bool_mask[..., : position + q_len], bias, scalar, None):
        a = step_inputs(b, hq, hkv, q_len, slots, dim, dtype, device, rotary=8)
        wide = {k: v.double() for k, v in a.items()}
        kwargs = dict(softcap=3.0, scale=0.4)
        mask = None if mask is None else mask.to(device)
        length = torch.tensor(position, device=device)
        got = fuseops.rope_cache_attention(**a, cache_length=length, attn_mask=mask, **kwargs)
        want = reference.rope_cache_attention(
            **wide, cache_length=torch.tensor(position), attn_mask=mask, **kwargs
        )
        torch.testing.assert_close(got.double(), want, rtol=TOL[dtype], atol=TOL[dtype])
        torch.testing.assert_close(
            a["key_cache"].double(), wide["key_cache"], rtol=TOL[dtype], atol=TOL[dtype]
        )


def test_matches_transformers_static_cache_step(device):
    # transformers' own step, float32: apply_rotary_pos_emb, StaticLayer's
    # update, SDPA over the whole cache with its mask.
    from transformers.cache_utils import StaticLayer
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    b, hq, hkv, slots, dim = 2, 8, 2, 32, 16
    a = step_inputs(b, hq, hkv, 1, slots, dim, torch.float32, device)
    layer = StaticLayer(max_cache_len=slots)
    prompt = torch.randn(b, hkv, 11, dim, device=device)
    layer.update(prompt, prompt.clone())
    q, k = apply_rotary_pos_emb(a["query"], a["key"], a["cos"], a["sin"])
    keys, values = layer.update(k, a["value"])
    visible = torch.arange(slots, device=device) <= 11
    want = torch.nn.functional.scaled_dot_product_attention(
        q, keys, values, attn_mask=visible[None], enable_gqa=True
    )
    fused = StaticLayer(max_cache_len=slots)
    fused.update(prompt, prompt.clone())
    got = fuseops.rope_cache_attention(
        a["query"],
        a["key"],
        a["value"],
        a["cos"],
        a["sin"],
        fused.keys,
        fused.values,
        fused.cumulative_length,
        visible[None, None, None].expand(b, 1, 1, slots),
    )
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fused.keys, layer.keys, rtol=1e-6, atol=1e-6)
    assert fused.get_seq_length() == layer.get_seq_length() == 12


def test_steps_one_token_at_a_time_fill_the_cache(device):
    # Eight single-token steps from an empty cache leave the cache a prefill
    # of the eight rotated keys would, and the last step's attention is
    # the last row of causal attention over all eight.
    b, hq, hkv, n, dim = 1, 4, 2, 8, 16
    a = step_inputs(b, hq, hkv, n, 12, dim, torch.float64, device)
    length = torch.tensor(0, device=device)
    cache_k, cache_v = a["key_cache"].clone(), a["value_cache"].clone()
    outs = []
    for i in range(n):
        step = {k: a[k][:, :, i : i + 1] for k in ("query", "key", "value")}
        step |= {k: a[k][:, i : i + 1] for k in ("cos", "sin")}
        outs.append(
            fuseops.rope_cache_attention(
                **step, key_cache=cache_k, value_cache=cache_v, cache_length=length
            )
        )
    want, want_k, _ = unfused(a, 0)
    torch.testing.assert_close(torch.cat(outs, dim=2), want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(cache_k[:, :, :n], want_k[:, :, :n], rtol=1e-12, atol=1e-12)
    assert length.item() == n


def test_compiled_step_writes_the_cache_in_place(device):
    a = step_inputs(1, 4, 2, 1, 16, 16, torch.float32, device)
    eager = {k: v.clone() for k, v in a.items()}
    length, eager_length = torch.tensor(5, device=device), torch.tensor(5, device=device)
    key_cache = a["key_cache"]
    compiled = torch.compile(fuseops.rope_cache_attention, fullgraph=True)
    got = compiled(**a, cache_length=length)
    want = fuseops.rope_cache_attention(**eager, cache_length=eager_length)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert a["key_cache"] is key_cache
    torch.testing.assert_close(key_cache, eager["key_cache"], rtol=0, atol=0)
    assert length.item() == 6


def test_refusals_leave_the_cache_alone(device):
    op = "rope_cache_attention"
    a = step_inputs(1, 4, 2, 2, 8, 8, torch.float32, device)
    before = {k: v.clone() for k, v in a.items()}
    length = torch.tensor(7, device=device)
    expect_error_mentions(
        lambda: fuseops.rope_cache_attention(**a, cache_length=length), [op, "do not fit"]
    )
    assert length.item() == 7
    for k, v in a.items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)
    length.fill_(0)
    aliased = dict(a, value_cache=a["key_cache"])
    expect_error_mentions(
        lambda: fuseops.rope_cache_attention(**aliased, cache_length=length), [op, "share memory"]
    )
    grad = dict(a, query=a["query"].detach().requires_grad_())
    expect_error_mentions(
        lambda: fuseops.rope_cache_attention(**grad, cache_length=length), [op, "inference op"]
    )
    expect_error_mentions(
        lambda: fuseops.rope_cache_attention(**a, cache_length=length.float()), [op, "int64"]
    )
    assert length.item() == 0
