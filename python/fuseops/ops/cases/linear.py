"""The test and bench cases of :mod:`fuseops.ops.linear` (see
:mod:`fuseops.ops.cases`): kept out of ``import fuseops``."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import linear as family
from ._sample import DTYPES, Sample, tensor


def _x_and_weight(rows, hidden, dtype, device, gen):
    def t(*shape):
        return torch.randn(*shape, dtype=torch.float32, device=device, generator=gen).to(dtype)

    return t(rows, hidden), t(hidden, hidden) / hidden**0.5, t(hidden)


@dataclass(frozen=True)
class _LinearTraffic:
    """x read and y written, the [hidden, hidden] weight and the bias read
    once, all in the dtype."""

    def bytes(self, rows: int, hidden: int, element_size: int) -> int:
        return element_size * (2 * rows * hidden + hidden * hidden + hidden)


def bench_cases():
    from ._bench_case import Case, Traffic

    # rows = tokens (M), hidden = in = out features (K = N): decode (M = 1,
    # 2, 4: the streaming kernel) and 8 (ATen's product). The weight read
    # once dominates the traffic.
    return [
        Case(
            "linear",
            "linear",
            "linear",
            _x_and_weight,
            forward_traffic=_LinearTraffic(),
            backward_traffic=Traffic(rows=0),
            native=torch.nn.functional.linear,
            native_label="F.linear",
            has_out=False,
            differentiable=(),
            shapes={
                "quick": [(1, 2048)],
                "standard": [(m, 2048) for m in (1, 2, 4, 8)],
                "full": [(m, 4096) for m in (1, 2, 4, 8)],
            },
            description="decode-sized x @ W.T + b, the weight read once",
        ),
        Case(
            "linear_prefill",
            "linear",
            "linear",
            _x_and_weight,
            forward_traffic=_LinearTraffic(),
            backward_traffic=_LinearTraffic(),
            native=torch.nn.functional.linear,
            native_label="F.linear",
            has_out=False,
            differentiable=(0, 1, 2),
            shapes={
                "quick": [(128, 2048)],
                "standard": [(m, 2048) for m in (32, 128, 512, 2048)],
                "full": [(m, 4096) for m in (128, 512, 2048)],
            },
            description="prefill/training-sized x @ W.T + b and its gradients",
            variant=True,
        ),
    ]


def samples(device) -> list[Sample]:
    op = torch.ops.fuseops.linear.default

    def call(
        rows, k, n, dtype=torch.float32, bias=True, layout="contiguous", grad=False, large=False
    ):
        args = (
            tensor(rows, dtype, device, layout, grad),
            tensor((n, k), dtype, device, layout, grad),
            tensor((n,), dtype, device, "contiguous", grad) if bias else None,
        )
        return Sample(op, args, family.linear, large=large)

    result = [
        call((1, 8), 8, 5),
        call((3, 16), 16, 7, torch.bfloat16, bias=False, grad=True),
        call((2, 3, 12), 12, 6, torch.float16, grad=True),
        call((4, 10), 10, 9, torch.float64, grad=True),
        call((5, 24), 24, 8, layout="transposed", grad=True),
        call((20, 16), 16, 4, grad=True),  # past the streaming rows: ATen's product
        call((1, 16), 16, 4, grad=True),  # one float32 row: the streaming kernel
        call((0, 8), 8, 3, grad=True),
        call((2, 0), 0, 3),  # an empty sum: the bias
    ]
    # Every CPU build: vector tails (K = 67), every row count of the
    # streaming kernel and enough channels for several tasks per thread.
    for dtype in DTYPES:
        for rows in (1, 2, 3, 4):
            result.append(call((rows, 67), 67, 130, dtype, grad=True, large=True))
    return result


def fuzz(d) -> Sample:
    """One random call for tests_py/test_fuzz.py (``d``: fuseops.ops._fuzz.Draw)."""
    k, n = d.size(40), d.size(40)
    x = d.tensor((*d.shape(max_dims=2), k), grad=True)
    weight = d.tensor((n, k), x.dtype, grad=True)
    bias = d.maybe(lambda: d.tensor((n,), x.dtype, grad=True))
    return Sample(torch.ops.fuseops.linear.default, (x, weight, bias), family.linear)


def export_cases() -> list:
    """The calls the export tests run (fuseops/ops/_export.py): decode rows
    and a prefill, with and without bias; the runtimes sum K products in
    another order (within 1e-5 of the largest output)."""
    import itertools

    from .._export import EXPORT_DTYPES, ExportCase
    from .._export import randn as t

    op = torch.ops.fuseops.linear.default
    cases = []
    for dtype, (m, n, k), bias in itertools.product(
        EXPORT_DTYPES, ((1, 20, 37), (24, 16, 64)), (False, True)
    ):
        args = (t(2, m, k, dtype=dtype), t(n, k, dtype=dtype)) + (
            (t(n, dtype=dtype),) if bias else ()
        )
        label = f"{dtype} {m}x{k} @ {n} bias={bias}"
        cases.append(ExportCase(op, label, args, rtol=1e-5, atol=1e-5))
    return cases


def autocast_cases() -> list:
    """linear under CPU autocast against torch's: a decode step's product (the streaming kernel in bfloat16) and a prefill's, float32 weights cast as torch casts linear's (tests_py/test_autocast.py)."""
    import torch.nn.functional as F

    from ._autocast import LOW, AutocastCase, D, rand

    return [
        AutocastCase(
            "linear",
            family.linear,
            F.linear,
            [
                (rand(2, D), rand(3 * D, D), rand(3 * D)),
                (rand(2, D, dtype=LOW), rand(3 * D, D), None),
                (rand(40, D, dtype=LOW), rand(3 * D, D), rand(3 * D)),
            ],
        )
    ]
