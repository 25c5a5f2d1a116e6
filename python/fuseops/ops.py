"""The public fuseops ops: thin wrappers over ``torch.ops.fuseops``.

Every ``out=`` may share memory with the inputs (the result is that of the
inputs before the call); an ``out=`` whose elements overlap each other, two
outputs sharing memory, or an ``out=`` that must be resized while sharing an
input's memory are refused (README, "out= and memory shared with inputs").
"""

from __future__ import annotations

from typing import Optional

import torch


def relu(x: torch.Tensor, *, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``max(x, 0)`` elementwise (NaN propagates), differentiable.

    With ``out=`` the result is written into a preallocated tensor (resized if
    its shape differs); like every out= op, that form is not differentiable.
    """
    if out is not None:
        torch.ops.fuseops.relu.out(x, out=out)
        return out
    return torch.ops.fuseops.relu(x)


def relu_backward(grad_output: torch.Tensor, result: torch.Tensor) -> torch.Tensor:
    """Gradient of relu given its output: ``grad_output`` where ``result > 0``."""
    return torch.ops.fuseops.relu_backward(grad_output, result)


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
    if out is not None:
        torch.ops.fuseops.rms_norm.out(x, weight, eps, out=out)
        return out
    return torch.ops.fuseops.rms_norm(x, weight, eps)


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
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(grad_input, grad_weight)`` of rms_norm in one pass over the rows;
    grad_weight (weight's dtype, accumulated in float32) is an empty tensor
    when ``weight`` is None."""
    return torch.ops.fuseops.rms_norm_backward(grad_output, x, weight, rstd)


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
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(grad_input, grad_weight)`` of fused_add_rms_norm. grad_input, the
    gradient of new_residual through the norm plus ``grad_new_residual``, is
    the gradient of both ``x`` and ``residual``."""
    return torch.ops.fuseops.fused_add_rms_norm_backward(
        grad_output, grad_new_residual, new_residual, weight, rstd
    )


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
    if out is not None:
        torch.ops.fuseops.layer_norm.out(x, weight, bias, eps, out=out)
        return out
    return torch.ops.fuseops.layer_norm(x, weight, bias, eps)


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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of layer_norm: ``(grad_input, grad_weight, grad_bias)`` from
    the per-row ``mean`` and ``rstd = 1 / sqrt(var + eps)`` of ``x``, as
    :func:`layer_norm_forward` returns them (shape ``x.shape[:-1]``) or as
    ``torch.native_layer_norm`` does (shape ``x.shape[:-1] + (1,)``, on CPU
    in x's dtype); used in float32 (float64 for float64 ``x``). grad_weight
    and grad_bias are the row sums of ``grad_output * x_hat`` and
    ``grad_output``, returned whether or not the forward had a weight or bias."""
    return torch.ops.fuseops.layer_norm_backward(grad_output, x, weight, mean, rstd)


def gelu(
    x: torch.Tensor, approximate: str = "none", *, out: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """GELU as ``torch.nn.functional.gelu``: ``approximate="none"`` is
    ``x * Phi(x)`` (erf form), ``"tanh"`` the tanh approximation; any other
    string is an error. Differentiable (twice). bfloat16/float16 compute in
    float32. With ``out=`` the result goes into a preallocated tensor (resized
    if its shape differs); that form is not differentiable."""
    if out is not None:
        torch.ops.fuseops.gelu.out(x, approximate, out=out)
        return out
    return torch.ops.fuseops.gelu(x, approximate)


def gelu_backward(
    grad_output: torch.Tensor, x: torch.Tensor, approximate: str = "none"
) -> torch.Tensor:
    """``grad_output * gelu'(x)``."""
    return torch.ops.fuseops.gelu_backward(grad_output, x, approximate)


def silu(x: torch.Tensor, *, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """SiLU (swish) ``x * sigmoid(x)`` as ``torch.nn.functional.silu``;
    differentiable (twice). ``out=`` as in :func:`gelu`."""
    if out is not None:
        torch.ops.fuseops.silu.out(x, out=out)
        return out
    return torch.ops.fuseops.silu(x)


def silu_backward(grad_output: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``grad_output * silu'(x)``."""
    return torch.ops.fuseops.silu_backward(grad_output, x)


def bias_gelu(
    x: torch.Tensor,
    bias: torch.Tensor,
    approximate: str = "none",
    *,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``gelu(x + bias, approximate)`` in one pass (bias 1-D of size
    ``x.shape[-1]``, x's dtype), as Megatron's bias-GELU; differentiable with
    respect to ``x`` and ``bias``. ``out=`` as in :func:`gelu`."""
    if out is not None:
        torch.ops.fuseops.bias_gelu.out(x, bias, approximate, out=out)
        return out
    return torch.ops.fuseops.bias_gelu(x, bias, approximate)


def bias_gelu_backward(
    grad_output: torch.Tensor, x: torch.Tensor, bias: torch.Tensor, approximate: str = "none"
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(grad_input, grad_bias)`` of bias_gelu: ``grad_output * gelu'(x + bias)``
    and its sum over all rows (float32 accumulation for bfloat16/float16)."""
    return torch.ops.fuseops.bias_gelu_backward(grad_output, x, bias, approximate)


def swiglu(
    gate: torch.Tensor,
    up: Optional[torch.Tensor] = None,
    *,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``silu(gate) * up`` in one pass, differentiable in both.

    With ``up`` omitted, ``gate`` is a packed ``[..., 2*H]`` tensor: its first
    half along the last dimension is the gate, the second half ``up``
    (``gate, up = input.chunk(2, -1)``); the result is ``[..., H]`` and the
    gradient flows back packed the same way. Halves that are views of one
    packed tensor are read in place, without copies. ``out=`` as in
    :func:`gelu`."""
    if up is None:
        if out is not None:
            torch.ops.fuseops.swiglu.packed_out(gate, out=out)
            return out
        return torch.ops.fuseops.swiglu.packed(gate)
    if out is not None:
        torch.ops.fuseops.swiglu.out(gate, up, out=out)
        return out
    return torch.ops.fuseops.swiglu(gate, up)


def swiglu_backward(
    grad_output: torch.Tensor, gate: torch.Tensor, up: Optional[torch.Tensor] = None
):
    """``(grad_gate, grad_up)`` of swiglu in one pass; with ``up`` omitted,
    ``gate`` is the packed input and the packed ``[..., 2*H]`` gradient is
    returned."""
    if up is None:
        return torch.ops.fuseops.swiglu_backward.packed(grad_output, gate)
    return torch.ops.fuseops.swiglu_backward(grad_output, gate, up)


def geglu(
    gate: torch.Tensor,
    up: Optional[torch.Tensor] = None,
    approximate: str = "none",
    *,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``gelu(gate, approximate) * up`` in one pass, differentiable in both;
    ``up=None`` means a packed ``[..., 2*H]`` input (gate first), as in
    :func:`swiglu`."""
    if up is None:
        if out is not None:
            torch.ops.fuseops.geglu.packed_out(gate, approximate, out=out)
            return out
        return torch.ops.fuseops.geglu.packed(gate, approximate)
    if out is not None:
        torch.ops.fuseops.geglu.out(gate, up, approximate, out=out)
        return out
    return torch.ops.fuseops.geglu(gate, up, approximate)


def geglu_backward(
    grad_output: torch.Tensor,
    gate: torch.Tensor,
    up: Optional[torch.Tensor] = None,
    approximate: str = "none",
):
    """``(grad_gate, grad_up)`` of geglu; packed gradient when ``up`` is
    omitted, as in :func:`swiglu_backward`."""
    if up is None:
        return torch.ops.fuseops.geglu_backward.packed(grad_output, gate, approximate)
    return torch.ops.fuseops.geglu_backward(grad_output, gate, up, approximate)
