"""The test and bench cases of :mod:`fuseops.ops.activation` (see
:mod:`fuseops.ops.cases`): kept out of ``import fuseops``."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import activation as family
from ._sample import DTYPES, Sample, tensor


def _gelu_out(x, *, approximate, out):
    return torch.ops.aten.gelu.out(x, approximate=approximate, out=out)


def bench_cases():
    from ._bench_case import Case, Traffic, x, x_bias

    return [
        Case(
            "gelu",
            "gelu",
            "gelu",
            x,
            options={"approximate": "none"},
            forward_traffic=Traffic(rows=2),
            backward_traffic=Traffic(rows=3),  # dy, x in; dx out
            native=lambda x, *, approximate: F.gelu(x, approximate=approximate),
            native_label="F.gelu",
            native_out=_gelu_out,
            description="exact (erf) GELU",
        ),
        Case(
            "gelu_tanh",
            "gelu",
            "gelu",
            x,
            options={"approximate": "tanh"},
            forward_traffic=Traffic(rows=2),
            backward_traffic=Traffic(rows=3),
            native=lambda x, *, approximate: F.gelu(x, approximate=approximate),
            native_label="F.gelu(tanh)",
            native_out=_gelu_out,
            description="tanh-approximated GELU",
            variant=True,
        ),
        Case(
            "silu",
            "silu",
            "silu",
            x,
            forward_traffic=Traffic(rows=2),
            backward_traffic=Traffic(rows=3),
            native=F.silu,
            native_label="F.silu",
            native_out=lambda x, *, out: torch.ops.aten.silu.out(x, out=out),
            description="x * sigmoid(x)",
        ),
        Case(
            "bias_gelu",
            "bias_gelu",
            "bias_gelu",
            x_bias,
            options={"approximate": "none"},
            forward_traffic=Traffic(rows=2, vectors=1),  # x, bias in; y out
            backward_traffic=Traffic(rows=3, vectors=2),  # dy, x, bias in; dx, dbias out
            native=lambda x, b, *, approximate: F.gelu(x + b, approximate=approximate),
            native_label="F.gelu(x + bias)",
            differentiable=(0, 1),
            description="bias add then exact GELU",
        ),
    ]


def samples(device) -> list[Sample]:
    ops = torch.ops.fuseops

    def t(shape, dtype=torch.float32, layout="contiguous", grad=False):
        return tensor(shape, dtype, device, layout, grad, scale=3.0)

    x, b = t((5, 7)), t((7,))
    specials = torch.tensor(family.SPECIAL_VALUES, device=device)
    result = [
        Sample(ops.gelu.default, (x, "none"), family.gelu),
        Sample(ops.gelu.default, (t((4, 3), grad=True), "tanh"), family.gelu),
        Sample(ops.gelu.default, (t((5, 7), torch.bfloat16, "transposed"), "none"), family.gelu),
        Sample(
            ops.gelu.default, (t((2, 3, 4), torch.float64, "expanded", True), "none"), family.gelu
        ),
        Sample(ops.gelu.default, (t((0, 3), torch.float16), "tanh"), family.gelu),
        Sample(ops.gelu.default, (t(()), "none"), family.gelu),
        Sample(ops.gelu.out, (x, "tanh"), family.gelu, {"out": torch.empty(5, 7, device=device)}),
        Sample(ops.gelu_backward.default, (t((5, 7)), x, "tanh"), family.gelu_backward),
        Sample(
            ops.gelu_backward.out,
            (t((5, 7)), x, "tanh"),
            family.gelu_backward,
            {"out": torch.empty(5, 7, device=device)},
        ),
        Sample(
            ops.gelu_backward.default,
            (t((5, 7), grad=True), t((5, 7), grad=True), "none"),
            family.gelu_backward,
        ),
        Sample(ops.silu.default, (t((4, 3), grad=True),), family.silu),
        Sample(ops.silu.default, (t((3, 8), torch.float16, "sliced", True),), family.silu),
        Sample(ops.silu.out, (x,), family.silu, {"out": torch.empty(5, 7, device=device)}),
        Sample(
            ops.silu_backward.default,
            (t((5, 7), grad=True), t((5, 7), grad=True)),
            family.silu_backward,
        ),
        Sample(
            ops.silu_backward.out,
            (t((5, 7)), x),
            family.silu_backward,
            {"out": torch.empty(5, 7, device=device)},
        ),
        Sample(
            ops.bias_gelu.default,
            (t((5, 7), grad=True), t((7,), grad=True), "tanh"),
            family.bias_gelu,
        ),
        Sample(
            ops.bias_gelu.default,
            (
                t((6, 7), torch.bfloat16, "transposed", True),
                t((7,), torch.bfloat16, "sliced", True),
                "none",
            ),
            family.bias_gelu,
        ),
        Sample(ops.bias_gelu.default, (t((0, 7)), b, "none"), family.bias_gelu),
        Sample(
            ops.bias_gelu.out,
            (x, b, "none"),
            family.bias_gelu,
            {"out": torch.empty(5, 7, device=device)},
        ),
        Sample(
            ops.bias_gelu_backward.default, (t((5, 7)), x, b, "none"), family.bias_gelu_backward
        ),
        Sample(
            ops.bias_gelu_backward.default,
            (t((4, 5), torch.float16), t((4, 5), torch.float16), t((5,), torch.float16), "tanh"),
            family.bias_gelu_backward,
        ),
        Sample(
            ops.bias_gelu_backward.out,
            (t((5, 7)), x, b, "tanh"),
            family.bias_gelu_backward,
            {
                "grad_input": torch.empty(5, 7, device=device),
                "grad_bias": torch.empty(7, device=device),
            },
        ),
    ]
    # Every CPU build on the special values, and on 301 rows of 67 (several
    # tasks per thread, a vector tail in every row).
    result += [
        Sample(
            ops.gelu.default, (specials.clone().requires_grad_(), "none"), family.gelu, large=True
        ),
        Sample(
            ops.gelu.default, (specials.clone().requires_grad_(), "tanh"), family.gelu, large=True
        ),
        Sample(ops.silu.default, (specials.clone().requires_grad_(),), family.silu, large=True),
    ]
    for dtype in DTYPES:
        for approximate in ("none", "tanh"):
            result += [
                Sample(
                    ops.gelu.default,
                    (t((301, 67), dtype, grad=True), approximate),
                    family.gelu,
                    large=True,
                ),
                Sample(
                    ops.bias_gelu.default,
                    (t((301, 67), dtype, grad=True), t((67,), dtype, grad=True), approximate),
                    family.bias_gelu,
                    large=True,
                ),
            ]
        result.append(
            Sample(ops.silu.default, (t((301, 67), dtype, grad=True),), family.silu, large=True)
        )
    return result


def fuzz(d) -> Sample:
    """One random call for tests_py/test_fuzz.py (``d``: fuseops.ops._fuzz.Draw)."""
    ops, approximate, kind = torch.ops.fuseops, d.choice(("none", "tanh")), d.int(0, 5)
    x = d.tensor(d.shape(min_dims=1 if kind >= 4 else 0), scale=3.0, grad=True)
    g, b = d.tensor(x.shape, x.dtype, grad=True), d.tensor(x.shape[-1:], x.dtype, 3.0, grad=True)
    return [
        lambda: Sample(ops.gelu.default, (x, approximate), family.gelu),
        lambda: Sample(ops.gelu_backward.default, (g, x, approximate), family.gelu_backward),
        lambda: Sample(ops.silu.default, (x,), family.silu),
        lambda: Sample(ops.silu_backward.default, (g, x), family.silu_backward),
        lambda: Sample(ops.bias_gelu.default, (x, b, approximate), family.bias_gelu),
        lambda: Sample(
            ops.bias_gelu_backward.default, (g, x, b, approximate), family.bias_gelu_backward
        ),
    ][kind]()


def export_cases() -> list:
    """The calls the export tests run (fuseops/ops/_export.py)."""
    from .._export import EXPORT_DTYPES, ExportCase, elementwise_cases, gelu_limits
    from .._export import randn as t

    ops = torch.ops.fuseops
    cases = []
    for approximate in ("none", "tanh"):
        cases += elementwise_cases(
            ops.gelu.default,
            lambda x, a=approximate: ops.gelu(x, a),
            family.SPECIAL_VALUES,
            approximate,
        )
    cases += elementwise_cases(ops.silu.default, None, family.SPECIAL_VALUES)
    cases += [
        ExportCase(
            ops.bias_gelu.default,
            f"{dtype} {approximate} {shape}",
            (t(*shape, dtype=dtype, scale=3.0), t(shape[-1], dtype=dtype)),
            lambda x, b, a=approximate: ops.bias_gelu(x, b, a),
            not_run_by=gelu_limits(dtype, approximate),
        )
        for approximate in ("none", "tanh")
        for dtype in EXPORT_DTYPES
        for shape in ((5, 24), (2, 3, 17))
    ]
    return cases


def autocast_cases() -> list:
    """gelu, silu and bias_gelu under CPU autocast against torch's (tests_py/test_autocast.py)."""
    import torch.nn.functional as F

    from ._autocast import LOW, AutocastCase, D, rand

    return [
        AutocastCase(
            "gelu",
            lambda x: family.gelu(x),
            lambda x: F.gelu(x),
            [(rand(4, D),), (rand(4, D, dtype=LOW),)],
        ),
        AutocastCase("silu", family.silu, F.silu, [(rand(4, D),), (rand(4, D, dtype=LOW),)]),
        AutocastCase(
            "bias_gelu",
            lambda x, b: family.bias_gelu(x, b, "tanh"),
            lambda x, b: F.gelu(x + b, approximate="tanh"),
            [
                (rand(4, D), rand(D)),
                (rand(4, D, dtype=LOW), rand(D)),
                (rand(4, D, dtype=LOW), rand(D, dtype=LOW)),
            ],
        ),
    ]


def row_reduction_cases() -> list:
    """bias_gelu: the bias gradient sums over rows (tests_py/test_threads.py)."""
    from ._threads import RowReductionCase, leaves

    x, b = leaves((4096, 256), (256,))
    return [RowReductionCase("bias_gelu", lambda: family.bias_gelu(x, b), (x, b))]
