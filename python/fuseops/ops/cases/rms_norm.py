"""The test and bench cases of :mod:`fuseops.ops.rms_norm` (see
:mod:`fuseops.ops.cases`): kept out of ``import fuseops``."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import rms_norm as family
from ._sample import DTYPES, Sample, tensor


def _native_fused_add_rms_norm(x, residual, weight, *, eps):
    new_residual = x + residual
    return F.rms_norm(new_residual, (x.shape[-1],), weight, eps), new_residual


def _fused_add_rms_norm_out(fn, args, options, outs):
    fn(*args, **options, out=outs[0], residual_out=outs[1])


def bench_cases():
    from ._bench_case import EPS, Case, Traffic, x_residual_weight, x_weight

    return [
        Case(
            "rms_norm",
            "rms_norm",
            "rms_norm",
            x_weight,
            options={"eps": EPS},
            forward_traffic=Traffic(rows=2, vectors=1),  # x, w in; y out
            backward_traffic=Traffic(rows=3, vectors=2),  # dy, x, w in; dx, dw out
            native=lambda x, w, *, eps: F.rms_norm(x, (x.shape[-1],), w, eps),
            native_label="F.rms_norm",
            differentiable=(0, 1),
            description="RMSNorm over the last dimension, with weight",
        ),
        Case(
            "fused_add_rms_norm",
            "fused_add_rms_norm",
            "fused_add_rms_norm",
            x_residual_weight,
            options={"eps": EPS},
            # x, residual, w in; out, new_residual out
            forward_traffic=Traffic(rows=4, vectors=1),
            # d_out, d_new_residual, new_residual, w in; one gradient for x and
            # residual (they are equal), dw out
            backward_traffic=Traffic(rows=4, vectors=2),
            native=_native_fused_add_rms_norm,
            native_label="x + residual, F.rms_norm",
            differentiable=(0, 1, 2),
            call_out=_fused_add_rms_norm_out,
            description="residual add then RMSNorm; returns (out, new residual)",
        ),
    ]


def samples(device) -> list[Sample]:
    ops = torch.ops.fuseops

    def t(shape, dtype=torch.float32, layout="contiguous", grad=False):
        return tensor(shape, dtype, device, layout, grad)

    x, r, w = t((5, 24)), t((5, 24)), t((24,))
    _, rstd = family.rms_norm_forward(x, w)
    _, new_residual, rstd2 = family.fused_add_rms_norm_forward(x, r, w)
    result = [
        Sample(ops.rms_norm.default, (x, w, 1e-6), family.rms_norm),
        Sample(ops.rms_norm.default, (x, None, None), family.rms_norm),
        Sample(
            ops.rms_norm.default,
            (t((6, 24), torch.bfloat16, "transposed"), None, 1e-5),
            family.rms_norm,
        ),
        Sample(
            ops.rms_norm.default,
            (t((3, 4, 24), grad=True), t((24,), grad=True), 1e-6),
            family.rms_norm,
        ),
        Sample(
            ops.rms_norm.default,
            (t((4, 16), torch.float64, "expanded", True), None, None),
            family.rms_norm,
        ),
        Sample(
            ops.rms_norm.default,
            (t((3, 16), torch.float16, "sliced"), t((16,), torch.float16, "sliced"), 1e-6),
            family.rms_norm,
        ),
        # A weight of another floating dtype than the input.
        Sample(ops.rms_norm.default, (t((4, 8), torch.bfloat16), t((8,)), 1e-6), family.rms_norm),
        Sample(
            ops.rms_norm.default,
            (t((0, 16), grad=True), t((16,), grad=True), 1e-6),
            family.rms_norm,
        ),
        Sample(
            ops.rms_norm.out,
            (x, w, 1e-6),
            family.rms_norm,
            {"out": torch.empty(5, 24, device=device)},
        ),
        Sample(ops.rms_norm_forward.default, (x, w, None), family.rms_norm_forward),
        Sample(
            ops.rms_norm_forward.default,
            (t((4, 5), torch.float16), t((5,), torch.float16), None),
            family.rms_norm_forward,
        ),
        Sample(
            ops.rms_norm_forward.default,
            (t((5, 24), grad=True), t((24,), grad=True), 1e-6),
            family.rms_norm_forward,
        ),
        Sample(ops.rms_norm_backward.default, (t((5, 24)), x, w, rstd), family.rms_norm_backward),
        Sample(
            ops.rms_norm_backward.default, (t((5, 24)), x, None, rstd), family.rms_norm_backward
        ),
        Sample(
            ops.rms_norm_backward.out,
            (t((5, 24)), x, w, rstd),
            family.rms_norm_backward,
            {
                "grad_input": torch.empty(5, 24, device=device),
                "grad_weight": torch.empty(24, device=device),
            },
        ),
        Sample(
            ops.rms_norm_backward.out,
            (t((5, 24)), x, None, rstd),
            family.rms_norm_backward,
            {
                "grad_input": torch.empty(5, 24, device=device),
                "grad_weight": torch.empty(0, device=device),
            },
        ),
        Sample(ops.fused_add_rms_norm.default, (x, r, w, 1e-6), family.fused_add_rms_norm),
        Sample(
            ops.fused_add_rms_norm.default,
            (
                t((5, 24), grad=True),
                t((5, 24), layout="transposed", grad=True),
                t((24,), grad=True),
                None,
            ),
            family.fused_add_rms_norm,
        ),
        Sample(
            ops.fused_add_rms_norm.out,
            (x, r, w, 1e-6),
            family.fused_add_rms_norm,
            {
                "out": torch.empty(5, 24, device=device),
                "residual_out": torch.empty(5, 24, device=device),
            },
        ),
        Sample(
            ops.fused_add_rms_norm_forward.default,
            (x, r, None, 1e-6),
            family.fused_add_rms_norm_forward,
        ),
        Sample(
            ops.fused_add_rms_norm_forward.default,
            (t((5, 24), grad=True), t((5, 24), grad=True), t((24,), grad=True), 1e-6),
            family.fused_add_rms_norm_forward,
        ),
        Sample(
            ops.fused_add_rms_norm_backward.default,
            (t((5, 24)), t((5, 24)), new_residual, w, rstd2),
            family.fused_add_rms_norm_backward,
        ),
        Sample(
            ops.fused_add_rms_norm_backward.default,
            (t((5, 24)), None, new_residual, w, rstd2),
            family.fused_add_rms_norm_backward,
        ),
        Sample(
            ops.fused_add_rms_norm_backward.out,
            (t((5, 24)), t((5, 24)), new_residual, w, rstd2),
            family.fused_add_rms_norm_backward,
            {
                "grad_input": torch.empty(5, 24, device=device),
                "grad_weight": torch.empty(24, device=device),
            },
        ),
        Sample(
            ops.fused_add_rms_norm_backward.out,
            (t((5, 24)), None, new_residual, None, rstd2),
            family.fused_add_rms_norm_backward,
            {
                "grad_input": torch.empty(5, 24, device=device),
                "grad_weight": torch.empty(0, device=device),
            },
        ),
    ]
    # 300 rows of 1027: several tasks per thread, a tail in every row.
    for dtype in DTYPES:
        result += [
            Sample(
                ops.rms_norm.default,
                (t((300, 1027), dtype, grad=True), t((1027,), dtype, grad=True), 1e-6),
                family.rms_norm,
                large=True,
            ),
            Sample(
                ops.fused_add_rms_norm.default,
                (
                    t((300, 1027), dtype, grad=True),
                    t((300, 1027), dtype, grad=True),
                    t((1027,), dtype, grad=True),
                    1e-6,
                ),
                family.fused_add_rms_norm,
                large=True,
            ),
            Sample(
                ops.rms_norm.default, (t((1027,), dtype), None, 1e-6), family.rms_norm, large=True
            ),
        ]
    return result


def fuzz(d) -> Sample:
    """One random call for tests_py/test_fuzz.py (``d``: fuseops.ops._fuzz.Draw)."""
    ops, x = torch.ops.fuseops, d.tensor(d.shape(min_dims=1), grad=True)
    # eps=None is the dtype's epsilon: float64's for the float64 reference.
    eps = d.choice((None, 1e-6, 1e-5, 0.5) if x.dtype == torch.float64 else (1e-6, 1e-5, 0.5))
    # A weight of another floating dtype than the input is allowed.
    w = d.maybe(lambda: d.tensor(x.shape[-1:], d.choice((x.dtype, d.dtype())), grad=True))
    kind = d.int(0, 3)
    if kind == 0:
        return Sample(ops.rms_norm.default, (x, w, eps), family.rms_norm)
    if kind == 1:
        residual = d.tensor(x.shape, x.dtype, grad=True)
        return Sample(
            ops.fused_add_rms_norm.default, (x, residual, w, eps), family.fused_add_rms_norm
        )
    rstd = family.rms_norm_forward(x.detach(), None if w is None else w.detach(), eps)[1]
    if kind == 2:
        return Sample(
            ops.rms_norm_backward.default,
            (d.tensor(x.shape, x.dtype), x, w, rstd),
            family.rms_norm_backward,
        )
    # x as new_residual; the gradient of new_residual may be absent.
    grad_new_residual = d.maybe(lambda: d.tensor(x.shape, x.dtype))
    return Sample(
        ops.fused_add_rms_norm_backward.default,
        (d.tensor(x.shape, x.dtype), grad_new_residual, x, w, rstd),
        family.fused_add_rms_norm_backward,
    )


def export_cases() -> list:
    """The calls the export tests run (fuseops/ops/_export.py)."""
    from .._export import EXPORT_DTYPES, ExportCase
    from .._export import randn as t

    ops = torch.ops.fuseops
    cases = []
    for dtype in EXPORT_DTYPES:
        cases += [
            ExportCase(
                ops.rms_norm.default, f"{dtype} weight", (t(5, 24, dtype=dtype), t(24, dtype=dtype))
            ),
            # eps=None: the machine epsilon of float32 (of float64 for float64).
            ExportCase(
                ops.rms_norm.default,
                f"{dtype} 3-d, no weight, eps=None",
                (t(2, 3, 40, dtype=dtype, scale=1e-4),),
                lambda x: ops.rms_norm(x, None, None),
            ),
            # A float32 weight on any x; eps large enough to matter.
            ExportCase(
                ops.rms_norm.default,
                f"{dtype} float32 weight, eps=0.5",
                (t(3, 7, dtype=dtype, scale=0.3), t(7)),
                lambda x, w: ops.rms_norm(x, w, 0.5),
            ),
        ]
    cases += [
        ExportCase(
            ops.fused_add_rms_norm.default,
            f"{dtype} {shape}",
            (t(*shape, dtype=dtype), t(*shape, dtype=dtype), t(shape[-1], dtype=dtype)),
            lambda x, r, w: ops.fused_add_rms_norm(x, r, w, 1e-6),
        )
        for dtype in EXPORT_DTYPES
        for shape in ((5, 24), (2, 3, 33))
    ]
    cases.append(
        ExportCase(
            ops.fused_add_rms_norm.default,
            "no weight, eps=None",
            (t(4, 16), t(4, 16)),
            lambda x, r: ops.fused_add_rms_norm(x, r, None, None),
        )
    )
    return cases


def autocast_cases() -> list:
    """rms_norm and fused_add_rms_norm under CPU autocast against torch's (tests_py/test_autocast.py)."""
    import torch.nn.functional as F

    from ._autocast import LOW, AutocastCase, D, rand, weight

    def fused_add_rms_norm_torch(x, residual, w):
        new_residual = x + residual
        return F.rms_norm(new_residual, (D,), w, 1e-6), new_residual

    return [
        AutocastCase(
            "rms_norm",
            lambda x, w: family.rms_norm(x, w, 1e-6),
            lambda x, w: F.rms_norm(x, (D,), w, 1e-6),
            [(rand(4, D), weight()), (rand(4, D, dtype=LOW), weight())],
        ),
        AutocastCase(
            "fused_add_rms_norm",
            lambda x, r, w: family.fused_add_rms_norm(x, r, w, 1e-6),
            fused_add_rms_norm_torch,
            [
                (rand(4, D), rand(4, D), weight()),
                (rand(4, D, dtype=LOW), rand(4, D), weight()),
                (rand(4, D, dtype=LOW), rand(4, D, dtype=LOW), weight()),
            ],
        ),
    ]


def row_reduction_cases() -> list:
    """rms_norm: the weight gradient sums over rows (tests_py/test_threads.py)."""
    from ._threads import RowReductionCase, leaves

    x, w = leaves((4096, 1024), (1024,))
    return [RowReductionCase("rms_norm", lambda: family.rms_norm(x, w, 1e-6), (x, w))]
