"""What the op modules' ExecuTorch decompositions share (their
``executorch_decompositions()``, collected by :mod:`fuseops.executorch`):
plain-PyTorch helpers, written with core ATen operators that ExecuTorch's
portable and XNNPACK kernels run, for the op's precision, GELU and SiLU,
per-row int8 quantization and the products of the quantized linears.
Imports nothing beyond torch.
"""

from __future__ import annotations

import math

import torch


def opmath(dtype: torch.dtype) -> torch.dtype:
    """The dtype fuseops computes in: float64 for float64, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def gelu_math(x, approximate: str, op: str):
    """The erf form (``aten.gelu``) or the tanh form, written out: XNNPACK's
    GELU computes the erf form whatever ``aten.gelu``'s ``approximate`` says."""
    if approximate not in ("none", "tanh"):
        raise ValueError(
            f"fuseops.executorch: {op}'s approximate must be 'none' or 'tanh', got {approximate!r}"
        )
    if approximate == "tanh":
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * (x * x * x))
        return 0.5 * x * (1.0 + torch.tanh(inner))
    return torch.nn.functional.gelu(x)


def silu_math(x):
    return x * torch.sigmoid(x)


def quantize_rows(x):
    """``quantize_per_token_int8``'s math in float32: ``(xq, x_scale)`` with
    ``xq`` the int8 values held in float32 (a row holding Inf or NaN holds
    NaN, which the products carry into that row's results, as the op's) and
    ``x_scale [..., 1]``."""
    xf = x.to(torch.float32)
    x_scale = xf.abs().amax(dim=-1, keepdim=True) / 127.0
    x_scale = torch.where(x_scale == 0, torch.ones_like(x_scale), x_scale)
    xq = torch.round(xf / x_scale).clamp(-127.0, 127.0)
    return xq, x_scale


def add_bias(y, bias, ct: torch.dtype):
    return y if bias is None else y + bias.to(ct)


def rows_times(x2d, w, out_shape):
    """``x2d [rows, K] @ w.T`` reshaped to ``out_shape``."""
    return (x2d @ w.t()).reshape(out_shape)


def dynamic_int8_linear(input, weight, scale, bias):
    """The per-row W8A8 linear's math (2:4) on its ``[N, K]`` int8-valued
    ``weight``: the rows quantized as the ops do, the integer products summed
    exactly (in float64, exact for the int8 ranges), then ``(acc * x_scale)
    * scale + bias`` in float32 (float64 for float64 input)."""
    dtype = input.dtype
    ct = opmath(dtype)
    n, k = weight.shape[0], input.shape[-1]
    xq, x_scale = quantize_rows(input)
    w = weight.to(torch.float64)
    acc = rows_times(xq.to(torch.float64).reshape(-1, k), w, input.shape[:-1] + (n,))
    y = (acc.to(ct) * x_scale.to(ct)) * scale.to(ct)
    return add_bias(y, bias, ct).to(dtype)
