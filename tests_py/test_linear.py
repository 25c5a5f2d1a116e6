"""fuseops.linear (opcheck, compilers, Meta, pybind, thread-count bits and
every CPU build are in test_conformance.py and test_threads.py, fed by
fuseops/ops/linear.py's samples).

Compared with fuseops.reference.linear, the product in float64. Up to 4
rows (8 in bfloat16/float16 where ATen emulates them) run fuseops'
streaming kernel, more run ATen's product (in float32 on widened operands
from 32 bfloat16/float16 rows where ATen emulates them); all sum K
products in float32: an output of magnitude ~sqrt(K) (inputs of
magnitude ~1) carries float32 rounding of order K * 2^-24 * sqrt(K) at
worst, well inside 1e-5 * sqrt(K) absolute for K <= 4096; a bfloat16 or
float16 result adds one rounding of the output (2^-8, 2^-11 relative), which
1e-2 and 2e-3 relative cover with margin for the inputs' own rounding.
"""

from __future__ import annotations

import math

import pytest
import torch

import fuseops
from fuseops import reference

from support.cpu_builds import cpu_runs
from support.errors import expect_error_mentions
from support.params import DTYPES
from support.processes import run_python

TOL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}


def inputs(rows, k, n, dtype, device, bias=True, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def t(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype).to(device)

    return t(*rows, k), t(n, k), t(n) if bias else None


def assert_close(got, want, dtype, k):
    tol = TOL[dtype]
    torch.testing.assert_close(got.double(), want.double(), rtol=tol, atol=tol * math.sqrt(k))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [(1,), (2,), (3,), (4,), (5,), (16,), (2, 2), (1, 3), (64,)])
@pytest.mark.parametrize("k,n", [(1024, 256), (67, 130), (7, 3)])
def test_matches_the_float64_product(device, dtype, rows, k, n):
    x, w, b = inputs(rows, k, n, dtype, device, bias=n != 3)
    y = fuseops.linear(x, w, b)
    assert y.dtype == dtype and y.shape == (*rows, n)
    assert_close(y, reference.linear(x, w, b), dtype, k)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rows_do_not_change_each_others_bits(dtype):
    # The CPU's streaming kernel sums each output on its own: a row's result
    # is the same bits alone or among the 4 rows of a decode step. On CUDA
    # fuseops.linear is cuBLAS, which picks its algorithm by shape, so there a
    # row's bits may depend on the batch (python/README.md says so).
    x, w, b = inputs((4,), 300, 70, dtype, "cpu")
    together = fuseops.linear(x, w, b)
    for r in range(4):
        assert torch.equal(fuseops.linear(x[r : r + 1], w, b), together[r : r + 1])
        assert torch.equal(fuseops.linear(x[: r + 1], w, b), together[: r + 1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_streamed_rows_have_the_same_bits_on_any_thread_count(dtype):
    # Up to 4 rows run fuseops' stream, whose sums do not depend on the
    # threads (linear's other results are ATen's products: THREAD_COUNT_DEPENDENT).
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            results.append(
                [
                    fuseops.linear(*inputs((rows,), 1030, 301, dtype, "cpu", seed=rows))
                    for rows in (1, 4)
                ]
            )
    finally:
        torch.set_num_threads(before)
    for other in results[1:]:
        for got, want in zip(other, results[0]):
            assert torch.equal(got, want)


_AVX512_BF16_CODE = """
import math, torch, fuseops
from fuseops import reference
gen = torch.Generator().manual_seed(3)
worst = 0.0
for rows, k, n in [(1, 1030, 37), (3, 64, 130), (4, 4096, 19), (8, 333, 16)]:
    x = torch.randn(rows, k, generator=gen, dtype=torch.float64).bfloat16()
    w = torch.randn(n, k, generator=gen, dtype=torch.float64).bfloat16()
    b = torch.randn(n, generator=gen, dtype=torch.float64).bfloat16()
    want = reference.linear(x, w, b).double()
    err = (fuseops.linear(x, w, b).double() - want).abs() - 1e-2 * want.abs()
    worst = max(worst, err.max().item() / math.sqrt(k))
# One product of denormals (1e-39 is below bfloat16's smallest normal).
tiny = fuseops.linear(torch.full((1, 32), 1e-39).bfloat16(), torch.ones(1, 32).bfloat16())
print(worst <= 1e-2, tiny.item() > 0)
"""


def test_bfloat16_rows_with_and_without_avx512_bf16():
    # The AVX512 build multiplies bfloat16 rows with vdpbf16ps on CPUs with
    # AVX512_BF16; FUSEOPS_DISABLE_AVX512_BF16=1 takes the widening path
    # there. Both match float64 (TOL's bound); vdpbf16ps treats denormals as
    # 0, which tells the paths apart (python/README.md says so).
    if not cpu_runs("AVX512"):
        pytest.skip("this CPU cannot run AVX512 code")
    widened = run_python(
        _AVX512_BF16_CODE,
        {"FUSEOPS_DISABLE_AVX512_BF16": "1", "ATEN_CPU_CAPABILITY": "avx512"},
    )
    assert widened.returncode == 0, widened.stderr
    assert widened.stdout.split() == ["True", "True"], widened.stdout
    with open("/proc/cpuinfo") as f:
        has_bf16 = "avx512_bf16" in f.read()
    plain = run_python(_AVX512_BF16_CODE, {"ATEN_CPU_CAPABILITY": "avx512"})
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.split() == ["True", str(not has_bf16)], plain.stdout


@pytest.mark.parametrize("gemms", ["emulated", "native"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reduced_rows_stream_up_to_8_where_aten_emulates_them(monkeypatch, gemms, dtype):
    # FUSEOPS_REDUCED_GEMMS forces what the CPU's detection decides: where
    # ATen emulates bfloat16/float16 products the kernel streams up to 8
    # rows (each row then has the bits it has alone: a one-row call always
    # streams), otherwise up to 4; both match float64.
    monkeypatch.setenv("FUSEOPS_REDUCED_GEMMS", gemms)
    for rows in range(5, 10):
        x, w, b = inputs((rows,), 1030, 37, dtype, "cpu", seed=rows)
        y = fuseops.linear(x, w, b)
        assert_close(y, reference.linear(x, w, b), dtype, 1030)
        if gemms == "emulated" and rows <= 8:
            for r in range(rows):
                assert torch.equal(fuseops.linear(x[r : r + 1], w, b), y[r : r + 1])


@pytest.mark.parametrize("gemms", ["emulated", "native"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reduced_products_of_32_rows_or_more_widen_where_aten_emulates_them(
    monkeypatch, gemms, dtype
):
    # Where ATen emulates bfloat16/float16 products, 32 rows or more run as
    # float32 products of the widened operands, forward and backward, the
    # weight widened in blocks of at most 8 Mi floats: 4100 x 2050 (8.4 Mi)
    # is a block of 4091 rows and one of 9. Either way the results are
    # float32 sums of exact products, rounded once: the float64 product's
    # tolerance holds, for the output and for the three gradients.
    monkeypatch.setenv("FUSEOPS_REDUCED_GEMMS", gemms)
    k, n = 2050, 4100
    for rows in [(32,), (5, 9)]:
        x, w, b = inputs(rows, k, n, dtype, "cpu", seed=len(rows))
        leaves = [t.requires_grad_() for t in (x, w, b)]
        y = fuseops.linear(*leaves)
        assert_close(y, reference.linear(x, w, b), dtype, k)
        g = torch.randn(y.shape, generator=torch.Generator().manual_seed(3)).to(dtype)
        got = torch.autograd.grad(y, leaves, g)
        g64, x64 = g.double().reshape(-1, n), x.detach().double().reshape(-1, k)
        want = (g64 @ w.detach().double(), g64.t() @ x64, g64.sum(0))
        for grad, expected, summed in zip(got, want, (n, x64.shape[0], x64.shape[0])):
            assert grad.dtype == dtype
            assert_close(grad.reshape(expected.shape), expected, dtype, summed)


def test_widened_backward_keeps_double_backward(monkeypatch):
    # A backward that builds a graph (create_graph) takes ATen's
    # differentiable products, so a gradient of the input gradient (here
    # with respect to the weight) is torch's linear's.
    monkeypatch.setenv("FUSEOPS_REDUCED_GEMMS", "emulated")
    x, w, b = inputs((40,), 64, 48, torch.bfloat16, "cpu")
    leaves = [t.requires_grad_() for t in (x, w, b)]
    g = torch.randn(40, 48).to(torch.bfloat16)
    results = []
    for linear in (fuseops.linear, torch.nn.functional.linear):
        (gx,) = torch.autograd.grad(linear(*leaves), [leaves[0]], g, create_graph=True)
        results.append(torch.autograd.grad(gx.float().square().sum(), [leaves[1]]))
    torch.testing.assert_close(
        results[0][0].double(), results[1][0].double(), rtol=2e-2, atol=2e-2 * 40
    )


def test_non_contiguous_inputs(device):
    x, w, b = inputs((6,), 40, 24, torch.float32, device)
    xt = x.t().contiguous().t()
    wt = w.t().contiguous().t()
    assert_close(fuseops.linear(xt, wt, b[::1]), reference.linear(x, w, b), torch.float32, 40)
    assert_close(
        fuseops.linear(x[:, ::2], w[:, ::2]),
        reference.linear(x[:, ::2], w[:, ::2]),
        torch.float32,
        20,
    )


def test_special_values_propagate(device):
    x, w, b = inputs((2,), 32, 4, torch.float32, device)
    x[0, 3] = float("nan")
    w[2, 5] = float("inf")
    y = fuseops.linear(x, w, b)
    want = reference.linear(x, w, b)
    assert torch.equal(y.isnan(), want.isnan()) and torch.equal(y.isinf(), want.isinf())


@pytest.mark.parametrize("rows", [(3,), (2, 20)])
def test_gradcheck(device, rows):
    x, w, b = inputs(rows, 6, 5, torch.float64, device)
    args = [t.requires_grad_() for t in (x, w, b)]
    assert torch.autograd.gradcheck(fuseops.linear, args)
    assert torch.autograd.gradgradcheck(fuseops.linear, args)


def test_gradients_match_torch_in_bfloat16(device):
    x, w, b = inputs((3, 4), 64, 32, torch.bfloat16, device)
    leaves = [t.requires_grad_() for t in (x, w, b)]
    g = torch.randn(3, 4, 32, dtype=torch.bfloat16, device=device)
    got = torch.autograd.grad(fuseops.linear(*leaves), leaves, g)
    want = torch.autograd.grad(torch.nn.functional.linear(*leaves), leaves, g)
    for a, e in zip(got, want):
        torch.testing.assert_close(a.double(), e.double(), rtol=1e-2, atol=1e-2 * 8)


def test_autocast_casts_like_torch_linear():
    x, w, b = inputs((2,), 16, 8, torch.float32, "cpu")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = fuseops.linear(x, w, b)
        want = torch.nn.functional.linear(x, w, b)
    assert y.dtype == want.dtype == torch.bfloat16


def test_bad_inputs_name_the_op_and_argument():
    x, w, _ = inputs((2,), 8, 4, torch.float32, "cpu")
    op = "fuseops::linear"
    expect_error_mentions(lambda: fuseops.linear(x, torch.randn(4, 7)), [op, "'weight'"])
    expect_error_mentions(lambda: fuseops.linear(x, torch.randn(8)), [op, "'weight'", "2-D"])
    expect_error_mentions(lambda: fuseops.linear(x, w.double()), [op, "'weight'", "dtype"])
    expect_error_mentions(lambda: fuseops.linear(x, w, torch.randn(5)), [op, "'bias'"])
    expect_error_mentions(lambda: fuseops.linear(torch.tensor(1.0), w), [op, "'input'"])
    expect_error_mentions(lambda: fuseops.linear(x.int(), w), [op, "'input'"])
