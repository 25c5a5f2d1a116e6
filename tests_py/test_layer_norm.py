"""fuseops.layer_norm / layer_norm_backward / fuseops.nn.LayerNorm against
fuseops.reference, torch.nn.functional.layer_norm and float64: the numerics
(opcheck, compilers, Meta, pybind, out= and every CPU build are in
test_conformance.py, fed by fuseops/ops/layer_norm.py's samples).

Tolerances (relative and absolute; inputs and outputs are O(1)):
- float32/float64: 1e-5 of the float64 result. fuseops accumulates in
  float32 (float64), over rows of at most a few thousand elements here: an
  error of ~1e-6.
- bfloat16/float16: fuseops computes in float32 and rounds once, so it must
  match the float64 result rounded to the dtype within one rounding step:
  1e-2 for bfloat16 (8-bit mantissa), 2e-3 for float16 (11-bit mantissa).
- grad_weight/grad_bias are sums over all rows; their tolerances grow with
  sqrt(rows), the growth of a sum's rounding error.
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

SHAPES = [(1,), (7,), (3, 17), (5, 0, 33), (2, 3, 64), (37, 1000), (16, 4099)]
AFFINE = [(False, False), (True, False), (False, True), (True, True)]
TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}


def stats_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def make_input(shape, dtype, layout, device="cpu"):
    def randn(s):
        return torch.randn(s, dtype=dtype, device=device) * 3 + 1

    if layout == "contiguous" or len(shape) < 2:
        return randn(shape)
    if layout == "transposed":
        return randn(tuple(reversed(shape))).transpose(0, -1)
    if layout == "sliced":
        return randn(shape[:-1] + (shape[-1] * 2 + 1,))[..., 1::2]
    raise AssertionError(layout)


def make_affine(hidden, dtype, with_weight, with_bias, device="cpu"):
    weight = torch.randn(hidden, dtype=dtype, device=device) if with_weight else None
    bias = torch.randn(hidden, dtype=dtype, device=device) if with_bias else None
    return weight, bias


def as_double(t):
    return None if t is None else t.double()


def as_detached(t):
    return None if t is None else t.detach()


def assert_close_to(actual, expected_double, dtype, scale=1.0):
    assert actual.dtype == dtype
    assert actual.shape == expected_double.shape
    tol = TOLERANCE[dtype] * scale
    torch.testing.assert_close(
        actual.double(), expected_double.to(dtype).double(), rtol=tol, atol=tol, equal_nan=True
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced"])
@pytest.mark.parametrize("affine", AFFINE, ids=lambda a: f"w{int(a[0])}b{int(a[1])}")
def test_forward_matches_reference(dtype, shape, layout, affine, device):
    x = make_input(shape, dtype, layout, device)
    weight, bias = make_affine(shape[-1], dtype, *affine, device)
    y = fuseops.layer_norm(x, weight, bias, 1e-5)
    assert y.is_contiguous()
    assert_close_to(y, reference.layer_norm(x.double(), as_double(weight), as_double(bias)), dtype)
    native = F.layer_norm(x.double(), (shape[-1],), as_double(weight), as_double(bias))
    assert_close_to(y, native, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("affine", AFFINE, ids=lambda a: f"w{int(a[0])}b{int(a[1])}")
def test_autograd_matches_float64_reference(dtype, shape, layout, affine, device):
    x = make_input(shape, dtype, layout, device).requires_grad_()
    weight, bias = make_affine(shape[-1], dtype, *affine, device)
    params = [p.requires_grad_() for p in (weight, bias) if p is not None]
    upstream = torch.randn(shape, dtype=dtype, device=device)
    fuseops.layer_norm(x, weight, bias).backward(upstream)

    x64 = x.detach().double().requires_grad_()
    params64 = [p.detach().double().requires_grad_() for p in params]
    w64 = params64[0] if weight is not None else None
    b64 = params64[-1] if bias is not None else None
    reference.layer_norm(x64, w64, b64).backward(upstream.double())

    assert_close_to(x.grad, x64.grad, dtype)
    rows = max(1, x.numel() // max(shape[-1], 1))
    for p, p64 in zip(params, params64):
        assert_close_to(p.grad, p64.grad, dtype, scale=math.sqrt(rows))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("with_weight", [False, True])
def test_backward_op_matches_reference(dtype, with_weight):
    x = torch.randn(33, 130, dtype=dtype)
    weight = torch.randn(130, dtype=dtype) if with_weight else None
    _, mean, rstd = fuseops.layer_norm_forward(x, weight, None, 1e-5)
    assert mean.dtype == rstd.dtype == stats_dtype(dtype)
    assert mean.shape == rstd.shape == (33,)
    grad = torch.randn(33, 130, dtype=dtype)
    actual = fuseops.layer_norm_backward(grad, x, weight, mean, rstd)
    expected = reference.layer_norm_backward(
        grad.double(), x.double(), as_double(weight), mean.double(), rstd.double()
    )
    for a, e, scale in zip(actual, expected, (1.0, math.sqrt(33), math.sqrt(33))):
        assert_close_to(a, e, dtype, scale)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("affine", AFFINE, ids=lambda a: f"w{int(a[0])}b{int(a[1])}")
def test_forward_statistics_feed_backward_like_autograd(dtype, affine):
    # What a caller writing its own autograd does: keep (mean, rstd) from
    # layer_norm_forward and hand them to layer_norm_backward.
    x = (torch.randn(4, 9, 70, dtype=dtype) * 3 + 1).requires_grad_()
    weight, bias = make_affine(70, dtype, *affine)
    params = [p.requires_grad_() for p in (weight, bias) if p is not None]
    out, mean, rstd = fuseops.layer_norm_forward(x, weight, bias, 1e-5)
    assert out.requires_grad and not mean.requires_grad and not rstd.requires_grad
    assert torch.equal(out, fuseops.layer_norm(x, weight, bias, 1e-5))
    upstream = torch.randn(4, 9, 70, dtype=dtype)
    out.backward(upstream)

    grads = fuseops.layer_norm_backward(upstream, x.detach(), as_detached(weight), mean, rstd)
    assert torch.equal(grads[0], x.grad)
    if weight is not None:
        assert torch.equal(grads[1], weight.grad)
    if bias is not None:
        assert torch.equal(grads[2], bias.grad)
    x_ref = x.detach().clone().requires_grad_()
    params_ref = [p.detach().clone().requires_grad_() for p in params]
    w_ref = params_ref[0] if weight is not None else None
    b_ref = params_ref[-1] if bias is not None else None
    F.layer_norm(x_ref, (70,), w_ref, b_ref, 1e-5).backward(upstream)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=tol, atol=tol)
    for p, p_ref in zip(params, params_ref):
        torch.testing.assert_close(p.grad, p_ref.grad, rtol=tol * 6, atol=tol * 6)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_backward_takes_native_layer_norm_statistics(dtype):
    # torch.native_layer_norm keeps a trailing 1 in the statistics' shape and,
    # on CPU, input's dtype; its own backward is the reference for them.
    x = torch.randn(3, 11, 40, dtype=dtype) * 3 + 1
    weight, bias = torch.randn(40, dtype=dtype), torch.randn(40, dtype=dtype)
    _, mean, rstd = torch.native_layer_norm(x, [40], weight, bias, 1e-5)
    assert mean.shape == rstd.shape == (3, 11, 1) and mean.dtype == dtype
    upstream = torch.randn(3, 11, 40, dtype=dtype)
    actual = fuseops.layer_norm_backward(upstream, x, weight, mean, rstd)
    expected = torch.ops.aten.native_layer_norm_backward(
        upstream, x, [40], mean, rstd, weight, bias, [True, True, True]
    )
    tol = TOLERANCE[dtype]
    for a, e, scale in zip(actual, expected, (1.0, math.sqrt(33), math.sqrt(33))):
        torch.testing.assert_close(a, e, rtol=tol * scale, atol=tol * scale)


def test_statistics_match_float64():
    x = torch.randn(9, 300) * 5 + 100
    _, mean, rstd = fuseops.layer_norm_forward(x)
    x64 = x.double()
    torch.testing.assert_close(mean.double(), x64.mean(-1), rtol=1e-6, atol=0)
    torch.testing.assert_close(
        rstd.double(), (x64.var(-1, unbiased=False) + 1e-5).rsqrt(), rtol=1e-5, atol=0
    )


def test_bfloat16_no_less_accurate_than_compiled_reference():
    torch._dynamo.reset()
    x = torch.randn(256, 1024, dtype=torch.bfloat16) * 4 + 2
    weight = torch.randn(1024, dtype=torch.bfloat16)
    bias = torch.randn(1024, dtype=torch.bfloat16)
    exact = reference.layer_norm(x.double(), weight.double(), bias.double())
    compiled = torch.compile(reference.layer_norm, fullgraph=True)(x, weight, bias)

    def error(y):
        return (y.double() - exact).abs().max().item()

    assert error(fuseops.layer_norm(x, weight, bias)) <= error(compiled)
    assert error(fuseops.layer_norm(x, weight, bias)) <= error(
        reference.layer_norm(x, weight, bias)
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_nan_and_inf_propagate_like_torch(dtype):
    x = torch.randn(4, 40, dtype=dtype)
    x[0, 3] = float("nan")
    x[1, 5] = float("inf")
    x[2, 7] = float("-inf")
    y = fuseops.layer_norm(x)
    expected = F.layer_norm(x, (40,))
    assert torch.equal(y.isnan(), expected.isnan())
    assert torch.equal(y.isinf(), expected.isinf())
    assert y[3].isfinite().all()


@pytest.mark.parametrize("affine", AFFINE, ids=lambda a: f"w{int(a[0])}b{int(a[1])}")
def test_gradcheck_float64(affine):
    x = torch.randn(5, 11, dtype=torch.float64, requires_grad=True)
    weight, bias = make_affine(11, torch.float64, *affine)
    args = [x] + [p.requires_grad_() if p is not None else None for p in (weight, bias)]
    assert torch.autograd.gradcheck(lambda x, w, b: fuseops.layer_norm(x, w, b), args)


def test_double_backward_is_a_clear_error():
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(fuseops.layer_norm(x).sum(), x, create_graph=False)
    assert grad.shape == x.shape
    y = fuseops.layer_norm(x)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(y.sum(), x, create_graph=True)


def test_out_in_place():
    x = torch.randn(8, 5)
    weight, bias = torch.randn(5), torch.randn(5)
    expected = fuseops.layer_norm(x, weight, bias)
    in_place = x.clone()
    fuseops.layer_norm(in_place, weight, bias, out=in_place)
    assert torch.equal(in_place, expected)


@pytest.mark.parametrize(
    "call, fragments",
    [
        (
            lambda: fuseops.layer_norm(torch.ones(3, dtype=torch.int32)),
            ["fuseops::layer_norm", "'input'", "Int"],
        ),
        (
            lambda: fuseops.layer_norm(torch.tensor(1.0)),
            ["fuseops::layer_norm", "'input'", "0-dimensional"],
        ),
        (
            lambda: fuseops.layer_norm(torch.ones(3, 8), torch.ones(7)),
            ["fuseops::layer_norm", "'weight'", "[8]", "[7]"],
        ),
        (
            lambda: fuseops.layer_norm(torch.ones(3, 8), None, torch.ones(8, dtype=torch.float64)),
            ["fuseops::layer_norm", "'bias'", "dtype"],
        ),
        (
            lambda: fuseops.layer_norm_backward(
                torch.ones(3, 7), torch.ones(3, 8), None, torch.ones(3), torch.ones(3)
            ),
            ["fuseops::layer_norm_backward", "'grad_output'", "shape"],
        ),
        (
            lambda: fuseops.layer_norm_backward(
                torch.ones(3, 8),
                torch.ones(3, 8),
                None,
                torch.ones(3, dtype=torch.int64),
                torch.ones(3),
            ),
            ["fuseops::layer_norm_backward", "'mean'", "dtype", "Long"],
        ),
        (
            lambda: fuseops.layer_norm_backward(
                torch.ones(3, 8), torch.ones(3, 8), None, torch.ones(3), torch.ones(3, 2)
            ),
            ["fuseops::layer_norm_backward", "'rstd'", "shape [3]", "followed by 1", "[3, 2]"],
        ),
        (
            lambda: fuseops.layer_norm_forward(torch.ones(3, 8), torch.ones(7)),
            ["fuseops::layer_norm_forward", "'weight'", "[8]", "[7]"],
        ),
    ],
)
def test_bad_input_errors_name_op_and_argument(call, fragments):
    expect_error_mentions(call, fragments)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(16)
        self.proj = torch.nn.Linear(16, 16)
        self.inner = torch.nn.Sequential(
            torch.nn.LayerNorm(16, elementwise_affine=False),
            torch.nn.Linear(16, 16),
            torch.nn.LayerNorm(16, bias=False),
        )
        self.plane_norm = torch.nn.LayerNorm((4, 16))

    def forward(self, x):
        x = self.proj(self.norm(x))
        return self.plane_norm(self.inner(x))


def test_replace_modules_reports_what_it_replaced():
    model = Block()
    replaced = fuseops.nn.replace_modules(model)
    assert [(r.name, r.old, r.new) for r in replaced] == [
        ("norm", "LayerNorm", "LayerNorm"),
        ("inner.0", "LayerNorm", "LayerNorm"),
        ("inner.2", "LayerNorm", "LayerNorm"),
    ]
    assert type(model.norm) is fuseops.nn.LayerNorm
    assert type(model.inner[0]) is fuseops.nn.LayerNorm
    # Normalization over two dimensions is not supported: left alone.
    assert type(model.plane_norm) is torch.nn.LayerNorm


def test_replaced_model_gives_same_outputs_and_gradients():
    model = Block()
    for p in model.parameters():
        torch.nn.init.normal_(p)
    x = torch.randn(3, 4, 16, requires_grad=True)
    y_before = model(x)
    y_before.square().sum().backward()
    grads_before = {n: p.grad.clone() for n, p in model.named_parameters()}
    x_grad_before = x.grad.clone()
    state_before = {k: v.clone() for k, v in model.state_dict().items()}

    model.zero_grad()
    x.grad = None
    fuseops.nn.replace_modules(model)
    assert model.state_dict().keys() == state_before.keys()
    y_after = model(x)
    y_after.square().sum().backward()
    # float32 normalization in a different summation order, then two Linear
    # layers: a few float32 ulps of O(10) values.
    torch.testing.assert_close(y_after, y_before, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(x.grad, x_grad_before, rtol=1e-4, atol=1e-4)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads_before[n], rtol=1e-4, atol=1e-3)


def test_module_is_a_drop_in():
    torch_norm = torch.nn.LayerNorm(24, eps=1e-6, bias=False)
    norm = fuseops.nn.LayerNorm(24, eps=1e-6, bias=False)
    norm.load_state_dict(torch_norm.state_dict())
    assert isinstance(norm, torch.nn.LayerNorm)
    x = torch.randn(7, 24)
    torch.testing.assert_close(norm(x), torch_norm(x), rtol=1e-5, atol=1e-5)
    # Configurations fuseops.layer_norm does not take go through torch.
    plane = fuseops.nn.LayerNorm((3, 24))
    assert plane(torch.randn(2, 3, 24)).shape == (2, 3, 24)
    x_bf16 = torch.randn(5, 24, dtype=torch.bfloat16)
    torch.testing.assert_close(norm(x_bf16), torch_norm(x_bf16))
