"""fuseops int8 quantization numerics (opcheck, compilers, Meta, pybind and
every CPU build are in test_conformance.py, fed by
fuseops/ops/quantize.py's samples).

The op's math is float32 by definition (absmax / 127, round(x / scale) to
nearest even), so q and scale must equal the reference's bit for bit: no
tolerance. The error against the unquantized values is checked separately:
at most half a quantization step per element.
"""

from __future__ import annotations

import pytest
import torch

import fuseops
from fuseops import reference

from support.errors import expect_error_mentions
from support.params import DTYPES


def make(shape, dtype, layout, device):
    if layout == "transposed" and len(shape) > 1:
        return (torch.randn(shape[::-1], device=device) * 4).to(dtype).transpose(0, -1)
    if layout == "sliced":
        return (torch.randn(shape[:-1] + (2 * shape[-1],), device=device) * 4).to(dtype)[..., ::2]
    return (torch.randn(shape, device=device) * 4).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "shape", [(1, 1), (3, 17), (0, 5), (4, 0), (33, 1031), (2, 3, 40)], ids=str
)
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced"])
def test_quantize_matches_reference_exactly(dtype, shape, layout, device):
    x = make(shape, dtype, layout, device)
    if x.shape[0] > 1 and x.shape[-1] > 0:
        x[1] = 0
    q, scale = fuseops.quantize_per_token_int8(x)
    want_q, want_scale = reference.quantize_per_token_int8(x)
    assert q.dtype == torch.int8 and scale.dtype == torch.float32
    assert q.shape == x.shape and scale.shape == x.shape[:-1]
    torch.testing.assert_close(q, want_q, rtol=0, atol=0)
    torch.testing.assert_close(scale, want_scale, rtol=0, atol=0)
    if len(shape) == 2:
        qc, sc = fuseops.quantize_per_channel_int8(x)
        torch.testing.assert_close(qc, want_q, rtol=0, atol=0)
        torch.testing.assert_close(sc, want_scale, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_error_against_unquantized_values_is_half_a_step(dtype, device):
    x = make((64, 515), dtype, "contiguous", device)
    q, scale = fuseops.quantize_per_channel_int8(x)
    back = fuseops.dequantize_int8(q, scale, dim=-1, dtype=torch.float64)
    error = (back - x.double()).abs()
    # Half a step, plus float32 rounding of x / scale and of the scale.
    assert (error <= scale.double()[:, None] * (0.5 + 1e-5) + 1e-30).all()
    assert q.abs().amax(-1).eq(127).all(), "every row's absmax maps to 127"
    relative = (error.norm() / x.double().norm()).item()
    assert relative < 0.01, relative


def test_round_half_to_even_and_zero_rows(device):
    x = torch.tensor(
        [[127.0, 0.5, 1.5, 2.5, -0.5, -1.5, 126.5], [0.0] * 7, [1e-44] + [0.0] * 6], device=device
    )
    q, scale = fuseops.quantize_per_token_int8(x)
    assert q[0].tolist() == [127, 0, 2, 2, 0, -2, 126]
    # absmax / 127 is 0 in float32: scale 1, all zeros, and dequantization gives 0.
    assert scale[1:].tolist() == [1.0, 1.0]
    assert q[1:].eq(0).all()
    assert fuseops.dequantize_int8(q, scale).isfinite().all()


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_non_finite_rows_are_refused(bad, device):
    x = torch.randn(5, 9, device=device)
    x[3, 4] = bad
    expect_error_mentions(
        lambda: fuseops.quantize_per_channel_int8(x),
        ["fuseops::quantize_per_channel_int8", "'weight'", "row 3", "Inf or NaN"],
    )
    huge = torch.zeros(2, 3, dtype=torch.float64, device=device)
    huge[1, 1] = 1e300
    expect_error_mentions(
        lambda: fuseops.quantize_per_token_int8(huge),
        ["'input'", "row 1", "beyond float32's range"],
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("dim", [0, 1, 2, -1, -3])
def test_dequantize_matches_reference(dtype, dim, device):
    q = torch.randint(-127, 128, (4, 9, 37), dtype=torch.int8, device=device)
    shape = list(q.shape)
    del shape[dim]
    scale = torch.rand(shape, device=device) + 0.01
    out = fuseops.dequantize_int8(q, scale, dim, dtype)
    assert out.dtype == dtype and out.shape == q.shape and out.is_contiguous()
    torch.testing.assert_close(out, reference.dequantize_int8(q, scale, dim, dtype), rtol=0, atol=0)
    # A non-contiguous q and scale give the same values.
    qt = q.transpose(0, 1).contiguous().transpose(0, 1)
    st = scale.t().contiguous().t()
    torch.testing.assert_close(fuseops.dequantize_int8(qt, st, dim, dtype), out, rtol=0, atol=0)


def test_inference_only(device):
    w = torch.randn(4, 8, device=device, requires_grad=True)
    expect_error_mentions(
        lambda: fuseops.quantize_per_channel_int8(w),
        ["fuseops::quantize_per_channel_int8", "inference op", "torch.no_grad()"],
    )
    with torch.no_grad():
        q, scale = fuseops.quantize_per_channel_int8(w)
    assert not q.requires_grad and not scale.requires_grad


def test_bad_inputs(device):
    expect_error_mentions(
        lambda: fuseops.quantize_per_channel_int8(torch.randn(2, 3, 4, device=device)),
        ["fuseops::quantize_per_channel_int8", "'weight'", "2-D"],
    )
    expect_error_mentions(
        lambda: fuseops.quantize_per_token_int8(torch.ones(3, 4, dtype=torch.int32, device=device)),
        ["fuseops::quantize_per_token_int8", "'input'", "dtype"],
    )
    expect_error_mentions(
        lambda: fuseops.quantize_per_token_int8(torch.tensor(1.0, device=device)),
        ["fuseops::quantize_per_token_int8", "'input'", "0-d"],
    )
    q = torch.zeros(3, 8, dtype=torch.int8, device=device)
    expect_error_mentions(
        lambda: fuseops.dequantize_int8(q.float(), torch.ones(3, device=device)),
        ["fuseops::dequantize_int8", "'q'", "int8"],
    )
    expect_error_mentions(
        lambda: fuseops.dequantize_int8(q, torch.ones(8, device=device)),
        ["fuseops::dequantize_int8", "'scale'", "shape"],
    )
    expect_error_mentions(
        lambda: fuseops.dequantize_int8(q, torch.ones(3, dtype=torch.float16, device=device)),
        ["fuseops::dequantize_int8", "'scale'", "float32"],
    )
    expect_error_mentions(
        lambda: fuseops.dequantize_int8(q, torch.ones(3, device=device), dim=2),
        ["fuseops::dequantize_int8", "'dim'"],
    )
    expect_error_mentions(
        lambda: fuseops.dequantize_int8(q, torch.ones(3, device=device), dtype=torch.int32),
        ["fuseops::dequantize_int8", "'dtype'"],
    )
