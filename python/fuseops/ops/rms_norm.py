"""rms_norm and fused_add_rms_norm (residual add, then RMSNorm), with the
forward ops that also return what backward needs and the backward ops."""

from __future__ import annotations

import math
from typing import Optional

import torch

from ._out import call, call_with_outs


def rms_norm(
    x: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    eps: Optional[float] = None,
    *,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """RMSNorm over the last dimension, as
    ``F.rms_norm(x, (x.shape[-1],), weight, eps)``: ``x / sqrt(mean(x^2) + eps)
    * weight``, differentiable with respect to ``x`` and ``weight``. ``weight``
    (optional, shape ``(x.shape[-1],)``) may have another floating dtype than
    ``x``; the result has x's dtype. bfloat16/float16 compute in float32.
    ``eps=None`` is PyTorch's default, the machine epsilon of float32 (of
    float64 for float64 input).

    With ``out=`` the result is written into a preallocated tensor (resized if
    its shape differs; ``x`` itself is allowed); that form is not differentiable.
    """
    return call(torch.ops.fuseops.rms_norm, x, weight, eps, out=out)


def rms_norm_forward(
    x: torch.Tensor, weight: Optional[torch.Tensor] = None, eps: Optional[float] = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(x, weight, eps), rstd)``, where ``rstd = 1 / sqrt(mean(x^2) + eps)``
    per row (shape ``x.shape[:-1]``, float32, or float64 for float64 input) is
    what :func:`rms_norm_backward` needs."""
    return torch.ops.fuseops.rms_norm_forward(x, weight, eps)


def rms_norm_backward(
    grad_output: torch.Tensor,
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    rstd: torch.Tensor,
    *,
    grad_input: Optional[torch.Tensor] = None,
    grad_weight: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(grad_input, grad_weight)`` of rms_norm in one pass over the rows;
    grad_weight (weight's dtype, accumulated in float32) is an empty tensor
    when ``weight`` is None. ``grad_input=``/``grad_weight=`` (together) take
    preallocated tensors; grad_input may be ``grad_output`` itself (computed
    in place), as rms_norm's autograd does with a gradient nothing else
    refers to."""
    return call_with_outs(
        "rms_norm_backward",
        (grad_output, x, weight, rstd),
        grad_input=grad_input,
        grad_weight=grad_weight,
    )


def fused_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    eps: Optional[float] = None,
    *,
    out: Optional[torch.Tensor] = None,
    residual_out: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual add and RMSNorm in one pass: returns ``(out, new_residual)``
    with ``new_residual = x + residual`` (rounded to the dtype, as ``x +
    residual`` is) and ``out = rms_norm(new_residual, weight, eps)``.
    Differentiable with respect to ``x``, ``residual`` and ``weight``.

    With ``out=`` and ``residual_out=`` (both or neither) the results are
    written into preallocated tensors, which may be ``x`` and ``residual``
    themselves (in place, as inference engines update the residual stream);
    that form is not differentiable.
    """
    if (out is None) != (residual_out is None):
        raise TypeError("fuseops.fused_add_rms_norm: pass both out= and residual_out=, or neither")
    if out is not None:
        torch.ops.fuseops.fused_add_rms_norm.out(
            x, residual, weight, eps, out=out, residual_out=residual_out
        )
        return out, residual_out
    return torch.ops.fuseops.fused_add_rms_norm(x, residual, weight, eps)


def fused_add_rms_norm_forward(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    eps: Optional[float] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(out, new_residual, rstd)``: fused_add_rms_norm plus what
    :func:`fused_add_rms_norm_backward` needs."""
    return torch.ops.fuseops.fused_add_rms_norm_forward(x, residual, weight, eps)


def fused_add_rms_norm_backward(
    grad_output: torch.Tensor,
    grad_new_residual: Optional[torch.Tensor],
    new_residual: torch.Tensor,
    weight: Optional[torch.Tensor],
    rstd: torch.Tensor,
    *,
    grad_input: Optional[torch.Tensor] = None,
    grad_weight: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(grad_input, grad_weight)`` of fused_add_rms_norm. grad_input, the
    gradient of new_residual through the norm plus ``grad_new_residual``, is
    the gradient of both ``x`` and ``residual``. ``grad_input=``/
    ``grad_weight=`` (together) take preallocated tensors as in
    :func:`rms_norm_backward`; grad_input may be ``grad_output`` or
    ``grad_new_residual`` itself (computed in place), as fused_add_rms_norm's
    autograd does with an output gradient nothing else refers to."""
    return call_with_outs(
        "fused_add_rms_norm_backward",
        (grad_output, grad_new_residual, new_residual, weight, rstd),
        grad_input=grad_input,
        grad_weight=grad_weight,
    )


def _rms_norm_eps(x: torch.Tensor, eps: Optional[float]) -> float:
    # F.rms_norm's default: the machine epsilon of the computation dtype.
    if eps is not None:
        return eps
    return torch.finfo(torch.float64 if x.dtype == torch.float64 else torch.float32).eps


def rms_norm_reference(
    x: torch.Tensor, weight: Optional[torch.Tensor] = None, eps: Optional[float] = None
) -> torch.Tensor:
    # As Llama-style model code writes it: bfloat16/float16 are upcast to
    # float32 for the mean of squares (in half precision it loses the row).
    xf = x.float() if x.dtype in (torch.bfloat16, torch.float16) else x
    y = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + _rms_norm_eps(x, eps))
    if weight is not None:
        y = y * weight
    return y.to(x.dtype)


def rms_norm_backward_reference(
    grad_output: torch.Tensor,
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    rstd: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_input, grad_weight); grad_weight is empty when weight is None."""
    compute = rstd.dtype
    g = grad_output.to(compute)
    x_hat = x.to(compute) * rstd.unsqueeze(-1)
    g_hat = g * weight.to(compute) if weight is not None else g
    grad_input = rstd.unsqueeze(-1) * (g_hat - x_hat * (g_hat * x_hat).mean(dim=-1, keepdim=True))
    if weight is None:
        grad_weight = x.new_empty(0)
    else:
        # The rows counted explicitly: reshape(-1, 0) is ambiguous for hidden size 0.
        rows = math.prod(x.shape[:-1])
        grad_weight = (g * x_hat).reshape(rows, x.shape[-1]).sum(0).to(weight.dtype)
    return grad_input.to(x.dtype), grad_weight


def fused_add_rms_norm_reference(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    eps: Optional[float] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual)."""
    new_residual = x + residual
    return rms_norm_reference(new_residual, weight, eps), new_residual


def fused_add_rms_norm_backward_reference(
    grad_output: torch.Tensor,
    grad_new_residual: Optional[torch.Tensor],
    new_residual: torch.Tensor,
    weight: Optional[torch.Tensor],
    rstd: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_input, grad_weight): rms_norm's backward of new_residual plus
    grad_new_residual, added before rounding to the dtype."""
    compute = rstd.dtype
    grad_input, grad_weight = rms_norm_backward_reference(
        grad_output, new_residual.to(compute), weight, rstd
    )
    if grad_new_residual is not None:
        grad_input = grad_input + grad_new_residual.to(compute)
    if weight is None:
        grad_weight = new_residual.new_empty(0)
    return grad_input.to(new_residual.dtype), grad_weight


# --- export: ONNX, ExecuTorch and their test calls (fuseops/ops/_export.py) ---


def onnx_translations() -> dict:
    """rms_norm and fused_add_rms_norm as ONNX ``RMSNormalization`` (the
    residual add in the input's dtype, as the op rounds it); float64 inputs
    decomposed, since the operator keeps its statistics in float32."""
    from ._onnx import DOUBLE, FLOAT, cast, dtype_of, ints, ones_like_last, op, opmath, scalar

    def normalized(x, weight, eps: Optional[float], dtype):
        ct = opmath(dtype)
        if eps is None:  # F.rms_norm's default, as the op's
            eps = torch.finfo(torch.float64 if ct == DOUBLE else torch.float32).eps
        xc = cast(x, ct)
        if ct == FLOAT:
            scale = ones_like_last(xc) if weight is None else cast(weight, FLOAT)
            y = op.RMSNormalization(xc, scale, axis=-1, epsilon=eps, stash_type=1)
        else:
            # RMSNormalization keeps its statistics in float32: float64 by hand.
            mean_square = op.ReduceMean(op.Mul(xc, xc), ints(-1), keepdims=1)
            y = op.Mul(xc, op.Reciprocal(op.Sqrt(op.Add(mean_square, scalar(eps, ct)))))
            if weight is not None:
                y = op.Mul(y, cast(weight, ct))
        return cast(y, dtype)

    def rms_norm_onnx(input, weight=None, eps: Optional[float] = None):
        """``fuseops::rms_norm``: ``RMSNormalization`` over the last dimension."""
        return normalized(input, weight, eps, dtype_of(input))

    def fused_add_rms_norm_onnx(input, residual, weight=None, eps: Optional[float] = None):
        """``fuseops::fused_add_rms_norm``: ``(rms_norm(x + residual), x +
        residual)`` with the sum rounded to the input's dtype (a float32 sum
        of two bfloat16/float16 values rounds to the same value as their sum
        does)."""
        dtype = dtype_of(input)
        ct = opmath(dtype)
        new_residual = cast(op.Add(cast(input, ct), cast(residual, ct)), dtype)
        return normalized(new_residual, weight, eps, dtype), new_residual

    ops = torch.ops.fuseops
    return {
        ops.rms_norm.default: rms_norm_onnx,
        ops.fused_add_rms_norm.default: fused_add_rms_norm_onnx,
    }


def executorch_decompositions() -> dict:
    """rms_norm and fused_add_rms_norm: the mean of squares over the last
    dimension, ``rsqrt``, the weight; the residual add rounded to the input's
    dtype, as the op rounds it."""
    from ._executorch import opmath

    def normalized(x, weight, eps: Optional[float], dtype):
        ct = opmath(dtype)
        if eps is None:  # F.rms_norm's default, as the op's
            eps = torch.finfo(ct).eps
        xc = x.to(ct)
        y = xc * torch.rsqrt((xc * xc).mean(dim=-1, keepdim=True) + eps)
        if weight is not None:
            y = y * weight.to(ct)
        return y.to(dtype)

    def rms_norm_decomposition(input, weight=None, eps: Optional[float] = None):
        """``fuseops::rms_norm``: ``x * rsqrt(mean(x^2) + eps) * weight``."""
        return normalized(input, weight, eps, input.dtype)

    def fused_add_rms_norm_decomposition(input, residual, weight=None, eps=None):
        """``fuseops::fused_add_rms_norm``: ``(rms_norm(x + residual), x +
        residual)`` with the sum rounded to the input's dtype."""
        dtype = input.dtype
        ct = opmath(dtype)
        new_residual = (input.to(ct) + residual.to(ct)).to(dtype)
        return normalized(new_residual, weight, eps, dtype), new_residual

    ops = torch.ops.fuseops
    return {
        ops.rms_norm.default: rms_norm_decomposition,
        ops.fused_add_rms_norm.default: fused_add_rms_norm_decomposition,
    }


__all__ = [
    "fused_add_rms_norm",
    "fused_add_rms_norm_backward",
    "fused_add_rms_norm_forward",
    "rms_norm",
    "rms_norm_backward",
    "rms_norm_forward",
]
