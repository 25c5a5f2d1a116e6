"""The test and bench cases of :mod:`fuseops.ops.int4_linear` (see
:mod:`fuseops.ops.cases`): kept out of ``import fuseops``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ._sample import Sample, tensor

if TYPE_CHECKING:
    from ._bench_case import CaseFields
from .. import int4_linear as family


def _f_linear(x, packed, scale_zero, group_size):
    from ._bench_case import peer_form

    def dequantized():
        w = family.dequantize_int4_weight(
            packed, scale_zero, group_size, x.shape[-1], torch.float32
        )
        return w.to(x.dtype)

    return torch.nn.functional.linear(x, peer_form(packed, ("float", x.dtype), dequantized))


def _weight_int4pack_mm(x, packed, scale_zero, group_size):
    # ATen's int4 weight-only matmul for CPU (torchao's int4 CPU layout):
    # weights (q - 8) * scale + offset per group, so the offset is
    # (8 - zero) * scale; its scales and offsets are in x's dtype. It takes
    # N in multiples of 16 and K in whole groups: smaller test shapes are
    # padded with zero weights (and zero activations), the bench's are not.
    k, n = x.shape[-1], scale_zero.shape[-1]
    groups = scale_zero.shape[0]
    n_padded, k_padded = -(-n // 16) * 16, groups * group_size
    from ._bench_case import peer_form

    def int4pack():
        q = family.unpack_int4_weight(packed, n, k).to(torch.int32)
        q = torch.nn.functional.pad(q, (0, k_padded - k, 0, n_padded - n), value=8)
        weight = torch._convert_weight_to_int4pack_for_cpu(q.contiguous(), 1)
        scale = torch.nn.functional.pad(scale_zero[:, 0, :], (0, n_padded - n))
        zero = torch.nn.functional.pad(scale_zero[:, 1, :], (0, n_padded - n), value=8.0)
        offset = (8 - zero) * scale
        scales_and_offsets = torch.stack((scale, offset), dim=-1).to(x.dtype).contiguous()
        return weight, scales_and_offsets

    weight, scales_and_offsets = peer_form(packed, ("int4pack", x.dtype), int4pack)
    if k_padded != k:
        x = torch.nn.functional.pad(x, (0, k_padded - k))
    y = torch._weight_int4pack_mm_for_cpu(x, weight, group_size, scales_and_offsets)
    return y if n_padded == n else y[..., :n]


def _x_and_weight(rows, hidden, dtype, device, gen):
    """Activations [rows, hidden] and a packed int4 weight [hidden, hidden]
    quantized from a random one in groups of 128."""
    x = torch.randn(rows, hidden, dtype=torch.float32, device=device, generator=gen).to(dtype)
    w = torch.randn(hidden, hidden, dtype=torch.float32, device=device, generator=gen) * 0.02
    packed, scale_zero = family.pack_int4_weight(*family.quantize_per_group_int4(w, 128), 128)
    return x, packed, scale_zero


def bench_cases():
    from ._bench_case import Case, Traffic

    # rows = tokens (M), hidden = in = out features (K = N), as the int8
    # linear cases: decode (M = 1, 8), a short prefill (32), a batch (256).
    shapes = {
        "quick": [(32, 2048)],
        "standard": [(m, 2048) for m in (1, 8, 32, 256)],
        "full": [(m, 8192) for m in (1, 8, 32, 256)],
    }
    # x read and y written in the dtype; the int4 weight (half a byte per
    # value) and its float32 scales and zero points (8 bytes per group of
    # 128) read once.
    common: CaseFields = dict(
        fuseops="int4_weight_only_linear",
        reference="int4_weight_only_linear",
        make_inputs=_x_and_weight,
        forward_traffic=Traffic(
            rows=2, extra=lambda rows, hidden: hidden * hidden // 2 + hidden * hidden // 16
        ),
        backward_traffic=Traffic(rows=0),
        has_out=False,
        differentiable=(),
        shapes=shapes,
        options=dict(group_size=128),
    )
    cases = [
        Case(
            "int4_weight_only_linear",
            native=_f_linear,
            native_label="F.linear (dequantized weight)",
            description="W4A16: x @ w.T, int4 weight in groups of 128 along K",
            **common,
        )
    ]
    dynamic: CaseFields = {
        **common,
        "fuseops": "int4_dynamic_linear",
        "reference": "int4_dynamic_linear",
    }
    cases.append(
        Case(
            "int4_dynamic_linear",
            native=_f_linear,
            native_label="F.linear (dequantized weight)",
            description="W4A8: x quantized to int8 per row @ int4 weight (groups of 128)",
            variant=True,
            **dynamic,
        )
    )
    if hasattr(torch, "_weight_int4pack_mm_for_cpu"):
        cases.append(
            Case(
                "int4_weight_only_linear_int4pack",
                native=_weight_int4pack_mm,
                native_label="torch._weight_int4pack_mm_for_cpu",
                description="W4A16 against ATen's int4 weight-only matmul for CPU",
                **common,
            )
        )
    return cases


def samples(device) -> list[Sample]:
    ops = torch.ops.fuseops
    gen = torch.Generator(device="cpu").manual_seed(4)

    def weight(n, k, scale=1.0):
        return (torch.randn(n, k, generator=gen) * scale).to(device)

    def packed(n, k, group_size, symmetric=True):
        q = family.quantize_per_group_int4(weight(n, k), group_size, symmetric)
        return family.pack_int4_weight(*q, group_size)

    def t(shape, dtype=torch.float32, layout="contiguous"):
        return tensor(shape, dtype, device, layout)

    quantized = family.quantize_per_group_int4(weight(37, 10), 4)
    result = [
        Sample(
            ops.quantize_per_group_int4.default,
            (weight(37, 10), 4, True),
            family.quantize_per_group_int4,
        ),
        Sample(
            ops.quantize_per_group_int4.default,
            (weight(5, 70), 32, False),
            family.quantize_per_group_int4,
        ),
        Sample(
            ops.quantize_per_group_int4.default,
            (weight(3, 16).to(torch.bfloat16), 16, True),
            family.quantize_per_group_int4,
        ),
        Sample(
            ops.quantize_per_group_int4.default,
            (weight(0, 5), 4, True),
            family.quantize_per_group_int4,
        ),
        Sample(ops.pack_int4_weight.default, (*quantized, 4), family.pack_int4_weight),
        Sample(
            ops.pack_int4_weight.default,
            (*family.quantize_per_group_int4(weight(16, 64), 32, False), 32),
            family.pack_int4_weight,
        ),
        Sample(
            ops.pack_int4_weight.default,
            (*family.quantize_per_group_int4(weight(0, 5), 2), 2),
            family.pack_int4_weight,
        ),
    ]
    w37, sz37 = packed(37, 10, 4)
    w_asym, sz_asym = packed(37, 10, 4, symmetric=False)
    result += [
        Sample(
            ops.int4_weight_only_linear.default,
            (t((3, 10)), w37, sz37, 4, None),
            family.int4_weight_only_linear,
        ),
        Sample(
            ops.int4_weight_only_linear.default,
            (t((3, 10)), w_asym, sz_asym, 4, t((37,))),
            family.int4_weight_only_linear,
        ),
        Sample(
            ops.int4_weight_only_linear.default,
            (t((2, 4, 10), torch.bfloat16, "transposed"), w37, sz37, 4, t((37,), torch.bfloat16)),
            family.int4_weight_only_linear,
        ),
        Sample(
            ops.int4_weight_only_linear.default,
            (t((5, 10), torch.float16, "sliced"), w37, sz37, 4, None),
            family.int4_weight_only_linear,
        ),
        Sample(
            ops.int4_weight_only_linear.default,
            (t((10,), torch.float64), w37, sz37, 4, None),
            family.int4_weight_only_linear,
        ),
        Sample(
            ops.int4_weight_only_linear.default,
            (t((0, 10)), w37, sz37, 4, None),
            family.int4_weight_only_linear,
        ),
        Sample(
            ops.int4_weight_only_linear.default,
            (t((3, 0)), *packed(5, 0, 2), 2, t((5,))),
            family.int4_weight_only_linear,
        ),
    ]
    # Every CPU build: the decode path (rows in registers) and the buffered
    # one (more rows than it takes, several tiles and chunks), partial
    # blocks of channels and a short last group.
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        for symmetric in (True, False):
            wp, szp = packed(37, 300, 64, symmetric)
            for m in (1, 2, 5, 61):
                result.append(
                    Sample(
                        ops.int4_weight_only_linear.default,
                        (t((m, 300), dtype), wp, szp, 64, t((37,), dtype)),
                        family.int4_weight_only_linear,
                        large=True,
                    )
                )
            # scale_zero in bfloat16 (what Int4Linear stores by default).
            for m in (1, 5):
                result.append(
                    Sample(
                        ops.int4_weight_only_linear.default,
                        (t((m, 300), dtype), wp, szp.to(torch.bfloat16), 64, t((37,), dtype)),
                        family.int4_weight_only_linear,
                        large=True,
                    )
                )
    # W4A8: the same weights; group sizes that are and are not multiples of
    # 8 (the VNNI path's step), rows in one tile and in several chunks.
    dyn = ops.int4_dynamic_linear.default
    result += [
        Sample(dyn, (t((3, 10)), w37, sz37, 4, None), family.int4_dynamic_linear),
        Sample(dyn, (t((3, 10)), w_asym, sz_asym, 4, t((37,))), family.int4_dynamic_linear),
        Sample(
            dyn,
            (t((2, 4, 10), torch.bfloat16, "transposed"), w37, sz37, 4, t((37,), torch.bfloat16)),
            family.int4_dynamic_linear,
        ),
        Sample(dyn, (t((10,), torch.float64), w37, sz37, 4, None), family.int4_dynamic_linear),
        Sample(dyn, (t((0, 10)), w37, sz37, 4, None), family.int4_dynamic_linear),
        Sample(dyn, (t((3, 0)), *packed(5, 0, 2), 2, t((5,))), family.int4_dynamic_linear),
    ]
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        for group_size, symmetric in ((64, True), (12, False)):
            wp, szp = packed(37, 300, group_size, symmetric)
            for m in (1, 3, 9, 70):
                result.append(
                    Sample(
                        dyn,
                        (t((m, 300), dtype), wp, szp, group_size, t((37,), dtype)),
                        family.int4_dynamic_linear,
                        large=True,
                    )
                )
            result.append(
                Sample(
                    dyn,
                    (t((3, 300), dtype), wp, szp.to(torch.bfloat16), group_size, None),
                    family.int4_dynamic_linear,
                    large=True,
                )
            )
    return result


def fuzz(d) -> Sample:
    """One random call for tests_py/test_fuzz.py (``d``: fuseops.ops._fuzz.Draw)."""
    ops, n, k = torch.ops.fuseops, d.size(40), d.size(40)
    group_size = d.choice((2, 4, 16, 32))
    symmetric = d.flag()
    kind = d.int(0, 2)
    if kind == 0:
        return Sample(
            ops.quantize_per_group_int4.default,
            (d.tensor((n, k)), group_size, symmetric),
            family.quantize_per_group_int4,
        )
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(d.int(0, 1000)))
    quantized = family.quantize_per_group_int4(w.to(d.device), group_size, symmetric)
    if kind == 1:
        return Sample(
            ops.pack_int4_weight.default, (*quantized, group_size), family.pack_int4_weight
        )
    x = d.tensor(d.shape(0, 2) + (k,))
    bias = d.maybe(lambda: d.tensor((n,), x.dtype))
    packed, scale_zero = family.pack_int4_weight(*quantized, group_size)
    if d.flag():
        scale_zero = scale_zero.to(torch.bfloat16)
    d.math_dtype = torch.float32  # float64 x is summed in float32
    if d.flag():
        return Sample(
            ops.int4_dynamic_linear.default,
            (x, packed, scale_zero, group_size, bias),
            family.int4_dynamic_linear,
        )
    return Sample(
        ops.int4_weight_only_linear.default,
        (x, packed, scale_zero, group_size, bias),
        family.int4_weight_only_linear,
    )


def export_cases() -> list:
    """The calls the export tests run (fuseops/ops/_export.py): every dtype
    with each shape (K a multiple of the group size or not, N a multiple of
    16 or not), symmetric and asymmetric weights, with and without bias, in
    turn; the weight-only linear within 1e-5 (its float sums over K run in
    another order, the group scales applied to the weight)."""
    import itertools

    from .._export import EXPORT_DTYPES, ExportCase
    from .._export import randn as t

    ops = torch.ops.fuseops

    def weight(n, k, group_size, symmetric):
        wq, scale, zero = family.quantize_per_group_int4(
            torch.randn(n, k) * 0.05, group_size, symmetric
        )
        return family.pack_int4_weight(wq, scale, zero, group_size)

    def linear_cases(op, **tolerance):
        cases = []
        shapes = ((3, 20, 64, 32), (1, 17, 72, 32), (2, 16, 128, 128))
        for i, (dtype, (m, n, k, group_size)) in enumerate(
            itertools.product(EXPORT_DTYPES, shapes)
        ):
            symmetric, bias, bfloat16_scales = i % 2 == 0, i % 4 < 2, i % 3 == 1
            packed, scale_zero = weight(n, k, group_size, symmetric)
            if bfloat16_scales:
                scale_zero = scale_zero.to(torch.bfloat16)
            args: tuple = (t(2, m, k, dtype=dtype), packed, scale_zero)
            if bias:
                args += (t(n, dtype=dtype),)
            call = (
                (lambda x, p, sz, b, g=group_size: op(x, p, sz, g, b))
                if bias
                else (lambda x, p, sz, g=group_size: op(x, p, sz, g, None))
            )
            label = (
                f"{dtype} {m}x{k} @ {n} group {group_size} symmetric={symmetric} bias={bias}"
                f" scale_zero {scale_zero.dtype}"
            )
            cases.append(ExportCase(op, label, args, call, **tolerance))
        return cases

    cases = linear_cases(ops.int4_weight_only_linear.default, rtol=1e-5, atol=1e-5)
    cases += linear_cases(ops.int4_dynamic_linear.default)
    # A row of zeros, a row holding Inf and one holding NaN (NaN rows).
    x = t(4, 64)
    x[1] = 0
    x[2, 5] = float("-inf")
    x[3, 0] = float("nan")
    cases.append(
        ExportCase(
            ops.int4_dynamic_linear.default,
            "zero, Inf and NaN rows",
            (x, *weight(8, 64, 32, True)),
            lambda x, p, sz: ops.int4_dynamic_linear(x, p, sz, 32, None),
        )
    )
    return cases
