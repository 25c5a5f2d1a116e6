"""out= tensors that share memory with inputs, with each other or with
themselves: every op follows the one rule of cpp/ops/common/checks.h
(prepare_outputs / writes_directly). Overlap with an input is computed as if
the inputs had been copied first; an out= that must be resized while sharing
an input's memory, two outputs sharing memory, and an out= whose elements
overlap each other are refused with an error naming the op and arguments.

Inputs are float64 and results are compared with fuseops.reference computed
on copies of the inputs taken before the call, within rtol 1e-10 (float64
kernels differ from the reference only in rounding of a few operations per
element). The regressions came from the fuzzer in test_fuzz.py.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch

import fuseops
from fuseops import reference

from support.errors import expect_error_mentions

F64 = torch.float64


def assert_close(actual, wanted):
    torch.testing.assert_close(actual, wanted, rtol=1e-10, atol=1e-12)


def packed_buffer():
    return torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], dtype=F64)


@pytest.mark.parametrize("form", ["swiglu", "geglu-none", "geglu-tanh"])
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "separate"])
def test_out_overlapping_strided_input(form, packed):
    # out covers elements 2..4 of a [3, 2] buffer whose columns are gate and
    # up: rows 1 and 2 of the inputs are overwritten by rows 0 and 1 of the
    # result unless every input is read first. ATen calls this overlap "too
    # hard"; it used to be treated as "none".
    buf = packed_buffer()
    gate, up = buf[:, :1].clone(), buf[:, 1:].clone()
    if form == "swiglu":
        expected = reference.swiglu(gate, up)
        op = fuseops.swiglu
    else:
        approximate = form.split("-")[1]
        expected = reference.geglu(gate, up, approximate)
        op = functools.partial(fuseops.geglu, approximate=approximate)
    out = buf.view(-1)[2:5].view(3, 1)
    args = (buf,) if packed else (buf[:, :1], buf[:, 1:])
    op(*args, out=out)
    assert_close(out, expected)


def test_out_overlapping_strided_input_report():
    # The report's numbers: row 1 is silu(3) * 4 = 11.431, was 4.748.
    buf = packed_buffer()
    fuseops.swiglu(buf, out=buf.view(-1)[2:5].view(3, 1))
    assert buf.view(-1)[3].item() == pytest.approx(4.0 * 3.0 / (1.0 + math.exp(-3.0)), rel=1e-12)


@pytest.mark.parametrize("op", ["relu", "gelu", "silu"])
def test_elementwise_out_overlapping_transposed_input(op):
    buf = torch.randn(5, 5, dtype=F64)
    x = buf.t()[:4]  # strided view of rows 0..3 of the columns
    expected = getattr(reference, op)(x.clone())
    out = buf[1:]  # contiguous rows 1..4: overlaps x without being x
    getattr(fuseops, op)(x, out=out)
    assert_close(out, expected)


def test_bias_gelu_out_is_bias_needing_resize_is_refused():
    x = torch.randn(4, 8, dtype=F64)
    b = torch.randn(8, dtype=F64)
    before = b.clone()
    expect_error_mentions(
        lambda: fuseops.bias_gelu(x, b, out=b),
        ["fuseops::bias_gelu.out", "'out'", "'bias'", "resized"],
    )
    assert torch.equal(b, before)


def test_bias_gelu_out_is_bias_same_shape_is_computed():
    x = torch.randn(8, dtype=F64)
    b = torch.randn(8, dtype=F64)
    expected = reference.bias_gelu(x, b.clone())
    fuseops.bias_gelu(x, b, out=b)
    assert_close(b, expected)


def test_rms_norm_out_is_weight_is_refused():
    x = torch.randn(4, 8, dtype=F64)
    w = torch.randn(8, dtype=F64)
    before = w.clone()
    expect_error_mentions(
        lambda: fuseops.rms_norm(x, w, out=w), ["fuseops::rms_norm.out", "'out'", "'weight'"]
    )
    assert torch.equal(w, before)


def test_rms_norm_out_overlapping_weight_is_computed():
    # Row 0 of out is the weight itself; earlier rows used to overwrite the
    # weight later rows still read.
    buf = torch.randn(5, 8, dtype=F64)
    x = torch.randn(4, 8, dtype=F64)
    w = buf[0]
    expected = reference.rms_norm(x, w.clone(), 1e-6)
    out = buf[:4]
    fuseops.rms_norm(x, w, 1e-6, out=out)
    assert_close(out, expected)


def test_fused_add_rms_norm_out_overlapping_weight_is_computed():
    buf = torch.randn(5, 8, dtype=F64)
    x, r = torch.randn(4, 8, dtype=F64), torch.randn(4, 8, dtype=F64)
    w = buf[1]
    expected_out, expected_res = reference.fused_add_rms_norm(x, r, w.clone(), 1e-6)
    out, res_out = buf[:4], torch.empty(4, 8, dtype=F64)
    fuseops.fused_add_rms_norm(x, r, w, 1e-6, out=out, residual_out=res_out)
    assert_close(out, expected_out)
    assert_close(res_out, expected_res)


def test_fused_add_rms_norm_out_is_weight_is_refused():
    x, r = torch.randn(4, 8, dtype=F64), torch.randn(4, 8, dtype=F64)
    w = torch.randn(8, dtype=F64)
    expect_error_mentions(
        lambda: fuseops.fused_add_rms_norm(
            x, r, w, out=w, residual_out=torch.empty(4, 8, dtype=F64)
        ),
        ["fuseops::fused_add_rms_norm.out", "'out'", "'weight'"],
    )


def test_layer_norm_out_is_weight_is_refused():
    x = torch.randn(4, 8, dtype=F64)
    w, b = torch.randn(8, dtype=F64), torch.randn(8, dtype=F64)
    expect_error_mentions(
        lambda: fuseops.layer_norm(x, w, b, out=b), ["fuseops::layer_norm.out", "'out'", "'bias'"]
    )


def test_fused_add_rms_norm_outputs_sharing_memory_are_refused():
    x, r = torch.randn(4, 8, dtype=F64), torch.randn(4, 8, dtype=F64)
    o = torch.empty(4, 8, dtype=F64)
    expect_error_mentions(
        lambda: fuseops.fused_add_rms_norm(x, r, out=o, residual_out=o),
        ["fuseops::fused_add_rms_norm.out", "'out'", "'residual_out'"],
    )
    buf = torch.empty(7, 8, dtype=F64)
    expect_error_mentions(
        lambda: fuseops.fused_add_rms_norm(x, r, out=buf[:4], residual_out=buf[3:]),
        ["fuseops::fused_add_rms_norm.out", "'out'", "'residual_out'", "share memory"],
    )


@pytest.mark.parametrize("swap", [False, True], ids=["out=x", "out=residual"])
def test_fused_add_rms_norm_in_place_both_ways(swap):
    x, r = torch.randn(4, 8, dtype=F64), torch.randn(4, 8, dtype=F64)
    w = torch.randn(8, dtype=F64)
    expected_out, expected_res = reference.fused_add_rms_norm(x, r, w, 1e-6)
    out, res_out = (r, x) if swap else (x, r)
    fuseops.fused_add_rms_norm(x, r, w, 1e-6, out=out, residual_out=res_out)
    assert_close(out, expected_out)
    assert_close(res_out, expected_res)


OUT_CALLS = {
    "relu": lambda out: fuseops.relu(torch.randn(4, 8), out=out),
    "gelu": lambda out: fuseops.gelu(torch.randn(4, 8), out=out),
    "silu": lambda out: fuseops.silu(torch.randn(4, 8), out=out),
    "bias_gelu": lambda out: fuseops.bias_gelu(torch.randn(4, 8), torch.randn(8), out=out),
    "swiglu": lambda out: fuseops.swiglu(torch.randn(4, 8), torch.randn(4, 8), out=out),
    "swiglu.packed": lambda out: fuseops.swiglu(torch.randn(4, 16), out=out),
    "geglu": lambda out: fuseops.geglu(torch.randn(4, 8), torch.randn(4, 8), out=out),
    "geglu.packed": lambda out: fuseops.geglu(torch.randn(4, 16), out=out),
    "rms_norm": lambda out: fuseops.rms_norm(torch.randn(4, 8), out=out),
    "layer_norm": lambda out: fuseops.layer_norm(torch.randn(4, 8), out=out),
    "fused_add_rms_norm": lambda out: fuseops.fused_add_rms_norm(
        torch.randn(4, 8), torch.randn(4, 8), out=out, residual_out=torch.empty(4, 8)
    ),
}


@pytest.mark.parametrize("name", sorted(OUT_CALLS))
def test_internally_overlapping_out_is_refused(name):
    overload = "packed_out" if name.endswith(".packed") else "out"
    op = "fuseops::" + name.split(".")[0] + "." + overload
    expect_error_mentions(
        lambda: OUT_CALLS[name](torch.empty(1, 8).expand(4, 8)),
        [op, "'out'", "share memory", "[0, 1]"],
    )


def test_provably_distinct_strided_out_is_accepted():
    # Transposed and sliced outputs have distinct elements though ATen cannot
    # tell them apart from overlapping ones cheaply.
    x = torch.randn(4, 8, dtype=F64)
    out = torch.empty(8, 9, dtype=F64)[:, ::2].t()
    fuseops.silu(x, out=out)
    assert_close(out, reference.silu(x))
