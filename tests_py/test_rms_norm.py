"""fuseops.rms_norm / fused_add_rms_norm against fuseops.reference, F.rms_norm
and float64 autograd: the numerics (opcheck, compilers, Meta, pybind, out=
and every CPU build are in test_conformance.py, fed by
fuseops/ops/rms_norm.py's samples).

Tolerances, per dtype:
- float64: 1e-10 relative; same formula, different summation order.
- float32: 1e-5 relative (+1e-6 absolute) of a float64 reference: a row's sum
  of squares is accumulated in float32 lanes of a few hundred terms each
  (relative error ~1e-6), then one rsqrt and two multiplies.
- bfloat16/float16: both fuseops and the reference compute in float32 and
  round once, so they differ by at most one unit in the last place of the
  dtype: 1e-2 relative for bfloat16 (8-bit mantissa, 2^-7 = 0.8%), 2e-3 for
  float16 (2^-10), against the float32-computed reference rounded to the dtype.
Weight gradients sum over rows; their absolute tolerance grows with sqrt(rows).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import fuseops
from fuseops import reference

from support.errors import expect_error_mentions
from support.params import DTYPES

SHAPES = [(1, 1), (5,), (7, 33), (4, 3, 64), (2, 4099), (300, 96), (0, 16), (3, 0)]
TOL = {
    torch.float64: (1e-10, 1e-12),
    torch.float32: (1e-5, 1e-6),
    torch.bfloat16: (1e-2, 1e-2),
    torch.float16: (2e-3, 2e-3),
}


def assert_close(actual, expected, dtype, atol_scale=1.0):
    rtol, atol = TOL[dtype]
    assert actual.shape == expected.shape
    torch.testing.assert_close(
        actual.double(), expected.double(), rtol=rtol, atol=atol * atol_scale, equal_nan=True
    )


def make(shape, dtype, layout="contiguous", device="cpu"):
    def randn(s):
        return torch.randn(s, dtype=dtype, device=device)

    if layout == "contiguous":
        return randn(shape)
    if layout == "transposed":
        if len(shape) < 2:
            return randn(shape)
        return randn(tuple(reversed(shape))).transpose(0, -1)
    if layout == "sliced":
        return randn(shape[:-1] + (shape[-1] * 2 + 1,))[..., 1::2]
    raise AssertionError(layout)


def expected_forward(x, w, eps):
    """The reference in float64 (float32/float64 inputs) or in float32 rounded
    to the dtype (bfloat16/float16)."""
    compute = torch.float64 if x.dtype in (torch.float32, torch.float64) else torch.float32
    if eps is None:
        eps = torch.finfo(torch.float64 if x.dtype == torch.float64 else torch.float32).eps
    wc = w.to(compute) if w is not None else None
    return reference.rms_norm(x.to(compute), wc, eps).to(x.dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced"])
@pytest.mark.parametrize("with_weight", [True, False], ids=["weight", "no_weight"])
def test_forward_matches_reference(dtype, shape, layout, with_weight, device):
    x = make(shape, dtype, layout, device)
    w = (
        make((shape[-1],), dtype, layout if layout == "sliced" else "contiguous", device)
        if with_weight
        else None
    )
    for eps in (1e-6, None):
        y = fuseops.rms_norm(x, w, eps)
        assert y.dtype == dtype and y.is_contiguous()
        assert_close(y, expected_forward(x, w, eps), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_matches_torch_rms_norm_including_default_eps(dtype):
    # Rows of tiny values make the eps visible.
    x = torch.randn(16, 40, dtype=dtype) * 1e-4
    w = torch.randn(40, dtype=dtype)
    assert_close(fuseops.rms_norm(x, w), F.rms_norm(x, (40,), w), dtype)
    assert_close(
        torch.nn.RMSNorm(40, dtype=dtype)(x), fuseops.nn.RMSNorm(40, dtype=dtype)(x), dtype
    )


def test_weight_of_another_dtype():
    x = torch.randn(6, 24, dtype=torch.bfloat16)
    w = torch.randn(24)
    y = fuseops.rms_norm(x, w, 1e-6)
    assert y.dtype == torch.bfloat16
    assert_close(y, reference.rms_norm(x.float(), w, 1e-6).bfloat16(), torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_weight_in_the_input_dtype_gives_the_bits_of_its_float32_copy(dtype, device):
    # The CPU kernels read a weight of the input's dtype as it is (no copy
    # per call); its values widened exactly, so the results are those of the
    # same weight in float32, bit for bit, in every form of the op.
    x = torch.randn(5, 300, device=device).to(dtype)
    residual = torch.randn(5, 300, device=device).to(dtype)
    w = torch.randn(300, device=device).to(dtype)
    assert torch.equal(fuseops.rms_norm(x, w, 1e-6), fuseops.rms_norm(x, w.float(), 1e-6))
    out, out32 = torch.empty_like(x), torch.empty_like(x)
    fuseops.rms_norm(x, w, 1e-6, out=out)
    fuseops.rms_norm(x, w.float(), 1e-6, out=out32)
    assert torch.equal(out, out32)
    for a, b in zip(
        fuseops.fused_add_rms_norm(x, residual, w, 1e-6),
        fuseops.fused_add_rms_norm(x, residual, w.float(), 1e-6),
    ):
        assert torch.equal(a, b)


def test_nan_and_inf_propagate_as_in_pytorch():
    x = torch.randn(4, 20)
    x[0, 3] = float("nan")
    x[1, 5] = float("inf")
    x[2, 7] = float("-inf")
    w = torch.randn(20)
    y = fuseops.rms_norm(x, w, 1e-6)
    expected = F.rms_norm(x, (20,), w, 1e-6)
    torch.testing.assert_close(y, expected, equal_nan=True, rtol=1e-5, atol=1e-6)
    assert y[0].isnan().all()
    out, _ = fuseops.fused_add_rms_norm(x, torch.zeros_like(x), w, 1e-6)
    torch.testing.assert_close(out, expected, equal_nan=True, rtol=1e-5, atol=1e-6)


def float64_grads(x, w, grad, eps, residual=None, grad_new_residual=None):
    """Gradients of the reference computed by float64 autograd."""
    xd = x.detach().double().requires_grad_()
    wd = w.detach().double().requires_grad_() if w is not None else None
    rd = residual.detach().double().requires_grad_() if residual is not None else None
    if rd is None:
        reference.rms_norm(xd, wd, eps).backward(grad.double())
    else:
        out, new_residual = reference.fused_add_rms_norm(xd, rd, wd, eps)
        torch.autograd.backward([out, new_residual], [grad.double(), grad_new_residual.double()])
    return xd.grad, (wd.grad if wd is not None else None), (rd.grad if rd is not None else None)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("with_weight", [True, False], ids=["weight", "no_weight"])
def test_autograd_matches_float64(dtype, shape, layout, with_weight, device):
    x = make(shape, dtype, layout, device).requires_grad_()
    w = make((shape[-1],), dtype, device=device).requires_grad_() if with_weight else None
    grad = make(shape, dtype, layout, device)
    fuseops.rms_norm(x, w, 1e-5).backward(grad)
    # bfloat16/float16 inputs are rounded already: the float64 reference
    # takes the very same values.
    gx, gw, _ = float64_grads(x, w, grad, 1e-5)
    assert_close(x.grad, gx.to(dtype), dtype)
    if with_weight:
        rows = max(1, x.numel() // max(shape[-1], 1))
        assert w.grad.dtype == dtype
        assert_close(w.grad, gw.to(dtype), dtype, atol_scale=math.sqrt(rows))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(7, 33), (2, 4099), (0, 8)], ids=str)
def test_backward_op_matches_reference_backward(dtype, shape):
    x = torch.randn(shape, dtype=dtype)
    w = torch.randn(shape[-1], dtype=dtype)
    grad = torch.randn(shape, dtype=dtype)
    out, rstd = fuseops.rms_norm_forward(x, w, 1e-6)
    assert rstd.shape == shape[:-1]
    assert rstd.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert_close(out, fuseops.rms_norm(x, w, 1e-6), dtype)
    gx, gw = fuseops.rms_norm_backward(grad, x, w, rstd)
    compute = torch.float64 if dtype in (torch.float32, torch.float64) else torch.float32
    rgx, rgw = reference.rms_norm_backward(
        grad.to(compute), x.to(compute), w.to(compute), rstd.to(compute)
    )
    assert_close(gx, rgx.to(dtype), dtype)
    assert_close(gw, rgw.to(dtype), dtype, atol_scale=math.sqrt(max(1, shape[0])))
    gx_none, gw_none = fuseops.rms_norm_backward(grad, x, None, rstd)
    assert gw_none.numel() == 0


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_fused_add_forward_and_backward(dtype, shape, layout, device):
    x = make(shape, dtype, layout, device).requires_grad_()
    residual = make(shape, dtype, layout, device).requires_grad_()
    w = make((shape[-1],), dtype, device=device).requires_grad_()
    out, new_residual = fuseops.fused_add_rms_norm(x, residual, w, 1e-6)
    # The sum is rounded to the dtype exactly as `x + residual` rounds it.
    assert torch.equal(new_residual.detach(), (x + residual).detach())
    assert_close(out, expected_forward(new_residual.detach(), w.detach(), 1e-6), dtype)

    g_out = make(shape, dtype, layout, device)
    g_res = make(shape, dtype, layout, device)
    torch.autograd.backward([out, new_residual], [g_out, g_res])
    gx, gw, gr = float64_grads(x, w, g_out, 1e-6, residual, g_res)
    assert_close(x.grad, gx.to(dtype), dtype)
    assert_close(residual.grad, gr.to(dtype), dtype)
    rows = max(1, x.numel() // max(shape[-1], 1))
    assert_close(w.grad, gw.to(dtype), dtype, atol_scale=math.sqrt(rows))
    if x.numel() > 0:
        assert x.grad.data_ptr() != residual.grad.data_ptr()


def test_fused_add_with_only_one_output_used():
    x = torch.randn(5, 12, requires_grad=True)
    r = torch.randn(5, 12, requires_grad=True)
    w = torch.randn(12, requires_grad=True)
    out, _ = fuseops.fused_add_rms_norm(x, r, w, 1e-6)
    out.sum().backward()
    gx, gw, gr = float64_grads(x, w, torch.ones(5, 12), 1e-6, r, torch.zeros(5, 12))
    assert_close(x.grad, gx.float(), torch.float32)
    assert_close(w.grad, gw.float(), torch.float32)

    x.grad = r.grad = w.grad = None
    _, new_residual = fuseops.fused_add_rms_norm(x, r, w, 1e-6)
    (new_residual * 3).sum().backward()
    assert torch.equal(x.grad, torch.full((5, 12), 3.0))
    assert torch.equal(r.grad, torch.full((5, 12), 3.0))
    assert w.grad is None


def test_fused_add_backward_op():
    x = torch.randn(9, 40)
    w = torch.randn(40)
    g = torch.randn(9, 40)
    g_res = torch.randn(9, 40)
    out, new_residual, rstd = fuseops.fused_add_rms_norm_forward(x, x, w, 1e-6)
    gs, gw = fuseops.fused_add_rms_norm_backward(g, g_res, new_residual, w, rstd)
    rgx, rgw = fuseops.rms_norm_backward(g, new_residual, w, rstd)
    torch.testing.assert_close(gs, rgx + g_res, rtol=1e-6, atol=1e-6)
    assert torch.equal(gw, rgw)
    gs_none, _ = fuseops.fused_add_rms_norm_backward(g, None, new_residual, w, rstd)
    assert torch.equal(gs_none, rgx)


def test_gradcheck_and_gradgradcheck_float64():
    x = torch.randn(4, 9, dtype=torch.float64, requires_grad=True)
    r = torch.randn(4, 9, dtype=torch.float64, requires_grad=True)
    w = torch.randn(9, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: fuseops.rms_norm(a, b, 1e-5), (x, w))
    assert torch.autograd.gradcheck(lambda a: fuseops.rms_norm(a, None, 1e-5), (x,))
    assert torch.autograd.gradgradcheck(lambda a, b: fuseops.rms_norm(a, b, 1e-5), (x, w))
    assert torch.autograd.gradcheck(
        lambda a, b, c: fuseops.fused_add_rms_norm(a, b, c, 1e-5), (x, r, w)
    )
    assert torch.autograd.gradgradcheck(
        lambda a, b, c: fuseops.fused_add_rms_norm(a, b, c, 1e-5), (x, r, w)
    )


def test_out_in_place_and_both_outputs():
    x = torch.randn(8, 50)
    w = torch.randn(50)
    expected = fuseops.rms_norm(x, w, 1e-6)
    y = x.clone()
    fuseops.rms_norm(y, w, 1e-6, out=y)
    assert torch.equal(y, expected)

    r = torch.randn(8, 50)
    exp_out, exp_res = fuseops.fused_add_rms_norm(x, r, w, 1e-6)
    xb, rb = x.clone(), r.clone()
    returned = fuseops.fused_add_rms_norm(xb, rb, w, 1e-6, out=xb, residual_out=rb)
    assert returned[0] is xb and returned[1] is rb
    assert torch.equal(xb, exp_out) and torch.equal(rb, exp_res)
    with pytest.raises(TypeError, match="both out= and residual_out="):
        fuseops.fused_add_rms_norm(x, r, w, out=torch.empty(8, 50))


@pytest.mark.parametrize(
    "call, fragments",
    [
        (
            lambda: fuseops.rms_norm(torch.ones(3, dtype=torch.int32)),
            ["fuseops::rms_norm", "'input'", "Int"],
        ),
        (
            lambda: fuseops.rms_norm(torch.tensor(1.0)),
            ["fuseops::rms_norm", "'input'", "0-dimensional"],
        ),
        (
            lambda: fuseops.rms_norm(torch.ones(2, 3), torch.ones(4)),
            ["fuseops::rms_norm", "'weight'", "[3]", "[4]"],
        ),
        (
            lambda: fuseops.fused_add_rms_norm(torch.ones(2, 3), torch.ones(3, 3)),
            ["fuseops::fused_add_rms_norm", "'residual'", "shape"],
        ),
        (
            lambda: fuseops.fused_add_rms_norm(
                torch.ones(2, 3), torch.ones(2, 3, dtype=torch.float16)
            ),
            ["fuseops::fused_add_rms_norm", "'residual'", "dtype"],
        ),
        (
            lambda: fuseops.rms_norm_backward(
                torch.ones(2, 3), torch.ones(2, 3), None, torch.ones(3)
            ),
            ["fuseops::rms_norm_backward", "'rstd'", "shape"],
        ),
    ],
)
def test_bad_input_errors_name_op_and_argument(call, fragments):
    expect_error_mentions(call, fragments)


class TinyBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1 = torch.nn.RMSNorm(24)
        self.proj = torch.nn.Linear(24, 24)
        self.norm2 = torch.nn.RMSNorm([24], eps=1e-5, elementwise_affine=False)
        self.norm_2d = torch.nn.RMSNorm([3, 24])  # over two dimensions: not replaced

    def forward(self, x):
        return self.norm_2d(self.norm2(self.proj(self.norm1(x))) + x)


def test_rms_norm_module_is_a_drop_in():
    m = fuseops.nn.RMSNorm(16, eps=1e-5)
    assert isinstance(m, torch.nn.RMSNorm)
    assert list(m.state_dict()) == list(torch.nn.RMSNorm(16).state_dict()) == ["weight"]
    assert fuseops.nn.RMSNorm(16, elementwise_affine=False).weight is None


def test_replace_modules_keeps_outputs_and_gradients():
    torch.manual_seed(0)
    model = TinyBlock()
    with torch.no_grad():
        model.norm1.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 3, 24)
    expected = model(x)
    expected.square().sum().backward()
    expected_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()

    replaced = fuseops.nn.replace_modules(model)
    assert sorted((r.name, r.old, r.new) for r in replaced) == [
        ("norm1", "RMSNorm", "RMSNorm"),
        ("norm2", "RMSNorm", "RMSNorm"),
    ]
    assert type(model.norm1) is fuseops.nn.RMSNorm
    assert type(model.norm_2d) is torch.nn.RMSNorm
    actual = model(x)
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    actual.square().sum().backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected_grads[name], rtol=1e-4, atol=1e-5)
