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


def _quantize_blocks_int8_reference(
    x: torch.Tensor, block: int, blocks: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [..., K]`` quantized per block of ``block`` values along K, as the
    int8 and int4 W*A8 linears quantize their activations: zeros past K to
    ``blocks * block``, each block of a row as a row of
    ``quantize_per_token_int8``. Returns ``(xq [..., blocks, block] int8,
    x_scale [..., blocks] float32)``."""
    padded = torch.nn.functional.pad(x, (0, blocks * block - x.shape[-1]))
    return _quantize_rows_reference(padded.reshape(*x.shape[:-1], blocks, block))


def dequantize_int8_reference(
    q: torch.Tensor, scale: torch.Tensor, dim: int = -1, dtype: Optional[torch.dtype] = None
) -> torch.Tensor:
    # The float64 product of an int8 and a float32 is exact, so rounding it
    # to float32 gives the kernels' float32 product.
    return (q.double() * scale.double().unsqueeze(dim)).to(dtype or torch.float32)


# --- export (fuseops/ops/_export.py) ---

NOT_EXPORTED = {
    ("quantize_per_channel_int8", "quantize_per_token_int8", "dequantize_int8"): PREPARES_WEIGHTS,
}


__all__ = ["dequantize_int8", "quantize_per_channel_int8", "quantize_per_token_int8"]
