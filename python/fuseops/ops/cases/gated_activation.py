"""The test and bench cases of :mod:`fuseops.ops.gated_activation` (see
:mod:`fuseops.ops.cases`): kept out of ``import fuseops``."""

from __future__ import annotations

import torch

from .. import gated_activation as family
from ._sample import DTYPES, Sample, tensor


def bench_cases():
    from ._bench_case import Case, Traffic, gate_up, packed

    return [
        Case(
            "swiglu",
            "swiglu",
            "swiglu",
            gate_up,
            forward_traffic=Traffic(rows=3),  # gate, up in; out
            backward_traffic=Traffic(rows=5),  # dy, gate, up in; dgate, dup out
            differentiable=(0, 1),
            description="silu(gate) * up (the reference is the native composite)",
        ),
        Case(
            "swiglu_packed",
            "swiglu",
            "swiglu",
            packed,
            forward_traffic=Traffic(rows=3),  # both halves in; out
            backward_traffic=Traffic(rows=5),  # dy, both halves in; the packed gradient out
            description="silu(x[..., :H]) * x[..., H:] on one packed [..., 2H] tensor "
            "(hidden is H)",
            variant=True,
        ),
        Case(
            "geglu",
            "geglu",
            "geglu",
            gate_up,
            options={"approximate": "none"},
            forward_traffic=Traffic(rows=3),
            backward_traffic=Traffic(rows=5),
            differentiable=(0, 1),
            description="gelu(gate) * up (the reference is the native composite)",
        ),
    ]


def samples(device) -> list[Sample]:
    ops = torch.ops.fuseops

    def t(shape, dtype=torch.float32, layout="contiguous", grad=False):
        return tensor(shape, dtype, device, layout, grad, scale=3.0)

    def packed_geglu(op, tensors, approximate, kwargs=None, large=False):
        # geglu's wrappers take a packed input as (..., input, None, approximate).
        wrapper = family.geglu_backward if op._schema.name.endswith("_backward") else family.geglu
        return Sample(
            op,
            (*tensors, approximate),
            wrapper,
            kwargs or {},
            wrapper_args=(*tensors, None, approximate),
            large=large,
        )

    packed = t((5, 14))
    gate, up = t((5, 7)), t((5, 7))
    grad = t((5, 7))
    # Halves of one packed tensor, read in place.
    view_gate, view_up = (h.detach().requires_grad_() for h in t((6, 10)).chunk(2, -1))
    result = [
        Sample(ops.swiglu.default, (gate, up), family.swiglu),
        Sample(ops.swiglu.default, (view_gate, view_up), family.swiglu),
        Sample(
            ops.swiglu.default,
            (t((4, 6), torch.float64, "expanded", True), t((4, 6), torch.float64, grad=True)),
            family.swiglu,
        ),
        Sample(
            ops.swiglu.default, (t((0, 3), torch.float16), t((0, 3), torch.float16)), family.swiglu
        ),
        Sample(
            ops.swiglu.out, (gate, up), family.swiglu, {"out": torch.empty(5, 7, device=device)}
        ),
        Sample(ops.swiglu.packed, (t((5, 14), grad=True),), family.swiglu),
        Sample(ops.swiglu.packed, (t((5, 14), torch.bfloat16, "transposed"),), family.swiglu),
        Sample(
            ops.swiglu.packed_out,
            (packed,),
            family.swiglu,
            {"out": torch.empty(5, 7, device=device)},
        ),
        Sample(ops.swiglu_backward.default, (grad, gate, up), family.swiglu_backward),
        Sample(
            ops.swiglu_backward.out,
            (grad, gate, up),
            family.swiglu_backward,
            {
                "grad_gate": torch.empty(5, 7, device=device),
                "grad_up": torch.empty(5, 7, device=device),
            },
        ),
        Sample(ops.swiglu_backward.packed, (grad, packed), family.swiglu_backward),
        Sample(ops.geglu.default, (t((5, 7), grad=True), up, "tanh"), family.geglu),
        Sample(
            ops.geglu.default,
            (t((2, 3, 4), torch.float16, "sliced"), t((2, 3, 4), torch.float16), "none"),
            family.geglu,
        ),
        Sample(
            ops.geglu.out,
            (gate, up, "none"),
            family.geglu,
            {"out": torch.empty(5, 7, device=device)},
        ),
        packed_geglu(ops.geglu.packed, (t((5, 14), grad=True),), "tanh"),
        packed_geglu(
            ops.geglu.packed_out, (packed,), "none", {"out": torch.empty(5, 7, device=device)}
        ),
        Sample(ops.geglu_backward.default, (grad, gate, up, "tanh"), family.geglu_backward),
        Sample(
            ops.geglu_backward.out,
            (grad, gate, up, "tanh"),
            family.geglu_backward,
            {
                "grad_gate": torch.empty(5, 7, device=device),
                "grad_up": torch.empty(5, 7, device=device),
            },
        ),
        packed_geglu(ops.geglu_backward.packed, (grad, packed), "none"),
        packed_geglu(
            ops.geglu_backward.packed,
            (t((4, 3), torch.bfloat16), t((4, 6), torch.bfloat16)),
            "tanh",
        ),
    ]
    # 301 rows of a packed 2 x 67: several tasks per thread, a vector tail in
    # every half row.
    for dtype in DTYPES:
        result.append(
            Sample(ops.swiglu.packed, (t((301, 134), dtype, grad=True),), family.swiglu, large=True)
        )
        for approximate in ("none", "tanh"):
            result.append(
                packed_geglu(
                    ops.geglu.packed, (t((301, 134), dtype, grad=True),), approximate, large=True
                )
            )
    return result


def fuzz(d) -> Sample:
    """One random call for tests_py/test_fuzz.py (``d``: fuseops.ops._fuzz.Draw)."""
    ops, approximate, shape = torch.ops.fuseops, d.choice(("none", "tanh")), d.shape(min_dims=1)
    gate = d.tensor(shape, scale=3.0, grad=True)
    up = d.tensor(shape, gate.dtype, grad=True)
    packed = d.tensor(shape[:-1] + (2 * shape[-1],), gate.dtype, 3.0, grad=True)
    return [
        lambda: Sample(ops.swiglu.default, (gate, up), family.swiglu),
        lambda: Sample(ops.swiglu.packed, (packed,), family.swiglu),
        lambda: Sample(ops.geglu.default, (gate, up, approximate), family.geglu),
        lambda: Sample(
            ops.geglu.packed,
            (packed, approximate),
            family.geglu,
            wrapper_args=(packed, None, approximate),
        ),
    ][d.int(0, 3)]()


def export_cases() -> list:
    """The calls the export tests run (fuseops/ops/_export.py): each op in
    both forms, in every dtype, with each GELU form."""
    import itertools

    from .._export import EXPORT_DTYPES, ExportCase, gelu_limits
    from .._export import randn as t

    ops = torch.ops.fuseops
    cases = []
    for op, approximates in ((ops.swiglu, (None,)), (ops.geglu, ("none", "tanh"))):
        for dtype, a, shape in itertools.product(
            EXPORT_DTYPES, approximates, ((5, 24), (2, 3, 17))
        ):
            extra = () if a is None else (a,)
            limits = gelu_limits(dtype, a)
            cases += [
                ExportCase(
                    op.default,
                    f"{dtype} {a} {shape}",
                    (t(*shape, dtype=dtype, scale=3.0), t(*shape, dtype=dtype)),
                    lambda g, u, op=op, extra=extra: op(g, u, *extra),
                    not_run_by=limits,
                ),
                ExportCase(
                    op.packed,
                    f"{dtype} {a} packed {shape}",
                    (t(*shape[:-1], 2 * shape[-1], dtype=dtype, scale=3.0),),
                    lambda x, op=op, extra=extra: op.packed(x, *extra),
                    not_run_by=limits,
                ),
            ]
    return cases


def autocast_cases() -> list:
    """swiglu and geglu under CPU autocast against torch's compositions (tests_py/test_autocast.py)."""
    import torch.nn.functional as F

    from ._autocast import LOW, AutocastCase, D, rand

    return [
        AutocastCase(
            "swiglu",
            family.swiglu,
            lambda g, u: F.silu(g) * u,
            [
                (rand(4, D), rand(4, D)),
                (rand(4, D, dtype=LOW), rand(4, D)),
                (rand(4, D, dtype=LOW), rand(4, D, dtype=LOW)),
            ],
        ),
        AutocastCase(
            "geglu",
            family.geglu,
            lambda g, u: F.gelu(g) * u,
            [(rand(4, D), rand(4, D)), (rand(4, D, dtype=LOW), rand(4, D))],
        ),
    ]
