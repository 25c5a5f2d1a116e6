"""fuseops.rope against a float64 evaluation of Hugging Face's formula
(fuseops.reference.rope on float64 copies), float64 autograd, gradcheck, the
in-place form, the cache builder and the module: the numerics (opcheck,
compilers, Meta, pybind, out= and every CPU build are in test_conformance.py,
fed by fuseops/ops/rope.py's samples).

Tolerances, per dtype, relative to the float64 result plus a small absolute
floor (values are O(1): |x| up to ~5, |cos|, |sin| <= 1):
- float64: 1e-12; the same two products and a sum.
- float32: 2e-6; a float32 fused multiply-add of two products (a few float32
  units in the last place, 2^-24 each, of terms up to ~5).
- bfloat16/float16: computed in float32 and rounded once: one unit in the
  last place of the dtype (2^-8 relative for bfloat16, 2^-11 for float16),
  doubled for the float32 error underneath.
"""

from __future__ import annotations

import pytest
import torch

import fuseops
from fuseops import reference

from support.errors import expect_error_mentions
from support.params import DTYPES

TOL = {
    torch.float64: (1e-12, 1e-12),
    torch.float32: (2e-6, 2e-6),
    torch.bfloat16: (2**-7, 1e-5),
    torch.float16: (2**-10, 1e-5),
}


def assert_close(actual, expected, dtype):
    rtol, atol = TOL[dtype]
    assert actual.shape == expected.shape and actual.dtype == dtype
    torch.testing.assert_close(actual.double(), expected.double(), rtol=rtol, atol=atol)


def wide(*tensors):
    """float64 copies of the floating tensors (positions stay integers)."""
    return [t.double() if t is not None and t.is_floating_point() else t for t in tensors]


# (token dims, heads, kv_heads, head_dim, rotary_dim, interleaved, positions kind)
CASES = [
    ((7,), 4, 2, 64, 64, False, "tokens"),
    ((7,), 4, 1, 64, 64, True, "tokens"),
    ((33,), 8, 8, 128, 128, False, "tokens"),
    ((2, 5), 3, 1, 70, 70, False, "batch"),  # a vector tail in every half row
    ((2, 5), 2, 2, 40, 24, True, "batch"),  # partial rotary
    ((2, 5), 4, 2, 96, 32, False, "broadcast"),  # positions [1, seq]
    ((3, 6), 2, 1, 64, 64, True, "per-token"),  # cos/sin [batch, seq, rd], no positions
    ((1,), 1, 1, 2, 2, False, "tokens"),
    ((0,), 2, 1, 16, 16, False, "tokens"),
]


def make_case(lead, heads, kv_heads, head_dim, rotary_dim, interleaved, kind, dtype, device):
    max_pos = 50
    cos, sin = fuseops.rope_cache(rotary_dim, max_pos, interleaved=interleaved, device=device)
    q = torch.randn(*lead, heads, head_dim, dtype=dtype, device=device)
    k = torch.randn(*lead, kv_heads, head_dim, dtype=dtype, device=device)
    if kind == "tokens":
        positions = torch.randint(0, max_pos, lead, device=device)
    elif kind == "batch":
        positions = torch.randint(0, max_pos, lead, device=device, dtype=torch.int32)
    elif kind == "broadcast":
        positions = torch.arange(lead[-1], device=device).unsqueeze(0)
    else:
        rows = torch.randint(0, max_pos, lead, device=device)
        cos, sin, positions = cos[rows], sin[rows], None
    return q, k, cos, sin, positions


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_forward_matches_float64_reference(case, dtype, device):
    *shape, interleaved, kind = case
    q, k, cos, sin, positions = make_case(*shape, interleaved, kind, dtype, device)
    q_out, k_out = fuseops.rope(q, k, cos, sin, positions, interleaved)
    q_want, k_want = reference.rope(*wide(q, k, cos, sin), positions, interleaved)
    assert_close(q_out, q_want, dtype)
    assert_close(k_out, k_want, dtype)
    assert q_out.is_contiguous() and k_out.is_contiguous()
    # Without key: the query's result alone, the same values.
    single = fuseops.rope(q, None, cos, sin, positions, interleaved)
    torch.testing.assert_close(single, q_out, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES[1:7], ids=str)
def test_gradients_match_float64_autograd(case, dtype, device):
    *shape, interleaved, kind = case
    q, k, cos, sin, positions = make_case(*shape, interleaved, kind, dtype, device)
    q.requires_grad_()
    k.requires_grad_()
    outs = fuseops.rope(q, k, cos, sin, positions, interleaved)
    upstream = [torch.randn_like(o) for o in outs]
    got = torch.autograd.grad(outs, (q, k), upstream)
    qd, kd = (t.detach().double().requires_grad_() for t in (q, k))
    want_outs = reference.rope(qd, kd, cos.double(), sin.double(), positions, interleaved)
    want = torch.autograd.grad(want_outs, (qd, kd), [u.double() for u in upstream])
    for g, w in zip(got, want):
        assert_close(g, w, dtype)
    # The backward op is the float64 reference's transposed rotation too.
    direct = fuseops.rope_backward(*upstream, cos, sin, positions, interleaved)
    for g, w in zip(direct, want):
        assert_close(g, w, dtype)
    torch.testing.assert_close(
        reference.rope_backward(*wide(*upstream, cos, sin), positions, interleaved), want
    )


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary_dim", [8, 12])
def test_gradcheck_and_double_backward(interleaved, rotary_dim, device):
    cos, sin = fuseops.rope_cache(rotary_dim, 20, interleaved=interleaved, device=device)
    cos, sin = cos.double(), sin.double()
    positions = torch.tensor([[4, 19, 0], [7, 7, 2]], device=device)

    def make(shape):
        return torch.randn(shape, dtype=torch.float64, device=device, requires_grad=True)

    q, k = make((2, 3, 3, 12)), make((2, 3, 1, 12))
    pair = lambda q, k: fuseops.rope(q, k, cos, sin, positions, interleaved)  # noqa: E731
    single = lambda q: fuseops.rope(q, None, cos, sin, positions, interleaved)  # noqa: E731
    assert torch.autograd.gradcheck(pair, (q, k))
    assert torch.autograd.gradgradcheck(pair, (q, k))
    assert torch.autograd.gradcheck(single, (q,))
    assert torch.autograd.gradgradcheck(single, (q,))
    backward = lambda g, h: fuseops.rope_backward(g, h, cos, sin, positions, interleaved)  # noqa: E731
    assert torch.autograd.gradcheck(backward, (q, k))


def test_only_one_output_used_gives_gradients_to_its_input(device):
    cos, sin = fuseops.rope_cache(16, 8, device=device)
    q = torch.randn(3, 2, 16, device=device, requires_grad=True)
    k = torch.randn(3, 1, 16, device=device, requires_grad=True)
    positions = torch.tensor([1, 5, 7], device=device)
    q_out, _ = fuseops.rope(q, k, cos, sin, positions)
    q_out.sum().backward()
    want = fuseops.rope_backward(torch.ones_like(q), None, cos, sin, positions)
    torch.testing.assert_close(q.grad, want, rtol=0, atol=0)
    assert k.grad is None


def test_rotation_keeps_norms_and_position_zero_is_identity(device):
    cos, sin = fuseops.rope_cache(64, 10, device=device)
    q = torch.randn(10, 4, 64, dtype=torch.float64, device=device)
    out = fuseops.rope(q, None, cos.double(), sin.double(), torch.arange(10, device=device))
    torch.testing.assert_close(out.norm(dim=-1), q.norm(dim=-1))
    torch.testing.assert_close(out[0], q[0], rtol=0, atol=0)
    # Relative positions: <rope(q, m), rope(k, n)> depends on m - n only.
    k = torch.randn(4, 64, dtype=torch.float64, device=device)
    qs = fuseops.rope(
        q[:1].expand(10, 4, 64), None, cos.double(), sin.double(), torch.arange(10, device=device)
    )
    ks = fuseops.rope(
        k.expand(10, 4, 64), None, cos.double(), sin.double(), torch.arange(10, device=device)
    )
    dots = (qs[1:] * ks[:-1]).sum(-1)
    # cos and sin are float32 (within 2 ulps of the exact values on either
    # device), so cos(a)cos(b) + sin(a)sin(b) is cos(a - b) only to a few
    # 2^-24: each dot is off by at most ~8 * 2^-24 of sum |q_i| |k_i|, and two
    # dots differ by twice that. A wrong rotation is off by O(sum |q_i k_i|).
    bound = 16 * 2**-24 * (q[0].abs() * k.abs()).sum(-1).max().item()
    torch.testing.assert_close(dots, dots[:1].expand_as(dots), rtol=0, atol=bound)


@pytest.mark.parametrize("dtype", DTYPES)
def test_in_place_on_views_of_a_fused_qkv(dtype, device):
    tokens, heads, kv, d = 11, 4, 2, 32
    cos, sin = fuseops.rope_cache(d, 64, device=device)
    positions = torch.randint(0, 64, (tokens,), device=device)
    qkv = torch.randn(tokens, (heads + 2 * kv) * d, dtype=dtype, device=device)
    q = qkv[:, : heads * d].view(tokens, heads, d)
    k = qkv[:, heads * d : (heads + kv) * d].view(tokens, kv, d)
    v = qkv[:, (heads + kv) * d :].clone()
    q_want, k_want = fuseops.rope(q, k, cos, sin, positions)
    returned = fuseops.rope_(q, k, cos, sin, positions)
    assert returned[0] is q and returned[1] is k
    torch.testing.assert_close(q, q_want, rtol=0, atol=0)
    torch.testing.assert_close(k, k_want, rtol=0, atol=0)
    torch.testing.assert_close(qkv[:, (heads + kv) * d :], v, rtol=0, atol=0)
    # Query alone, partial rotary: the tail of head_dim is untouched.
    x = torch.randn(tokens, heads, d, dtype=dtype, device=device)
    tail = x[..., 16:].clone()
    part_cos, part_sin = fuseops.rope_cache(16, 64, interleaved=True, device=device)
    want = fuseops.rope(x, None, part_cos, part_sin, positions, True)
    assert fuseops.rope_(x, None, part_cos, part_sin, positions, True) is x
    torch.testing.assert_close(x, want, rtol=0, atol=0)
    torch.testing.assert_close(x[..., 16:], tail, rtol=0, atol=0)


def test_out_overlapping_its_inputs_is_computed_from_the_inputs(device):
    cos, sin = fuseops.rope_cache(16, 8, device=device)
    positions = torch.tensor([0, 3, 7, 1], device=device)
    buffer = torch.randn(4, 3, 16, device=device)
    q, k = buffer[:, :2], buffer[:, 2:]
    q_want, k_want = fuseops.rope(q.clone(), k.clone(), cos, sin, positions)
    # The outputs swap places with the inputs: out is where k was and more.
    out = torch.empty(4, 2, 16, device=device)
    fuseops.rope(q, k, cos, sin, positions, out=out, key_out=buffer[:, :1])
    torch.testing.assert_close(out, q_want, rtol=0, atol=0)
    torch.testing.assert_close(buffer[:, :1], k_want, rtol=0, atol=0)


def test_overlapping_query_and_key_in_place_are_refused(device):
    cos, sin = fuseops.rope_cache(16, 8, device=device)
    positions = torch.arange(4, device=device)
    x = torch.randn(4, 3, 16, device=device)
    expect_error_mentions(
        lambda: fuseops.rope_(x[:, :2], x[:, 1:], cos, sin, positions),
        ["fuseops::rope.out", "'out'", "'key_out'", "share memory"],
    )
    expect_error_mentions(
        lambda: fuseops.rope_(x, x, cos, sin, positions),
        ["fuseops::rope.out", "'out'", "'key_out'", "share memory"],
    )


def test_cache_dtypes(device):
    # The cache may be float32 for bfloat16 activations (math in float32), or
    # any floating dtype: its values are used as they are.
    q = torch.randn(6, 2, 32, device=device)
    k = torch.randn(6, 1, 32, device=device)
    positions = torch.tensor([5, 0, 9, 2, 2, 8], device=device)
    cos, sin = fuseops.rope_cache(32, 10, device=device)
    for cache_dtype in DTYPES:
        c, s = cos.to(cache_dtype), sin.to(cache_dtype)
        got = fuseops.rope(q, k, c, s, positions)
        want = reference.rope(*wide(q, k, c, s), positions)
        for g, w in zip(got, want):
            assert_close(g, w, torch.float32)
    got = fuseops.rope(q.bfloat16(), k.bfloat16(), cos, sin, positions)
    want = reference.rope(*wide(q.bfloat16(), k.bfloat16(), cos, sin), positions)
    for g, w in zip(got, want):
        assert_close(g, w, torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("interleaved", [False, True])
def test_cache_in_the_input_dtype_gives_the_bits_of_its_float32_copy(dtype, interleaved, device):
    # The CPU kernel reads cos/sin of the input's dtype as they are (no copy
    # per call); their values widened exactly, so the results are those of
    # the same tables in float32, bit for bit: a cache indexed by positions
    # and one row per token (Hugging Face's form), forward and backward.
    q = torch.randn(6, 3, 32, device=device).to(dtype)
    k = torch.randn(6, 1, 32, device=device).to(dtype)
    positions = torch.tensor([5, 0, 9, 2, 2, 8], device=device)
    cos, sin = (t.to(dtype) for t in fuseops.rope_cache(24, 10, device=device))
    rows = (cos[positions], sin[positions])
    for tables, pos in (((cos, sin), positions), (rows, None)):
        wide_tables = [t.float() for t in tables]
        got = fuseops.rope(q, k, *tables, pos, interleaved)
        want = fuseops.rope(q, k, *wide_tables, pos, interleaved)
        assert all(torch.equal(g, w) for g, w in zip(got, want))
        grads = []
        for c, s in (tables, wide_tables):
            qq, kk = q.clone().requires_grad_(), k.clone().requires_grad_()
            sum(
                o.float().square().sum() for o in fuseops.rope(qq, kk, c, s, pos, interleaved)
            ).backward()
            grads.append((qq.grad, kk.grad))
        assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_hugging_face_drop_in(device):
    # Llama's attention: q [batch, heads, seq, head_dim], position_embeddings
    # (cos, sin) [batch, seq, head_dim] in the activations' dtype.
    batch, heads, kv, seq, d = 2, 4, 2, 7, 64
    cos_cache, sin_cache = fuseops.rope_cache(d, 32, device=device)
    position_ids = torch.tensor([[0, 1, 2, 3, 4, 5, 6], [9, 10, 11, 12, 13, 14, 15]], device=device)
    cos, sin = cos_cache[position_ids], sin_cache[position_ids]
    q = torch.randn(batch, heads, seq, d, device=device)
    k = torch.randn(batch, kv, seq, d, device=device)

    def rotate_half(x):
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
        return torch.cat((-x2, x1), dim=-1)

    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    q_want, k_want = q * c + rotate_half(q) * s, k * c + rotate_half(k) * s
    q_got, k_got = fuseops.apply_rotary_pos_emb(q, k, cos, sin)
    assert q_got.shape == q.shape and k_got.shape == k.shape
    torch.testing.assert_close(q_got, q_want, rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(k_got, k_want, rtol=2e-6, atol=2e-6)
    q2, k2 = fuseops.apply_rotary_pos_emb(
        q.transpose(1, 2), k.transpose(1, 2), cos, sin, unsqueeze_dim=2
    )
    torch.testing.assert_close(q2, q_got.transpose(1, 2), rtol=0, atol=0)
    torch.testing.assert_close(k2, k_got.transpose(1, 2), rtol=0, atol=0)


@pytest.mark.parametrize(
    "rotary_dim, scaling, factor, interleaved",
    [
        (64, None, 1.0, False),
        (10, None, 1.0, True),
        (32, "linear", 4.0, False),
        (32, "ntk", 8.0, True),
    ],
)
def test_rope_cache_matches_float64(rotary_dim, scaling, factor, interleaved):
    cos, sin = fuseops.rope_cache(
        rotary_dim, 300, 10000.0, scaling, factor, interleaved=interleaved
    )
    want_cos, want_sin = reference.rope_cache(
        rotary_dim, 300, 10000.0, scaling, factor, interleaved=interleaved
    )
    assert cos.dtype == sin.dtype == torch.float32 and cos.shape == (300, rotary_dim)
    # One float32 rounding of values in [-1, 1] (2^-24 relative; 6e-8 absolute).
    torch.testing.assert_close(cos.double(), want_cos, rtol=0, atol=6e-8)
    torch.testing.assert_close(sin.double(), want_sin, rtol=0, atol=6e-8)


def test_rope_cache_bad_arguments():
    with pytest.raises(ValueError, match="rotary_dim must be a positive even number, got 7"):
        fuseops.rope_cache(7, 10)
    with pytest.raises(ValueError, match="scaling must be None, 'linear' or 'ntk', got 'yarn'"):
        fuseops.rope_cache(8, 10, scaling="yarn")
    with pytest.raises(ValueError, match="factor must be positive, got 0"):
        fuseops.rope_cache(8, 10, scaling="linear", factor=0)


def test_rotary_embedding_module(device):
    m = fuseops.nn.RotaryEmbedding(32, max_position_embeddings=16).to(device)
    assert list(m.state_dict()) == []
    q = torch.randn(5, 2, 32, device=device)
    k = torch.randn(5, 1, 32, device=device)
    positions = torch.tensor([0, 3, 15, 2, 9], device=device)
    cos, sin = fuseops.rope_cache(32, 16, device=device)
    for got, want in zip(m(q, k, positions), fuseops.rope(q, k, cos, sin, positions)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    # A position past the cache grows it (to at least twice its length).
    far = torch.tensor([0, 40, 3, 3, 1], device=device)
    got = m(q, None, far)
    assert m.cos_cached.shape == (41, 32) and m.cos_cached.device.type == torch.device(device).type
    cos, sin = fuseops.rope_cache(32, 41, device=device)
    torch.testing.assert_close(got, fuseops.rope(q, None, cos, sin, far), rtol=0, atol=0)
    fixed = fuseops.nn.RotaryEmbedding(32, max_position_embeddings=16, grow=False)
    if device == "cpu":
        expect_error_mentions(
            lambda: fixed(q.cpu(), None, far.cpu()),
            ["fuseops::rope.single", "'positions'", "[0, 16)", "40"],
        )


def test_torch_rotary_embedding_is_replaced_by_the_fused_module():
    # The plain-torch module computes the Hugging Face formula; replace_modules
    # swaps it for RotaryEmbedding, which gives the same rotation (float32
    # math on both sides: a few ulp apart) with the same gradients.
    model = torch.nn.Sequential(fuseops.nn.TorchRotaryEmbedding(16, max_position_embeddings=8))
    q = torch.randn(2, 6, 3, 16, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 6, 1, 16, dtype=torch.float64, requires_grad=True)
    positions = torch.arange(6).expand(2, 6)
    expected = [t.detach() for t in model[0](q, k, positions)]
    expected_grads = torch.autograd.grad(
        sum(o.square().sum() for o in model[0](q, k, positions)), (q, k)
    )
    replaced = fuseops.nn.replace_modules(model)
    assert [(r.old, r.new) for r in replaced] == [("TorchRotaryEmbedding", "RotaryEmbedding")]
    assert type(model[0]) is fuseops.nn.RotaryEmbedding
    got = model[0](q, k, positions)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g.detach(), e, rtol=1e-12, atol=1e-12)
    grads = torch.autograd.grad(sum(o.square().sum() for o in got), (q, k))
    for g, e in zip(grads, expected_grads):
        torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-12)


def test_bad_inputs_name_the_op_and_argument():
    cos, sin = fuseops.rope_cache(8, 16)
    q, k = torch.randn(4, 2, 8), torch.randn(4, 1, 8)
    positions = torch.arange(4)
    cases = [
        (
            lambda: fuseops.rope(q, k, cos, sin, positions + 13),
            ["fuseops::rope", "'positions'", "[0, 16)", "to 16"],
        ),
        (
            lambda: fuseops.rope(q, k, cos, sin, positions - 2),
            ["fuseops::rope", "'positions'", "from -2"],
        ),
        (
            lambda: fuseops.rope(q, k, cos, sin, positions.float()),
            ["fuseops::rope", "'positions'", "int64 or int32", "Float"],
        ),
        (
            lambda: fuseops.rope(q, k, cos, sin, torch.arange(3)),
            ["fuseops::rope", "'positions'", "broadcastable", "[4]", "[3]"],
        ),
        (
            lambda: fuseops.rope(q, torch.randn(4, 1, 6), cos, sin, positions),
            ["fuseops::rope", "'key'", "head_dim", "[4, 1, 6]"],
        ),
        (
            lambda: fuseops.rope(q, k.double(), cos, sin, positions),
            ["fuseops::rope", "'key'", "dtype", "Double"],
        ),
        (
            lambda: fuseops.rope(q, k, cos[:, :3], sin[:, :3], positions),
            ["fuseops::rope", "rotary dim", "even", "got 3"],
        ),
        (
            lambda: fuseops.rope(q[..., :6], k[..., :6], cos, sin, positions),
            ["fuseops::rope", "rotary dim", "at most head_dim (6", "got 8"],
        ),
        (
            lambda: fuseops.rope(q, k, cos, sin[:8], positions),
            ["fuseops::rope", "'sin'", "same shape as 'cos'"],
        ),
        (
            lambda: fuseops.rope(q, k, cos[None], sin[None], positions),
            ["fuseops::rope", "'cos'", "[max_pos, rotary_dim]", "[1, 16, 8]"],
        ),
        (
            lambda: fuseops.rope(q, k, cos[:3], sin[:3]),
            ["fuseops::rope", "one row per token", "[4, 8]", "[3, 8]"],
        ),
        (
            lambda: fuseops.rope(q[0, 0], None, cos, sin, positions),
            ["fuseops::rope.single", "'input'", "[..., heads, head_dim]"],
        ),
        (
            lambda: fuseops.rope(q.int(), None, cos, sin, positions),
            ["fuseops::rope.single", "'input'", "dtype"],
        ),
        (
            lambda: fuseops.rope_backward(q, k, cos, sin, positions + 20),
            ["fuseops::rope_backward", "'positions'"],
        ),
        (
            lambda: fuseops.rope(
                q,
                k,
                cos,
                sin,
                positions,
                out=torch.empty(4, 2, 8, dtype=torch.float64),
                key_out=torch.empty(4, 1, 8),
            ),
            ["fuseops::rope.out", "'out'", "dtype"],
        ),
    ]
    for call, fragments in cases:
        expect_error_mentions(call, fragments)
    # Nothing is written when a position is refused.
    x = torch.randn(4, 2, 8)
    before = x.clone()
    expect_error_mentions(lambda: fuseops.rope_(x, None, cos, sin, positions * 10), ["'positions'"])
    torch.testing.assert_close(x, before, rtol=0, atol=0)


def test_cos_and_sin_are_not_differentiable():
    cos, sin = fuseops.rope_cache(8, 16)
    q = torch.randn(4, 2, 8, requires_grad=True)
    k = torch.randn(4, 1, 8, requires_grad=True)
    positions = torch.arange(4)
    for args in [(q, k), (q, None)]:
        expect_error_mentions(
            lambda: fuseops.rope(*args, cos.requires_grad_(), sin, positions),
            ["fuseops::rope", "'cos' and 'sin' are not differentiable", "torch.no_grad()"],
        )
        cos.requires_grad_(False)
    # Under no_grad a cache that requires grad is just read.
    with torch.no_grad():
        fuseops.rope(q, k, cos.requires_grad_(), sin, positions)


def _random_view(arena, rng, tokens, heads, head_dim):
    """A [tokens, heads, head_dim] view of `arena` at a random offset, in a
    random layout: contiguous, rows padded (a slice of a fused projection),
    heads outermost, or every other element along head_dim."""
    kind = rng.choice(["contiguous", "padded", "heads-first", "strided"])
    if kind == "contiguous":
        strides = (heads * head_dim, head_dim, 1)
    elif kind == "padded":
        strides = (heads * head_dim + int(rng.integers(0, 12)), head_dim, 1)
    elif kind == "heads-first":
        strides = (head_dim, tokens * head_dim, 1)
    else:
        strides = (2 * heads * head_dim, 2 * head_dim, 2)
    span = 1 + sum((n - 1) * s for n, s in zip((tokens, heads, head_dim), strides))
    offset = int(rng.integers(0, arena.numel() - span + 1))
    return arena.as_strided((tokens, heads, head_dim), strides, offset)


def _addressed(arena, view):
    marks = torch.zeros(arena.numel(), dtype=torch.bool)
    marks.as_strided(view.shape, view.stride(), view.storage_offset()).fill_(True)
    return marks


@pytest.mark.parametrize("seed", range(300))
def test_fuzz_out_and_in_place_aliasing(seed):
    """q, k, out and key_out as random views of one buffer, overlapping or
    not, out= sometimes exactly q (in place): the call either writes what
    float64 math gives on copies of the inputs taken before the call and
    changes no element outside out= and key_out=, or refuses because out=
    and key_out= may share elements (then changes nothing). Refusal of
    disjoint outputs is allowed only for layouts the exact test does not
    cover (rows not made of whole heads, or head_dim strided)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    tokens, heads, kv, head_dim = (
        int(rng.integers(1, 5)),
        int(rng.integers(1, 4)),
        int(rng.integers(1, 3)),
        2 * int(rng.integers(1, 6)),
    )
    rotary_dim = 2 * int(rng.integers(1, head_dim // 2 + 1))
    interleaved = bool(rng.integers(0, 2))
    arena = torch.randn(400, dtype=torch.float64)
    q = _random_view(arena, rng, tokens, heads, head_dim)
    k = _random_view(arena, rng, tokens, kv, head_dim)
    out = q if rng.random() < 0.3 else _random_view(arena, rng, tokens, heads, head_dim)
    key_out = k if rng.random() < 0.3 else _random_view(arena, rng, tokens, kv, head_dim)
    cos, sin = fuseops.rope_cache(rotary_dim, 8, interleaved=interleaved)
    cos, sin = cos.double(), sin.double()
    positions = torch.from_numpy(rng.integers(0, 8, tokens))
    q_want, k_want = reference.rope(q.clone(), k.clone(), cos, sin, positions, interleaved)
    before = arena.clone()
    written = _addressed(arena, out) | _addressed(arena, key_out)
    outputs_meet = bool((_addressed(arena, out) & _addressed(arena, key_out)).any())
    exact_layouts = all(
        v.stride(-1) == 1 and (v.shape[1] == 1 or v.stride(1) == head_dim) for v in (out, key_out)
    )
    try:
        fuseops.rope(q, k, cos, sin, positions, interleaved, out=out, key_out=key_out)
    except RuntimeError as error:
        assert "fuseops::rope.out" in str(error) and "share memory" in str(error), str(error)
        assert outputs_meet or not exact_layouts, f"seed {seed}: disjoint outputs refused"
        torch.testing.assert_close(arena, before, rtol=0, atol=0)
        return
    assert not outputs_meet, f"seed {seed}: overlapping outputs accepted"
    torch.testing.assert_close(out, q_want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(key_out, k_want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(arena[~written], before[~written], rtol=0, atol=0)
