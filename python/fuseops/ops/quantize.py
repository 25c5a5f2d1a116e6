"""Symmetric int8 quantization: per output channel (weights), per token
(activations), and dequantization.

The math, the same in every build and device: each row (the last dimension)
gets one float32 ``scale = absmax(row) / 127``, and ``q = round(x / scale)``
to nearest, ties to even, clamped to [-127, 127]. Everything is float32:
float64 inputs are rounded to float32 first (eight bits make the
difference moot). A row whose ``absmax / 127`` is 0 in float32 (all zeros, or
only values below about 1.8e-43) gets ``scale = 1`` and quantizes to zeros,
so dequantization gives 0, never NaN. A row holding Inf or NaN (in float64
also a value beyond float32's range) is refused with an error naming the row.

These are inference ops: they have no derivative, and called on tensors that
require grad with grad mode on they raise (use ``torch.no_grad()``).
"""

from __future__ import annotations

from typing import Optional

import torch

from ._export import PREPARES_WEIGHTS
from ._sample import DTYPES, Sample, tensor


def quantize_per_channel_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, scale)`` of a linear layer's weight ``[N, K]``: q int8 ``[N, K]``,
    scale float32 ``[N]``, one per output channel (module docstring)."""
    return torch.ops.fuseops.quantize_per_channel_int8(weight)


def quantize_per_token_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, scale)`` of activations ``[..., K]``: q int8 ``[..., K]``, scale
    float32 ``[...]``, one per row (module docstring)."""
    return torch.ops.fuseops.quantize_per_token_int8(x)


def dequantize_int8(
    q: torch.Tensor, scale: torch.Tensor, dim: int = -1, dtype: Optional[torch.dtype] = None
) -> torch.Tensor:
    """``q * scale`` with one float32 scale per slice along ``dim``, the
    dimension each scale covers (the one quantization reduced): ``scale`` has
    q's shape without ``dim``. The product is computed in float32 (float64
    for a float64 result) and rounded to ``dtype`` (default float32)."""
    return torch.ops.fuseops.dequantize_int8(q, scale, dim, dtype)


def _quantize_rows_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # The op's float32 math spelled out: float64 inputs (and the float64
    # copies the conformance suite passes) are rounded to float32 first,
    # exactly as the kernels do, so q and scale must match bit for bit.
    # amax / 127 through float64: ATen's CUDA division by a Python scalar
    # multiplies by its reciprocal (1 ulp off); a float64 quotient rounded to
    # float32 is the correctly rounded float32 division the kernels compute.
    xf = x.float()
    scale = (
        (xf.abs().amax(-1).double() / 127).float()
        if xf.shape[-1]
        else torch.zeros(xf.shape[:-1], device=x.device)
    )
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = torch.round(xf / scale.unsqueeze(-1)).clamp(-127, 127).to(torch.int8)
    return q, scale


def quantize_per_channel_int8_reference(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _quantize_rows_reference(weight)


def quantize_per_token_int8_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _quantize_rows_reference(x)


def dequantize_int8_reference(
    q: torch.Tensor, scale: torch.Tensor, dim: int = -1, dtype: Optional[torch.dtype] = None
) -> torch.Tensor:
    # The float64 product of an int8 and a float32 is exact, so rounding it
    # to float32 gives the kernels' float32 product.
    return (q.double() * scale.double().unsqueeze(dim)).to(dtype or torch.float32)


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
        Sample(ops.quantize_per_channel_int8.default, (t((6, 33)),), quantize_per_channel_int8),
        Sample(ops.quantize_per_channel_int8.default, (zero_row,), quantize_per_channel_int8),
        Sample(
            ops.quantize_per_channel_int8.default,
            (t((5, 8), torch.bfloat16, "transposed"),),
            quantize_per_channel_int8,
        ),
        Sample(
            ops.quantize_per_channel_int8.default,
            (t((0, 8), torch.float16),),
            quantize_per_channel_int8,
        ),
        Sample(
            ops.quantize_per_token_int8.default,
            (t((2, 3, 17), torch.float64, "sliced"),),
            quantize_per_token_int8,
        ),
        Sample(
            ops.quantize_per_token_int8.default,
            (t((4, 6), torch.float16, "expanded"),),
            quantize_per_token_int8,
        ),
        Sample(ops.quantize_per_token_int8.default, (t((3, 0)),), quantize_per_token_int8),
        Sample(
            ops.dequantize_int8.default,
            (q, torch.rand(3, 5, device=device) + 0.1, -1, None),
            dequantize_int8,
        ),
        Sample(
            ops.dequantize_int8.default,
            (q, torch.rand(5, 7, device=device) + 0.1, 0, torch.bfloat16),
            dequantize_int8,
        ),
        Sample(
            ops.dequantize_int8.default,
            (q.transpose(0, 2), torch.rand(7, 3, device=device), 1, torch.float64),
            dequantize_int8,
        ),
    ]
    # Every CPU build on rows with a vector tail, several tasks per thread.
    for dtype in DTYPES:
        result.append(
            Sample(
                ops.quantize_per_channel_int8.default,
                (t((301, 67), dtype),),
                quantize_per_channel_int8,
                large=True,
            )
        )
        result.append(
            Sample(
                ops.quantize_per_token_int8.default,
                (t((3, 97, 45), dtype),),
                quantize_per_token_int8,
                large=True,
            )
        )
        big_q = torch.randint(-127, 128, (301, 67), dtype=torch.int8, device=device)
        result.append(
            Sample(
                ops.dequantize_int8.default,
                (big_q, torch.rand(301, device=device), -1, dtype),
                dequantize_int8,
                large=True,
            )
        )
        result.append(
            Sample(
                ops.dequantize_int8.default,
                (big_q, torch.rand(67, device=device), 0, dtype),
                dequantize_int8,
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
            quantize_per_channel_int8,
        )
    if kind == 1:
        return Sample(
            ops.quantize_per_token_int8.default,
            (d.tensor(d.shape(1, 3), scale=3.0),),
            quantize_per_token_int8,
        )
    q = d.integers(d.shape(1, 3), -127, 128, torch.int8)
    dim = d.int(-q.dim(), q.dim() - 1)
    scale = d.tensor(q.shape[: dim % q.dim()] + q.shape[dim % q.dim() + 1 :], torch.float32)
    dtype = d.choice((None,) + DTYPES)
    return Sample(ops.dequantize_int8.default, (q, scale, dim, dtype), dequantize_int8)


# --- export (fuseops/ops/_export.py) ---

NOT_EXPORTED = {
    ("quantize_per_channel_int8", "quantize_per_token_int8", "dequantize_int8"): PREPARES_WEIGHTS,
}


__all__ = ["dequantize_int8", "quantize_per_channel_int8", "quantize_per_token_int8"]
