"""fuseops int4 linear layers: quantize_per_group_int4, pack_int4_weight,
int4_weight_only_linear, fuseops.nn.Int4Linear and quantize_(model,
"w4a16") (opcheck, compilers, Meta, pybind and every CPU build are in
test_conformance.py, fed by fuseops/ops/int4_linear.py's samples).

The quantizer computes in float32 and is compared exactly with its rule
written out group by group (fuseops.reference.quantize_per_group_int4).

int4_weight_only_linear is compared with a float64 reference of the same
quantized math, x @ w.T + bias with w = (q - zero) * scale dequantized
exactly in float64. The op works in float32 group by group: it sums the
products x * q (q in [0, 15], exact; each product rounds once, 2^-24
relative), takes off zero * (the group's sum of x) and scales the
difference, adding it to the row's result (a few more roundings per group),
so its error is at most about K * 2^-24 * sum|x| * 15 * |scale|, within a
small factor of the same bound on sum|x * w| for the dequantized weight; the
tolerance, 2e-6 * sqrt(K) of max|y| plus one unit in the last place of
bfloat16/float16 results (2^-8, 2^-11), holds that for random
data with margin while still catching a wrong element. The error against
the unquantized float layer is reported and compared with plain
round-to-nearest int4 (scale absmax / 7), not used as the criterion.
"""

from __future__ import annotations

import io

import pytest
import torch

import fuseops
from fuseops import reference

from support.cpu_builds import CAPABILITY_ORDER, cpu_runs, run_under_cpu_capability
from support.errors import expect_error_mentions
from support.int8_math import ROUNDING
from support.params import DTYPES
from support.processes import run_python


def packed_weight(n, k, group_size, device, symmetric=True, seed=0):
    gen = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=gen) * 0.05).to(device)
    quantized = fuseops.quantize_per_group_int4(w, group_size, symmetric)
    return w, quantized, fuseops.pack_int4_weight(*quantized, group_size)


def dequantized(wq, scale, zero, group_size):
    group = torch.arange(wq.shape[1], device=wq.device) // group_size
    return (wq.double() - zero.double()[:, group]) * scale.double()[:, group]


def assert_matches(y, want, k):
    tolerance = 2e-6 * max(1.0, k) ** 0.5 + ROUNDING[y.dtype]
    scale = max(1.0, want.abs().max().item()) if want.numel() else 1.0
    torch.testing.assert_close(y.double(), want, rtol=ROUNDING[y.dtype], atol=tolerance * scale)


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n,k,group_size", [(5, 70, 32), (16, 128, 128), (3, 7, 2), (1, 300, 64)])
def test_quantize_matches_its_rule(symmetric, dtype, n, k, group_size, device):
    w = torch.randn(n, k, device=device).to(dtype)
    w[0, : min(k, group_size)] = 0  # an all-zero group: scale 1
    got = fuseops.quantize_per_group_int4(w, group_size, symmetric)
    want = reference.quantize_per_group_int4(w, group_size, symmetric)
    for g, r in zip(got, want):
        assert g.dtype == r.dtype and torch.equal(g, r)
    wq, scale, zero = got
    assert int(wq.max()) <= 15 and int(zero.max()) <= 15
    assert (scale[0, 0] == 1).item()
    back = dequantized(wq, scale, zero, group_size)
    step = scale.abs().double().repeat_interleave(group_size, 1)[:, :k]
    # Round to nearest: within half a step, but for the symmetric rule's
    # values near -m, which round to 8 steps and are clamped to 7.
    steps = 1.0 if symmetric else 0.5
    assert ((back - w.double()).abs() <= step * (steps + 1e-6)).all()
    if symmetric:
        assert (zero == 8).all()
        for g in range(scale.shape[1]):
            part = w[:, g * group_size : (g + 1) * group_size].float()
            largest = part.abs().argmax(1, keepdim=True)
            exact = back[:, g * group_size : (g + 1) * group_size].gather(1, largest)
            assert torch.equal(exact, part.double().gather(1, largest))


def test_pack_layout(device):
    wq = torch.randint(0, 16, (37, 10), dtype=torch.uint8, device=device)
    scale = torch.rand(37, 3, device=device)
    zero = torch.randint(0, 16, (37, 3), dtype=torch.uint8, device=device)
    packed, scale_zero = fuseops.pack_int4_weight(wq, scale, zero, 4)
    assert packed.shape == (3, 6, 16) and packed.dtype == torch.uint8
    assert scale_zero.shape == (3, 2, 37) and scale_zero.dtype == torch.float32
    for n in range(48):
        for k in range(12):
            want = wq[n, k].item() if n < 37 and k < 10 else 0
            byte = packed[n // 16, k // 2, n % 16].item()
            assert (byte & 0xF if k % 2 == 0 else byte >> 4) == want
    assert torch.equal(fuseops.unpack_int4_weight(packed, 37, 10), wq)
    for got, want in zip((packed, scale_zero), reference.pack_int4_weight(wq, scale, zero, 4)):
        assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "m,n,k,group_size",
    [
        (1, 16, 32, 32),
        (1, 37, 129, 64),
        (3, 5, 1, 2),
        (8, 64, 256, 128),
        (33, 40, 67, 16),
        (257, 48, 130, 128),
    ],
)
@pytest.mark.parametrize("symmetric", [True, False])
def test_matches_float64_reference(dtype, m, n, k, group_size, symmetric, device):
    _, quantized, (packed, scale_zero) = packed_weight(n, k, group_size, device, symmetric)
    x = torch.randn(m, k, device=device).to(dtype)
    bias = torch.randn(n, device=device).to(dtype)
    y = fuseops.int4_weight_only_linear(x, packed, scale_zero, group_size, bias)
    assert y.dtype == dtype and y.shape == (m, n) and y.is_contiguous()
    want = x.double() @ dequantized(*quantized, group_size).T + bias.double()
    assert_matches(y, want, k)


@pytest.mark.parametrize("weight_pairs", ["0", "1"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_rows_do_not_depend_on_the_batch(dtype, weight_pairs, device, monkeypatch):
    # Every row sums in the same order whatever the number of rows (the
    # decode path and the buffered one; for bfloat16 on CPUs with
    # AVX512_BF16 and FUSEOPS_WEIGHT_PAIRS=1, read at every call, the pair
    # path's in-register and shared-group tiles), so a row computed alone
    # equals the same row in a batch (decode vs prefill).
    monkeypatch.setenv("FUSEOPS_WEIGHT_PAIRS", weight_pairs)
    _, _, (packed, scale_zero) = packed_weight(40, 300, 64, device)
    x = torch.randn(100, 300, device=device).to(dtype)
    batch = fuseops.int4_weight_only_linear(x, packed, scale_zero, 64)
    for row in (0, 5, 6, 7, 8, 31, 32, 47, 48, 99):
        alone = fuseops.int4_weight_only_linear(x[row : row + 1], packed, scale_zero, 64)
        assert torch.equal(alone, batch[row : row + 1])
        some = fuseops.int4_weight_only_linear(x[: row + 1], packed, scale_zero, 64)
        assert torch.equal(some, batch[: row + 1])


# Every build's float32 path returns the same bits; the AVX512 build's
# bfloat16 pair path (CPUs with AVX512_BF16) differs by float32 rounding and
# is turned off here (its own test is below).
_FLOAT_PATHS = {"FUSEOPS_DISABLE_AVX512_BF16": "1"}

_SAVE_CODE = """
import torch, fuseops
inputs = torch.load({path!r})
with torch.inference_mode():
    want = [fuseops.int4_weight_only_linear(*call) for call in inputs]
torch.save((inputs, want), {path!r})
"""

_BUILDS_CODE = """
import torch, fuseops
inputs, want = torch.load({path!r})
with torch.inference_mode():
    for (x, packed, scale_zero, group_size, bias), y in zip(inputs, want):
        got = fuseops.int4_weight_only_linear(x, packed, scale_zero, group_size, bias)
        torch.testing.assert_close(got, y, rtol=0, atol=0, equal_nan=True)
"""


@pytest.fixture(scope="module")
def builds_calls(tmp_path_factory):
    # The decode path (1 and 2 rows), the buffered one (61 rows), both
    # quantizers, a short last group and a partial block of channels; the
    # results of the build this CPU picks, float32 paths only.
    inputs = []
    for dtype in DTYPES:
        for m, symmetric in [(1, True), (2, False), (61, False)]:
            _, _, weight = packed_weight(37, 300, 64, "cpu", symmetric, seed=m)
            x = torch.randn(m, 300).to(dtype)
            if m > 1:
                x[-1, 1] = float("nan")
            inputs.append((x, *weight, 64, torch.randn(37).to(dtype)))
    path = tmp_path_factory.mktemp("int4") / "calls.pt"
    torch.save(inputs, path)
    result = run_python(_SAVE_CODE.format(path=str(path)), _FLOAT_PATHS)
    assert result.returncode == 0, result.stderr
    return str(path)


@pytest.mark.parametrize("capability", [c.lower() for c in CAPABILITY_ORDER])
def test_same_bits_in_every_cpu_build(capability, builds_calls):
    run_under_cpu_capability(capability, _BUILDS_CODE.format(path=builds_calls), _FLOAT_PATHS)


_PAIR_PATH_CODE = """
import torch, fuseops
gen = torch.Generator().manual_seed(5)
worst = 0.0
for m, n, k, group_size, symmetric in [(1, 37, 300, 64, True), (8, 16, 128, 128, False),
                                       (13, 40, 70, 32, True), (45, 33, 256, 2, False)]:
    w = torch.randn(n, k, generator=gen) * 0.05
    wq, scale, zero = fuseops.quantize_per_group_int4(w, group_size, symmetric)
    packed, scale_zero = fuseops.pack_int4_weight(wq, scale, zero, group_size)
    group = torch.arange(k) // group_size
    exact = (wq.double() - zero.double()[:, group]) * scale.double()[:, group]
    x = torch.randn(m, k, generator=gen).bfloat16()
    want = x.double() @ exact.T
    got = fuseops.int4_weight_only_linear(x, packed, scale_zero, group_size).double()
    # float32 sums of k products (2^-24 each) and bfloat16's rounding of the result.
    bound = 2e-6 * k ** 0.5 * max(1.0, want.abs().max().item()) + 2.0 ** -8 * want.abs()
    worst = max(worst, ((got - want).abs() / bound).max().item())
# Denormal activations (1e-39 is below bfloat16's smallest normal): the
# float32 path multiplies them, vdpbf16ps takes them as 0.
ones = fuseops.pack_int4_weight(*fuseops.quantize_per_group_int4(torch.ones(16, 64), 32, True), 32)
tiny = fuseops.int4_weight_only_linear(torch.full((1, 64), 1e-39).bfloat16(), *ones, 32)
print(worst <= 1.0, bool((tiny > 0).all()), bool((tiny == 0).all()))
"""


def test_bfloat16_pair_path_with_and_without_avx512_bf16():
    # The AVX512 build multiplies bfloat16 rows by vdpbf16ps (a pair of
    # activations by a pair of decoded weights) on CPUs with AVX512_BF16;
    # FUSEOPS_WEIGHT_PAIRS=0 or FUSEOPS_DISABLE_AVX512_BF16=1 takes the
    # float32 path. Both match float64 within float32 sums; denormal
    # activations tell the paths apart (python/README.md says so).
    if not cpu_runs("AVX512"):
        pytest.skip("this CPU cannot run AVX512 code")
    avx512 = {"ATEN_CPU_CAPABILITY": "avx512"}
    with open("/proc/cpuinfo") as f:
        flags = f.read()
    has_bf16 = "avx512_bf16" in flags
    # By default the pairs where there is no AMX-BF16 (Zen 4), as for int8.
    pairs_by_default = has_bf16 and "amx_bf16" not in flags
    for env, pairs in [
        (_FLOAT_PATHS, False),
        ({"FUSEOPS_WEIGHT_PAIRS": "0"}, False),
        ({"FUSEOPS_WEIGHT_PAIRS": "1"}, has_bf16),
        ({}, pairs_by_default),
    ]:
        result = run_python(_PAIR_PATH_CODE, {**env, **avx512})
        assert result.returncode == 0, (env, result.stderr)
        assert result.stdout.split() == ["True", str(not pairs), str(pairs)], (env, result.stdout)


@pytest.mark.parametrize("layout", ["transposed", "sliced", "3d"])
def test_any_layout_and_leading_dims(layout, device):
    _, _, (packed, scale_zero) = packed_weight(24, 20, 4, device)
    if layout == "transposed":
        x = torch.randn(20, 6, device=device).t()
    elif layout == "sliced":
        x = torch.randn(6, 40, device=device)[:, ::2]
    else:
        x = torch.randn(2, 3, 20, device=device)
    y = fuseops.int4_weight_only_linear(x, packed, scale_zero, 4)
    assert y.shape == x.shape[:-1] + (24,)
    assert torch.equal(y, fuseops.int4_weight_only_linear(x.contiguous(), packed, scale_zero, 4))


def test_empty_inputs(device):
    _, _, (packed, scale_zero) = packed_weight(8, 12, 4, device)
    y = fuseops.int4_weight_only_linear(torch.randn(0, 12, device=device), packed, scale_zero, 4)
    assert y.shape == (0, 8)
    empty_k = fuseops.pack_int4_weight(
        *fuseops.quantize_per_group_int4(torch.zeros(5, 0, device=device), 2), 2
    )
    bias = torch.randn(5, device=device)
    y = fuseops.int4_weight_only_linear(torch.randn(3, 0, device=device), *empty_k, 2, bias)
    assert torch.equal(y, bias.expand(3, 5))


def test_special_values_make_their_row_nan(device):
    # NaN propagates as in the reference; an infinite activation makes its
    # row NaN (the zero points' share, zero * sum(x), is taken off as
    # Inf - Inf), where the dequantized matmul gives +-Inf for most channels.
    _, _, (packed, scale_zero) = packed_weight(20, 64, 32, device)
    x = torch.randn(4, 64, device=device)
    x[1, 3] = float("nan")
    x[2, 40] = float("inf")
    y = fuseops.int4_weight_only_linear(x, packed, scale_zero, 32)
    assert y[1].isnan().all() and y[2].isnan().all()
    want = reference.int4_weight_only_linear(x[[0, 3]].double(), packed, scale_zero, 32)
    assert_matches(y[[0, 3]], want, 64)


def _rtn_int4(w, group_size):
    # Plain symmetric round-to-nearest int4: scale absmax / 7, q in [-7, 7].
    n, k = w.shape
    groups = w.view(n, k // group_size, group_size)
    scale = groups.abs().amax(-1, keepdim=True) / 7
    return (torch.round(groups / scale).clamp(-7, 7) * scale).view(n, k)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_error_against_the_float_layer(dtype, device):
    """Reported, not the correctness criterion: int4 in groups of 128 costs
    ~10% relative error on a random Gaussian layer, less than plain
    round-to-nearest int4 (absmax / 7); asymmetric about the same."""
    gen = torch.Generator().manual_seed(3)
    w = (torch.randn(256, 1024, generator=gen) * 0.05).to(device)
    x = torch.randn(16, 1024, generator=gen).to(device).to(dtype)
    exact = x.double() @ w.double().T
    errors = {}
    for symmetric in (True, False):
        quantized = fuseops.quantize_per_group_int4(w, 128, symmetric)
        packed = fuseops.pack_int4_weight(*quantized, 128)
        y = fuseops.int4_weight_only_linear(x, *packed, 128).double()
        errors["symmetric" if symmetric else "asymmetric"] = (
            (y - exact).norm() / exact.norm()
        ).item()
    rtn = x.double() @ _rtn_int4(w, 128).double().T
    errors["rtn absmax/7"] = ((rtn - exact).norm() / exact.norm()).item()
    print(f"int4 vs float layer ({dtype}): " + ", ".join(f"{k} {v:.3e}" for k, v in errors.items()))
    assert errors["symmetric"] < errors["rtn absmax/7"] < 0.2
    assert errors["asymmetric"] < 0.2


def test_inference_only(device):
    w, quantized, (packed, scale_zero) = packed_weight(8, 12, 4, device)
    x = torch.randn(2, 12, device=device, requires_grad=True)
    expect_error_mentions(
        lambda: fuseops.int4_weight_only_linear(x, packed, scale_zero, 4),
        ["fuseops::int4_weight_only_linear", "inference op", "torch.no_grad()"],
    )
    expect_error_mentions(
        lambda: fuseops.quantize_per_group_int4(w.requires_grad_(), 4),
        ["fuseops::quantize_per_group_int4", "inference op"],
    )
    with torch.no_grad():
        assert not fuseops.int4_weight_only_linear(x, packed, scale_zero, 4).requires_grad
    with torch.inference_mode():
        fuseops.int4_weight_only_linear(x, packed, scale_zero, 4)


def test_bad_inputs(device):
    _, (wq, scale, zero), (packed, scale_zero) = packed_weight(20, 64, 32, device)
    op = "fuseops::int4_weight_only_linear"
    x = torch.randn(2, 64, device=device)

    def linear(*args, **kwargs):
        return lambda: fuseops.int4_weight_only_linear(*args, **kwargs)

    expect_error_mentions(
        linear(torch.randn(2, 65, device=device), packed, scale_zero, 32), [op, "'input'", "K = 65"]
    )
    expect_error_mentions(linear(x, packed, scale_zero, 64), [op, "'packed'", "group_size"])
    expect_error_mentions(linear(x, packed, scale_zero, 5), [op, "'group_size'", "even"])
    expect_error_mentions(
        linear(x, packed.to(torch.int8), scale_zero, 32), [op, "'packed'", "uint8"]
    )
    expect_error_mentions(linear(x, packed[:, :, :8], scale_zero, 32), [op, "'packed'", "shape"])
    expect_error_mentions(
        linear(x, packed, scale_zero[:, :, :5], 32), [op, "'scale_zero'", "N = 5"]
    )
    expect_error_mentions(linear(x, packed, scale_zero.half(), 32), [op, "'scale_zero'", "float32"])
    expect_error_mentions(
        linear(x, packed, scale_zero, 32, torch.randn(19, device=device)), [op, "'bias'", "[20]"]
    )
    expect_error_mentions(
        linear(x, packed, scale_zero, 32, torch.randn(20, device=device).half()),
        [op, "'bias'", "dtype"],
    )
    expect_error_mentions(linear(x.int(), packed, scale_zero, 32), [op, "'input'", "dtype"])
    pack = "fuseops::pack_int4_weight"
    expect_error_mentions(
        lambda: fuseops.pack_int4_weight(wq.to(torch.int8), scale, zero, 32),
        [pack, "'wq'", "uint8"],
    )
    expect_error_mentions(
        lambda: fuseops.pack_int4_weight(wq | 16, scale, zero, 32), [pack, "'wq'", "[0, 15]"]
    )
    expect_error_mentions(
        lambda: fuseops.pack_int4_weight(wq, scale, zero | 32, 32), [pack, "'zero'", "[0, 15]"]
    )
    expect_error_mentions(
        lambda: fuseops.pack_int4_weight(wq, scale, zero, 16), [pack, "'scale'", "group_size"]
    )
    expect_error_mentions(
        lambda: fuseops.pack_int4_weight(wq, scale, zero.float(), 32), [pack, "'zero'", "uint8"]
    )
    quantize = "fuseops::quantize_per_group_int4"
    bad = torch.randn(4, 8, device=device)
    bad[1, 2] = float("nan")
    expect_error_mentions(
        lambda: fuseops.quantize_per_group_int4(bad, 4), [quantize, "'weight'", "finite"]
    )
    expect_error_mentions(
        lambda: fuseops.quantize_per_group_int4(bad[0], 4), [quantize, "'weight'", "2-D"]
    )
    expect_error_mentions(
        lambda: fuseops.quantize_per_group_int4(bad, -2), [quantize, "'group_size'", "positive"]
    )


# --- fuseops.nn.Int4Linear and quantize_(model, "w4a16") ------------------------


def test_int4_linear_module_from_float_and_state_dict(device):
    linear = torch.nn.Linear(70, 33, device=device)
    module = fuseops.nn.Int4Linear.from_float(linear, group_size=32)
    x = torch.randn(4, 70, device=device)
    with torch.no_grad():
        y = module(x)
        # The weight its buffers hold (scales rounded to bfloat16).
        weight = fuseops.dequantize_int4_weight(module.packed, module.scale_zero, 32, 70)
        want = x.double() @ weight.T + linear.bias.double()
        assert_matches(y, want, 70)
        assert ((y - linear(x)).norm() / linear(x).norm()).item() < 0.2
    assert set(module.state_dict()) == {"packed", "scale_zero", "bias"}
    buffer = io.BytesIO()
    torch.save(module.state_dict(), buffer)
    buffer.seek(0)
    restored = fuseops.nn.Int4Linear(70, 33, device=device, group_size=32)
    restored.load_state_dict(torch.load(buffer))
    with torch.no_grad():
        assert torch.equal(restored(x), y)
    assert "group_size=32" in repr(module) and "mode='w4a16'" in repr(module)
    module.to(torch.float16)
    assert module.scale_zero.dtype == torch.bfloat16 and module.bias.dtype == torch.float16
    assert module.packed.dtype == torch.uint8
    with pytest.raises(ValueError, match="group_size must be a positive even number"):
        fuseops.nn.Int4Linear(8, 8, group_size=3)
    # The group size travels with the buffers' shapes.
    other = fuseops.nn.Int4Linear(70, 33, device=device, group_size=64)
    other.load_state_dict(restored.state_dict())
    assert other.group_size == 32
    with torch.no_grad():
        assert torch.equal(other(x), y)


def test_int4_linear_scales_in_bfloat16_or_float32(device):
    """Int4Linear stores scale_zero in bfloat16 by default. With the
    symmetric scheme the scales are rounded once (each dequantized weight
    within 2^-8 of the float32 scales' one, relatively), the zero points
    exact; scale_dtype=torch.float32 keeps quantize_per_group_int4's scales.
    The ops widen bfloat16 scale_zero to float32 exactly: the same bits as
    its float32 copy, on both ops."""
    linear = torch.nn.Linear(300, 37, device=device)  # a partial block of channels
    rounded = fuseops.nn.Int4Linear.from_float(linear, group_size=64, scheme="symmetric")
    exact = fuseops.nn.Int4Linear.from_float(
        linear, group_size=64, scale_dtype=torch.float32, symmetric=True
    )
    assert rounded.scale_zero.dtype == torch.bfloat16 and exact.scale_zero.dtype == torch.float32
    assert "scale_dtype=torch.bfloat16" in repr(rounded) and "scheme='symmetric'" in repr(exact)
    assert torch.equal(rounded.packed, exact.packed)
    assert torch.equal(rounded.scale_zero[:, 1].float(), exact.scale_zero[:, 1])
    quantized = fuseops.quantize_per_group_int4(linear.weight.detach(), 64)
    assert torch.equal(exact.scale_zero[:, 0], quantized[1].t())
    w_rounded = fuseops.dequantize_int4_weight(rounded.packed, rounded.scale_zero, 64, 300)
    w_exact = fuseops.dequantize_int4_weight(exact.packed, exact.scale_zero, 64, 300)
    assert ((w_rounded - w_exact).abs() <= 2**-8 * w_exact.abs()).all()
    assert not torch.equal(w_rounded, w_exact), "no scale was rounded"
    widened = rounded.scale_zero.float()
    for op in (fuseops.int4_weight_only_linear, fuseops.int4_dynamic_linear):
        for dtype in (torch.float32, torch.bfloat16):
            for rows in (1, 5):
                x = torch.randn(rows, 300, device=device).to(dtype)
                y = op(x, rounded.packed, rounded.scale_zero, 64)
                assert torch.equal(y, op(x, rounded.packed, widened, 64)), (op, dtype, rows)
    # A state_dict loads as saved: its scale dtype comes with it.
    restored = fuseops.nn.Int4Linear(300, 37, device=device, group_size=64)
    restored.load_state_dict(exact.state_dict())
    assert restored.scale_dtype == torch.float32
    x = torch.randn(3, 300, device=device)
    with torch.no_grad():
        assert torch.equal(restored(x), exact(x))
    exact.to(torch.bfloat16)
    assert exact.scale_zero.dtype == torch.float32
    with pytest.raises(ValueError, match="scale_dtype must be torch.bfloat16 or torch.float32"):
        fuseops.nn.Int4Linear(8, 8, scale_dtype=torch.float16)
    model = torch.nn.Sequential(torch.nn.Linear(64, 16)).to(device)
    fuseops.quantize_(model, "w4a8", group_size=32, scale_dtype=torch.float32)
    assert model[0].scale_zero.dtype == torch.float32 and model[0].mode == "w4a8"


def test_quantize_w4a16_swaps_linear_layers(device):
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8, bias=False)
    ).to(device)
    x = torch.randn(5, 64, device=device)
    with torch.no_grad():
        before = model(x)
    changed = fuseops.quantize_(model, "w4a16", group_size=64)
    assert [(c.name, c.mode) for c in changed] == [("0", "w4a16"), ("2", "w4a16")]
    assert all(isinstance(model[i], fuseops.nn.Int4Linear) for i in (0, 2))
    assert model[0].group_size == 64
    with torch.no_grad():
        after = model(x)
    assert ((after - before).norm() / before.norm()).item() < 0.2


def test_w4a16_model_compiles_and_exports():
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    fuseops.quantize_(model, "w4a16", group_size=16)
    x = torch.randn(3, 16)
    with torch.no_grad():
        eager = model(x)
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")(x)
    assert torch.equal(compiled, eager)
    exported = torch.export.export(model, (x,))
    targets = {str(n.target) for n in exported.graph.nodes if n.op == "call_function"}
    assert "fuseops.int4_weight_only_linear.default" in targets
    with torch.no_grad():
        assert torch.equal(exported.module()(x), eager)


def _scale_min_weight(n, k, seed):
    """A weight with what trained ones have and Gaussian ones lack: a few
    input features (columns) 8x larger, and heavy tails."""
    g = torch.Generator().manual_seed(seed)
    w = torch.distributions.StudentT(3.0).sample((n, k)) * 0.02
    w = w * torch.where(torch.rand(k, generator=g) < 0.03, 8.0, 1.0)
    return w


@pytest.mark.parametrize("scale_dtype", [torch.bfloat16, torch.float32])
def test_scale_min_scheme_fits_each_group_better_than_min_max(scale_dtype):
    """quantize_int4_scale_min: levels in [0, 15], scales and zero points
    exact in scale_dtype (what Int4Linear stores), the packed layer
    computing with exactly those values, and each group's weighted squared
    error no larger than the min-max fit's (the search starts from it; the
    bfloat16 rounding of both can reorder them by at most its 2^-8, hence
    the 1% slack) and clearly smaller over the whole weight (the fit finds
    scales the endpoints miss: >= 5% here, measured 10-20%)."""
    w = _scale_min_weight(48, 200, seed=3)  # 200 = 6 groups of 32 and a partial one
    wq, scale, zero = fuseops.quantization.quantize_int4_scale_min(w, 32, scale_dtype=scale_dtype)
    assert wq.dtype == torch.uint8 and wq.shape == (48, 200) and int(wq.max()) <= 15
    assert scale.shape == zero.shape == (48, 7)
    assert torch.equal(scale.to(scale_dtype).float(), scale)
    assert torch.equal(zero.to(scale_dtype).float(), zero)
    assert (scale > 0).all()
    group = torch.arange(200) // 32
    fitted = (wq.double() - zero.double()[:, group]) * scale.double()[:, group]
    # min-max with a fractional zero: [min(w, 0), max(w)] over 15 steps.
    minmax = torch.empty_like(fitted)
    for g in range(7):
        part = w[:, g * 32 : (g + 1) * 32].double()
        lo = part.amin(1, keepdim=True).clamp(max=0)
        s = ((part.amax(1, keepdim=True) - lo) / 15).to(scale_dtype).double()
        z = (-lo / s).to(scale_dtype).double()
        minmax[:, g * 32 : (g + 1) * 32] = ((part / s + z).round().clamp(0, 15) - z) * s
    weights = torch.empty_like(fitted)
    for g in range(7):
        part = w[:, g * 32 : (g + 1) * 32].double()
        weights[:, g * 32 : (g + 1) * 32] = part.pow(2).mean(1, keepdim=True).sqrt() + part.abs()
    err_fit = torch.zeros(48, 7, dtype=torch.float64).index_add_(
        1, group, weights * (fitted - w.double()) ** 2
    )
    err_minmax = torch.zeros(48, 7, dtype=torch.float64).index_add_(
        1, group, weights * (minmax - w.double()) ** 2
    )
    assert (err_fit <= err_minmax * 1.01).all()
    assert err_fit.sum() <= 0.95 * err_minmax.sum()
    # The layer packs exactly these values.
    linear = torch.nn.Linear(200, 48, bias=False)
    with torch.no_grad():
        linear.weight.copy_(w)
    layer = fuseops.nn.Int4Linear.from_float(linear, scale_dtype=scale_dtype)
    assert layer.scheme == "scale_min" and layer.group_size == 32
    assert torch.equal(
        fuseops.dequantize_int4_weight(layer.packed, layer.scale_zero, 32, 200), fitted
    )


def test_scale_min_importance_moves_the_error_to_unimportant_features():
    """An importance per input feature weights the fit: the features marked
    important come back closer than without it, at the others' expense."""
    w = _scale_min_weight(64, 128, seed=4)
    important = torch.zeros(128, dtype=torch.bool)
    important[::8] = True
    importance = torch.where(important, 100.0, 1.0)
    plain = fuseops.quantization.quantize_int4_scale_min(w, 32, scale_dtype=torch.float32)
    weighted = fuseops.quantization.quantize_int4_scale_min(
        w, 32, importance=importance, scale_dtype=torch.float32
    )
    group = torch.arange(128) // 32

    def error(q):
        wq, s, z = q
        return ((wq.double() - z.double()[:, group]) * s.double()[:, group] - w.double()) ** 2

    assert error(weighted)[:, important].sum() < 0.8 * error(plain)[:, important].sum()
    assert error(weighted)[:, ~important].sum() > error(plain)[:, ~important].sum()


def test_scale_min_groups_that_are_flat_or_zero_come_back_exactly():
    w = torch.zeros(3, 64)
    w[1, :32] = -0.5  # one value repeated: the minimum, scale 1/15
    w[2, 32:] = 0.25  # one positive value repeated (and zeros in the other group)
    wq, scale, zero = fuseops.quantization.quantize_int4_scale_min(w, 32, scale_dtype=torch.float32)
    group = torch.arange(64) // 32
    back = (wq.float() - zero[:, group]) * scale[:, group]
    torch.testing.assert_close(back, w, rtol=0, atol=1e-7)


def test_scale_min_bad_input_names_the_argument():
    q = fuseops.quantization.quantize_int4_scale_min
    with pytest.raises(ValueError, match="quantize_int4_scale_min: weight must be 2-D"):
        q(torch.zeros(4))
    with pytest.raises(ValueError, match="group_size must be a positive even number"):
        q(torch.zeros(4, 8), 3)
    with pytest.raises(ValueError, match="scale_dtype must be"):
        q(torch.zeros(4, 8), 8, scale_dtype=torch.float16)
    with pytest.raises(
        ValueError, match=r"importance must be 1-D of the weight's in_features \(8\)"
    ):
        q(torch.zeros(4, 8), 8, importance=torch.ones(4))
    with pytest.raises(ValueError, match="Inf or NaN"):
        q(torch.full((4, 8), float("nan")), 8)
    with pytest.raises(ValueError, match="Int4Linear: unknown scheme 'q4k'"):
        fuseops.nn.Int4Linear(8, 8, scheme="q4k")
    with pytest.raises(ValueError, match="importance applies to scheme 'scale_min'"):
        fuseops.nn.Int4Linear.from_float(
            torch.nn.Linear(8, 8), group_size=8, scheme="symmetric", importance=torch.ones(8)
        )
    with pytest.raises(ValueError, match="fuseops.quantize_: unknown recipe 'half'"):
        fuseops.quantize_(torch.nn.Sequential(torch.nn.Linear(8, 8)), "w4a16", recipe="half")


class _TinyLm(torch.nn.Module):
    """A head tied to an embedding and attention-style names, for the recipes."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 64)
        self.layers = torch.nn.ModuleList(
            torch.nn.ModuleDict(
                {n: torch.nn.Linear(64, 64) for n in ("q_proj", "v_proj", "down_proj")}
            )
            for _ in range(2)
        )
        self.lm_head = torch.nn.Linear(64, 50, bias=False)
        self.lm_head.weight = self.embed.weight

    def get_output_embeddings(self):
        return self.lm_head


@pytest.mark.parametrize("mode", ["w4a16", "w4a8"])
def test_recipes_give_the_head_and_the_value_projections_8_bits(mode):
    eight = {"w4a16": "w8a16", "w4a8": "w8a8"}[mode]
    want = {
        "mixed": lambda n: "w8a16" if n == "lm_head" else eight if n.endswith("v_proj") else mode,
        "pure": lambda n: "w8a16" if n == "lm_head" else mode,
        "uniform": lambda n: mode,
    }
    for recipe, rule in want.items():
        model = _TinyLm()
        got = {q.name: q.mode for q in fuseops.quantize_(model, mode, recipe=recipe)}
        assert len(got) == 7 and all(m == rule(n) for n, m in got.items()), (recipe, got)
        for name, layer_mode in got.items():
            layer = model.get_submodule(name)
            kind = fuseops.nn.Int4Linear if layer_mode.startswith("w4") else fuseops.nn.Int8Linear
            assert isinstance(layer, kind) and layer.mode == layer_mode, (recipe, name)
        # The tied embedding keeps its float weight; the head has its own copy.
        assert isinstance(model.embed.weight, torch.nn.Parameter)
