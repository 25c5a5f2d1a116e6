"""fuseops.rms_norm / fused_add_rms_norm against fuseops.reference, F.rms_norm
and float64 autograd.

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

from conftest import DTYPES, expect_error_mentions, run_under_cpu_capability

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


def make(shape, dtype, layout="contiguous"):
    if layout == "contiguous":
        return torch.randn(shape, dtype=dtype)
    if layout == "transposed":
        if len(shape) < 2:
            return torch.randn(shape, dtype=dtype)
        return torch.randn(tuple(reversed(shape)), dtype=dtype).transpose(0, -1)
    if layout == "sliced":
        return torch.randn(shape[:-1] + (shape[-1] * 2 + 1,), dtype=dtype)[..., 1::2]
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
def test_forward_matches_reference(dtype, shape, layout, with_weight):
    x = make(shape, dtype, layout)
    w = make((shape[-1],), dtype, layout if layout == "sliced" else "contiguous") if with_weight else None
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
    assert_close(torch.nn.RMSNorm(40, dtype=dtype)(x), fuseops.nn.RMSNorm(40, dtype=dtype)(x), dtype)


def test_weight_of_another_dtype():
    x = torch.randn(6, 24, dtype=torch.bfloat16)
    w = torch.randn(24)
    y = fuseops.rms_norm(x, w, 1e-6)
    assert y.dtype == torch.bfloat16
    assert_close(y, reference.rms_norm(x.float(), w, 1e-6).bfloat16(), torch.bfloat16)


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
def test_autograd_matches_float64(dtype, shape, layout, with_weight):
    x = make(shape, dtype, layout).requires_grad_()
    w = torch.randn(shape[-1], dtype=dtype, requires_grad=True) if with_weight else None
    grad = make(shape, dtype, layout)
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
def test_fused_add_forward_and_backward(dtype, shape, layout):
    x = make(shape, dtype, layout).requires_grad_()
    residual = make(shape, dtype, layout).requires_grad_()
    w = torch.randn(shape[-1], dtype=dtype, requires_grad=True)
    out, new_residual = fuseops.fused_add_rms_norm(x, residual, w, 1e-6)
    # The sum is rounded to the dtype exactly as `x + residual` rounds it.
    assert torch.equal(new_residual.detach(), (x + residual).detach())
    assert_close(out, expected_forward(new_residual.detach(), w.detach(), 1e-6), dtype)

    g_out = make(shape, dtype, layout)
    g_res = make(shape, dtype, layout)
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


def test_out_variants():
    x = torch.randn(8, 50)
    w = torch.randn(50)
    expected = fuseops.rms_norm(x, w, 1e-6)
    out = torch.empty(8, 50)
    assert fuseops.rms_norm(x, w, 1e-6, out=out) is out
    assert torch.equal(out, expected)
    strided = torch.empty(50, 8).t()
    fuseops.rms_norm(x, w, 1e-6, out=strided)
    assert torch.equal(strided, expected)
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


def test_opcheck_all_overloads():
    x = torch.randn(5, 24)
    r = torch.randn(5, 24)
    w = torch.randn(24)
    xb = torch.randn(24, 6, dtype=torch.bfloat16).t()  # non-contiguous
    _, rstd = fuseops.rms_norm_forward(x, w)
    _, new_residual, rstd2 = fuseops.fused_add_rms_norm_forward(x, r, w)
    ops = torch.ops.fuseops
    samples = [
        (ops.rms_norm.default, (x, w, 1e-6), {}),
        (ops.rms_norm.default, (x, None, None), {}),
        (ops.rms_norm.default, (xb, None, 1e-5), {}),
        (ops.rms_norm.default, (x.clone().requires_grad_(), w.clone().requires_grad_(), 1e-6), {}),
        (ops.rms_norm.out, (x, w, 1e-6), {"out": torch.empty(5, 24)}),
        (ops.rms_norm_forward.default, (x, w, None), {}),
        (ops.rms_norm_forward.default, (x.clone().requires_grad_(), w, 1e-6), {}),
        (ops.rms_norm_backward.default, (torch.randn(5, 24), x, w, rstd), {}),
        (ops.rms_norm_backward.default, (torch.randn(5, 24), x, None, rstd), {}),
        (ops.fused_add_rms_norm.default, (x, r, w, 1e-6), {}),
        (
            ops.fused_add_rms_norm.default,
            (x.clone().requires_grad_(), r.clone().requires_grad_(), w.clone().requires_grad_(), None),
            {},
        ),
        (
            ops.fused_add_rms_norm.out,
            (x, r, w, 1e-6),
            {"out": torch.empty(5, 24), "residual_out": torch.empty(5, 24)},
        ),
        (ops.fused_add_rms_norm_forward.default, (x, r, None, 1e-6), {}),
        (
            ops.fused_add_rms_norm_backward.default,
            (torch.randn(5, 24), torch.randn(5, 24), new_residual, w, rstd2),
            {},
        ),
        (
            ops.fused_add_rms_norm_backward.default,
            (torch.randn(5, 24), None, new_residual, w, rstd2),
            {},
        ),
    ]
    for op, args, kwargs in samples:
        torch.library.opcheck(op, args, kwargs)


def test_torch_compile_fullgraph_no_graph_break():
    def f(x, r, w):
        out, new_residual = fuseops.fused_add_rms_norm(x * 2.0, r, w, 1e-6)
        return fuseops.rms_norm(out + 1.0, w, 1e-6) + new_residual

    compiled = torch.compile(f, fullgraph=True, backend="inductor")
    x, r, w = torch.randn(16, 33), torch.randn(16, 33), torch.randn(33)
    torch.testing.assert_close(compiled(x, r, w), f(x, r, w))


def test_torch_compile_backward():
    def f(x, w):
        return fuseops.rms_norm(x, w, 1e-6).square().sum()

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    x = torch.randn(10, 12, requires_grad=True)
    w = torch.randn(12, requires_grad=True)
    compiled(x, w).backward()
    xe = x.detach().clone().requires_grad_()
    we = w.detach().clone().requires_grad_()
    f(xe, we).backward()
    torch.testing.assert_close(x.grad, xe.grad)
    torch.testing.assert_close(w.grad, we.grad)


def test_torch_export_keeps_the_op():
    class M(torch.nn.Module):
        def forward(self, x, r):
            return fuseops.fused_add_rms_norm(x, r)

    exported = torch.export.export(M(), (torch.randn(3, 4), torch.randn(3, 4)))
    targets = [str(n.target) for n in exported.graph.nodes if n.op == "call_function"]
    assert "fuseops.fused_add_rms_norm.default" in targets


def test_meta_tensors():
    x = torch.empty(4, 5, device="meta", dtype=torch.float16)
    w = torch.empty(5, device="meta", dtype=torch.float16)
    out, rstd = fuseops.rms_norm_forward(x, w)
    assert out.device.type == "meta" and out.shape == (4, 5) and out.dtype == torch.float16
    assert rstd.shape == (4,) and rstd.dtype == torch.float32
    gx, gw = fuseops.rms_norm_backward(out, x, w, rstd)
    assert gx.shape == (4, 5) and gw.shape == (5,)


def test_pybind_path_equals_dispatcher_path():
    x = torch.randn(9, 31)
    r = torch.randn(9, 31)
    w = torch.randn(31)
    assert torch.equal(fuseops._C.rms_norm(x, w, 1e-6), torch.ops.fuseops.rms_norm(x, w, 1e-6))
    assert torch.equal(fuseops._C.rms_norm(x), torch.ops.fuseops.rms_norm(x))
    out = torch.empty(9, 31)
    fuseops._C.rms_norm_out(x, w, None, out)
    assert torch.equal(out, torch.ops.fuseops.rms_norm(x, w))
    a, b = fuseops._C.fused_add_rms_norm(x, r, w)
    ea, eb = torch.ops.fuseops.fused_add_rms_norm(x, r, w)
    assert torch.equal(a, ea) and torch.equal(b, eb)
    o, ro = torch.empty(9, 31), torch.empty(9, 31)
    fuseops._C.fused_add_rms_norm_out(x, r, w, None, o, ro)
    assert torch.equal(o, ea) and torch.equal(ro, eb)
    _, rstd = fuseops._C.rms_norm_forward(x, w)
    g = torch.randn(9, 31)
    for actual, expected in zip(
        fuseops._C.rms_norm_backward(g, x, w, rstd), fuseops.rms_norm_backward(g, x, w, rstd)
    ):
        assert torch.equal(actual, expected)
    # The C++ API carries autograd too.
    xg = torch.randn(5, 7, requires_grad=True)
    fuseops._C.rms_norm(xg, None, 1e-6).sum().backward()
    assert xg.grad is not None and xg.grad.shape == (5, 7)


@pytest.mark.parametrize(
    "call, fragments",
    [
        (lambda: fuseops.rms_norm(torch.ones(3, dtype=torch.int32)), ["fuseops::rms_norm", "'input'", "Int"]),
        (lambda: fuseops.rms_norm(torch.tensor(1.0)), ["fuseops::rms_norm", "'input'", "0-dimensional"]),
        (
            lambda: fuseops.rms_norm(torch.ones(2, 3), torch.ones(4)),
            ["fuseops::rms_norm", "'weight'", "[3]", "[4]"],
        ),
        (
            lambda: fuseops.fused_add_rms_norm(torch.ones(2, 3), torch.ones(3, 3)),
            ["fuseops::fused_add_rms_norm", "'residual'", "shape"],
        ),
        (
            lambda: fuseops.fused_add_rms_norm(torch.ones(2, 3), torch.ones(2, 3, dtype=torch.float16)),
            ["fuseops::fused_add_rms_norm", "'residual'", "dtype"],
        ),
        (
            lambda: fuseops.rms_norm_backward(torch.ones(2, 3), torch.ones(2, 3), None, torch.ones(3)),
            ["fuseops::rms_norm_backward", "'rstd'", "shape"],
        ),
        (
            lambda: fuseops.rms_norm(torch.ones(3), out=torch.empty(3, dtype=torch.float64)),
            ["fuseops::rms_norm.out", "'out'", "dtype"],
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


@pytest.mark.slow
@pytest.mark.parametrize("capability", ["default", "avx2", "avx512"])
def test_each_cpu_capability(capability, tmp_path):
    # The child process only runs fuseops; inputs and float64 references
    # stay in this process.
    cases = {}
    for dt in DTYPES:
        # 300 rows of 1027: several tasks per thread, a tail in every row.
        cases[str(dt)] = [torch.randn(300, 1027, dtype=dt) for _ in range(3)] + [
            torch.randn(1027, dtype=dt)
        ]
    torch.save(cases, tmp_path / "inputs.pt")
    code = (
        "import torch, fuseops\n"
        f"cases = torch.load({str(tmp_path / 'inputs.pt')!r})\n"
        "results = {}\n"
        "for name, (x, r, g, w) in cases.items():\n"
        "    out, s, rstd = fuseops.fused_add_rms_norm_forward(x, r, w, 1e-6)\n"
        "    results[name] = (out, s, rstd) + fuseops.rms_norm_backward(g, s, w, rstd)\n"
        f"torch.save(results, {str(tmp_path / 'results.pt')!r})\n"
    )
    run_under_cpu_capability(capability, code)
    results = torch.load(tmp_path / "results.pt")
    for dt in DTYPES:
        x, r, g, w = cases[str(dt)]
        out, s, rstd, gx, gw = results[str(dt)]
        assert torch.equal(s, x + r), dt
        assert_close(out, expected_forward(s, w, 1e-6), dt)
        gx_ref, gw_ref, _ = float64_grads(s, w, g, 1e-6)
        assert_close(gx, gx_ref.to(dt), dt)
        assert_close(gw, gw_ref.to(dt), dt, atol_scale=math.sqrt(300))
