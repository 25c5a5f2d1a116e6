"""Regressions found by fuzzing (other than out= aliasing, in
test_aliasing.py): unclear errors for missing tensors, valid input refused
with hidden size 0, and gradients silently missing through the backward ops.
"""

from __future__ import annotations

import math

import pytest
import torch

import fuseops
from fuseops import reference

from support.errors import expect_error_mentions


def x34():
    return torch.randn(3, 4)


# (op as the dispatcher names it, argument, call) for every op with a tensor
# argument left as None, through the public wrapper and through torch.ops.
MISSING_TENSOR_CALLS = [
    ("fuseops::relu", "input", lambda: fuseops.relu(None)),
    ("fuseops::relu", "input", lambda: torch.ops.fuseops.relu(None)),
    ("fuseops::relu_backward", "result", lambda: fuseops.relu_backward(x34(), None)),
    ("fuseops::gelu", "input", lambda: fuseops.gelu(None)),
    ("fuseops::gelu_backward", "grad_output", lambda: fuseops.gelu_backward(None, x34())),
    ("fuseops::silu", "input", lambda: torch.ops.fuseops.silu(None)),
    ("fuseops::silu_backward", "input", lambda: fuseops.silu_backward(x34(), None)),
    ("fuseops::bias_gelu", "bias", lambda: fuseops.bias_gelu(x34(), None)),
    ("fuseops::bias_gelu", "input", lambda: fuseops.bias_gelu(None, torch.randn(4))),
    ("fuseops::bias_gelu_backward", "bias", lambda: fuseops.bias_gelu_backward(x34(), x34(), None)),
    ("fuseops::swiglu", "gate", lambda: torch.ops.fuseops.swiglu(None, x34())),
    ("fuseops::swiglu", "up", lambda: torch.ops.fuseops.swiglu(x34(), None)),
    ("fuseops::swiglu.packed", "input", lambda: fuseops.swiglu(None)),
    ("fuseops::swiglu_backward", "gate", lambda: fuseops.swiglu_backward(x34(), None, x34())),
    ("fuseops::swiglu_backward.packed", "input", lambda: fuseops.swiglu_backward(x34(), None)),
    ("fuseops::geglu", "up", lambda: torch.ops.fuseops.geglu(x34(), None)),
    ("fuseops::geglu.packed", "input", lambda: fuseops.geglu(None)),
    ("fuseops::geglu_backward", "up", lambda: torch.ops.fuseops.geglu_backward(x34(), x34(), None)),
    ("fuseops::rms_norm", "input", lambda: fuseops.rms_norm(None, torch.randn(4))),
    (
        "fuseops::rms_norm_forward",
        "input",
        lambda: fuseops.rms_norm_forward(None, torch.randn(4, requires_grad=True)),
    ),
    (
        "fuseops::rms_norm_backward",
        "rstd",
        lambda: fuseops.rms_norm_backward(x34(), x34(), None, None),
    ),
    ("fuseops::fused_add_rms_norm", "residual", lambda: fuseops.fused_add_rms_norm(x34(), None)),
    (
        "fuseops::fused_add_rms_norm_backward",
        "new_residual",
        lambda: fuseops.fused_add_rms_norm_backward(x34(), None, None, None, torch.ones(3)),
    ),
    ("fuseops::layer_norm", "input", lambda: fuseops.layer_norm(None)),
]


@pytest.mark.parametrize(
    "op,arg,call",
    MISSING_TENSOR_CALLS,
    ids=[f"{op}-{arg}-{i}" for i, (op, arg, _) in enumerate(MISSING_TENSOR_CALLS)],
)
def test_missing_tensor_names_op_and_argument(op, arg, call):
    expect_error_mentions(call, [op, f"'{arg}'", "undefined"])


@pytest.mark.parametrize("fused", [False, True], ids=["rms_norm", "fused_add_rms_norm"])
def test_hidden_size_zero_with_weight_and_create_graph(fused):
    # Each row is empty: the result is empty, the weight gradient an empty sum.
    x = torch.randn(3, 0, dtype=torch.float64, requires_grad=True)
    w = torch.randn(0, dtype=torch.float64, requires_grad=True)
    if fused:
        r = torch.randn(3, 0, dtype=torch.float64, requires_grad=True)
        y = fuseops.fused_add_rms_norm(x, r, w)[0]
        wanted = reference.fused_add_rms_norm(x, r, w)[0]
    else:
        y = fuseops.rms_norm(x, w)
        wanted = reference.rms_norm(x, w)
    assert y.shape == wanted.shape == (3, 0)
    grad_x, grad_w = torch.autograd.grad(y.sum(), (x, w), create_graph=True)
    assert grad_x.shape == (3, 0) and grad_w.shape == (0,)


# python/README.md, "Where results differ from torch": with an infinite upstream
# gradient, gelu_backward multiplies it by gelu'(x) computed whole. Where
# gelu'(x) is tiny but not zero (x = -8: about -4e-14 for the erf form,
# -1e-20 for tanh) the product is -inf, the exact limit; torch's vectorized
# CPU path (64 elements here) distributes the product over terms one of
# which has underflowed to 0, and inf * 0 gives NaN. In float16 at x = -13.5
# (erf form) fuseops' float32 derivative is already 0 (NaN); torch's float16
# result depends on the CPU (-inf on AMD Zen 4, NaN on an Intel Xeon with
# AVX512_FP16), so either is accepted for torch there.
EXTREME_GELU = [
    ("none", torch.float32, -8.0, float("-inf"), ("nan",)),
    ("tanh", torch.float32, -8.0, float("-inf"), ("nan",)),
    ("none", torch.float16, -13.5, "nan", (float("-inf"), "nan")),
]


def exact_gelu_derivative(x, approximate):
    """gelu'(x) in float64, in forms that keep its tiny negative tail."""
    if approximate == "none":
        phi = math.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
        return 0.5 * math.erfc(-x / math.sqrt(2)) + x * phi
    k, c = math.sqrt(2 / math.pi), 0.044715
    e = math.exp(2 * k * (x + c * x**3))  # 1 + tanh(u) = 2e / (1 + e)
    du = k * (1 + 3 * c * x * x)
    return e / (1 + e) + 0.5 * x * 4 * e / (1 + e) ** 2 * du


@pytest.mark.parametrize("approximate,dtype,x,ours,torchs", EXTREME_GELU)
def test_gelu_backward_of_infinite_gradient_where_the_derivative_is_tiny(
    approximate, dtype, x, ours, torchs
):
    assert exact_gelu_derivative(x, approximate) < 0  # inf * gelu'(x) -> -inf
    xt = torch.full((64,), x, dtype=dtype)
    upstream = torch.full((64,), float("inf"), dtype=dtype)
    xr = xt.clone().requires_grad_()
    torch.nn.functional.gelu(xr, approximate=approximate).backward(upstream)

    def is_pinned(got, pinned):
        return got.isnan().all() if pinned == "nan" else (got == pinned).all()

    assert is_pinned(fuseops.gelu_backward(upstream, xt, approximate), ours)
    assert any(is_pinned(xr.grad, pinned) for pinned in torchs), xr.grad
    # A finite upstream gradient agrees with torch.
    torch.testing.assert_close(
        fuseops.gelu_backward(torch.ones_like(xt), xt, approximate),
        torch.ops.aten.gelu_backward(torch.ones_like(xt), xt, approximate=approximate),
    )


def test_rms_norm_rows_whose_squares_overflow_float32():
    # python/README.md: where the row's mean square overflows float32, rstd is 0; the
    # output is 0 and the gradients 0 or NaN, never a finite nonzero value
    # (torch is no better there, with NaN in other places).
    x = (torch.randn(3, 16, dtype=torch.float64) * 1e30).float().requires_grad_()
    w = torch.randn(16, requires_grad=True)
    y = fuseops.rms_norm(x, w)
    assert torch.equal(y, torch.zeros_like(y))
    for upstream in (torch.ones(3, 16), torch.full((3, 16), 1e30)):
        grads = torch.autograd.grad(fuseops.rms_norm(x, w), (x, w), upstream)
        for g in grads:
            assert ((g == 0) | g.isnan()).all()


def test_layer_norm_rows_whose_squares_overflow_float32_are_exact():
    # python/README.md: layer_norm rescales rows whose squared deviations overflow
    # float32 (CPU), so they normalise like any other row: output and
    # gradients match float64 within float32 accumulation (1e-5; the input
    # gradient scales with rstd ~ 1e-30, hence the relative comparison).
    x = (torch.randn(3, 16, dtype=torch.float64) * 1e30).float().requires_grad_()
    w = torch.randn(16, requires_grad=True)
    b = torch.randn(16, requires_grad=True)
    upstream = torch.randn(3, 16)
    y = fuseops.layer_norm(x, w, b)
    grads = torch.autograd.grad(y, (x, w, b), upstream)
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, b))
    y64 = torch.nn.functional.layer_norm(x64, (16,), w64, b64, 1e-5)
    grads64 = torch.autograd.grad(y64, (x64, w64, b64), upstream.double())
    torch.testing.assert_close(y.double(), y64, rtol=1e-5, atol=1e-5)
    for g, g64 in zip(grads, grads64):
        scale = g64.abs().max()
        torch.testing.assert_close(g.double() / scale, g64 / scale, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_norm_weight_gradient_near_float32_max(op):
    # python/README.md: weight gradients are float32 sums over rows. A sum beyond
    # float32's range is +-inf with the exact sum's sign; a sum whose terms'
    # magnitudes add up to less than float32's maximum is accurate (1e-5,
    # float32 accumulation); in between a partial sum may overflow, giving
    # +-inf or NaN though the exact sum fits (torch too, in other columns).
    x = torch.randn(8, 16)
    w = torch.ones(16, requires_grad=True)
    upstream = torch.full((8, 16), 1e38)
    (grad_w,) = torch.autograd.grad(getattr(fuseops, op)(x, w), (w,), upstream)
    x64 = x.double()
    if op == "layer_norm":
        centred = x64 - x64.mean(-1, keepdim=True)
        x_hat = centred * (centred.pow(2).mean(-1, keepdim=True) + 1e-5).rsqrt()
    else:
        eps = torch.finfo(torch.float32).eps  # rms_norm's default
        x_hat = x64 * (x64.pow(2).mean(-1, keepdim=True) + eps).rsqrt()
    terms = upstream.double() * x_hat
    exact, magnitude = terms.sum(0), terms.abs().sum(0)
    float32_max = torch.finfo(torch.float32).max
    beyond, safe = exact.abs() > float32_max, magnitude < float32_max
    assert beyond.any() and safe.any()
    assert torch.equal(grad_w[beyond], exact[beyond].sign().float() * math.inf)
    torch.testing.assert_close(grad_w[safe].double(), exact[safe], rtol=1e-5, atol=0)
    between = ~beyond & ~safe
    close = (grad_w.double() - exact).abs() <= 1e-5 * exact.abs()
    assert (close | ~grad_w.isfinite())[between].all()


def test_fused_gelu_backwards_and_silu_with_infinite_gradient():
    # python/README.md: bias_gelu and geglu share gelu_backward's -inf at x = -8;
    # silu_backward matches torch everywhere on a fine grid.
    x = torch.full((4, 16), -8.0)
    upstream = torch.full((4, 16), float("inf"))
    for approximate in ("none", "tanh"):
        grad_x, _ = fuseops.bias_gelu_backward(upstream, x, torch.zeros(16), approximate)
        grad_gate, _ = fuseops.geglu_backward(upstream, x, torch.ones(4, 16), approximate)
        assert (grad_x == -math.inf).all() and (grad_gate == -math.inf).all()
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        grid = torch.linspace(-1000, 1000, 20001, dtype=torch.float64).to(dtype)
        for sign in (1, -1):
            g = torch.full_like(grid, sign * math.inf)
            torch.testing.assert_close(
                fuseops.silu_backward(g, grid),
                torch.ops.aten.silu_backward(g, grid),
                equal_nan=True,
                rtol=0,
                atol=0,
            )


# --- found by the property-based fuzzer (test_fuzz.py) ---------------------


def test_causal_conv1d_forward_without_x_names_the_op_and_argument():
    # Was "tensor does not have a device" from autograd's input handling.
    expect_error_mentions(
        lambda: fuseops.causal_conv1d_forward(None, torch.randn(4, 3)),
        ["fuseops::causal_conv1d_forward", "'x'"],
    )


def test_rope_refuses_sin_on_another_device():
    # Only cos was checked: sin on the meta device was read as CPU memory.
    q, cos = torch.randn(2, 1, 4), torch.randn(2, 4)
    for call in (
        lambda: fuseops.rope(q, None, cos, cos.to("meta")),
        lambda: fuseops.rope_backward(q, None, cos, cos.to("meta")),
    ):
        expect_error_mentions(call, ["fuseops::rope", "'sin'", "device"])


@pytest.mark.parametrize("option", ["softcap", "z_loss"])
def test_cross_entropy_refuses_options_beyond_float32(option):
    # softcap=1e300 became inf in the float32 math: a NaN loss where the
    # exact one is finite.
    logits, target = torch.randn(3, 5), torch.tensor([0, 1, 4])
    kwargs = {option: 1e300}
    expect_error_mentions(
        lambda: fuseops.cross_entropy(logits, target, **kwargs),
        ["fuseops::cross_entropy", f"'{option}'", "float32"],
    )


def test_layer_norm_backward_reference_takes_native_statistics():
    # The reference missed the statistics' trailing 1 (native_layer_norm's form).
    x, g = torch.randn(3, 8, dtype=torch.float64), torch.randn(3, 8, dtype=torch.float64)
    _, mean, rstd = fuseops.layer_norm_forward(x, None, None, 1e-5)
    want = reference.layer_norm_backward(g, x, None, mean, rstd)
    got = reference.layer_norm_backward(g, x, None, mean[:, None], rstd[:, None])
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("shape", [(0,), (3, 0), (5,), (2, 3, 4)])
def test_references_sum_weight_gradients_over_rows_of_any_shape(shape):
    # reshape(-1, 0) is ambiguous, and sum over no dimensions sums them all:
    # the references' bias/weight gradients got hidden size 0 and 1-D input wrong.
    x, g = torch.randn(shape, dtype=torch.float64), torch.randn(shape, dtype=torch.float64)
    w = torch.randn(shape[-1:], dtype=torch.float64)
    _, grad_bias = reference.bias_gelu_backward(g, x, w)
    got, want = fuseops.bias_gelu_backward(g, x, w)[1], grad_bias
    assert got.shape == want.shape == w.shape
    torch.testing.assert_close(got, want)
    rstd = fuseops.rms_norm_forward(x, w, 1e-6)[1]
    got, want = (
        fuseops.rms_norm_backward(g, x, w, rstd)[1],
        reference.rms_norm_backward(g, x, w, rstd)[1],
    )
    assert got.shape == want.shape == w.shape
    torch.testing.assert_close(got, want)
