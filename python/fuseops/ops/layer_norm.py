"""layer_norm over the last dimension, its forward op that also returns the
statistics backward needs, and its backward op."""

from __future__ import annotations

from typing import Optional

import torch

from ._out import call, call_with_outs


def layer_norm(
    x: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    eps: float = 1e-5,
    *,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Layer normalization over the last dimension, as
    ``F.layer_norm(x, (x.shape[-1],), weight, bias, eps)``; differentiable with
    respect to ``x``, ``weight`` and ``bias`` (each optional, of shape
    ``(x.shape[-1],)`` and x's dtype). bfloat16/float16 compute in float32.

    With ``out=`` the result is written into a preallocated tensor (resized if
    its shape differs; ``x`` itself is allowed); that form is not differentiable.
    """
    return call(torch.ops.fuseops.layer_norm, x, weight, bias, eps, out=out)


def layer_norm_forward(
    x: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    eps: float = 1e-5,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(layer_norm(x, weight, bias, eps), mean, rstd)``: the per-row mean and
    ``rstd = 1 / sqrt(var + eps)`` (shape ``x.shape[:-1]``, float32; float64
    for float64 ``x``) are what :func:`layer_norm_backward` needs. The output
    is differentiable, the statistics are not."""
    return torch.ops.fuseops.layer_norm_forward(x, weight, bias, eps)


def layer_norm_backward(
    grad_output: torch.Tensor,
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    mean: torch.Tensor,
    rstd: torch.Tensor,
    *,
    grad_input: Optional[torch.Tensor] = None,
    grad_weight: Optional[torch.Tensor] = None,
    grad_bias: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of layer_norm: ``(grad_input, grad_weight, grad_bias)`` from
    the per-row ``mean`` and ``rstd = 1 / sqrt(var + eps)`` of ``x``, as
    :func:`layer_norm_forward` returns them (shape ``x.shape[:-1]``) or as
    ``torch.native_layer_norm`` does (shape ``x.shape[:-1] + (1,)``, on CPU
    in x's dtype); used in float32 (float64 for float64 ``x``). grad_weight
    and grad_bias are the row sums of ``grad_output * x_hat`` and
    ``grad_output``, returned whether or not the forward had a weight or bias.
    ``grad_input=``, ``grad_weight=``, ``grad_bias=`` (all three) take
    preallocated tensors; grad_input may be ``grad_output`` itself (computed
    in place), as layer_norm's autograd does with a gradient nothing else
    refers to."""
    return call_with_outs(
        "layer_norm_backward",
        (grad_output, x, weight, mean, rstd),
        grad_input=grad_input,
        grad_weight=grad_weight,
        grad_bias=grad_bias,
    )


def layer_norm_reference(
    x: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    mean = x.mean(dim=-1, keepdim=True)
    var = (x - mean).pow(2).mean(dim=-1, keepdim=True)
    y = (x - mean) / torch.sqrt(var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


def layer_norm_backward_reference(
    grad_output: torch.Tensor,
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    mean: torch.Tensor,
    rstd: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # With x_hat = (x - mean) * rstd and g = grad_output * weight:
    # grad_input = rstd * (g - mean(g) - x_hat * mean(g * x_hat)).
    # Statistics of shape x.shape[:-1], or with native_layer_norm's trailing 1.
    mean, rstd = mean.reshape(x.shape[:-1]), rstd.reshape(x.shape[:-1])
    x_hat = (x - mean.unsqueeze(-1)) * rstd.unsqueeze(-1)
    g = grad_output * weight if weight is not None else grad_output
    grad_input = rstd.unsqueeze(-1) * (
        g - g.mean(dim=-1, keepdim=True) - x_hat * (g * x_hat).mean(dim=-1, keepdim=True)
    )
    rows = tuple(range(x.dim() - 1))
    grad_weight = (grad_output * x_hat).sum(dim=rows) if rows else grad_output * x_hat
    grad_bias = grad_output.sum(dim=rows) if rows else grad_output.clone()
    return grad_input.to(x.dtype), grad_weight.to(x.dtype), grad_bias.to(x.dtype)


# --- export: ONNX, ExecuTorch and their test calls (fuseops/ops/_export.py) ---


def onnx_translations() -> dict:
    """layer_norm as ONNX ``LayerNormalization``; float64 inputs decomposed,
    since the operator keeps its statistics in float32."""
    from ._onnx import FLOAT, cast, dtype_of, ints, ones_like_last, op, opmath, scalar

    def layer_norm_onnx(input, weight=None, bias=None, eps: float = 1e-5):
        """``fuseops::layer_norm``: ``LayerNormalization`` over the last dimension."""
        dtype = dtype_of(input)
        ct = opmath(dtype)
        xc = cast(input, ct)
        if ct == FLOAT:
            scale = ones_like_last(xc) if weight is None else cast(weight, FLOAT)
            b = None if bias is None else cast(bias, FLOAT)
            y = op.LayerNormalization(xc, scale, b, axis=-1, epsilon=eps, stash_type=1)
            if isinstance(y, (tuple, list)):
                y = y[0]
        else:
            # LayerNormalization keeps its statistics in float32: float64 by hand.
            centered = op.Sub(xc, op.ReduceMean(xc, ints(-1), keepdims=1))
            var = op.ReduceMean(op.Mul(centered, centered), ints(-1), keepdims=1)
            y = op.Div(centered, op.Sqrt(op.Add(var, scalar(eps, ct))))
            if weight is not None:
                y = op.Mul(y, cast(weight, ct))
            if bias is not None:
                y = op.Add(y, cast(bias, ct))
        return cast(y, dtype)

    return {torch.ops.fuseops.layer_norm.default: layer_norm_onnx}


def executorch_decompositions() -> dict:
    """layer_norm: the mean and (biased) variance over the last dimension,
    ``rsqrt``, the weight and bias."""
    from ._executorch import opmath

    def layer_norm_decomposition(input, weight=None, bias=None, eps: float = 1e-5):
        """``fuseops::layer_norm`` in float32 (float64 for float64)."""
        dtype = input.dtype
        ct = opmath(dtype)
        xc = input.to(ct)
        centered = xc - xc.mean(dim=-1, keepdim=True)
        var = (centered * centered).mean(dim=-1, keepdim=True)
        y = centered * torch.rsqrt(var + eps)
        if weight is not None:
            y = y * weight.to(ct)
        if bias is not None:
            y = y + bias.to(ct)
        return y.to(dtype)

    return {torch.ops.fuseops.layer_norm.default: layer_norm_decomposition}


__all__ = ["layer_norm", "layer_norm_backward", "layer_norm_forward"]
