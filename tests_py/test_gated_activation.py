"""fuseops.swiglu / geglu (separate and packed forms, backward, MLP modules)
against fuseops.reference and torch itself: the numerics (opcheck,
compilers, Meta, pybind, out= and every CPU build are in
test_conformance.py, fed by fuseops/ops/gated_activation.py's samples).

Tolerances as in test_activation.py: float32/float64 against the float64
reference within 1e-5 relative; bfloat16/float16 against the float32-computed
reference rounded to the dtype, within one unit in the last place.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fuseops
from fuseops import reference

from support import exact
from support.errors import expect_error_mentions
from support.params import DTYPES

# Shapes of the result [..., H]; packed inputs are [..., 2*H].
SHAPES = [(0, 4), (), (1,), (7,), (3, 17), (2, 0, 3), (2, 3, 4, 5), (300, 67)]
FORMS = ["swiglu", "geglu-none", "geglu-tanh"]


def tolerances(dtype):
    return {
        torch.float32: dict(rtol=1e-5, atol=2e-6),
        torch.float64: dict(rtol=1e-5, atol=1e-6),
        torch.bfloat16: dict(rtol=2**-7, atol=1e-3),
        torch.float16: dict(rtol=2**-10, atol=1e-4),
    }[dtype]


def wide(dtype):
    return torch.float64 if dtype in (torch.float32, torch.float64) else torch.float32


def assert_close(actual, wanted, dtype, scale=1.0):
    """`scale`: the largest factor multiplying the activation (up, the
    upstream gradient), which scales the absolute floor too."""
    assert actual.dtype == dtype and actual.shape == wanted.shape
    tol = tolerances(dtype)
    tol["atol"] *= max(1.0, float(scale))
    torch.testing.assert_close(actual, wanted.to(dtype), equal_nan=True, **tol)


def absmax(t):
    return t.abs().max().item() if t.numel() else 1.0


def fused(form, gate, up=None, **kwargs):
    if form == "swiglu":
        return fuseops.swiglu(gate, up, **kwargs)
    return fuseops.geglu(gate, up, form.split("-")[1], **kwargs)


def fused_backward(form, grad, gate, up=None):
    if form == "swiglu":
        return fuseops.swiglu_backward(grad, gate, up)
    return fuseops.geglu_backward(grad, gate, up, form.split("-")[1])


def act(form, x):
    if form == "swiglu":
        return reference.silu(x)
    return reference.gelu(x, form.split("-")[1])


def act_backward(form, grad, x):
    if form == "swiglu":
        return reference.silu_backward(grad, x)
    return reference.gelu_backward(grad, x, form.split("-")[1])


def packed_input(shape, dtype, device="cpu"):
    packed_shape = shape[:-1] + (2 * shape[-1],) if shape else (2,)
    return (torch.randn(packed_shape, dtype=torch.float64, device=device) * 3).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("form", FORMS)
def test_forward_separate_views_contiguous_and_packed(dtype, shape, form, device):
    packed = packed_input(shape, dtype, device)
    gate, up = packed.chunk(2, dim=-1)  # strided views of the packed tensor
    if not shape:
        gate, up = gate.reshape(()), up.reshape(())
    w = wide(dtype)
    want = act(form, gate.to(w)) * up.to(w)
    scale = absmax(up)
    assert_close(fused(form, gate, up), want, dtype, scale)
    assert_close(fused(form, gate.contiguous(), up.contiguous()), want, dtype, scale)
    if shape:
        assert_close(fused(form, packed), want, dtype, scale)
        # Transposed leading dims: the packed rows are not evenly spaced.
        if len(shape) >= 3:
            t = packed.transpose(0, 1)
            tg, tu = t.chunk(2, dim=-1)
            assert_close(fused(form, t), act(form, tg.to(w)) * tu.to(w), dtype, scale)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [s for s in SHAPES if s], ids=str)
@pytest.mark.parametrize("form", FORMS)
def test_backward_separate_and_packed(dtype, shape, form, device):
    packed = packed_input(shape, dtype, device)
    gate, up = packed.chunk(2, dim=-1)
    grad = (torch.randn(shape, dtype=torch.float64, device=device)).to(dtype)
    w = wide(dtype)
    want_gate = act_backward(form, grad.to(w) * up.to(w), gate.to(w))
    want_up = grad.to(w) * act(form, gate.to(w))
    grad_gate, grad_up = fused_backward(form, grad, gate, up)
    scale = absmax(grad) * absmax(packed)
    assert_close(grad_gate, want_gate, dtype, scale)
    assert_close(grad_up, want_up, dtype, scale)
    want_packed = torch.cat([want_gate, want_up], -1)
    assert_close(fused_backward(form, grad, packed), want_packed, dtype, scale)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("form", FORMS)
def test_autograd_matches_reference(dtype, form):
    packed = packed_input((23, 19), dtype).requires_grad_()
    upstream = torch.randn(23, 19, dtype=torch.float64).to(dtype)
    fused(form, packed).backward(upstream)
    ref_packed = packed.detach().to(wide(dtype)).requires_grad_()
    approximate = "none" if form == "swiglu" else form.split("-")[1]
    ref = (
        reference.swiglu if form == "swiglu" else (lambda x: reference.geglu(x, None, approximate))
    )
    ref(ref_packed).backward(upstream.to(wide(dtype)))
    scale = absmax(upstream) * absmax(packed.detach())
    assert_close(packed.grad, ref_packed.grad, dtype, scale)

    gate = packed.detach()[:, :19].clone().requires_grad_()
    up = packed.detach()[:, 19:].clone().requires_grad_()
    fused(form, gate, up).backward(upstream)
    assert_close(gate.grad, ref_packed.grad[:, :19], dtype, scale)
    assert_close(up.grad, ref_packed.grad[:, 19:], dtype, scale)


@pytest.mark.parametrize("form", FORMS)
def test_gradcheck_float64(form):
    packed = torch.randn(4, 10, dtype=torch.float64, requires_grad=True)
    gate = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    up = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: fused(form, x), (packed,))
    assert torch.autograd.gradcheck(lambda a, b: fused(form, a, b), (gate, up))


def test_double_backward_is_an_error_not_a_wrong_answer():
    gate = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    up = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    # Refused when the graph of the gradient would be recorded (the policy of
    # cpp/ops/autograd/no_derivative.h).
    y = fuseops.swiglu(gate, up).sum()
    with pytest.raises(RuntimeError, match="swiglu_backward is not differentiable"):
        torch.autograd.grad(y, gate, create_graph=True)


def test_special_values_follow_float64_math():
    """Every pair of special gate and up values, against the exact formula
    in float64 (see support/exact.py: not ATen, whose float32 gelu(+Inf) is
    NaN in its AVX-512 build)."""
    specials = torch.tensor(
        [0.0, 1.0, -1.0, 30.0, -30.0, float("inf"), float("-inf"), float("nan")]
    )
    gate = specials.repeat_interleave(len(specials))
    up = specials.repeat(len(specials))
    for name, y in (
        ("silu", fuseops.swiglu(gate, up)),
        ("none", fuseops.geglu(gate, up, "none")),
        ("tanh", fuseops.geglu(gate, up, "tanh")),
    ):
        torch.testing.assert_close(
            y.double(),
            exact.activation(gate, name) * up.double(),
            rtol=1e-5,
            atol=1e-6,
            equal_nan=True,
        )


def test_out_is_the_gate_half_of_its_own_input():
    packed = torch.randn(6, 20)
    gate, up = packed.chunk(2, -1)
    buffer = packed.clone()
    g, u = buffer.chunk(2, -1)
    fuseops.swiglu(g, u, out=g)
    torch.testing.assert_close(g, F.silu(gate) * up)


@pytest.mark.parametrize(
    "call, fragments",
    [
        (
            lambda: fuseops.swiglu(torch.ones(3, 4), torch.ones(3, 5)),
            ["fuseops::swiglu", "'up'", "shape"],
        ),
        (
            lambda: fuseops.swiglu(torch.ones(3), torch.ones(3, dtype=torch.float64)),
            ["fuseops::swiglu", "'up'", "dtype"],
        ),
        (
            lambda: fuseops.swiglu(torch.ones(3, 5)),
            ["fuseops::swiglu.packed", "'input'", "even", "[3, 5]"],
        ),
        (lambda: fuseops.swiglu(torch.ones(())), ["fuseops::swiglu.packed", "'input'"]),
        (
            lambda: fuseops.geglu(torch.ones(3), torch.ones(3), "fast"),
            ["fuseops::geglu", "'approximate'", "'fast'"],
        ),
        (
            lambda: fuseops.geglu(torch.ones(2, 4), approximate="erf"),
            ["fuseops::geglu.packed", "'approximate'"],
        ),
        (
            lambda: fuseops.swiglu(torch.ones(2, 4, dtype=torch.int64)),
            ["fuseops::swiglu.packed", "'input'", "Long"],
        ),
        (
            lambda: fuseops.swiglu_backward(torch.ones(3, 4), torch.ones(3, 4)),
            ["fuseops::swiglu_backward.packed", "'grad_output'", "[3, 2]"],
        ),
    ],
)
def test_bad_input_errors_name_op_and_argument(call, fragments):
    expect_error_mentions(call, fragments)


class _LlamaMLP(torch.nn.Module):
    """The composite the fused blocks replace (Llama's MLP)."""

    def __init__(self, dim, hidden, act):
        super().__init__()
        self.gate_proj = torch.nn.Linear(dim, hidden, bias=False)
        self.up_proj = torch.nn.Linear(dim, hidden, bias=False)
        self.down_proj = torch.nn.Linear(hidden, dim, bias=False)
        self.act = act

    def forward(self, x):
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


@pytest.mark.parametrize(
    "cls, kwargs, act",
    [
        (fuseops.nn.SwiGLU, {}, F.silu),
        (fuseops.nn.GeGLU, {}, F.gelu),
        (fuseops.nn.GeGLU, {"approximate": "tanh"}, lambda t: F.gelu(t, approximate="tanh")),
    ],
)
def test_mlp_blocks_match_the_composite_and_load_its_checkpoint(cls, kwargs, act):
    ref = _LlamaMLP(12, 40, act).double()
    block = cls(12, 40, **kwargs, dtype=torch.float64)
    block.load_state_dict(ref.state_dict())  # same keys: gate_proj/up_proj/down_proj
    x = torch.randn(3, 5, 12, dtype=torch.float64)
    y_ref, y = ref(x), block(x)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-12)
    y_ref.sum().backward()
    y.sum().backward()
    for (name, p), (_, q) in zip(ref.named_parameters(), block.named_parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-10, atol=1e-12, msg=name)


def test_mlp_block_options():
    block = fuseops.nn.SwiGLU(8, 16, out_features=4, bias=True)
    assert block(torch.randn(2, 8)).shape == (2, 4)
    assert block.gate_proj.bias is not None
    with pytest.raises(ValueError, match="approximate"):
        fuseops.nn.GeGLU(8, 16, approximate="fast")
