"""The test and bench cases of :mod:`fuseops.ops.relu` (see
:mod:`fuseops.ops.cases`): kept out of ``import fuseops``."""

from __future__ import annotations

import torch

from .. import relu as family
from ._sample import DTYPES, Sample, tensor


def bench_cases():
    from ._bench_case import Case, Traffic, x

    return [
        Case(
            "relu",
            "relu",
            "relu",
            x,
            forward_traffic=Traffic(rows=2),  # x in, y out
            backward_traffic=Traffic(rows=3),  # dy, y in; dx out
            native=torch.relu,
            native_label="torch.relu",
            native_out=lambda x, *, out: torch.clamp_min(x, 0, out=out),
            description="max(x, 0)",
        ),
    ]


def samples(device) -> list[Sample]:
    ops = torch.ops.fuseops
    x = tensor((5, 7), device=device)
    specials = torch.tensor(
        [0.0, -0.0, float("nan"), float("inf"), float("-inf"), 1.5, -2.0], device=device
    )
    result = []
    for layout, dtype, shape, grad in [
        ("contiguous", torch.float32, (5, 7), False),
        ("contiguous", torch.float32, (4, 3), True),
        ("transposed", torch.bfloat16, (3, 4), True),
        ("sliced", torch.float16, (2, 3, 5), False),
        ("expanded", torch.float64, (4, 6), True),
        ("contiguous", torch.float32, (0, 3), True),
        ("contiguous", torch.float32, (), False),
    ]:
        result.append(
            Sample(ops.relu.default, (tensor(shape, dtype, device, layout, grad),), family.relu)
        )
    result += [
        Sample(ops.relu.out, (x,), family.relu, {"out": torch.empty(5, 7, device=device)}),
        Sample(
            ops.relu_backward.default,
            (tensor((5, 7), device=device), family.relu(x)),
            family.relu_backward,
        ),
        Sample(
            ops.relu_backward.out,
            (tensor((5, 7), device=device), family.relu(x)),
            family.relu_backward,
            {"out": torch.empty(5, 7, device=device)},
        ),
        Sample(
            ops.relu_backward.default,
            (tensor((7, 5), device=device, layout="transposed", grad=True), family.relu(x.t())),
            family.relu_backward,
        ),
    ]
    # Every CPU build on the special values, and on 301 rows of 67 (several
    # tasks per thread, a vector tail in every row).
    result.append(Sample(ops.relu.default, (specials.requires_grad_(),), family.relu, large=True))
    result += [
        Sample(
            ops.relu.default,
            (tensor((301, 67), dtype, device, grad=True),),
            family.relu,
            large=True,
        )
        for dtype in DTYPES
    ]
    return result


def fuzz(d) -> Sample:
    """One random call for tests_py/test_fuzz.py (``d``: fuseops.ops._fuzz.Draw)."""
    x = d.tensor(d.shape(), grad=True)
    if d.flag():
        return Sample(torch.ops.fuseops.relu.default, (x,), family.relu)
    return Sample(
        torch.ops.fuseops.relu_backward.default,
        (d.tensor(x.shape, x.dtype, grad=True), family.relu(x.detach())),
        family.relu_backward,
    )


def export_cases() -> list:
    """The calls the export tests run (fuseops/ops/_export.py)."""
    from .._export import elementwise_cases
    from ..activation import SPECIAL_VALUES

    return elementwise_cases(torch.ops.fuseops.relu.default, None, SPECIAL_VALUES)


def autocast_cases() -> list:
    """relu under CPU autocast against torch's (tests_py/test_autocast.py)."""
    import torch.nn.functional as F

    from ._autocast import LOW, AutocastCase, D, rand

    return [AutocastCase("relu", family.relu, F.relu, [(rand(4, D),), (rand(4, D, dtype=LOW),)])]
