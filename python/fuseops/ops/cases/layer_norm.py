"""The test and bench cases of :mod:`fuseops.ops.layer_norm` (see
:mod:`fuseops.ops.cases`): kept out of ``import fuseops``."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import layer_norm as family
from ._sample import DTYPES, Sample, tensor


def bench_cases():
    from ._bench_case import Case, Traffic, x_weight_bias

    return [
        Case(
            "layer_norm",
            "layer_norm",
            "layer_norm",
            x_weight_bias,
            options={"eps": 1e-5},
            forward_traffic=Traffic(rows=2, vectors=2),  # x, w, b in; y out
            backward_traffic=Traffic(rows=3, vectors=3),  # dy, x, w in; dx, dw, db out
            native=lambda x, w, b, *, eps: F.layer_norm(x, (x.shape[-1],), w, b, eps),
            native_label="F.layer_norm",
            differentiable=(0, 1, 2),
            description="LayerNorm over the last dimension, with weight and bias",
        ),
    ]


def samples(device) -> list[Sample]:
    ops = torch.ops.fuseops

    def t(shape, dtype=torch.float32, layout="contiguous", grad=False):
        return tensor(shape, dtype, device, layout, grad)

    x, w, b = t((5, 24)), t((24,)), t((24,))
    _, mean, rstd = family.layer_norm_forward(x, w, b, 1e-5)
    result = [
        Sample(ops.layer_norm.default, (x, w, b, 1e-5), family.layer_norm),
        Sample(ops.layer_norm.default, (x, None, None, 1e-6), family.layer_norm),
        Sample(
            ops.layer_norm.default,
            (t((6, 20), torch.bfloat16, "transposed"), None, t((20,), torch.bfloat16), 1e-5),
            family.layer_norm,
        ),
        Sample(
            ops.layer_norm.default,
            (t((3, 4, 24), grad=True), t((24,), grad=True), t((24,), grad=True), 1e-5),
            family.layer_norm,
        ),
        Sample(
            ops.layer_norm.default, (t((3, 24), grad=True), None, None, 1e-5), family.layer_norm
        ),
        Sample(
            ops.layer_norm.default,
            (
                t((4, 16), torch.float64, "expanded", True),
                t((16,), torch.float64, "sliced", True),
                None,
                1e-5,
            ),
            family.layer_norm,
        ),
        Sample(
            ops.layer_norm.default,
            (t((2, 3, 16), torch.float16, "sliced"), None, None, 1e-5),
            family.layer_norm,
        ),
        Sample(
            ops.layer_norm.default,
            (t((0, 16), grad=True), t((16,), grad=True), t((16,), grad=True), 1e-5),
            family.layer_norm,
        ),
        Sample(
            ops.layer_norm.out,
            (x, w, b, 1e-5),
            family.layer_norm,
            {"out": torch.empty(5, 24, device=device)},
        ),
        Sample(ops.layer_norm_forward.default, (x, w, None, 1e-5), family.layer_norm_forward),
        Sample(
            ops.layer_norm_forward.default,
            (t((4, 5, 16), torch.float16), t((16,), torch.float16), None, 1e-5),
            family.layer_norm_forward,
        ),
        Sample(
            ops.layer_norm_forward.default,
            (t((3, 24), grad=True), t((24,), grad=True), b, 1e-5),
            family.layer_norm_forward,
        ),
        # Statistics as torch.native_layer_norm keeps them (a trailing 1).
        Sample(
            ops.layer_norm_backward.default,
            (t((5, 24)), x, w, mean[:, None], rstd[:, None]),
            family.layer_norm_backward,
        ),
        Sample(
            ops.layer_norm_backward.default,
            (t((5, 24)), x, w, mean, rstd),
            family.layer_norm_backward,
        ),
        Sample(
            ops.layer_norm_backward.default,
            (t((5, 24)), x, None, mean, rstd),
            family.layer_norm_backward,
        ),
        Sample(
            ops.layer_norm_backward.out,
            (t((5, 24)), x, w, mean, rstd),
            family.layer_norm_backward,
            {
                "grad_input": torch.empty(5, 24, device=device),
                "grad_weight": torch.empty(24, device=device),
                "grad_bias": torch.empty(24, device=device),
            },
        ),
    ]
    for dtype in DTYPES:
        for shape in [(3, 7), (37, 1000), (5, 4099)]:
            result.append(
                Sample(
                    ops.layer_norm.default,
                    (
                        t(shape, dtype, grad=True),
                        t(shape[-1:], dtype, grad=True),
                        t(shape[-1:], dtype, grad=True),
                        1e-5,
                    ),
                    family.layer_norm,
                    large=True,
                )
            )
    return result


def fuzz(d) -> Sample:
    """One random call for tests_py/test_fuzz.py (``d``: fuseops.ops._fuzz.Draw)."""
    ops, eps = torch.ops.fuseops, d.choice((1e-6, 1e-5, 0.5))
    x = d.tensor(d.shape(min_dims=1), grad=True)
    w, b = (d.maybe(lambda: d.tensor(x.shape[-1:], x.dtype, grad=True)) for _ in "wb")
    if d.flag():
        return Sample(ops.layer_norm.default, (x, w, b, eps), family.layer_norm)
    _, mean, rstd = family.layer_norm_forward(
        x.detach(), None if w is None else w.detach(), None, eps
    )
    return Sample(
        ops.layer_norm_backward.default,
        (d.tensor(x.shape, x.dtype), x, w, mean, rstd),
        family.layer_norm_backward,
    )


def export_cases() -> list:
    """The calls the export tests run (fuseops/ops/_export.py)."""
    from .._export import EXPORT_DTYPES, ExportCase
    from .._export import randn as t

    layer_norm = torch.ops.fuseops.layer_norm
    cases = []
    for dtype in EXPORT_DTYPES:
        cases += [
            ExportCase(
                layer_norm.default,
                f"{dtype} weight and bias",
                (t(5, 24, dtype=dtype, scale=3.0), t(24, dtype=dtype), t(24, dtype=dtype)),
                lambda x, w, b: layer_norm(x, w, b, 1e-5),
            ),
            ExportCase(
                layer_norm.default,
                f"{dtype} 3-d, neither, eps=0.5",
                (t(2, 3, 40, dtype=dtype),),
                lambda x: layer_norm(x, None, None, 0.5),
            ),
            ExportCase(
                layer_norm.default,
                f"{dtype} bias only",
                (t(3, 9, dtype=dtype) + 5, t(9, dtype=dtype)),
                lambda x, b: layer_norm(x, None, b, 1e-6),
            ),
        ]
    return cases


def autocast_cases() -> list:
    """layer_norm under CPU autocast against torch's (tests_py/test_autocast.py)."""
    import torch.nn.functional as F

    from ._autocast import LOW, AutocastCase, D, rand, weight

    return [
        AutocastCase(
            "layer_norm",
            lambda x, w, b: family.layer_norm(x, w, b, 1e-5),
            lambda x, w, b: F.layer_norm(x, (D,), w, b, 1e-5),
            [(rand(4, D), weight(), rand(D)), (rand(4, D, dtype=LOW), weight(), rand(D))],
        )
    ]


def row_reduction_cases() -> list:
    """layer_norm: the weight and bias gradients sum over rows
    (tests_py/test_threads.py)."""
    from ._threads import RowReductionCase, leaves

    x, w, b = leaves((4096, 1024), (1024,), (1024,))
    return [RowReductionCase("layer_norm", lambda: family.layer_norm(x, w, b, 1e-5), (x, w, b))]
