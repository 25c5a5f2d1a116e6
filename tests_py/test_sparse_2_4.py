"""fuseops 2:4 sparse linear layers: prune_2_4, pack_2_4,
sparse_2_4_linear, fuseops.nn.Sparse24Linear and the 2:4 modes of
fuseops.quantize_ (opcheck, compilers, Meta, pybind and every CPU build are
in test_conformance.py, fed by fuseops/ops/sparse_2_4.py's samples).

sparse_2_4_linear is compared with a float64 reference of the same math,
x @ (W * scale).T + bias with the dense 2:4 weight W exact in float64. The
op sums the K/2 kept products in float32 (each product rounded at most
once, 2^-24 relative) in a fixed order, so its error is at most about
K * 2^-24 * sum|x * w| * scale; the tolerance, 2e-6 * sqrt(K) relative to
max|y| plus 1e-6, holds that for random data with margin while still
catching a wrong element (a dropped or misplaced kept value moves y by
O(|x * w|)). bfloat16/float16 results are rounded once more (one unit in
their last place: 2^-8, 2^-11). float64 activations are summed in float64
(with float64 or int8 values), to 1e-12 * K of max|y|. The error of int8 values against the pruned float
layer and of pruning against the dense layer is reported separately.

sparse_2_4_dynamic_linear (W8A8) sums int8 products exactly, so it is
checked for the same bits as int8_dynamic_linear on the dense weight (in
every CPU build, and with the AVX-512 path without VNNI forced), and
against an independent float64 formula: its float32 epilogue rounds the
sum and two products once each, 1e-6 of max|y| with margin.
"""

from __future__ import annotations

import io

import pytest
import torch

import fuseops
from fuseops import reference

from support.cpu_builds import CAPABILITY_ORDER, cpu_runs, run_under_cpu_capability
from support.errors import expect_error_mentions
from support.int8_math import ROUNDING, assert_dynamic_matches, dynamic_reference
from support.params import DTYPES
from support.processes import run_python


def assert_matches(y, want, k):
    tolerance = 2e-6 * max(1.0, k) ** 0.5 + ROUNDING[y.dtype]
    if y.dtype == torch.float64:
        tolerance = 1e-12 * max(1.0, k)
    scale = max(1.0, want.abs().max().item()) if want.numel() else 1.0
    torch.testing.assert_close(y.double(), want, rtol=ROUNDING[y.dtype], atol=tolerance * scale)


def dense_2_4(n, k, device, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return fuseops.prune_2_4(
        (torch.randn(n, k, generator=gen) * 0.05).to(device=device, dtype=dtype)
    )


# --- prune_2_4 ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_prune_keeps_the_two_largest_magnitudes(dtype, device):
    w = torch.tensor(
        [
            [
                1.0,
                -3.0,
                2.0,
                0.5,
                2.0,
                -2.0,
                2.0,
                1.0,
                0.0,
                0.0,
                0.0,
                5.0,
                float("nan"),
                7.0,
                -8.0,
                0.0,
            ]
        ]
    )
    want = torch.tensor(
        [
            [
                0.0,
                -3.0,
                2.0,
                0.0,
                2.0,
                -2.0,
                0.0,
                0.0,
                0.0,
                0.0,
                0.0,
                5.0,
                float("nan"),
                0.0,
                -8.0,
                0.0,
            ]
        ]
    )
    got = fuseops.prune_2_4(w.to(device=device, dtype=dtype))
    assert got.dtype == dtype and got.shape == w.shape
    torch.testing.assert_close(got.cpu(), want.to(dtype), equal_nan=True, rtol=0, atol=0)
    x = torch.randn(33, 64, device=device).to(dtype)
    pruned = fuseops.prune_2_4(x)
    groups = pruned.ne(0).view(33, 16, 4)
    assert torch.equal(groups.sum(-1), torch.full((33, 16), 2, device=device))
    mag = x.abs().view(33, 16, 4).float()
    assert (
        mag.masked_fill(~groups, float("inf")).amin(-1) >= mag.masked_fill(groups, 0).amax(-1)
    ).all()
    assert torch.equal(pruned, reference.prune_2_4(x))
    assert torch.equal(pruned[groups.view(33, 64)], x[groups.view(33, 64)])


def test_prune_any_layout_and_empty(device):
    x = torch.randn(16, 8, device=device).t()
    assert torch.equal(fuseops.prune_2_4(x), fuseops.prune_2_4(x.contiguous()))
    assert fuseops.prune_2_4(torch.randn(0, 8, device=device)).shape == (0, 8)
    assert fuseops.prune_2_4(torch.randn(3, 0, device=device)).shape == (3, 0)


# --- pack_2_4 -------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES + [torch.int8], ids=str)
def test_pack_layout(dtype, device):
    n, k = 7, 20
    w = dense_2_4(n, k, device)
    w[2] = 0  # groups with no nonzeros keep positions 0 and 1
    w[3, 1] = 0  # one nonzero
    scale = None
    if dtype == torch.int8:
        w, scale = fuseops.quantize_per_channel_int8(w)
    else:
        w = w.to(dtype)
    values, meta, s = fuseops.pack_2_4(w, scale)
    assert values.shape == (n, k // 2) and values.dtype == dtype
    assert meta.shape == (n, 3) and meta.dtype == torch.uint8
    assert s.dtype == torch.float32 and torch.equal(
        s, scale if scale is not None else torch.ones(n, device=device)
    )
    for row in range(n):
        kept = [c for c in range(k) if (meta[row, c // 8].item() >> (c % 8)) & 1]
        assert len(kept) == k // 2 and all(
            len([c for c in kept if c // 4 == g]) == 2 for g in range(k // 4)
        )
        assert all(w[row, c].item() == 0 for c in range(k) if c not in kept)
        assert torch.equal(values[row], w[row, kept])
    assert (
        meta[2, 0].item() == 0x33 and meta[2, 2].item() == 0x03
    )  # K = 20: the last high nibble unused
    assert torch.equal(fuseops.unpack_2_4(values, meta, k), w)
    for got, want in zip((values, meta, s), reference.pack_2_4(w, scale)):
        assert torch.equal(got, want)


def test_pack_refuses_what_is_not_2_4(device):
    w = dense_2_4(5, 16, device)
    w[3, 9] = 1.0
    w[3, 10] = 1.0
    w[3, 11] = 1.0
    expect_error_mentions(
        lambda: fuseops.pack_2_4(w),
        ["fuseops::pack_2_4", "'weight'", "not 2:4", "row 3, group 2", "holds 3", "prune_2_4"],
    )
    nan = dense_2_4(2, 8, device)
    nan[0, :3] = float("nan")
    expect_error_mentions(lambda: fuseops.pack_2_4(nan), ["fuseops::pack_2_4", "row 0, group 0"])
    op = "fuseops::pack_2_4"
    wq = torch.zeros(4, 8, dtype=torch.int8, device=device)
    expect_error_mentions(lambda: fuseops.pack_2_4(wq), [op, "'scale'", "required"])
    expect_error_mentions(
        lambda: fuseops.pack_2_4(wq, torch.ones(3, device=device)), [op, "'scale'", "[4]"]
    )
    expect_error_mentions(
        lambda: fuseops.pack_2_4(wq, torch.ones(4, device=device).double()),
        [op, "'scale'", "float32"],
    )
    expect_error_mentions(
        lambda: fuseops.pack_2_4(torch.zeros(4, 6, device=device)),
        [op, "'weight'", "multiple of 4"],
    )
    expect_error_mentions(
        lambda: fuseops.pack_2_4(torch.zeros(8, device=device)), [op, "'weight'", "2-D"]
    )
    expect_error_mentions(
        lambda: fuseops.pack_2_4(torch.zeros(4, 8, dtype=torch.int32, device=device)),
        [op, "'weight'", "dtype"],
    )
    expect_error_mentions(
        lambda: fuseops.prune_2_4(wq), ["fuseops::prune_2_4", "'weight'", "dtype"]
    )
    expect_error_mentions(
        lambda: fuseops.prune_2_4(torch.zeros(4, 6, device=device)),
        ["fuseops::prune_2_4", "multiple of 4"],
    )


# --- sparse_2_4_linear ------------------------------------------------------------

SHAPES = [(1, 16, 4), (1, 37, 132), (3, 5, 8), (8, 64, 256), (33, 40, 68), (257, 48, 140)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_float_weight_matches_float64_reference(dtype, m, n, k, with_bias, device):
    w = dense_2_4(n, k, device, dtype)
    values, meta, scale = fuseops.pack_2_4(w)
    x = torch.randn(m, k, device=device).to(dtype)
    bias = torch.randn(n, device=device).to(dtype) if with_bias else None
    y = fuseops.sparse_2_4_linear(x, values, meta, scale, bias)
    assert y.dtype == dtype and y.shape == (m, n) and y.is_contiguous()
    want = x.double() @ w.double().T
    if with_bias:
        want = want + bias.double()
    assert_matches(y, want, k)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_int8_weight_matches_float64_reference(dtype, m, n, k, device):
    wq, wscale = fuseops.quantize_per_channel_int8(dense_2_4(n, k, device))
    values, meta, scale = fuseops.pack_2_4(wq, wscale)
    x = torch.randn(m, k, device=device).to(dtype)
    bias = torch.randn(n, device=device).to(dtype)
    y = fuseops.sparse_2_4_linear(x, values, meta, scale, bias)
    assert y.dtype == dtype and y.shape == (m, n)
    want = (x.double() @ wq.double().T) * wscale.double() + bias.double()
    assert_matches(y, want, k)


def test_rows_do_not_depend_on_the_batch(device):
    # Every row sums in the same order whatever the number of rows (decode
    # vs prefill give the same bits).
    values, meta, scale = fuseops.pack_2_4(dense_2_4(40, 300, device))
    x = torch.randn(100, 300, device=device)
    batch = fuseops.sparse_2_4_linear(x, values, meta, scale)
    for row in (0, 3, 4, 31, 32, 99):
        assert torch.equal(
            fuseops.sparse_2_4_linear(x[row : row + 1], values, meta, scale), batch[row : row + 1]
        )


@pytest.mark.parametrize("layout", ["transposed", "sliced", "3d"])
def test_any_layout_and_leading_dims(layout, device):
    values, meta, scale = fuseops.pack_2_4(dense_2_4(24, 20, device))
    if layout == "transposed":
        x = torch.randn(20, 6, device=device).t()
    elif layout == "sliced":
        x = torch.randn(6, 40, device=device)[:, ::2]
    else:
        x = torch.randn(2, 3, 20, device=device)
    y = fuseops.sparse_2_4_linear(x, values, meta, scale)
    assert y.shape == x.shape[:-1] + (24,)
    assert torch.equal(y, fuseops.sparse_2_4_linear(x.contiguous(), values, meta, scale))
    # Strided packed tensors are read as their values, not their memory.
    assert torch.equal(
        fuseops.sparse_2_4_linear(x, values.t().contiguous().t(), meta.t().contiguous().t(), scale),
        y,
    )


def test_empty_inputs(device):
    packed = fuseops.pack_2_4(dense_2_4(8, 12, device))
    assert fuseops.sparse_2_4_linear(torch.randn(0, 12, device=device), *packed).shape == (0, 8)
    empty_k = fuseops.pack_2_4(torch.zeros(5, 0, device=device))
    bias = torch.randn(5, device=device)
    assert torch.equal(
        fuseops.sparse_2_4_linear(torch.randn(3, 0, device=device), *empty_k, bias),
        bias.expand(3, 5),
    )
    assert fuseops.sparse_2_4_linear(
        torch.randn(3, 12, device=device), *fuseops.pack_2_4(torch.zeros(0, 12, device=device))
    ).shape == (3, 0)


def test_error_against_the_dense_layer(device):
    """Reported, not the correctness criterion: pruning a random layer to
    2:4 loses much of it (its weights are not sparse); int8 values add
    under 1% to that, measured against the pruned float layer."""
    gen = torch.Generator().manual_seed(7)
    w = (torch.randn(256, 1024, generator=gen) * 0.05).to(device)
    x = torch.randn(16, 1024, device=device)
    pruned = fuseops.prune_2_4(w)
    dense, sparse = x.double() @ w.double().T, x.double() @ pruned.double().T
    y = fuseops.sparse_2_4_linear(
        x, *fuseops.pack_2_4(*fuseops.quantize_per_channel_int8(pruned))
    ).double()

    def relative(a, b):
        return ((a - b).norm() / b.norm()).item()

    print(
        f"2:4 pruning vs dense layer: relative error {relative(sparse, dense):.2e}; "
        f"int8 values vs pruned float layer {relative(y, sparse):.2e}"
    )
    assert relative(y, sparse) < 0.01


def test_inference_only(device):
    w = dense_2_4(8, 12, device)
    packed = fuseops.pack_2_4(w)
    x = torch.randn(2, 12, device=device, requires_grad=True)
    expect_error_mentions(
        lambda: fuseops.sparse_2_4_linear(x, *packed),
        ["fuseops::sparse_2_4_linear", "inference op", "torch.no_grad()"],
    )
    expect_error_mentions(
        lambda: fuseops.prune_2_4(w.requires_grad_()), ["fuseops::prune_2_4", "inference op"]
    )
    expect_error_mentions(lambda: fuseops.pack_2_4(w), ["fuseops::pack_2_4", "inference op"])
    with torch.no_grad():
        assert not fuseops.sparse_2_4_linear(x, *packed).requires_grad
    with torch.inference_mode():
        fuseops.sparse_2_4_linear(x, *packed)


def test_bad_inputs(device):
    values, meta, scale = fuseops.pack_2_4(dense_2_4(20, 16, device))
    op = "fuseops::sparse_2_4_linear"
    f = fuseops.sparse_2_4_linear
    x = torch.randn(2, 16, device=device)
    expect_error_mentions(
        lambda: f(torch.randn(2, 12, device=device), values, meta, scale),
        [op, "'input'", "K = 12", "'values'"],
    )
    expect_error_mentions(lambda: f(x, values.double(), meta, scale), [op, "'values'", "dtype"])
    expect_error_mentions(lambda: f(x, values[0], meta, scale), [op, "'values'", "2-D"])
    expect_error_mentions(lambda: f(x, values, meta.int(), scale), [op, "'meta'", "uint8"])
    expect_error_mentions(lambda: f(x, values, meta[:3], scale), [op, "'meta'", "[20, 2]"])
    expect_error_mentions(lambda: f(x, values, meta, scale[:3]), [op, "'scale'", "[20]"])
    expect_error_mentions(lambda: f(x, values, meta, scale.half()), [op, "'scale'", "float32"])
    expect_error_mentions(
        lambda: f(x, values, meta, scale, torch.randn(19, device=device)), [op, "'bias'", "[20]"]
    )
    expect_error_mentions(
        lambda: f(x, values, meta, scale, torch.randn(20, device=device).half()),
        [op, "'bias'", "dtype"],
    )
    expect_error_mentions(lambda: f(x.int(), values, meta, scale), [op, "'input'", "dtype"])
    expect_error_mentions(
        lambda: f(torch.tensor(1.0, device=device), values, meta, scale), [op, "'input'", "0-d"]
    )


# --- sparse_2_4_dynamic_linear (W8A8 dynamic) ------------------------------------


def int8_2_4(n, k, device, seed=0):
    """A 2:4 int8 weight with scales, packed, with its colsum, and the dense
    int8 weight."""
    wq, scale = fuseops.quantize_per_channel_int8(dense_2_4(n, k, device, seed=seed))
    values, meta, s = fuseops.pack_2_4(wq, scale)
    return (values, meta, s, fuseops.colsum_2_4(values)), wq, scale


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m,n,k", SHAPES + [(5, 33, 200), (3, 17, 8192)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_dynamic_matches_float64_reference(dtype, m, n, k, with_bias, device):
    weight, wq, scale = int8_2_4(n, k, device)
    x = torch.randn(m, k, device=device).to(dtype)
    bias = torch.randn(n, device=device).to(dtype) if with_bias else None
    y = fuseops.sparse_2_4_dynamic_linear(x, *weight, bias)
    assert y.dtype == dtype and y.shape == (m, n) and y.is_contiguous()
    assert_dynamic_matches(y, dynamic_reference(x, wq, scale, bias))


def test_dynamic_extreme_values_are_exact(device):
    # Activations at +-absmax quantize to +-127 and kept weights of -128 or
    # 127 (a packed weight need not come from quantize_per_channel_int8):
    # the largest products. Every sum is a whole number below 2^24, so
    # float(acc) is exact; with scales of 1 the result is the sum itself.
    n, k = 33, 1032
    gen = torch.Generator().manual_seed(3)
    keep = fuseops.prune_2_4(torch.randn(n, k, generator=gen)) != 0
    wq = (
        (torch.where(torch.rand(n, k, generator=gen) < 0.5, -128, 127) * keep)
        .to(torch.int8)
        .to(device)
    )
    x = torch.where(torch.rand(4, k, generator=gen) < 0.5, -127.0, 127.0).to(device)
    values, meta, s = fuseops.pack_2_4(wq, torch.ones(n, device=device))
    y = fuseops.sparse_2_4_dynamic_linear(x, values, meta, s, fuseops.colsum_2_4(values))
    assert torch.equal(y.double(), x.double() @ wq.double().T)


def test_dynamic_rows_are_independent_and_special_rows(device):
    weight, _, _ = int8_2_4(40, 300, device)
    x = torch.randn(100, 300, device=device)
    x[3] = 0
    x[7, 5] = float("inf")
    x[50, 0] = float("nan")
    bias = torch.randn(40, device=device)
    batch = fuseops.sparse_2_4_dynamic_linear(x, *weight, bias)
    assert torch.equal(batch[3], bias)  # an all-zero row: the bias alone
    assert batch[7].isnan().all() and batch[50].isnan().all()
    finite = [r for r in range(100) if r not in (7, 50)]
    assert batch[finite].isfinite().all()
    for row in (0, 1, 2, 5, 11, 12, 47, 48, 99):
        assert torch.equal(
            fuseops.sparse_2_4_dynamic_linear(x[row : row + 1], *weight, bias), batch[row : row + 1]
        )


@pytest.mark.parametrize("layout", ["transposed", "sliced", "3d"])
def test_dynamic_any_layout_and_leading_dims(layout, device):
    weight, _, _ = int8_2_4(24, 20, device)
    if layout == "transposed":
        x = torch.randn(20, 6, device=device).t()
    elif layout == "sliced":
        x = torch.randn(6, 40, device=device)[:, ::2]
    else:
        x = torch.randn(2, 3, 20, device=device)
    y = fuseops.sparse_2_4_dynamic_linear(x, *weight)
    assert y.shape == x.shape[:-1] + (24,)
    assert torch.equal(y, fuseops.sparse_2_4_dynamic_linear(x.contiguous(), *weight))
    values, meta, s, colsum = weight
    strided = (values.t().contiguous().t(), meta.t().contiguous().t(), s, colsum)
    assert torch.equal(fuseops.sparse_2_4_dynamic_linear(x, *strided), y)


def test_dynamic_empty_inputs(device):
    weight, _, _ = int8_2_4(8, 12, device)
    assert fuseops.sparse_2_4_dynamic_linear(torch.randn(0, 12, device=device), *weight).shape == (
        0,
        8,
    )
    values, meta, s = fuseops.pack_2_4(
        torch.zeros(5, 0, dtype=torch.int8, device=device), torch.ones(5, device=device)
    )
    bias = torch.randn(5, device=device)
    y = fuseops.sparse_2_4_dynamic_linear(
        torch.randn(3, 0, device=device), values, meta, s, fuseops.colsum_2_4(values), bias
    )
    assert torch.equal(y, bias.expand(3, 5))


def test_dynamic_inference_only(device):
    weight, _, _ = int8_2_4(8, 12, device)
    x = torch.randn(2, 12, device=device, requires_grad=True)
    expect_error_mentions(
        lambda: fuseops.sparse_2_4_dynamic_linear(x, *weight),
        ["fuseops::sparse_2_4_dynamic_linear", "inference op", "torch.no_grad()"],
    )
    with torch.no_grad():
        assert not fuseops.sparse_2_4_dynamic_linear(x, *weight).requires_grad


def test_dynamic_bad_inputs(device):
    (values, meta, s, colsum), _, _ = int8_2_4(20, 16, device)
    op = "fuseops::sparse_2_4_dynamic_linear"
    f = fuseops.sparse_2_4_dynamic_linear
    x = torch.randn(2, 16, device=device)
    expect_error_mentions(
        lambda: f(torch.randn(2, 12, device=device), values, meta, s, colsum),
        [op, "'input'", "K = 12"],
    )
    expect_error_mentions(lambda: f(x, values.float(), meta, s, colsum), [op, "'values'", "int8"])
    expect_error_mentions(lambda: f(x, values, meta[:3], s, colsum), [op, "'meta'", "[20, 2]"])
    expect_error_mentions(lambda: f(x, values, meta, s[:5], colsum), [op, "'scale'", "[20]"])
    expect_error_mentions(lambda: f(x, values, meta, s, colsum.long()), [op, "'colsum'", "int32"])
    expect_error_mentions(lambda: f(x, values, meta, s, colsum[:19]), [op, "'colsum'", "[20]"])
    expect_error_mentions(
        lambda: f(x, values, meta, s, colsum, torch.randn(19, device=device)),
        [op, "'bias'", "[20]"],
    )
    expect_error_mentions(lambda: f(x.int(), values, meta, s, colsum), [op, "'input'", "dtype"])
    big_k = 132108
    big = fuseops.pack_2_4(
        torch.zeros(1, big_k, dtype=torch.int8, device=device), torch.ones(1, device=device)
    )
    expect_error_mentions(
        lambda: f(
            torch.zeros(1, big_k, device=device),
            *big,
            torch.zeros(1, dtype=torch.int32, device=device),
        ),
        [op, "'input'", "at most 132104"],
    )


# Checked in every CPU build (and on AVX-512 with VNNI switched off) against
# the bits this process's build gives: the sums are exact, so no build may
# differ; the dense W8A8 op on the same weights (its activations per block of
# 32) against its own bits likewise.
_BUILDS_CODE = """
import torch, fuseops
inputs, want = torch.load({path!r})
with torch.inference_mode():
    for (x, weight, dense, bias), ys in zip(inputs, want):
        got = (fuseops.sparse_2_4_dynamic_linear(x, *weight, bias), fuseops.int8_dynamic_linear(x, *dense, bias))
        for g, y in zip(got, ys):
            torch.testing.assert_close(g, y, rtol=0, atol=0, equal_nan=True)
"""


@pytest.fixture(scope="module")
def dynamic_calls(tmp_path_factory):
    inputs = []
    for dtype in DTYPES:
        for m, n, k in [(1, 37, 140), (2, 33, 200), (5, 17, 8192), (61, 40, 68)]:
            weight, wq, scale = int8_2_4(n, k, "cpu", seed=m)
            x = torch.randn(m, k).to(dtype)
            if m > 1:
                x[-1, 1] = float("nan")
            inputs.append(
                (x, weight, fuseops.pack_int8_weight(wq, scale), torch.randn(n).to(dtype))
            )
    with torch.inference_mode():
        want = [
            (
                fuseops.sparse_2_4_dynamic_linear(x, *weight, bias),
                fuseops.int8_dynamic_linear(x, *dense, bias),
            )
            for x, weight, dense, bias in inputs
        ]
    path = tmp_path_factory.mktemp("sparse_w8a8") / "calls.pt"
    torch.save((inputs, want), path)
    return str(path)


@pytest.mark.parametrize("capability", [c.lower() for c in CAPABILITY_ORDER])
def test_dynamic_same_bits_in_every_cpu_build(capability, dynamic_calls):
    run_under_cpu_capability(capability, _BUILDS_CODE.format(path=dynamic_calls))


# colsum only corrects the VNNI path's activations shifted to unsigned: the
# other paths ignore it, so a wrong one shows which path ran.
_WRONG_COLSUM_CODE = """
x, (values, meta, s, colsum), (packed, ds, dcolsum), bias = inputs[0]
with torch.inference_mode():
    sparse = fuseops.sparse_2_4_dynamic_linear(x, values, meta, s, colsum + 1, bias)
    dense = fuseops.int8_dynamic_linear(x, packed, ds, dcolsum + 1, bias)
print(torch.equal(sparse, want[0][0]), torch.equal(dense, want[0][1]))
"""


def test_dynamic_same_bits_without_vnni(dynamic_calls):
    # FUSEOPS_DISABLE_AVX512_VNNI=1: the AVX-512 build's paths for CPUs
    # without AVX512_VNNI (vpmaddwd), here and in int8_dynamic_linear.
    if not cpu_runs("AVX512"):
        pytest.skip("this CPU cannot run AVX512 code")
    code = _BUILDS_CODE.format(path=dynamic_calls) + _WRONG_COLSUM_CODE
    forced = run_python(code, {"FUSEOPS_DISABLE_AVX512_VNNI": "1", "ATEN_CPU_CAPABILITY": "avx512"})
    assert forced.returncode == 0, forced.stderr
    assert forced.stdout.split()[-2:] == ["True", "True"], forced.stdout
    with open("/proc/cpuinfo") as f:
        flags = f.read()
    if "avx512_vnni" in flags and "avx512_vbmi2" in flags:
        # And without the switch the VNNI paths run: the wrong colsum shows.
        plain = run_python(code, {"ATEN_CPU_CAPABILITY": "avx512"})
        assert plain.returncode == 0, plain.stderr
        assert plain.stdout.split()[-2:] == ["False", "False"], plain.stdout


# --- fuseops.nn.Sparse24Linear and fuseops.quantize_ ------------------------------


@pytest.mark.parametrize("mode", ["2:4", "2:4+w8a16", "2:4+w8a8"])
def test_module_from_float_and_state_dict(mode, device):
    linear = torch.nn.Linear(72, 33, device=device)
    module = fuseops.nn.Sparse24Linear.from_float(linear, mode=mode)
    assert module.mode == mode and f"mode={mode!r}" in repr(module)
    x = torch.randn(4, 72, device=device)
    with torch.no_grad():
        y = module(x)
        pruned = fuseops.prune_2_4(linear.weight)
        if mode == "2:4":
            assert module.values.dtype == torch.float32
            assert_matches(y, x.double() @ pruned.double().T + linear.bias.double(), 72)
        elif mode == "2:4+w8a16":
            wq, scale = fuseops.quantize_per_channel_int8(pruned)
            assert module.values.dtype == torch.int8
            assert_matches(
                y, (x.double() @ wq.double().T) * scale.double() + linear.bias.double(), 72
            )
        else:
            wq, scale = fuseops.quantize_per_channel_int8(pruned)
            assert module.values.dtype == torch.int8
            assert torch.equal(module.colsum, wq.sum(1, dtype=torch.int32))
            assert_dynamic_matches(y, dynamic_reference(x, wq, scale, linear.bias))
    assert set(module.state_dict()) == {"values", "meta", "scale", "bias"}
    buffer = io.BytesIO()
    torch.save(module.state_dict(), buffer)
    buffer.seek(0)
    restored = fuseops.nn.Sparse24Linear(72, 33, device=device, mode=mode)
    restored.load_state_dict(torch.load(buffer))
    with torch.no_grad():
        assert torch.equal(restored(x), y)
        assert torch.equal(module(x.bfloat16()), restored(x.bfloat16()))
    module.to(torch.bfloat16)
    assert module.scale.dtype == torch.float32 and module.bias.dtype == torch.bfloat16
    assert module.meta.dtype == torch.uint8
    assert module.values.dtype == (torch.bfloat16 if mode == "2:4" else torch.int8)
    with torch.no_grad():
        assert module(x.bfloat16()).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="unknown mode '2:4\\+w4'"):
        fuseops.nn.Sparse24Linear(8, 8, mode="2:4+w4")
    with pytest.raises(ValueError, match="multiple of 4"):
        fuseops.nn.Sparse24Linear(6, 8)
    with torch.no_grad():  # a fresh module (zero weights, a valid mask): the bias alone
        fresh = fuseops.nn.Sparse24Linear(8, 3, device=device, mode=mode)
        assert torch.equal(fresh(torch.randn(2, 8, device=device)), fresh.bias.expand(2, 3))


def test_module_int8_modes_share_buffers(device):
    # "2:4+w8a16" and "2:4+w8a8" hold the same buffers: a state_dict saved
    # in one loads in the other (colsum, not saved, is derived on loading),
    # and the mode may be switched between them, not to or from "2:4".
    linear = torch.nn.Linear(64, 24, device=device)
    w8a16 = fuseops.nn.Sparse24Linear.from_float(linear, mode="2:4+w8a16")
    w8a8 = fuseops.nn.Sparse24Linear(64, 24, device=device, mode="2:4+w8a8")
    w8a8.load_state_dict(w8a16.state_dict())
    assert "colsum" not in w8a16.state_dict() and torch.equal(
        w8a8.colsum, w8a8.values.sum(1, dtype=torch.int32)
    )
    x = torch.randn(3, 64, device=device)
    with torch.no_grad():
        values, meta, scale = w8a16.values, w8a16.meta, w8a16.scale
        y8 = fuseops.sparse_2_4_dynamic_linear(
            x, values, meta, scale, fuseops.colsum_2_4(values), linear.bias
        )
        y16 = fuseops.sparse_2_4_linear(x, values, meta, scale, linear.bias)
        assert torch.equal(w8a8(x), y8) and torch.equal(w8a16(x), y16) and not torch.equal(y8, y16)
        w8a16.mode = "2:4+w8a8"
        assert w8a16.mode == "2:4+w8a8" and "mode='2:4+w8a8'" in repr(w8a16)
        assert torch.equal(w8a16(x), y8)
        w8a8.mode = "2:4+w8a16"
        assert torch.equal(w8a8(x), y16)
    with pytest.raises(ValueError, match="cannot switch"):
        w8a8.mode = "2:4"
    with pytest.raises(ValueError, match="cannot switch"):
        fuseops.nn.Sparse24Linear(8, 8).mode = "2:4+w8a8"
    with pytest.raises(ValueError, match="unknown mode 'w8a8'"):
        w8a8.mode = "w8a8"
    assert w8a8.mode == "2:4+w8a16"


@pytest.mark.parametrize("mode", ["2:4", "2:4+w8a16", "2:4+w8a8"])
def test_quantize_2_4_modes(mode, device):
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 64, bias=False),
        torch.nn.Linear(64, 6),
        torch.nn.Linear(6, 8),
    ).to(device)
    x = torch.randn(5, 32, device=device)
    changed = fuseops.quantize_(model, mode=mode, skip=["3"])
    # "4" has 6 input features: not a multiple of 4, left alone.
    assert [(c.name, c.mode) for c in changed] == [("0", mode), ("2", mode)]
    assert isinstance(model[0], fuseops.nn.Sparse24Linear) and isinstance(
        model[2], fuseops.nn.Sparse24Linear
    )
    assert type(model[3]) is torch.nn.Linear and type(model[4]) is torch.nn.Linear
    with torch.no_grad():
        assert model(x).shape == (5, 8)


@pytest.mark.parametrize(
    "mode,op", [("2:4+w8a16", "sparse_2_4_linear"), ("2:4+w8a8", "sparse_2_4_dynamic_linear")]
)
def test_sparse_model_compiles_and_exports(mode, op):
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    fuseops.quantize_(model, mode=mode)
    x = torch.randn(3, 16)
    with torch.no_grad():
        eager = model(x)
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")(x)
    assert torch.equal(compiled, eager)
    exported = torch.export.export(model, (x,))
    targets = {str(n.target) for n in exported.graph.nodes if n.op == "call_function"}
    assert f"fuseops.{op}.default" in targets
    with torch.no_grad():
        assert torch.equal(exported.module()(x), eager)
