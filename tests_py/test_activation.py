"""fuseops.gelu / silu / bias_gelu (and their backward ops and modules)
against fuseops.reference and torch itself: the numerics (opcheck,
compilers, Meta, pybind, out= and every CPU build are in
test_conformance.py, fed by fuseops/ops/activation.py's samples).

Tolerances: float32/float64 results are compared with the reference computed
in float64, within 1e-5 relative: the vectorized erf/exp are accurate to a
few ulp, far below that. The float32 absolute floor, 2e-6, covers the
reference's own textbook tanh form, 1 + tanh(u), which cancels in float32
for x < -5 where the true value is still up to ~1.1e-6 (fuseops computes it
as a sigmoid, without cancellation). bfloat16/float16
results are computed in float32 and rounded once, so they are compared with
the float32-computed reference rounded to the dtype, within one unit in the
last place (2^-7 bfloat16, 2^-10 float16 relative).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import fuseops
from fuseops import reference

from support import exact
from support.errors import expect_error_mentions
from support.params import DTYPES

SHAPES = [(0,), (), (1,), (7,), (3, 17), (5, 0, 3), (2, 3, 4, 5), (1000, 67)]
APPROXIMATIONS = ["none", "tanh"]


def tolerances(dtype):
    return {
        torch.float32: dict(rtol=1e-5, atol=2e-6),
        torch.float64: dict(rtol=1e-5, atol=1e-6),
        torch.bfloat16: dict(rtol=2**-7, atol=1e-3),
        torch.float16: dict(rtol=2**-10, atol=1e-4),
    }[dtype]


def expected(fn, *args, dtype):
    """fn on float64 inputs (float32/float64) or float32 inputs rounded to
    the dtype (bfloat16/float16)."""
    wide = torch.float64 if dtype in (torch.float32, torch.float64) else torch.float32
    result = fn(*(a.to(wide) if isinstance(a, torch.Tensor) else a for a in args))
    if isinstance(result, tuple):
        return tuple(r.to(dtype) for r in result)
    return result.to(dtype)


def assert_close(actual, wanted, dtype, scale=1.0):
    """`scale`: the largest factor multiplying the activation (the upstream
    gradient in backward), which scales the absolute floor too."""
    assert actual.dtype == dtype and actual.shape == wanted.shape
    tol = tolerances(dtype)
    tol["atol"] *= max(1.0, float(scale))
    torch.testing.assert_close(actual, wanted, equal_nan=True, **tol)


def make_input(shape, dtype, layout, device="cpu"):
    x = torch.randn(shape, dtype=torch.float64, device=device) * 3
    if layout == "transposed" and len(shape) > 1:
        x = x.transpose(0, -1).contiguous().transpose(0, -1)
    elif layout == "sliced" and len(shape) > 0:
        x = torch.cat([x, x], dim=-1)[..., ::2]
    return x.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced"])
@pytest.mark.parametrize("approximate", APPROXIMATIONS)
def test_gelu_forward_and_backward(dtype, shape, layout, approximate, device):
    x = make_input(shape, dtype, layout, device)
    g = make_input(shape, dtype, layout, device)
    y = fuseops.gelu(x, approximate)
    assert y.is_contiguous()
    assert_close(y, expected(reference.gelu, x, approximate, dtype=dtype), dtype)
    assert_close(
        fuseops.gelu_backward(g, x, approximate),
        expected(reference.gelu_backward, g, x, approximate, dtype=dtype),
        dtype,
        scale=g.abs().max() if g.numel() else 1.0,
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced"])
def test_silu_forward_and_backward(dtype, shape, layout, device):
    x = make_input(shape, dtype, layout, device)
    g = make_input(shape, dtype, layout, device)
    assert_close(fuseops.silu(x), expected(reference.silu, x, dtype=dtype), dtype)
    assert_close(
        fuseops.silu_backward(g, x),
        expected(reference.silu_backward, g, x, dtype=dtype),
        dtype,
        scale=g.abs().max() if g.numel() else 1.0,
    )


BIAS_SHAPES = [(0, 5), (7,), (3, 17), (2, 0, 3), (300, 67), (2, 33, 130), (1100, 64)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", BIAS_SHAPES, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced"])
@pytest.mark.parametrize("approximate", APPROXIMATIONS)
def test_bias_gelu_forward_and_backward(dtype, shape, layout, approximate, device):
    x = make_input(shape, dtype, layout, device)
    bias = make_input(shape[-1:], dtype, "sliced" if layout == "sliced" else "contiguous", device)
    g = make_input(shape, dtype, layout, device)
    assert_close(
        fuseops.bias_gelu(x, bias, approximate),
        expected(reference.bias_gelu, x, bias, approximate, dtype=dtype),
        dtype,
    )
    grad_input, grad_bias = fuseops.bias_gelu_backward(g, x, bias, approximate)
    want_input, _ = expected(reference.bias_gelu_backward, g, x, bias, approximate, dtype=dtype)
    assert_close(grad_input, want_input, dtype, scale=g.abs().max() if g.numel() else 1.0)
    # grad_bias sums up to 1100 rows: float64 reference, with the float32
    # accumulation's error (~rows * 2^-24 of the sum of magnitudes) allowed
    # for, plus the final rounding to the dtype.
    exact = reference.bias_gelu_backward(g.double(), x.double(), bias.double(), approximate)[
        0
    ].reshape(-1, shape[-1])
    scale = exact.abs().sum(0) + 1
    err = (grad_bias.double() - exact.sum(0)).abs()
    assert grad_bias.dtype == dtype and grad_bias.shape == bias.shape
    assert bool((err <= tolerances(dtype)["rtol"] * 2 * scale).all()), err.max()


SPECIALS = [
    0.0,
    -0.0,
    1.0,
    -1.0,
    30.0,
    -30.0,
    100.0,
    -100.0,
    float("inf"),
    float("-inf"),
    float("nan"),
]


def assert_special_values(actual, expected):
    """NaN where the float64 formula is NaN, the same infinities, finite
    values to float32 accuracy (1e-5 relative, 1e-6 absolute floor for the
    tiny tails such as silu'(-30) = -2.7e-12)."""
    torch.testing.assert_close(actual.double(), expected, rtol=1e-5, atol=1e-6, equal_nan=True)


def test_special_values_follow_float64_math():
    """fuseops differs from torch here on purpose where torch's answer is
    not the formula's (python/README.md, "Special values"): ATen's AVX-512 float32
    gelu(+Inf) is NaN."""
    x = torch.tensor(SPECIALS)
    g = torch.ones_like(x)
    for approximate in APPROXIMATIONS:
        assert_special_values(fuseops.gelu(x, approximate), exact.activation(x, approximate))
        assert_special_values(
            fuseops.gelu_backward(g, x, approximate), exact.activation_derivative(x, approximate)
        )
        zero_bias = torch.zeros(()).expand(x.shape[-1]).contiguous()
        assert_special_values(
            fuseops.bias_gelu(x, zero_bias, approximate), exact.activation(x, approximate)
        )
    assert_special_values(fuseops.silu(x), exact.activation(x, "silu"))
    assert_special_values(fuseops.silu_backward(g, x), exact.activation_derivative(x, "silu"))


def test_float32_accuracy_over_the_whole_range():
    """Every float32 input region, against exact float64 formulas: the
    inlined exp's range reduction, its overflow (x > 88.72) and flush
    (x < -87) boundaries, and both tails. Allowed error 1e-5 relative plus
    an absolute floor: 1e-9 for the forward values (in the far tails they
    are below 1e-9 and exp's argument, rounded to float32, has a condition
    number |argument| there); 2e-7 for the derivatives, which are sums of
    O(1) terms that cancel where a derivative crosses zero (silu's near
    x = -1.28), so their error is relative to those terms; for GELU-erf,
    1e-7 * |x| more, the documented bound of the erf approximation ATen uses
    too (A&S 7.1.26, |error| <= 1.5e-7)."""
    boundaries = torch.tensor([87.0, 87.3365, 88.0, 88.7228, 88.75, 89.0, 3.5, 5.0, 10.0])
    x = torch.cat([torch.linspace(-100, 100, 400_001), boundaries, -boundaries])
    x64 = x.double()
    g = torch.ones_like(x)
    s = torch.sigmoid(x64)
    inner = math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64**3)
    s2 = torch.sigmoid(2 * inner)
    d_inner = math.sqrt(2 / math.pi) * (1 + 3 * 0.044715 * x64**2)
    cdf = 0.5 * torch.special.erfc(-x64 / math.sqrt(2))
    pdf = torch.exp(-0.5 * x64**2) / math.sqrt(2 * math.pi)
    cases = {
        "silu": (fuseops.silu(x), x64 * s, 1e-9, 0.0),
        "silu_backward": (fuseops.silu_backward(g, x), s * (1 + x64 * (1 - s)), 2e-7, 0.0),
        "gelu tanh": (fuseops.gelu(x, "tanh"), x64 * s2, 1e-9, 0.0),
        "gelu_backward tanh": (
            fuseops.gelu_backward(g, x, "tanh"),
            s2 + 2 * x64 * s2 * (1 - s2) * d_inner,
            2e-7,
            0.0,
        ),
        "gelu none": (fuseops.gelu(x, "none"), x64 * cdf, 1e-9, 1e-7),
        "gelu_backward none": (fuseops.gelu_backward(g, x, "none"), cdf + x64 * pdf, 2e-7, 1e-7),
    }
    for name, (got, want, floor, erf_floor) in cases.items():
        allowed = 1e-5 * want.abs() + floor + erf_floor * x64.abs().clamp(min=1)
        excess = (got.double() - want).abs() / allowed
        worst = int(excess.argmax())
        assert excess[worst] <= 1, (
            f"{name}: x={x[worst].item()!r} got {got[worst].item()!r} want {want[worst].item()!r}"
        )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_autograd_matches_torch(dtype):
    wide = torch.float64 if dtype in (torch.float32, torch.float64) else torch.float32
    x = make_input((37, 19), dtype, "contiguous").requires_grad_()
    bias = make_input((19,), dtype, "contiguous").requires_grad_()
    upstream = make_input((37, 19), dtype, "contiguous")
    scale = upstream.abs().max()
    for approximate in APPROXIMATIONS:
        x.grad = bias.grad = None
        fuseops.bias_gelu(x, bias, approximate).backward(upstream)
        x_ref = x.detach().to(wide).requires_grad_()
        bias_ref = bias.detach().to(wide).requires_grad_()
        F.gelu(x_ref + bias_ref, approximate=approximate).backward(upstream.to(wide))
        assert_close(x.grad, x_ref.grad.to(dtype), dtype, scale)
        # A sum over 37 rows, rounded once to the dtype.
        torch.testing.assert_close(
            bias.grad.to(wide), bias_ref.grad, rtol=2 * tolerances(dtype)["rtol"], atol=1e-3
        )
    x.grad = None
    fuseops.silu(x).backward(upstream)
    x_ref = x.detach().to(wide).requires_grad_()
    F.silu(x_ref).backward(upstream.to(wide))
    assert_close(x.grad, x_ref.grad.to(dtype), dtype, scale)


@pytest.mark.parametrize("approximate", APPROXIMATIONS)
def test_gradcheck_and_gradgradcheck_float64(approximate):
    x = torch.randn(6, 9, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(9, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: fuseops.gelu(t, approximate), (x,))
    assert torch.autograd.gradgradcheck(lambda t: fuseops.gelu(t, approximate), (x,))
    assert torch.autograd.gradcheck(lambda t, b: fuseops.bias_gelu(t, b, approximate), (x, bias))
    assert torch.autograd.gradcheck(fuseops.silu, (x,))
    assert torch.autograd.gradgradcheck(fuseops.silu, (x,))


def test_double_backward_of_bias_gelu_is_an_error_not_a_wrong_answer():
    x = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(5, dtype=torch.float64, requires_grad=True)
    # Refused when the graph of the gradient would be recorded (the policy of
    # cpp/ops/autograd/no_derivative.h).
    y = fuseops.bias_gelu(x, bias).sum()
    with pytest.raises(RuntimeError, match="bias_gelu_backward is not differentiable"):
        torch.autograd.grad(y, x, create_graph=True)


def test_out_in_place():
    x = torch.randn(8, 5)
    y = x.clone()
    fuseops.gelu(y, out=y)
    assert_close(y, expected(reference.gelu, x, dtype=torch.float32), torch.float32)


@pytest.mark.parametrize(
    "call, fragments",
    [
        (
            lambda: fuseops.gelu(torch.ones(3), "exact"),
            ["fuseops::gelu", "'approximate'", "'none' or 'tanh'", "'exact'"],
        ),
        (
            lambda: fuseops.gelu(torch.ones(3), out=torch.empty(3), approximate="x"),
            ["fuseops::gelu.out", "'approximate'"],
        ),
        (
            lambda: fuseops.gelu(torch.ones(3, dtype=torch.int32)),
            ["fuseops::gelu", "'input'", "Int"],
        ),
        (lambda: fuseops.silu(torch.ones(3, dtype=torch.complex64)), ["fuseops::silu", "'input'"]),
        (
            lambda: fuseops.silu_backward(torch.ones(3), torch.ones(4)),
            ["fuseops::silu_backward", "'grad_output'", "shape"],
        ),
        (
            lambda: fuseops.bias_gelu(torch.ones(3, 4), torch.ones(3)),
            ["fuseops::bias_gelu", "'bias'", "size"],
        ),
        (
            lambda: fuseops.bias_gelu(torch.ones(3, 4), torch.ones(1, 4)),
            ["fuseops::bias_gelu", "'bias'", "1-D"],
        ),
        (
            lambda: fuseops.bias_gelu(torch.ones(3, 4), torch.ones(4, dtype=torch.float64)),
            ["fuseops::bias_gelu", "'bias'", "dtype"],
        ),
        (
            lambda: fuseops.bias_gelu(torch.ones(3, 4), torch.ones(4), "erf"),
            ["fuseops::bias_gelu", "'approximate'", "'erf'"],
        ),
    ],
)
def test_bad_input_errors_name_op_and_argument(call, fragments):
    expect_error_mentions(call, fragments)


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(16, 32),
            torch.nn.GELU(),
            torch.nn.Linear(32, 32),
            torch.nn.GELU(approximate="tanh"),
            torch.nn.Linear(32, 32),
            torch.nn.SiLU(),
            torch.nn.SiLU(inplace=True),
            torch.nn.Linear(32, 4),
        )

    def forward(self, x):
        return self.net(x)


def test_replace_modules_keeps_outputs_and_gradients():
    model = _Model().double()
    x = torch.randn(10, 16, dtype=torch.float64)
    before = model(x)
    before.sum().backward()
    grads_before = {n: p.grad.clone() for n, p in model.named_parameters()}
    state_before = {k: v.clone() for k, v in model.state_dict().items()}
    model.zero_grad()

    replaced = fuseops.nn.replace_modules(model)
    assert [(r.name, r.old, r.new) for r in replaced] == [
        ("net.1", "GELU", "GELU"),
        ("net.3", "GELU", "GELU"),
        ("net.5", "SiLU", "SiLU"),
    ]
    assert type(model.net[1]) is fuseops.nn.GELU and model.net[3].approximate == "tanh"
    assert type(model.net[6]) is torch.nn.SiLU  # inplace=True is left to torch
    assert model.state_dict().keys() == state_before.keys()
    after = model(x)
    after.sum().backward()
    torch.testing.assert_close(after, before, rtol=1e-10, atol=1e-12)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads_before[n], rtol=1e-10, atol=1e-12)


def test_modules_construct_like_torch():
    assert isinstance(fuseops.nn.GELU("tanh"), torch.nn.GELU)
    assert fuseops.nn.GELU(approximate="tanh").approximate == "tanh"
    silu = fuseops.nn.SiLU(inplace=True)
    x = torch.randn(5)
    want = F.silu(x)
    assert silu(x) is x  # torch's in-place path
    torch.testing.assert_close(x, want)
