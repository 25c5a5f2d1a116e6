"""fuseops.int4_dynamic_linear (W4A8): int4_weight_only_linear's packed
weight times activations quantized to int8 per row and weight group, and the "w4a8" mode of
fuseops.nn.Int4Linear, quantize_ and fuseops.transformers.apply (opcheck,
compilers, Meta, pybind and every CPU build's results against float64 are in
test_conformance.py, fed by fuseops/ops/int4_linear.py's samples).

The reference is the same quantized math in float64: each group of a row
quantized in float32 exactly as the op does (fuseops.reference.quantize_per_token_int8
on the row's groups),
the weight dequantized exactly, the products summed in float64. The op's
products and zero-point shares are exact integers (int32); what rounds is
its float32 epilogue: per group, the product of the weight's and the
activations' scales, and one fused multiply-add (that product times the
group's integer sum, added to the row's result), so its error is a few float32 roundings of the terms per group:
the tolerance 2e-6 * sqrt(K) of max|y| (as test_int4_linear.py's) plus one
unit in the last place of bfloat16/float16 results holds that with margin
and still catches a wrong element. The error against the float layer adds
the activations' int8 rounding to the weights': it is reported, and bounded
against W4A16's on the same weights.
"""

from __future__ import annotations

import io

import pytest
import torch

import fuseops
from fuseops import reference

from support.cpu_builds import CAPABILITY_ORDER, run_under_cpu_capability
from support.errors import expect_error_mentions
from support.int8_math import ROUNDING
from support.params import DTYPES


def packed_weight(n, k, group_size, device, symmetric=True, seed=0):
    gen = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=gen) * 0.05).to(device)
    quantized = fuseops.quantize_per_group_int4(w, group_size, symmetric)
    return w, fuseops.pack_int4_weight(*quantized, group_size)


def assert_matches(y, want, k):
    tolerance = 2e-6 * max(1.0, k) ** 0.5 + ROUNDING[y.dtype]
    scale = max(1.0, want.abs().max().item()) if want.numel() else 1.0
    torch.testing.assert_close(
        y.double(), want.double(), rtol=ROUNDING[y.dtype], atol=tolerance * scale
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "m,n,k,group_size",
    [
        (1, 16, 32, 32),
        (1, 37, 129, 64),
        (3, 5, 1, 2),
        (8, 64, 256, 128),
        (9, 40, 300, 12),  # groups of 12: the last step of each is half empty
        (33, 40, 67, 16),
        (70, 48, 130, 8),
    ],
)
@pytest.mark.parametrize("symmetric", [True, False])
def test_matches_float64_reference(dtype, m, n, k, group_size, symmetric, device):
    _, (packed, scale_zero) = packed_weight(n, k, group_size, device, symmetric)
    x = torch.randn(m, k, device=device).to(dtype)
    bias = torch.randn(n, device=device).to(dtype)
    y = fuseops.int4_dynamic_linear(x, packed, scale_zero, group_size, bias)
    assert y.dtype == dtype and y.shape == (m, n) and y.is_contiguous()
    want = reference.int4_dynamic_linear(x.double(), packed, scale_zero, group_size, bias.double())
    # The reference quantizes float64 rows as the op does: rounded to float32 first.
    assert_matches(y, want, k)


def test_quantizes_the_activations():
    """Not the weight-only product: the result is that of the int8-rounded
    activations (a row of values that int8 cannot hold shows it)."""
    _, (packed, scale_zero) = packed_weight(16, 64, 32, "cpu")
    x = torch.zeros(1, 64)
    x[0, 0], x[0, 1] = 127.0, 0.4  # 0.4 rounds to 0 at scale 1
    dynamic = fuseops.int4_dynamic_linear(x, packed, scale_zero, 32)
    rounded = fuseops.int4_weight_only_linear(torch.round(x), packed, scale_zero, 32)
    weight_only = fuseops.int4_weight_only_linear(x, packed, scale_zero, 32)
    torch.testing.assert_close(dynamic, rounded, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(dynamic, weight_only, rtol=1e-6, atol=1e-6)


def test_each_group_gets_its_own_activation_scale(device):
    """A large value in one group of a row sets that group's step only: the
    other groups keep their small values (at one scale per row, 127.0 in
    group 0 would round every 0.3 of group 1 to 0)."""
    _, (packed, scale_zero) = packed_weight(16, 64, 32, device)
    x = torch.full((1, 64), 0.3, device=device)
    x[0, 0] = 127.0
    dynamic = fuseops.int4_dynamic_linear(x, packed, scale_zero, 32)
    group0_rounded = x.clone()
    group0_rounded[0, :32] = torch.round(x[0, :32])
    weight_only = fuseops.int4_weight_only_linear(group0_rounded, packed, scale_zero, 32)
    torch.testing.assert_close(dynamic, weight_only, rtol=1e-5, atol=1e-4)
    per_row = x.clone()
    per_row[0, 32:] = 0.0
    per_row[0, :32] = torch.round(x[0, :32])
    assert not torch.allclose(
        dynamic, fuseops.int4_weight_only_linear(per_row, packed, scale_zero, 32), atol=1e-3
    )


def test_rows_do_not_depend_on_the_batch(device):
    # Integer sums, and the same float32 epilogue whatever the tile, so a row
    # computed alone equals the same row in a batch (decode vs prefill).
    _, (packed, scale_zero) = packed_weight(40, 300, 64, device)
    x = torch.randn(100, 300, device=device)
    batch = fuseops.int4_dynamic_linear(x, packed, scale_zero, 64)
    for row in (0, 5, 8, 31, 32, 99):
        alone = fuseops.int4_dynamic_linear(x[row : row + 1], packed, scale_zero, 64)
        assert torch.equal(alone, batch[row : row + 1])


_BUILDS_CODE = """
import os
if {no_vnni}:
    os.environ["FUSEOPS_DISABLE_AVX512_VNNI"] = "1"
import torch, fuseops
inputs, want = torch.load({path!r})
with torch.inference_mode():
    for (x, packed, scale_zero, group_size, bias), y in zip(inputs, want):
        got = fuseops.int4_dynamic_linear(x, packed, scale_zero, group_size, bias)
        torch.testing.assert_close(got, y, rtol=0, atol=0, equal_nan=True)
"""


@pytest.fixture(scope="module")
def builds_calls(tmp_path_factory):
    # One tile and several chunks, both quantizers, group sizes that are
    # and are not multiples of 8, a partial block of channels, a NaN row.
    inputs = []
    for dtype in DTYPES:
        for m, symmetric, group_size in [(1, True, 64), (3, False, 12), (61, False, 32)]:
            _, weight = packed_weight(37, 300, group_size, "cpu", symmetric, seed=m)
            x = torch.randn(m, 300).to(dtype)
            if m > 1:
                x[-1, 1] = float("nan")
            inputs.append((x, *weight, group_size, torch.randn(37).to(dtype)))
    with torch.inference_mode():
        want = [fuseops.int4_dynamic_linear(*call) for call in inputs]
    path = tmp_path_factory.mktemp("int4_dynamic") / "calls.pt"
    torch.save((inputs, want), path)
    return str(path)


@pytest.mark.parametrize("capability", [c.lower() for c in CAPABILITY_ORDER])
def test_same_bits_in_every_cpu_build(capability, builds_calls):
    run_under_cpu_capability(capability, _BUILDS_CODE.format(path=builds_calls, no_vnni=False))


def test_same_bits_without_vnni(builds_calls):
    # The AVX-512 build's path for CPUs without AVX512_VNNI (16-bit pair
    # products), forced on a CPU that has it; the plain AVX-512 run above
    # takes the VNNI path where the CPU has it.
    run_under_cpu_capability("avx512", _BUILDS_CODE.format(path=builds_calls, no_vnni=True))


def test_special_values_make_their_row_nan(device):
    _, (packed, scale_zero) = packed_weight(20, 64, 32, device)
    x = torch.randn(4, 64, device=device)
    x[1, 3] = float("nan")
    x[2, 40] = float("inf")
    y = fuseops.int4_dynamic_linear(x, packed, scale_zero, 32)
    assert y[1].isnan().all() and y[2].isnan().all()
    want = reference.int4_dynamic_linear(x[[0, 3]].double(), packed, scale_zero, 32)
    assert_matches(y[[0, 3]], want, 64)


def test_empty_inputs(device):
    _, (packed, scale_zero) = packed_weight(8, 12, 4, device)
    y = fuseops.int4_dynamic_linear(torch.randn(0, 12, device=device), packed, scale_zero, 4)
    assert y.shape == (0, 8)
    empty_k = fuseops.pack_int4_weight(
        *fuseops.quantize_per_group_int4(torch.zeros(5, 0, device=device), 2), 2
    )
    bias = torch.randn(5, device=device)
    y = fuseops.int4_dynamic_linear(torch.randn(3, 0, device=device), *empty_k, 2, bias)
    assert torch.equal(y, bias.expand(3, 5))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_error_against_the_float_layer(dtype, device):
    """Reported, not the correctness criterion: W4A8 adds the activations'
    int8 rounding (about 1% relative on Gaussian rows) to int4's ~10%."""
    gen = torch.Generator().manual_seed(3)
    w = (torch.randn(256, 1024, generator=gen) * 0.05).to(device)
    x = torch.randn(16, 1024, generator=gen).to(device).to(dtype)
    exact = x.double() @ w.double().T
    packed = fuseops.pack_int4_weight(*fuseops.quantize_per_group_int4(w, 128), 128)
    errors = {}
    for name, op in (
        ("w4a16", fuseops.int4_weight_only_linear),
        ("w4a8", fuseops.int4_dynamic_linear),
    ):
        y = op(x, *packed, 128).double()
        errors[name] = ((y - exact).norm() / exact.norm()).item()
    print(f"int4 vs float layer ({dtype}): " + ", ".join(f"{k} {v:.3e}" for k, v in errors.items()))
    assert errors["w4a8"] < errors["w4a16"] + 0.02


def test_inference_only_and_bad_inputs(device):
    _, (packed, scale_zero) = packed_weight(8, 12, 4, device)
    x = torch.randn(2, 12, device=device, requires_grad=True)
    expect_error_mentions(
        lambda: fuseops.int4_dynamic_linear(x, packed, scale_zero, 4),
        ["fuseops::int4_dynamic_linear", "inference op", "torch.no_grad()"],
    )
    with torch.no_grad():
        expect_error_mentions(
            lambda: fuseops.int4_dynamic_linear(x, packed, scale_zero, 6),
            ["fuseops::int4_dynamic_linear", "packed", "group_size"],
        )
        expect_error_mentions(
            lambda: fuseops.int4_dynamic_linear(x[:, :8], packed, scale_zero, 4),
            ["fuseops::int4_dynamic_linear", "input", "K = 8"],
        )
        expect_error_mentions(
            lambda: fuseops.int4_dynamic_linear(x, packed, scale_zero, 4, torch.randn(7)),
            ["fuseops::int4_dynamic_linear", "bias"],
        )
        expect_error_mentions(
            lambda: fuseops.int4_dynamic_linear(x.int(), packed, scale_zero, 4),
            ["fuseops::int4_dynamic_linear", "input"],
        )


# --- the "w4a8" mode ----------------------------------------------------------


def test_int4_linear_w4a8_mode_shares_the_w4a16_buffers(device):
    linear = torch.nn.Linear(70, 33, device=device)
    module = fuseops.nn.Int4Linear.from_float(linear, group_size=32, mode="w4a8")
    assert module.mode == "w4a8" and "mode='w4a8'" in repr(module)
    x = torch.randn(4, 70, device=device)
    with torch.no_grad():
        y = module(x)
        want = fuseops.int4_dynamic_linear(x, module.packed, module.scale_zero, 32, module.bias)
        assert torch.equal(y, want)
        assert ((y - linear(x)).norm() / linear(x).norm()).item() < 0.2
    buffer = io.BytesIO()
    torch.save(module.state_dict(), buffer)
    buffer.seek(0)
    weight_only = fuseops.nn.Int4Linear(70, 33, device=device, group_size=32)
    weight_only.load_state_dict(torch.load(buffer))
    with torch.no_grad():
        assert torch.equal(
            weight_only(x),
            fuseops.int4_weight_only_linear(x, module.packed, module.scale_zero, 32, module.bias),
        )
        weight_only.mode = "w4a8"
        assert torch.equal(weight_only(x), y)


def test_quantize_w4a8_and_export():
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 8))
    changed = fuseops.quantize_(model, "w4a8", group_size=32)
    assert [(c.name, c.mode) for c in changed] == [("0", "w4a8"), ("2", "w4a8")]
    assert all(model[i].mode == "w4a8" and model[i].group_size == 32 for i in (0, 2))
    x = torch.randn(3, 64)
    with torch.no_grad():
        eager = model(x)
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")(x)
    assert torch.equal(compiled, eager)
    exported = torch.export.export(model, (x,))
    targets = {str(n.target) for n in exported.graph.nodes if n.op == "call_function"}
    assert "fuseops.int4_dynamic_linear.default" in targets
