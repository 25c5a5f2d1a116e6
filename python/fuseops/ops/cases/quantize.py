"""The test and bench cases of :mod:`fuseops.ops.quantize` (see
:mod:`fuseops.ops.cases`): kept out of ``import fuseops``."""

from __future__ import annotations

import torch

from .. import quantize as family
from ._sample import DTYPES, Sample, tensor


def bench_cases():
    from ._bench_case import Case, Traffic, x

    return [
        Case(
            "quantize_per_token_int8",
            "quantize_per_token_int8",
            "quantize_per_token_int8",
            x,
            # x read in its dtype; q (one byte an element) and the float32
            # scales written.
            forward_traffic=Traffic(rows=1, extra=lambda rows, hidden: rows * hidden + 4 * rows),
            backward_traffic=Traffic(rows=0),
            has_out=False,
            differentiable=(),
            description="int8 per row: absmax/127 scale, round half to even",
        ),
    ]


def samples(device) -> list[Sample]:
    ops = torch.ops.fuseops

    def t(shape, dtype=torch.float32, layout="contiguous"):
        return tensor(shape, dtype, device, layout, scale=3.0)

    zero_row = t((4, 9))
    zero_row[2] = 0
    q = torch.randint(-127, 128, (3, 5, 7), dtype=torch.int8, device=device)
    result = [
        Sample(
            ops.quantize_per_channel_int8.default, (t((6, 33)),), family.quantize_per_channel_int8
        ),
        Sample(
            ops.quantize_per_channel_int8.default, (zero_row,), family.quantize_per_channel_int8
        ),
        Sample(
            ops.quantize_per_channel_int8.default,
            (t((5, 8), torch.bfloat16, "transposed"),),
            family.quantize_per_channel_int8,
        ),
        Sample(
            ops.quantize_per_channel_int8.default,
            (t((0, 8), torch.float16),),
            family.quantize_per_channel_int8,
        ),
        Sample(
            ops.quantize_per_token_int8.default,
            (t((2, 3, 17), torch.float64, "sliced"),),
            family.quantize_per_token_int8,
        ),
        Sample(
            ops.quantize_per_token_int8.default,
            (t((4, 6), torch.float16, "expanded"),),
            family.quantize_per_token_int8,
        ),
        Sample(ops.quantize_per_token_int8.default, (t((3, 0)),), family.quantize_per_token_int8),
        Sample(
            ops.dequantize_int8.default,
            (q, torch.rand(3, 5, device=device) + 0.1, -1, None),
            family.dequantize_int8,
        ),
        Sample(
            ops.dequantize_int8.default,
            (q, torch.rand(5, 7, device=device) + 0.1, 0, torch.bfloat16),
            family.dequantize_int8,
        ),
        Sample(
            ops.dequantize_int8.default,
            (q.transpose(0, 2), torch.rand(7, 3, device=device), 1, torch.float64),
            family.dequantize_int8,
        ),
    ]
    # Every CPU build on rows with a vector tail, several tasks per thread.
    for dtype in DTYPES:
        result.append(
            Sample(
                ops.quantize_per_channel_int8.default,
                (t((301, 67), dtype),),
                family.quantize_per_channel_int8,
                large=True,
            )
        )
        result.append(
            Sample(
                ops.quantize_per_token_int8.default,
                (t((3, 97, 45), dtype),),
                family.quantize_per_token_int8,
                large=True,
            )
        )
        big_q = torch.randint(-127, 128, (301, 67), dtype=torch.int8, device=device)
        result.append(
            Sample(
                ops.dequantize_int8.default,
                (big_q, torch.rand(301, device=device), -1, dtype),
                family.dequantize_int8,
                large=True,
            )
        )
        result.append(
            Sample(
                ops.dequantize_int8.default,
                (big_q, torch.rand(67, device=device), 0, dtype),
                family.dequantize_int8,
                large=True,
            )
        )
    return result


def fuzz(d) -> Sample:
    """One random call for tests_py/test_fuzz.py (``d``: fuseops.ops._fuzz.Draw)."""
    ops, kind = torch.ops.fuseops, d.int(0, 2)
    if kind == 0:
        return Sample(
            ops.quantize_per_channel_int8.default,
            (d.tensor(d.shape(2, 2), scale=3.0),),
            family.quantize_per_channel_int8,
        )
    if kind == 1:
        return Sample(
            ops.quantize_per_token_int8.default,
            (d.tensor(d.shape(1, 3), scale=3.0),),
            family.quantize_per_token_int8,
        )
    q = d.integers(d.shape(1, 3), -127, 128, torch.int8)
    dim = d.int(-q.dim(), q.dim() - 1)
    scale = d.tensor(q.shape[: dim % q.dim()] + q.shape[dim % q.dim() + 1 :], torch.float32)
    dtype = d.choice((None,) + DTYPES)
    return Sample(ops.dequantize_int8.default, (q, scale, dim, dtype), family.dequantize_int8)
