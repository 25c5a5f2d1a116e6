"""fuseops int8 linear layers: pack_int8_weight, int8_weight_only_linear,
fuseops.nn.Int8Linear and fuseops.quantize_ (opcheck, compilers, Meta, pybind
and every CPU build are in test_conformance.py, fed by
fuseops/ops/int8_linear.py's samples).

int8_weight_only_linear is compared with a float64 reference of the same
quantized math, x @ (wq * scale).T + bias with the int8 weight exact in
float64. The op sums K products in float32 (each exact: int8 times a
float32 or narrower activation fits float32's mantissa only up to rounding
of the product, 2^-24 relative) in a fixed order, so its error is at most
about K * 2^-24 * sum|x * w| * scale; the tolerance, 2e-6 * sqrt(K) relative
to max|y| plus 1e-6, holds that for random data with margin while still
catching a wrong element. bfloat16/float16 results are rounded once more (one
unit in their last place: 2^-8, 2^-11). The error against the unquantized
float layer is reported separately.

int8_dynamic_linear is compared with a float64 reference of its quantized
math (each block of 32 of a row quantized in float32 as
quantize_per_token_int8 quantizes a row, the int8 products summed exactly,
the scales applied in float64). The op sums each block in int32, exactly,
so only its float32 epilogue rounds: one fused multiply-add per block (the
block's scale times its exact sum, added to the running result, each within
2^-24 of it), the channel's scale and the bias: within 2e-6 * sqrt(K) of
max|y|, as the weight-only op's float32 sums, plus one unit in the last
place for bfloat16/float16 results.
"""

from __future__ import annotations

import io
import warnings

import pytest
import torch

import fuseops
from fuseops import reference

from support.cpu_builds import cpu_runs
from support.errors import expect_error_mentions
from support.int8_math import (
    ROUNDING,
    assert_block_dynamic_matches,
    block_dynamic_reference,
    dynamic_reference,
)
from support.params import DTYPES
from support.processes import run_python


def quantized_weight(n, k, device, gen_seed=0):
    gen = torch.Generator().manual_seed(gen_seed)
    w = torch.randn(n, k, generator=gen).to(device) * 0.05
    wq, scale = fuseops.quantize_per_channel_int8(w)
    return w, wq, scale


def assert_matches(y, want, k):
    tolerance = 2e-6 * max(1.0, k) ** 0.5 + ROUNDING[y.dtype]
    scale = max(1.0, want.abs().max().item()) if want.numel() else 1.0
    torch.testing.assert_close(y.double(), want, rtol=ROUNDING[y.dtype], atol=tolerance * scale)


def test_pack_layout(device):
    wq = torch.randint(-127, 128, (37, 10), dtype=torch.int8, device=device)
    scale = torch.rand(37, device=device)
    packed, scale_copy, colsum = fuseops.pack_int8_weight(wq, scale)
    assert packed.shape == (3, 3, 16, 4) and packed.dtype == torch.int8
    for n in range(48):
        for k in range(12):
            want = wq[n, k].item() if n < 37 and k < 10 else 0
            assert packed[n // 16, k // 4, n % 16, k % 4].item() == want
    assert torch.equal(scale_copy, scale) and scale_copy.data_ptr() != scale.data_ptr()
    # One activation block (K = 10 < 32): each channel's whole sum.
    assert torch.equal(colsum, wq.long().sum(1).view(1, 37).short()) and colsum.dtype == torch.int16
    assert torch.equal(fuseops.unpack_int8_weight(packed, 37, 10), wq)
    for got, want in zip((packed, scale_copy, colsum), reference.pack_int8_weight(wq, scale)):
        assert torch.equal(got, want)


def test_pack_colsum_per_activation_block(device):
    """colsum[b, n]: channel n's weights summed over K's block b of 32 (the
    last block partial), int16, for the W8A8 kernels' correction."""
    wq = torch.randint(-128, 128, (20, 70), dtype=torch.int8, device=device)
    _, _, colsum = fuseops.pack_int8_weight(wq, torch.ones(20, device=device))
    assert colsum.shape == (3, 20) and colsum.dtype == torch.int16
    for b, (start, end) in enumerate(((0, 32), (32, 64), (64, 70))):
        assert torch.equal(colsum[b].long(), wq[:, start:end].long().sum(1))
    # The extremes fit int16: 32 * -128.
    low = fuseops.pack_int8_weight(
        torch.full((3, 64), -128, dtype=torch.int8, device=device), torch.ones(3, device=device)
    )[2]
    assert (low == -4096).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "m,n,k", [(1, 16, 4), (1, 37, 129), (3, 5, 1), (8, 64, 256), (33, 40, 67), (257, 48, 130)]
)
@pytest.mark.parametrize("with_bias", [False, True])
def test_weight_only_matches_float64_reference(dtype, m, n, k, with_bias, device):
    _, wq, scale = quantized_weight(n, k, device)
    packed, s, _ = fuseops.pack_int8_weight(wq, scale)
    x = torch.randn(m, k, device=device).to(dtype)
    bias = torch.randn(n, device=device).to(dtype) if with_bias else None
    y = fuseops.int8_weight_only_linear(x, packed, s, bias)
    assert y.dtype == dtype and y.shape == (m, n) and y.is_contiguous()
    want = (x.double() @ wq.double().T) * scale.double()
    if with_bias:
        want = want + bias.double()
    assert_matches(y, want, k)


_PAIR_PATH_CODE = """
import torch, fuseops
gen = torch.Generator().manual_seed(5)
worst = 0.0
for m, n, k in [(1, 37, 300), (8, 16, 128), (13, 40, 70), (45, 33, 256)]:
    wq, scale = fuseops.quantize_per_channel_int8(torch.randn(n, k, generator=gen) * 0.05)
    packed, s, _ = fuseops.pack_int8_weight(wq, scale)
    x = torch.randn(m, k, generator=gen).bfloat16()
    want = x.double() @ (wq.double() * scale.double()[:, None]).T
    got = fuseops.int8_weight_only_linear(x, packed, s).double()
    # float32 sums of k products (2^-24 each) and bfloat16's rounding of the result.
    bound = 2e-6 * k ** 0.5 * max(1.0, want.abs().max().item()) + 2.0 ** -8 * want.abs()
    worst = max(worst, ((got - want).abs() / bound).max().item())
# Denormal activations (1e-39 is below bfloat16's smallest normal): the
# float32 path multiplies them, vdpbf16ps takes them as 0.
wq, scale = fuseops.quantize_per_channel_int8(torch.ones(16, 64))
packed, s, _ = fuseops.pack_int8_weight(wq, scale)
tiny = fuseops.int8_weight_only_linear(torch.full((1, 64), 1e-39).bfloat16(), packed, s)
print(worst <= 1.0, bool((tiny > 0).all()), bool((tiny == 0).all()))
"""


def test_bfloat16_pair_path_where_chosen_and_forced():
    # The AVX512 build multiplies bfloat16 rows by vdpbf16ps on weights
    # widened to bfloat16 pairs on CPUs with AVX512_BF16 and no AMX;
    # FUSEOPS_WEIGHT_PAIRS=1 takes that path on any CPU with AVX512_BF16 and
    # FUSEOPS_WEIGHT_PAIRS=0 the float32 path. Both match float64 within
    # float32 sums; denormal activations tell them apart.
    if not cpu_runs("AVX512"):
        pytest.skip("this CPU cannot run AVX512 code")
    with open("/proc/cpuinfo") as f:
        flags = f.read()
    has_bf16 = "avx512_bf16" in flags
    pairs_by_default = has_bf16 and "amx_bf16" not in flags
    for env, pairs in [
        ({"FUSEOPS_WEIGHT_PAIRS": "0"}, False),
        ({"FUSEOPS_WEIGHT_PAIRS": "1"}, has_bf16),
        ({}, pairs_by_default),
    ]:
        result = run_python(_PAIR_PATH_CODE, {**env, "ATEN_CPU_CAPABILITY": "avx512"})
        assert result.returncode == 0, (env, result.stderr)
        assert result.stdout.split() == ["True", str(not pairs), str(pairs)], (env, result.stdout)


def test_weight_pairs_switch_refuses_other_values():
    # Read by the AVX512 build's bfloat16 calls.
    if not cpu_runs("AVX512"):
        pytest.skip("this CPU cannot run AVX512 code")
    result = run_python(
        "import torch, fuseops\n"
        "wq, scale = fuseops.quantize_per_channel_int8(torch.ones(16, 64))\n"
        "packed, s, _ = fuseops.pack_int8_weight(wq, scale)\n"
        "fuseops.int8_weight_only_linear(torch.ones(1, 64).bfloat16(), packed, s)\n",
        {"FUSEOPS_WEIGHT_PAIRS": "yes", "ATEN_CPU_CAPABILITY": "avx512"},
    )
    assert result.returncode != 0
    assert "FUSEOPS_WEIGHT_PAIRS" in result.stderr, result.stderr


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_do_not_depend_on_the_batch(dtype, device):
    # Every row sums in the same order whatever the number of rows, so a row
    # computed alone equals the same row in a batch (decode vs prefill); in
    # bfloat16 too, where CPUs with AVX512_BF16 take the vdpbf16ps path. Two
    # orders of a sum of 1024 products give another bfloat16 in about one
    # output in 10^4: 200 rows of 512 outputs, each row checked alone.
    _, wq, scale = quantized_weight(512, 1024, device)
    packed, s, _ = fuseops.pack_int8_weight(wq, scale)
    x = torch.randn(200, 1024, device=device).to(dtype)
    batch = fuseops.int8_weight_only_linear(x, packed, s)
    for row in range(200):
        alone = fuseops.int8_weight_only_linear(x[row : row + 1], packed, s)
        assert torch.equal(alone, batch[row : row + 1]), row
    for rows in (2, 6, 7, 13, 33):
        assert torch.equal(fuseops.int8_weight_only_linear(x[:rows], packed, s), batch[:rows])


@pytest.mark.parametrize("layout", ["transposed", "sliced", "3d"])
def test_any_layout_and_leading_dims(layout, device):
    _, wq, scale = quantized_weight(24, 20, device)
    packed, s, _ = fuseops.pack_int8_weight(wq, scale)
    if layout == "transposed":
        x = torch.randn(20, 6, device=device).t()
    elif layout == "sliced":
        x = torch.randn(6, 40, device=device)[:, ::2]
    else:
        x = torch.randn(2, 3, 20, device=device)
    y = fuseops.int8_weight_only_linear(x, packed, s)
    assert y.shape == x.shape[:-1] + (24,)
    assert torch.equal(y, fuseops.int8_weight_only_linear(x.contiguous(), packed, s))


def test_empty_inputs(device):
    _, wq, scale = quantized_weight(8, 12, device)
    packed, s, _ = fuseops.pack_int8_weight(wq, scale)
    assert fuseops.int8_weight_only_linear(torch.randn(0, 12, device=device), packed, s).shape == (
        0,
        8,
    )
    empty_k = fuseops.pack_int8_weight(
        torch.zeros(5, 0, dtype=torch.int8, device=device), torch.ones(5, device=device)
    )
    bias = torch.randn(5, device=device)
    y = fuseops.int8_weight_only_linear(
        torch.randn(3, 0, device=device), empty_k[0], empty_k[1], bias
    )
    assert torch.equal(y, bias.expand(3, 5))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_error_against_the_float_layer(dtype, device):
    """Reported, not the correctness criterion: per-channel int8 weights on
    a random layer cost well under 1% relative error."""
    w, wq, scale = quantized_weight(256, 1024, device)
    packed, s, _ = fuseops.pack_int8_weight(wq, scale)
    x = torch.randn(16, 1024, device=device).to(dtype)
    y = fuseops.int8_weight_only_linear(x, packed, s).double()
    exact = x.double() @ w.double().T
    relative = ((y - exact).norm() / exact.norm()).item()
    print(f"int8 weight-only vs float layer ({dtype}): relative error {relative:.2e}")
    assert relative < 0.01


def test_inference_only(device):
    _, wq, scale = quantized_weight(8, 12, device)
    packed, s, _ = fuseops.pack_int8_weight(wq, scale)
    x = torch.randn(2, 12, device=device, requires_grad=True)
    expect_error_mentions(
        lambda: fuseops.int8_weight_only_linear(x, packed, s),
        ["fuseops::int8_weight_only_linear", "inference op", "torch.no_grad()"],
    )
    with torch.no_grad():
        assert not fuseops.int8_weight_only_linear(x, packed, s).requires_grad
    with torch.inference_mode():
        fuseops.int8_weight_only_linear(x, packed, s)


def test_bad_inputs(device):
    wq = torch.randint(-127, 128, (20, 12), dtype=torch.int8, device=device)
    packed, s, _ = fuseops.pack_int8_weight(wq, torch.rand(20, device=device))
    op = "fuseops::int8_weight_only_linear"
    x = torch.randn(2, 12, device=device)
    expect_error_mentions(
        lambda: fuseops.int8_weight_only_linear(torch.randn(2, 13, device=device), packed, s),
        [op, "'input'", "K = 13", "'packed'"],
    )
    expect_error_mentions(
        lambda: fuseops.int8_weight_only_linear(x, packed.float(), s), [op, "'packed'", "int8"]
    )
    expect_error_mentions(
        lambda: fuseops.int8_weight_only_linear(x, packed[:, :, :8], s), [op, "'packed'", "shape"]
    )
    expect_error_mentions(
        lambda: fuseops.int8_weight_only_linear(x, packed, s[:5]), [op, "'scale'", "N = 5"]
    )
    expect_error_mentions(
        lambda: fuseops.int8_weight_only_linear(x, packed, s.half()), [op, "'scale'", "float32"]
    )
    expect_error_mentions(
        lambda: fuseops.int8_weight_only_linear(x, packed, s, torch.randn(19, device=device)),
        [op, "'bias'", "[20]"],
    )
    expect_error_mentions(
        lambda: fuseops.int8_weight_only_linear(
            x, packed, s, torch.randn(20, device=device).half()
        ),
        [op, "'bias'", "dtype"],
    )
    expect_error_mentions(
        lambda: fuseops.int8_weight_only_linear(x.int(), packed, s), [op, "'input'", "dtype"]
    )
    expect_error_mentions(
        lambda: fuseops.pack_int8_weight(wq.float(), s),
        ["fuseops::pack_int8_weight", "'wq'", "int8"],
    )
    expect_error_mentions(
        lambda: fuseops.pack_int8_weight(wq, s[:12]),
        ["fuseops::pack_int8_weight", "'scale'", "[20]"],
    )
    expect_error_mentions(
        lambda: fuseops.pack_int8_weight(wq[0], s), ["fuseops::pack_int8_weight", "'wq'", "2-D"]
    )


# --- fuseops.nn.Int8Linear and fuseops.quantize_ ------------------------------


def test_int8_linear_module_from_float_and_state_dict(device):
    linear = torch.nn.Linear(70, 33, device=device)
    module = fuseops.nn.Int8Linear.from_float(linear)
    x = torch.randn(4, 70, device=device)
    with torch.no_grad():
        y = module(x)
        wq, scale = fuseops.quantize_per_channel_int8(linear.weight)
        want = (x.double() @ wq.double().T) * scale.double() + linear.bias.double()
        assert_matches(y, want, 70)
        assert ((y - linear(x)).norm() / linear(x).norm()).item() < 0.01
    # colsum is derived (W8A8 only), not saved.
    assert set(module.state_dict()) == {"packed", "scale", "bias"}
    buffer = io.BytesIO()
    torch.save(module.state_dict(), buffer)
    buffer.seek(0)
    restored = fuseops.nn.Int8Linear(70, 33, device=device)
    restored.load_state_dict(torch.load(buffer))
    with torch.no_grad():
        assert torch.equal(restored(x), y)
        assert torch.equal(module(x.bfloat16()), restored(x.bfloat16()))
    assert "mode='w8a16'" in repr(module)
    module.to(torch.bfloat16)
    assert module.scale.dtype == torch.float32 and module.bias.dtype == torch.bfloat16
    assert module.packed.dtype == torch.int8 and module.colsum.dtype == torch.int16


def test_quantize_swaps_linear_layers_in_place(device):
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64),
        torch.nn.ReLU(),
        torch.nn.Sequential(torch.nn.Linear(64, 64, bias=False), torch.nn.Linear(64, 8)),
    ).to(device)
    x = torch.randn(5, 32, device=device)
    with torch.no_grad():
        before = model(x)
    changed = fuseops.quantize_(model, skip=["2.1"])
    assert [c.name for c in changed] == ["0", "2.0"]
    assert isinstance(model[0], fuseops.nn.Int8Linear) and isinstance(
        model[2][0], fuseops.nn.Int8Linear
    )
    assert type(model[2][1]) is torch.nn.Linear
    with torch.no_grad():
        after = model(x)
    assert ((after - before).norm() / before.norm()).item() < 0.02
    model2 = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    assert [c.name for c in fuseops.quantize_(model2, skip=lambda name, m: name == "0")] == ["1"]


@pytest.mark.parametrize("mode", ["2:4+w4", "int4"])
def test_quantize_refuses_modes_not_built(mode):
    with pytest.raises(
        ValueError,
        match=r"unknown mode .*supported: 'w8a16', 'w8a8', 'w4a16', 'w4a8', '2:4', '2:4\+w8a16', '2:4\+w8a8'",
    ):
        fuseops.quantize_(torch.nn.Linear(4, 4), mode=mode)


def test_quantized_model_compiles_and_exports():
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    fuseops.quantize_(model)
    x = torch.randn(3, 16)
    with torch.no_grad():
        eager = model(x)
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")(x)
    assert torch.equal(compiled, eager)
    exported = torch.export.export(model, (x,))
    targets = {str(n.target) for n in exported.graph.nodes if n.op == "call_function"}
    assert "fuseops.int8_weight_only_linear.default" in targets
    with torch.no_grad():
        assert torch.equal(exported.module()(x), eager)


# --- int8_dynamic_linear (W8A8 dynamic) ----------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "m,n,k", [(1, 16, 4), (1, 37, 129), (3, 5, 1), (8, 64, 256), (33, 40, 67), (257, 48, 530)]
)
@pytest.mark.parametrize("with_bias", [False, True])
def test_dynamic_matches_float64_reference(dtype, m, n, k, with_bias, device):
    _, wq, scale = quantized_weight(n, k, device)
    packed, s, colsum = fuseops.pack_int8_weight(wq, scale)
    x = torch.randn(m, k, device=device).to(dtype)
    bias = torch.randn(n, device=device).to(dtype) if with_bias else None
    y = fuseops.int8_dynamic_linear(x, packed, s, colsum, bias)
    assert y.dtype == dtype and y.shape == (m, n) and y.is_contiguous()
    assert_block_dynamic_matches(y, block_dynamic_reference(x, wq, scale, bias), k)
    # And the library's own reference (fuseops.reference) agrees.
    assert_block_dynamic_matches(
        y, reference.int8_dynamic_linear(x.double(), packed, s, colsum, bias), k
    )


def test_dynamic_extreme_values_are_exact(device):
    # Activations at +-absmax (127 in every block: block scales of 1)
    # quantize to +-127 and weights of -128 (a packed weight need not come
    # from quantize_per_channel_int8): the largest products, where int16 pair
    # sums (vpmaddubsw) would saturate. Every partial sum is a whole number
    # below 2^24 (1030 * 127 * 128), so the float32 accumulation is exact;
    # with scales of 1 the result is the integer sum itself.
    n, k = 33, 1030
    gen = torch.Generator().manual_seed(3)
    wq = torch.where(torch.rand(n, k, generator=gen) < 0.5, -128, 127).to(torch.int8).to(device)
    x = torch.where(torch.rand(4, k, generator=gen) < 0.5, -127.0, 127.0).to(device)
    packed, s, colsum = fuseops.pack_int8_weight(wq, torch.ones(n, device=device))
    y = fuseops.int8_dynamic_linear(x, packed, s, colsum)
    assert torch.equal(y.double(), x.double() @ wq.double().T)


def test_dynamic_rows_are_independent_and_special_rows(device):
    _, wq, scale = quantized_weight(40, 300, device)
    packed, s, colsum = fuseops.pack_int8_weight(wq, scale)
    x = torch.randn(100, 300, device=device)
    x[3] = 0
    x[7, 5] = float("inf")
    x[50, 0] = float("nan")
    bias = torch.randn(40, device=device)
    batch = fuseops.int8_dynamic_linear(x, packed, s, colsum, bias)
    assert torch.equal(batch[3], bias)  # an all-zero row: the bias alone
    assert batch[7].isnan().all() and batch[50].isnan().all()
    finite = [r for r in range(100) if r not in (7, 50)]
    assert batch[finite].isfinite().all()
    for row in (0, 5, 11, 12, 47, 48, 99):
        assert torch.equal(
            fuseops.int8_dynamic_linear(x[row : row + 1], packed, s, colsum, bias),
            batch[row : row + 1],
        )


@pytest.mark.parametrize("layout", ["transposed", "sliced", "3d"])
def test_dynamic_any_layout_and_leading_dims(layout, device):
    _, wq, scale = quantized_weight(24, 20, device)
    packed, s, colsum = fuseops.pack_int8_weight(wq, scale)
    if layout == "transposed":
        x = torch.randn(20, 6, device=device).t()
    elif layout == "sliced":
        x = torch.randn(6, 40, device=device)[:, ::2]
    else:
        x = torch.randn(2, 3, 20, device=device)
    y = fuseops.int8_dynamic_linear(x, packed, s, colsum)
    assert y.shape == x.shape[:-1] + (24,)
    assert torch.equal(y, fuseops.int8_dynamic_linear(x.contiguous(), packed, s, colsum))


def test_dynamic_empty_inputs(device):
    _, wq, scale = quantized_weight(8, 12, device)
    packed, s, colsum = fuseops.pack_int8_weight(wq, scale)
    assert fuseops.int8_dynamic_linear(
        torch.randn(0, 12, device=device), packed, s, colsum
    ).shape == (0, 8)
    empty_k = fuseops.pack_int8_weight(
        torch.zeros(5, 0, dtype=torch.int8, device=device), torch.ones(5, device=device)
    )
    bias = torch.randn(5, device=device)
    assert torch.equal(
        fuseops.int8_dynamic_linear(torch.randn(3, 0, device=device), *empty_k, bias),
        bias.expand(3, 5),
    )


def test_dynamic_inference_only(device):
    _, wq, scale = quantized_weight(8, 12, device)
    weight = fuseops.pack_int8_weight(wq, scale)
    x = torch.randn(2, 12, device=device, requires_grad=True)
    expect_error_mentions(
        lambda: fuseops.int8_dynamic_linear(x, *weight),
        ["fuseops::int8_dynamic_linear", "inference op", "torch.no_grad()"],
    )
    with torch.no_grad():
        assert not fuseops.int8_dynamic_linear(x, *weight).requires_grad


def test_dynamic_bad_inputs(device):
    wq = torch.randint(-127, 128, (20, 12), dtype=torch.int8, device=device)
    packed, s, colsum = fuseops.pack_int8_weight(wq, torch.rand(20, device=device))
    op = "fuseops::int8_dynamic_linear"
    x = torch.randn(2, 12, device=device)
    f = fuseops.int8_dynamic_linear
    expect_error_mentions(
        lambda: f(torch.randn(2, 13, device=device), packed, s, colsum), [op, "'input'", "K = 13"]
    )
    expect_error_mentions(lambda: f(x, packed.float(), s, colsum), [op, "'packed'", "int8"])
    expect_error_mentions(lambda: f(x, packed, s[:5], colsum), [op, "'scale'", "N = 5"])
    expect_error_mentions(lambda: f(x, packed, s, colsum.long()), [op, "'colsum'", "int16"])
    expect_error_mentions(lambda: f(x, packed, s, colsum[:, :19]), [op, "'colsum'", "[1, 20]"])
    # The per-channel colsum of the older layout: named as such.
    old = wq.long().sum(1).int()
    expect_error_mentions(lambda: f(x, packed, s, old), [op, "'colsum'", "older", "pack"])
    expect_error_mentions(
        lambda: f(x, packed, s, colsum, torch.randn(19, device=device)), [op, "'bias'", "[20]"]
    )
    expect_error_mentions(lambda: f(x.int(), packed, s, colsum), [op, "'input'", "dtype"])


def test_dynamic_takes_any_k(device):
    """Each block's int32 sum is at most 32 * 127 * 128: K has no limit (one
    scale per row capped it at 132104, where a row's int32 sum could
    overflow). The worst case past that K: every product at its largest."""
    k = 140_000
    wq = torch.full((2, k), -128, dtype=torch.int8, device=device)
    x = torch.full((1, k), 127.0, device=device)
    y = fuseops.int8_dynamic_linear(x, *fuseops.pack_int8_weight(wq, torch.ones(2, device=device)))
    want = block_dynamic_reference(x, wq, torch.ones(2, device=device))
    assert want[0, 0].item() == -127 * 128 * k
    assert_block_dynamic_matches(y, want, k)


@pytest.mark.parametrize("rows", ["uniform", "spread", "outlier channels"])
def test_dynamic_per_block_beats_per_token_and_per_tensor(rows):
    """Reported, and a bound of the choice of activation scales: error
    against the dequantized float layer (the same per-channel int8 weights),
    per-block activation scales (ours) against one scale per row (the same
    math with blocks of K) and torch.ao's dynamic Linear (one scale per
    tensor). Rows of one magnitude ("uniform") differ little; rows spread
    over three decades ("spread", as real activations' tokens can be) are
    where one scale per tensor loses the small rows; a few channels 30x the
    others ("outlier channels", as trained models' activations have) are
    where one scale per row loses every other channel."""
    import torch.ao.nn.quantized.dynamic as nnqd

    gen = torch.Generator().manual_seed(5)
    n, k = 256, 1024
    w = torch.randn(n, k, generator=gen) * 0.05
    wq, scale = fuseops.quantize_per_channel_int8(w)
    weight = fuseops.pack_int8_weight(wq, scale)
    x = torch.randn(32, k, generator=gen)
    if rows == "spread":
        x = x * torch.logspace(-2, 1, 32).unsqueeze(1)
    elif rows == "outlier channels":
        x[:, torch.randperm(k, generator=gen)[:8]] *= 30
    exact = x.double() @ (wq.double() * scale.double().unsqueeze(1)).T

    def row_errors(y):
        return (y.double() - exact).norm(dim=1) / exact.norm(dim=1)

    ours = row_errors(fuseops.int8_dynamic_linear(x, *weight))
    errors = {"per token": row_errors(dynamic_reference(x, wq, scale))}
    previous = torch.backends.quantized.engine
    for engine in ("fbgemm", "onednn"):
        # torch.ao's quantized tensors are deprecated (a UserWarning).
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            torch.backends.quantized.engine = engine
            module = nnqd.Linear(k, n, bias_=False)
            qweight = torch._make_per_channel_quantized_tensor(
                wq, scale.double(), torch.zeros(n, dtype=torch.long), 0
            )
            module.set_weight_bias(qweight, None)
            errors[engine] = row_errors(module(x))
    torch.backends.quantized.engine = previous
    print(
        f"W8A8 ({rows} rows) relative error vs the dequantized float layer, mean over rows: "
        f"per block of 32 (fuseops) {ours.mean():.2e}, "
        + ", ".join(f"{e} {v.mean():.2e}" for e, v in errors.items())
    )
    assert ours.max() < 0.02
    for other, theirs in errors.items():
        assert ours.mean() < theirs.mean(), other
    if rows == "outlier channels":
        assert ours.mean() < 0.5 * errors["per token"].mean()


def test_int8_linear_colsum_is_derived_for_w8a8_only(device):
    """colsum is pack_int8_weight's in mode "w8a8" (set at construction, by
    from_float, by load_state_dict and by a switch of mode), empty in
    "w8a16" (half a bit per weight no kernel of that mode reads), and never
    saved; a state_dict of an older release, which saved one sum per
    channel ([N], int32), loads."""
    linear = torch.nn.Linear(70, 33, device=device)
    wq, scale = fuseops.quantize_per_channel_int8(linear.weight.detach())
    want = fuseops.pack_int8_weight(wq, scale)[2]
    module = fuseops.nn.Int8Linear.from_float(linear, mode="w8a8")
    assert torch.equal(module.colsum, want) and module.colsum.shape == (3, 33)
    module.mode = "w8a16"
    assert module.colsum.shape == (0, 33)
    module.mode = "w8a8"
    assert torch.equal(module.colsum, want)
    old = dict(module.state_dict())
    old["colsum"] = wq.long().sum(1).int()
    restored = fuseops.nn.Int8Linear(70, 33, device=device, mode="w8a8")
    restored.load_state_dict(old)
    assert torch.equal(restored.colsum, want)
    x = torch.randn(3, 70, device=device)
    with torch.no_grad():
        assert torch.equal(restored(x), module(x))
    with pytest.raises(ValueError, match="unknown mode 'w8a4'"):
        module.mode = "w8a4"


def test_int8_linear_w8a8_mode_and_quantize(device):
    linear = torch.nn.Linear(70, 33, device=device)
    module = fuseops.nn.Int8Linear.from_float(linear, mode="w8a8")
    assert "mode='w8a8'" in repr(module)
    x = torch.randn(4, 70, device=device)
    with torch.no_grad():
        y = module(x)
        wq, scale = fuseops.quantize_per_channel_int8(linear.weight)
        assert_block_dynamic_matches(y, block_dynamic_reference(x, wq, scale, linear.bias), 70)
        # Same buffers in both modes: a w8a16 module loads the state_dict.
        other = fuseops.nn.Int8Linear(70, 33, device=device)
        other.load_state_dict(module.state_dict())
        assert not torch.equal(other(x), y)
        other.mode = "w8a8"
        assert torch.equal(other(x), y)
    with pytest.raises(ValueError, match="unknown mode 'w4'"):
        fuseops.nn.Int8Linear(4, 4, mode="w4")
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)
    ).to(device)
    with torch.no_grad():
        before = model(x[:, :32])
        changed = fuseops.quantize_(model, mode="w8a8")
        assert [c.mode for c in changed] == ["w8a8", "w8a8"] and model[0].mode == "w8a8"
        assert ((model(x[:, :32]) - before).norm() / before.norm()).item() < 0.03


def test_w8a8_model_compiles_and_exports():
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    fuseops.quantize_(model, mode="w8a8")
    x = torch.randn(3, 16)
    with torch.no_grad():
        eager = model(x)
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")(x)
    assert torch.equal(compiled, eager)
    exported = torch.export.export(model, (x,))
    targets = {str(n.target) for n in exported.graph.nodes if n.op == "call_function"}
    assert "fuseops.int8_dynamic_linear.default" in targets
