"""The test and bench cases of :mod:`fuseops.ops.sparse_2_4` (see
:mod:`fuseops.ops.cases`): kept out of ``import fuseops``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ._sample import Sample, tensor

if TYPE_CHECKING:
    from ._bench_case import CaseFields
from .. import sparse_2_4 as family


def _dense_peer(values, meta, scale, k, form):
    # form: "int8" (the dense int8 kernel's packed weight and scales),
    # "int8_dynamic" (those and the column sums) or a float dtype (the
    # dequantized dense weight in it).
    from ._bench_case import peer_form

    def make():
        dense = family.unpack_2_4(values, meta, k)
        if form in ("int8", "int8_dynamic"):
            from ..int8_linear import pack_int8_weight

            packed = pack_int8_weight(dense, scale)
            return packed if form == "int8_dynamic" else packed[:2]
        if dense.dtype == torch.int8:
            return ((dense.float() * scale[:, None]).to(form),)
        return (dense.to(form),)

    return peer_form(values, ("dense", form), make)


def _f_linear(x, values, meta, scale):
    (w,) = _dense_peer(values, meta, scale, x.shape[-1], x.dtype)
    return torch.nn.functional.linear(x, w)


def _dense_int8(x, values, meta, scale):
    packed, s = _dense_peer(values, meta, scale, x.shape[-1], "int8")
    return torch.ops.fuseops.int8_weight_only_linear(x, packed, s, None)


def _dense_int8_dynamic(x, values, meta, scale, colsum):
    packed, s, cs = _dense_peer(values, meta, scale, x.shape[-1], "int8_dynamic")
    return torch.ops.fuseops.int8_dynamic_linear(x, packed, s, cs, None)


def _ao_dynamic_linear(engine):
    # torch.ao's dynamic Linear with the dense pruned int8 weight (the dense
    # W8A8 cases' peer, fuseops/ops/int8_linear.py).
    from .int8_linear import _ao_dynamic_linear as dense_peer

    peer = dense_peer(engine)

    def call(x, values, meta, scale, colsum):
        return peer(x, *_dense_peer(values, meta, scale, x.shape[-1], "int8_dynamic"))

    return call


def _x_and_float_weight(rows, hidden, dtype, device, gen):
    x = torch.randn(rows, hidden, dtype=torch.float32, device=device, generator=gen).to(dtype)
    w = (torch.randn(hidden, hidden, dtype=torch.float32, device=device, generator=gen) * 0.02).to(
        dtype
    )
    return (x, *family.pack_2_4(family.prune_2_4(w)))


def _x_and_int8_weight(rows, hidden, dtype, device, gen):
    x = torch.randn(rows, hidden, dtype=torch.float32, device=device, generator=gen).to(dtype)
    w = family.prune_2_4(
        torch.randn(hidden, hidden, dtype=torch.float32, device=device, generator=gen) * 0.02
    )
    return (x, *family.pack_2_4(*torch.ops.fuseops.quantize_per_channel_int8(w)))


def _x_and_dynamic_weight(rows, hidden, dtype, device, gen):
    x, values, meta, scale = _x_and_int8_weight(rows, hidden, dtype, device, gen)
    return x, values, meta, scale, family.colsum_2_4(values)


def bench_cases():
    from ._bench_case import Case, Traffic

    @dataclass(frozen=True)
    class FloatWeightTraffic(Traffic):
        # x read and y written in the dtype, the kept half of the weight in
        # the dtype, its mask (1/8 byte per weight) and the float32 scales.
        def bytes(self, rows, hidden, element_size):
            return (
                element_size * (2 * rows * hidden + hidden * hidden // 2)
                + hidden * hidden // 8
                + 4 * hidden
            )

    # rows = tokens (M), hidden = in = out features (K = N), as the int8
    # rows: decode (1, 8), a short prefill (32) and a batch (256); the quick
    # preset's one row the short prefill.
    shapes = {
        "quick": [(32, 1024)],
        "standard": [(m, 1024) for m in (1, 8, 32, 256)],
        "full": [(m, 8192) for m in (1, 8, 32, 256)],
    }
    common: CaseFields = dict(
        fuseops="sparse_2_4_linear",
        reference="sparse_2_4_linear",
        backward_traffic=Traffic(rows=0),
        has_out=False,
        differentiable=(),
        shapes=shapes,
    )
    float_weight: CaseFields = {
        **common,
        "make_inputs": _x_and_float_weight,
        "forward_traffic": FloatWeightTraffic(rows=2),
    }
    # int8 values: half the int8 weight, the mask and the scales.
    int8: CaseFields = {
        **common,
        "make_inputs": _x_and_int8_weight,
        "forward_traffic": Traffic(
            rows=2, extra=lambda rows, hidden: hidden * hidden * 5 // 8 + 4 * hidden
        ),
    }
    # W8A8: the same weight bytes plus the int32 column sums.
    dynamic: CaseFields = {
        **common,
        "fuseops": "sparse_2_4_dynamic_linear",
        "reference": "sparse_2_4_dynamic_linear",
        "make_inputs": _x_and_dynamic_weight,
        "forward_traffic": Traffic(
            rows=2, extra=lambda rows, hidden: hidden * hidden * 5 // 8 + 8 * hidden
        ),
    }
    return [
        Case(
            "sparse_2_4_dynamic_linear",
            native=_dense_int8_dynamic,
            native_label="fuseops.int8_dynamic_linear (dense int8 weight)",
            description="2:4 sparse int8 weight, W8A8 dynamic, against the dense W8A8 kernel",
            **dynamic,
        ),
        Case(
            "sparse_2_4_dynamic_linear_ao_fbgemm",
            native=_ao_dynamic_linear("fbgemm"),
            native_label="torch.ao dynamic Linear (fbgemm, dense weight)",
            description="2:4 sparse W8A8 against torch.ao.nn.quantized.dynamic.Linear, fbgemm engine",
            **dynamic,
        ),
        Case(
            "sparse_2_4_dynamic_linear_ao_onednn",
            native=_ao_dynamic_linear("onednn"),
            native_label="torch.ao dynamic Linear (onednn, dense weight)",
            description="2:4 sparse W8A8 against torch.ao.nn.quantized.dynamic.Linear, onednn engine",
            **dynamic,
        ),
        Case(
            "sparse_2_4_linear",
            native=_f_linear,
            native_label="F.linear (dense pruned weight)",
            description="2:4 sparse float weight: kept values + bitmask",
            **float_weight,
        ),
        Case(
            "sparse_2_4_linear_int8",
            native=_dense_int8,
            native_label="fuseops.int8_weight_only_linear (dense int8 weight)",
            description="2:4 sparse int8 weight (W8A16) against the dense int8 kernel",
            **int8,
        ),
        Case(
            "sparse_2_4_linear_int8_f_linear",
            native=_f_linear,
            native_label="F.linear (dequantized weight)",
            description="2:4 sparse int8 weight (W8A16) against F.linear",
            variant=True,
            **int8,
        ),
    ]


def samples(device) -> list[Sample]:
    ops = torch.ops.fuseops
    gen = torch.Generator(device="cpu").manual_seed(2)

    def t(shape, dtype=torch.float32, layout="contiguous"):
        return tensor(shape, dtype, device, layout)

    def float_weight(n, k, dtype=torch.float32):
        return family.prune_2_4(t((n, k), dtype))

    def int8_weight(n, k):
        wq = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen)
        keep = family.prune_2_4(torch.randn(n, k, generator=gen)) != 0
        scale = torch.rand(n, generator=gen) * 0.02 + 1e-3
        return (wq * keep).to(device), scale.to(device)

    sparse_rows = float_weight(6, 12)
    sparse_rows[1] = 0  # groups with fewer than 2 nonzeros keep zeros
    result = [
        Sample(ops.prune_2_4.default, (t((6, 12)),), family.prune_2_4),
        Sample(ops.prune_2_4.default, (t((5, 8), torch.bfloat16, "transposed"),), family.prune_2_4),
        Sample(ops.prune_2_4.default, (t((3, 16), torch.float16, "sliced"),), family.prune_2_4),
        Sample(ops.prune_2_4.default, (t((0, 8), torch.float64),), family.prune_2_4),
        Sample(ops.pack_2_4.default, (float_weight(6, 12), None), family.pack_2_4),
        Sample(ops.pack_2_4.default, (sparse_rows, t((6,)).abs()), family.pack_2_4),
        Sample(ops.pack_2_4.default, (float_weight(4, 16, torch.bfloat16), None), family.pack_2_4),
        Sample(ops.pack_2_4.default, (*int8_weight(5, 20),), family.pack_2_4),
        Sample(ops.pack_2_4.default, (float_weight(0, 8, torch.float16), None), family.pack_2_4),
    ]
    w37 = family.pack_2_4(float_weight(37, 12))
    w37_bf16 = family.pack_2_4(float_weight(37, 12, torch.bfloat16))
    w37_f16 = family.pack_2_4(float_weight(37, 12, torch.float16))
    w37_f64 = family.pack_2_4(float_weight(37, 12, torch.float64))
    q37 = family.pack_2_4(*int8_weight(37, 12))
    result += [
        Sample(ops.sparse_2_4_linear.default, (t((3, 12)), *w37, None), family.sparse_2_4_linear),
        Sample(
            ops.sparse_2_4_linear.default, (t((3, 12)), *w37, t((37,))), family.sparse_2_4_linear
        ),
        Sample(
            ops.sparse_2_4_linear.default,
            (t((2, 4, 12), torch.bfloat16, "transposed"), *w37_bf16, t((37,), torch.bfloat16)),
            family.sparse_2_4_linear,
        ),
        Sample(
            ops.sparse_2_4_linear.default,
            (t((5, 12), torch.float16, "sliced"), *w37_f16, None),
            family.sparse_2_4_linear,
        ),
        Sample(
            ops.sparse_2_4_linear.default,
            (t((12,), torch.float64), *w37_f64, None),
            family.sparse_2_4_linear,
        ),
        Sample(ops.sparse_2_4_linear.default, (t((0, 12)), *w37, None), family.sparse_2_4_linear),
        Sample(
            ops.sparse_2_4_linear.default,
            (t((3, 0)), *family.pack_2_4(t((5, 0))), t((5,))),
            family.sparse_2_4_linear,
        ),
        Sample(
            ops.sparse_2_4_linear.default, (t((3, 12)), *q37, t((37,))), family.sparse_2_4_linear
        ),
        Sample(
            ops.sparse_2_4_linear.default,
            (t((4, 12), torch.bfloat16), *q37, None),
            family.sparse_2_4_linear,
        ),
        Sample(
            ops.sparse_2_4_linear.default,
            (t((2, 12), torch.float64), *q37, None),
            family.sparse_2_4_linear,
        ),
    ]
    d37 = (*q37, family.colsum_2_4(q37[0]))
    zero_rows = t((4, 12))
    zero_rows[1] = 0  # scale 1, the bias alone
    result += [
        Sample(
            ops.sparse_2_4_dynamic_linear.default,
            (t((3, 12)), *d37, None),
            family.sparse_2_4_dynamic_linear,
        ),
        Sample(
            ops.sparse_2_4_dynamic_linear.default,
            (zero_rows, *d37, t((37,))),
            family.sparse_2_4_dynamic_linear,
        ),
        Sample(
            ops.sparse_2_4_dynamic_linear.default,
            (t((2, 4, 12), torch.bfloat16, "transposed"), *d37, t((37,), torch.bfloat16)),
            family.sparse_2_4_dynamic_linear,
        ),
        Sample(
            ops.sparse_2_4_dynamic_linear.default,
            (t((5, 12), torch.float16, "sliced"), *d37, None),
            family.sparse_2_4_dynamic_linear,
        ),
        Sample(
            ops.sparse_2_4_dynamic_linear.default,
            (t((12,), torch.float64), *d37, None),
            family.sparse_2_4_dynamic_linear,
        ),
        Sample(
            ops.sparse_2_4_dynamic_linear.default,
            (t((0, 12)), *d37, None),
            family.sparse_2_4_dynamic_linear,
        ),
        Sample(
            ops.sparse_2_4_dynamic_linear.default,
            (
                t((3, 0)),
                *family.pack_2_4(*int8_weight(5, 0)),
                torch.zeros(5, dtype=torch.int32, device=device),
                t((5,)),
            ),
            family.sparse_2_4_dynamic_linear,
        ),
    ]
    # Every CPU build: more rows than a register tile and a task's chunk,
    # partial tiles and blocks of channels, a tail of features shorter than
    # a vector (K = 140: 8 x 16 + 12).
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        wf = family.pack_2_4(float_weight(37, 140, dtype))
        wq = family.pack_2_4(*int8_weight(37, 140))
        for m in (1, 5, 61):
            result.append(
                Sample(
                    ops.sparse_2_4_linear.default,
                    (t((m, 140), dtype), *wf, t((37,), dtype)),
                    family.sparse_2_4_linear,
                    large=True,
                )
            )
            result.append(
                Sample(
                    ops.sparse_2_4_linear.default,
                    (t((m, 140), dtype), *wq, t((37,), dtype)),
                    family.sparse_2_4_linear,
                    large=True,
                )
            )
        # W8A8: K = 200 (3 steps of 64 features + 8; 12 vectors of 16 + 8).
        wd = family.pack_2_4(*int8_weight(37, 200))
        for m in (1, 5, 61):
            result.append(
                Sample(
                    ops.sparse_2_4_dynamic_linear.default,
                    (t((m, 200), dtype), *wd, family.colsum_2_4(wd[0]), t((37,), dtype)),
                    family.sparse_2_4_dynamic_linear,
                    large=True,
                )
            )
    return result


def fuzz(d) -> Sample:
    """One random call for tests_py/test_fuzz.py (``d``: fuseops.ops._fuzz.Draw)."""
    ops, n, k, kind = torch.ops.fuseops, d.size(20), 4 * d.size(10), d.int(0, 3)
    if kind == 0:
        return Sample(ops.prune_2_4.default, (d.tensor((n, k)),), family.prune_2_4)
    if kind == 3 or d.flag():  # int8 values, 2 of every 4 kept, with their scale
        keep = family.prune_2_4(d.tensor((n, k), torch.float32)) != 0
        weight, scale = (
            d.integers((n, k), -127, 128, torch.int8) * keep,
            d.tensor((n,), torch.float32, 0.02),
        )
        x_dtype = None
    else:
        weight, scale = (
            family.prune_2_4(d.tensor((n, k))),
            d.maybe(lambda: d.tensor((n,), torch.float32)),
        )
        x_dtype = weight.dtype
    if kind == 1:
        return Sample(ops.pack_2_4.default, (weight, scale), family.pack_2_4)
    x = d.tensor(d.shape(0, 2) + (k,), x_dtype)
    bias = d.maybe(lambda: d.tensor((n,), x.dtype))
    if kind == 3:  # W8A8: float64 x is quantized from float32, summed exactly
        values, meta, scale = family.pack_2_4(weight, scale)
        d.math_dtype = torch.float32
        return Sample(
            ops.sparse_2_4_dynamic_linear.default,
            (x, values, meta, scale, family.colsum_2_4(values), bias),
            family.sparse_2_4_dynamic_linear,
        )
    return Sample(
        ops.sparse_2_4_linear.default,
        (x, *family.pack_2_4(weight, scale), bias),
        family.sparse_2_4_linear,
    )


def export_cases() -> list:
    """The calls the export tests run (fuseops/ops/_export.py): the
    weight-only linear within 1e-5 (its float sums over K run in another
    order), float and int8 values; the dynamic one as float32 (equal int32
    sums, the epilogue's float32 order apart)."""
    import itertools

    from .._export import EXPORT_DTYPES, ExportCase
    from .._export import randn as t
    from ..quantize import quantize_per_channel_int8

    ops = torch.ops.fuseops

    def pruned(n, k):
        return family.prune_2_4(torch.randn(n, k) * 0.05)

    def int8_packed(n, k):
        return family.pack_2_4(*quantize_per_channel_int8(pruned(n, k)))

    cases = []
    for dtype, (m, n, k), bias in itertools.product(
        EXPORT_DTYPES, ((3, 20, 36), (1, 16, 64)), (False, True)
    ):
        float_packed = family.pack_2_4(pruned(n, k).to(dtype))
        for kind, packed in (("float", float_packed), ("int8", int8_packed(n, k))):
            args = (t(2, m, k, dtype=dtype), *packed) + ((t(n, dtype=dtype),) if bias else ())
            label = f"{dtype} {kind} values {m}x{k} @ {n} bias={bias}"
            cases.append(
                ExportCase(ops.sparse_2_4_linear.default, label, args, rtol=1e-5, atol=1e-5)
            )
        values, meta, scale = int8_packed(n, k)
        args = (t(2, m, k, dtype=dtype), values, meta, scale, family.colsum_2_4(values))
        args += (t(n, dtype=dtype),) if bias else ()
        cases.append(
            ExportCase(
                ops.sparse_2_4_dynamic_linear.default, f"{dtype} {m}x{k} @ {n} bias={bias}", args
            )
        )
    return cases
