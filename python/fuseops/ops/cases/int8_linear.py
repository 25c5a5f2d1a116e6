"""The test and bench cases of :mod:`fuseops.ops.int8_linear` (see
:mod:`fuseops.ops.cases`): kept out of ``import fuseops``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ._sample import Sample, tensor

if TYPE_CHECKING:
    from ._bench_case import CaseFields
from .. import int8_linear as family


def _peer_weight(packed, scale, n, k, dtype, form):
    from ._bench_case import peer_form

    def make():
        wq = family.unpack_int8_weight(packed, n, k).contiguous()
        if form == "float":
            return ((wq.to(torch.float32) * scale[:, None]).to(dtype),)
        return (wq, scale.to(dtype))

    return peer_form(packed, (form, dtype), make)


def _f_linear(x, packed, scale):
    (w,) = _peer_weight(packed, scale, scale.shape[0], x.shape[-1], x.dtype, "float")
    return torch.nn.functional.linear(x, w)


def _weight_int8pack_mm(x, packed, scale):
    wq, s = _peer_weight(packed, scale, scale.shape[0], x.shape[-1], x.dtype, "int8")
    return torch._weight_int8pack_mm(x, wq, s)


def _dynamic_peer_weight(packed, scale, n, k, engine):
    # torch.ao's dynamic Linear with the same per-channel int8 weight; it
    # quantizes activations per tensor (uint8, asymmetric) at run time.
    from ._bench_case import peer_form

    def make():
        import warnings

        import torch.ao.nn.quantized.dynamic as nnqd

        torch.backends.quantized.engine = engine
        wq = family.unpack_int8_weight(packed, n, k).contiguous()
        # torch.ao's quantized tensors are deprecated (a UserWarning).
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            qweight = torch._make_per_channel_quantized_tensor(
                wq, scale.double(), torch.zeros(n, dtype=torch.long), 0
            )
            module = nnqd.Linear(k, n, bias_=False)
            module.set_weight_bias(qweight, None)
        return (module,)

    return peer_form(packed, ("ao", engine), make)


def _ao_dynamic_linear(engine):
    def peer(x, packed, scale, colsum):
        (module,) = _dynamic_peer_weight(packed, scale, scale.shape[0], x.shape[-1], engine)
        # The engine is process-wide: set it for each call (a cheap store).
        torch.backends.quantized.engine = engine
        return module(x.float()).to(x.dtype)

    return peer


def _int_mm(x, packed, scale, colsum):
    # torch._int_mm on activations quantized beforehand (per token, where the op has a scale per block of 32; as the
    # op does, outside the timing) and the int8 weight [K, N]: the int8
    # GEMM alone plus the scales' epilogue.
    from ._bench_case import peer_form

    def make():
        xq, x_scale = torch.ops.fuseops.quantize_per_token_int8(x)
        wq = family.unpack_int8_weight(packed, scale.shape[0], x.shape[-1]).contiguous()
        return xq, x_scale.unsqueeze(-1), wq

    # Kept with the activations; `packed` belongs to the same input set.
    xq, x_scale, wq = peer_form(x, ("int_mm", id(packed)), make)
    return (torch._int_mm(xq, wq.t()).float() * x_scale * scale).to(x.dtype)


def _x_and_weight(rows, hidden, dtype, device, gen):
    """Activations [rows, hidden] and a packed int8 weight [hidden, hidden]
    quantized from a random one."""
    x = torch.randn(rows, hidden, dtype=torch.float32, device=device, generator=gen).to(dtype)
    w = torch.randn(hidden, hidden, dtype=torch.float32, device=device, generator=gen) * 0.02
    packed, scale, _ = family.pack_int8_weight(*torch.ops.fuseops.quantize_per_channel_int8(w))
    return x, packed, scale


def _x_and_dynamic_weight(rows, hidden, dtype, device, gen):
    x = torch.randn(rows, hidden, dtype=torch.float32, device=device, generator=gen).to(dtype)
    w = torch.randn(hidden, hidden, dtype=torch.float32, device=device, generator=gen) * 0.02
    return (x, *family.pack_int8_weight(*torch.ops.fuseops.quantize_per_channel_int8(w)))


def _f_linear_dynamic(x, packed, scale, colsum):
    return _f_linear(x, packed, scale)


def bench_cases():
    from ._bench_case import Case, Traffic

    # rows = tokens (M), hidden = in = out features (K = N): decode (M = 1,
    # 8), a short prefill (32) and a batch (256); the quick preset's one row
    # the short prefill. The full shapes' int8 weight (64 MiB) exceeds the
    # cache; the other presets' (4 MiB) rotate through input sets that
    # together do.
    shapes = {
        "quick": [(32, 2048)],
        "standard": [(m, 2048) for m in (1, 8, 32, 256)],
        "full": [(m, 8192) for m in (1, 8, 32, 256)],
    }
    # x read and y written in the dtype; the int8 weight and its float32
    # scales read once.
    traffic = Traffic(rows=2, extra=lambda rows, hidden: hidden * hidden + 4 * hidden)
    common: CaseFields = dict(
        fuseops="int8_weight_only_linear",
        reference="int8_weight_only_linear",
        make_inputs=_x_and_weight,
        forward_traffic=traffic,
        backward_traffic=Traffic(rows=0),
        has_out=False,
        differentiable=(),
        shapes=shapes,
    )
    # W8A8: the same traffic plus the int16 column sums, one per block of 32
    # inputs and output.
    dynamic: CaseFields = {
        **common,
        "fuseops": "int8_dynamic_linear",
        "reference": "int8_dynamic_linear",
        "make_inputs": _x_and_dynamic_weight,
        "forward_traffic": Traffic(
            rows=2,
            extra=lambda rows, hidden: hidden * hidden + 4 * hidden + 2 * -(-hidden // 32) * hidden,
        ),
    }
    return [
        Case(
            "int8_dynamic_linear",
            native=_f_linear_dynamic,
            native_label="F.linear (dequantized weight)",
            description="W8A8 dynamic: x quantized per block of 32, int8 x int8 in int32",
            **dynamic,
        ),
        Case(
            "int8_dynamic_linear_ao_fbgemm",
            native=_ao_dynamic_linear("fbgemm"),
            native_label="torch.ao dynamic Linear (fbgemm)",
            description="W8A8 against torch.ao.nn.quantized.dynamic.Linear, fbgemm engine",
            **dynamic,
        ),
        Case(
            "int8_dynamic_linear_ao_onednn",
            native=_ao_dynamic_linear("onednn"),
            native_label="torch.ao dynamic Linear (onednn)",
            description="W8A8 against torch.ao.nn.quantized.dynamic.Linear, onednn engine",
            **dynamic,
        ),
        Case(
            "int8_dynamic_linear_int_mm",
            native=_int_mm,
            native_label="torch._int_mm (x pre-quantized)",
            description="W8A8 against ATen's int8 matmul on pre-quantized activations",
            **dynamic,
        ),
        Case(
            "int8_weight_only_linear",
            native=_f_linear,
            native_label="F.linear (dequantized weight)",
            description="W8A16: x @ (wq * scale).T, int8 weight per channel",
            **common,
        ),
        Case(
            "int8_weight_only_linear_int8pack",
            native=_weight_int8pack_mm,
            native_label="torch._weight_int8pack_mm",
            description="W8A16 against ATen's int8 weight-only matmul",
            **common,
        ),
    ]


def samples(device) -> list[Sample]:
    ops = torch.ops.fuseops
    gen = torch.Generator(device="cpu").manual_seed(1)

    def weight(n, k):
        wq = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen).to(device)
        scale = (torch.rand(n, generator=gen) * 0.02 + 1e-3).to(device)
        return wq, scale

    def packed(n, k):
        return family.pack_int8_weight(*weight(n, k))[:2]

    def t(shape, dtype=torch.float32, layout="contiguous"):
        return tensor(shape, dtype, device, layout)

    w37, s37 = packed(37, 10)
    result = [
        Sample(ops.pack_int8_weight.default, weight(37, 10), family.pack_int8_weight),
        Sample(ops.pack_int8_weight.default, weight(16, 4), family.pack_int8_weight),
        Sample(ops.pack_int8_weight.default, weight(0, 5), family.pack_int8_weight),
        Sample(
            ops.int8_weight_only_linear.default,
            (t((3, 10)), w37, s37, None),
            family.int8_weight_only_linear,
        ),
        Sample(
            ops.int8_weight_only_linear.default,
            (t((3, 10)), w37, s37, t((37,))),
            family.int8_weight_only_linear,
        ),
        Sample(
            ops.int8_weight_only_linear.default,
            (t((2, 4, 10), torch.bfloat16, "transposed"), w37, s37, t((37,), torch.bfloat16)),
            family.int8_weight_only_linear,
        ),
        Sample(
            ops.int8_weight_only_linear.default,
            (t((5, 10), torch.float16, "sliced"), w37, s37, None),
            family.int8_weight_only_linear,
        ),
        Sample(
            ops.int8_weight_only_linear.default,
            (t((10,), torch.float64), w37, s37, None),
            family.int8_weight_only_linear,
        ),
        Sample(
            ops.int8_weight_only_linear.default,
            (t((0, 10)), w37, s37, None),
            family.int8_weight_only_linear,
        ),
        Sample(
            ops.int8_weight_only_linear.default,
            (t((3, 0)), *packed(5, 0), t((5,))),
            family.int8_weight_only_linear,
        ),
    ]
    wd = family.pack_int8_weight(*weight(37, 10))
    zero_rows = t((4, 10))
    zero_rows[1] = 0  # scale 1, the bias alone
    result += [
        Sample(
            ops.int8_dynamic_linear.default, (t((3, 10)), *wd, None), family.int8_dynamic_linear
        ),
        Sample(
            ops.int8_dynamic_linear.default, (zero_rows, *wd, t((37,))), family.int8_dynamic_linear
        ),
        Sample(
            ops.int8_dynamic_linear.default,
            (t((2, 4, 10), torch.bfloat16, "transposed"), *wd, t((37,), torch.bfloat16)),
            family.int8_dynamic_linear,
        ),
        Sample(
            ops.int8_dynamic_linear.default,
            (t((5, 10), torch.float16, "sliced"), *wd, None),
            family.int8_dynamic_linear,
        ),
        Sample(
            ops.int8_dynamic_linear.default,
            (t((10,), torch.float64), *wd, None),
            family.int8_dynamic_linear,
        ),
        Sample(
            ops.int8_dynamic_linear.default, (t((0, 10)), *wd, None), family.int8_dynamic_linear
        ),
        Sample(
            ops.int8_dynamic_linear.default,
            (t((3, 0)), *family.pack_int8_weight(*weight(5, 0)), t((5,))),
            family.int8_dynamic_linear,
        ),
    ]
    # Every CPU build: more rows than a register tile and than a task's
    # chunk (the widened-weight path), partial blocks of channels and groups.
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        wp, sp = packed(37, 129)
        for m in (1, 5, 61):
            result.append(
                Sample(
                    ops.int8_weight_only_linear.default,
                    (t((m, 129), dtype), wp, sp, t((37,), dtype)),
                    family.int8_weight_only_linear,
                    large=True,
                )
            )
        # W8A8: one tile, several, several chunks and slices of 128 groups
        # (K = 600: 150 groups).
        wd = family.pack_int8_weight(*weight(37, 600))
        for m in (1, 5, 61):
            result.append(
                Sample(
                    ops.int8_dynamic_linear.default,
                    (t((m, 600), dtype), *wd, t((37,), dtype)),
                    family.int8_dynamic_linear,
                    large=True,
                )
            )
    return result


def fuzz(d) -> Sample:
    """One random call for tests_py/test_fuzz.py (``d``: fuseops.ops._fuzz.Draw)."""
    ops, n, k = torch.ops.fuseops, d.size(40), d.size(40)
    wq, scale = d.integers((n, k), -127, 128, torch.int8), d.tensor((n,), torch.float32, 0.02)
    kind = d.int(0, 2)
    if kind == 0:
        return Sample(ops.pack_int8_weight.default, (wq, scale), family.pack_int8_weight)
    x = d.tensor(d.shape(0, 2) + (k,))
    bias = d.maybe(lambda: d.tensor((n,), x.dtype))
    packed, scale, colsum = family.pack_int8_weight(wq, scale)
    d.math_dtype = torch.float32  # float64 x is summed in float32
    if kind == 1:
        return Sample(
            ops.int8_weight_only_linear.default,
            (x, packed, scale, bias),
            family.int8_weight_only_linear,
        )
    return Sample(
        ops.int8_dynamic_linear.default,
        (x, packed, scale, colsum, bias),
        family.int8_dynamic_linear,
    )


def export_cases() -> list:
    """The calls the export tests run (fuseops/ops/_export.py): the
    weight-only linear within 1e-5 (its float sums over K run in another
    order), the dynamic one as float32 (equal int32 sums, the epilogue's
    float32 order apart)."""
    import itertools

    from .._export import EXPORT_DTYPES, ExportCase
    from .._export import randn as t
    from ..quantize import quantize_per_channel_int8

    ops = torch.ops.fuseops

    def weight(n, k):
        return family.pack_int8_weight(*quantize_per_channel_int8(torch.randn(n, k) * 0.05))

    cases = []
    for dtype, (m, n, k), bias in itertools.product(
        EXPORT_DTYPES, ((3, 20, 37), (1, 16, 64)), (False, True)
    ):
        packed, scale, _ = weight(n, k)
        args = (t(2, m, k, dtype=dtype), packed, scale) + ((t(n, dtype=dtype),) if bias else ())
        label = f"{dtype} {m}x{k} @ {n} bias={bias}"
        cases.append(
            ExportCase(ops.int8_weight_only_linear.default, label, args, rtol=1e-5, atol=1e-5)
        )
    for dtype, (m, n, k), bias in itertools.product(
        EXPORT_DTYPES, ((3, 20, 37), (1, 16, 64)), (False, True)
    ):
        args = (t(2, m, k, dtype=dtype), *weight(n, k)) + ((t(n, dtype=dtype),) if bias else ())
        label = f"{dtype} {m}x{k} @ {n} bias={bias}"
        cases.append(ExportCase(ops.int8_dynamic_linear.default, label, args))
    # A row of zeros (scale 1), a row holding Inf and one holding NaN (NaN rows).
    x = t(4, 32)
    x[1] = 0
    x[2, 5] = float("inf")
    x[3, 0] = float("nan")
    cases.append(
        ExportCase(ops.int8_dynamic_linear.default, "zero, Inf and NaN rows", (x, *weight(8, 32)))
    )
    return cases
