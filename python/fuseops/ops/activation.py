"""The activations gelu (erf or tanh form), silu and bias_gelu (bias add then
gelu), with their backward ops."""

from __future__ import annotations

import math
from typing import Optional

import torch

from ._out import call, call_with_outs

#: Inputs where the activations' special cases live: signed zeros, the
#: saturated tails, infinities and NaN.
SPECIAL_VALUES = (
    0.0,
    -0.0,
    1.0,
    -1.0,
    30.0,
    -30.0,
    100.0,
    -100.0,
    float("inf"),
    float("-inf"),
    float("nan"),
)


def gelu(
    x: torch.Tensor, approximate: str = "none", *, out: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """GELU as ``torch.nn.functional.gelu``: ``approximate="none"`` is
    ``x * Phi(x)`` (erf form), ``"tanh"`` the tanh approximation; any other
    string is an error. Differentiable (twice). bfloat16/float16 compute in
    float32. With ``out=`` the result goes into a preallocated tensor (resized
    if its shape differs); that form is not differentiable."""
    return call(torch.ops.fuseops.gelu, x, approximate, out=out)


def gelu_backward(
    grad_output: torch.Tensor,
    x: torch.Tensor,
    approximate: str = "none",
    *,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``grad_output * gelu'(x)``. ``out=`` may be ``grad_output`` itself
    (computed in place), as gelu's autograd does with a gradient nothing else
    refers to."""
    return call(torch.ops.fuseops.gelu_backward, grad_output, x, approximate, out=out)


def silu(x: torch.Tensor, *, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """SiLU (swish) ``x * sigmoid(x)`` as ``torch.nn.functional.silu``;
    differentiable (twice). ``out=`` as in :func:`gelu`."""
    return call(torch.ops.fuseops.silu, x, out=out)


def silu_backward(
    grad_output: torch.Tensor, x: torch.Tensor, *, out: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """``grad_output * silu'(x)``; ``out=`` as in :func:`gelu_backward`."""
    return call(torch.ops.fuseops.silu_backward, grad_output, x, out=out)


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
    return call(torch.ops.fuseops.bias_gelu, x, bias, approximate, out=out)


def bias_gelu_backward(
    grad_output: torch.Tensor,
    x: torch.Tensor,
    bias: torch.Tensor,
    approximate: str = "none",
    *,
    grad_input: Optional[torch.Tensor] = None,
    grad_bias: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(grad_input, grad_bias)`` of bias_gelu: ``grad_output * gelu'(x + bias)``
    and its sum over all rows (float32 accumulation for bfloat16/float16).
    ``grad_input=``/``grad_bias=`` (together) take preallocated tensors;
    grad_input may be ``grad_output`` itself (computed in place), as
    bias_gelu's autograd does with a gradient nothing else refers to."""
    return call_with_outs(
        "bias_gelu_backward",
        (grad_output, x, bias, approximate),
        grad_input=grad_input,
        grad_bias=grad_bias,
    )


def gelu_reference(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    # The textbook formulas, as model code writes them (e.g. "gelu_new").
    if approximate == "tanh":
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))
        return 0.5 * x * (1.0 + torch.tanh(inner))
    if approximate != "none":
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def gelu_backward_reference(
    grad_output: torch.Tensor, x: torch.Tensor, approximate: str = "none"
) -> torch.Tensor:
    if approximate == "tanh":
        k = math.sqrt(2.0 / math.pi)
        t = torch.tanh(k * (x + 0.044715 * x * x * x))
        derivative = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x)
    else:
        cdf = 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))
        pdf = torch.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
        derivative = cdf + x * pdf
    return grad_output * derivative


def silu_reference(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(x)


def silu_backward_reference(grad_output: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    s = torch.sigmoid(x)
    return grad_output * s * (1 + x * (1 - s))


def bias_gelu_reference(
    x: torch.Tensor, bias: torch.Tensor, approximate: str = "none"
) -> torch.Tensor:
    return gelu_reference(x + bias, approximate)


def bias_gelu_backward_reference(
    grad_output: torch.Tensor, x: torch.Tensor, bias: torch.Tensor, approximate: str = "none"
) -> tuple[torch.Tensor, torch.Tensor]:
    grad_input = gelu_backward_reference(grad_output, x + bias, approximate)
    # The rows counted explicitly: reshape(-1, 0) is ambiguous for hidden size 0.
    return grad_input, grad_input.reshape(math.prod(x.shape[:-1]), x.shape[-1]).sum(0)


# --- export: ONNX, ExecuTorch and their test calls (fuseops/ops/_export.py) ---


def onnx_translations() -> dict:
    """gelu (both forms) and bias_gelu as ONNX ``Gelu`` (opset 20), silu as
    ``x * Sigmoid(x)``, computed in float32 (float64 for float64)."""
    from ._onnx import cast, dtype_of, gelu_math, op, opmath, silu_math

    def gelu_onnx(input, approximate: str = "none"):
        """``fuseops::gelu``: ONNX ``Gelu`` (erf or tanh form) in float32."""
        dtype = dtype_of(input)
        return cast(gelu_math(cast(input, opmath(dtype)), approximate), dtype)

    def silu_onnx(input):
        """``fuseops::silu``: ``x * Sigmoid(x)`` in float32."""
        dtype = dtype_of(input)
        return cast(silu_math(cast(input, opmath(dtype))), dtype)

    def bias_gelu_onnx(input, bias, approximate: str = "none"):
        """``fuseops::bias_gelu``: ``Gelu(x + bias)``, the sum kept in float32
        as the op keeps it."""
        dtype = dtype_of(input)
        ct = opmath(dtype)
        return cast(gelu_math(op.Add(cast(input, ct), cast(bias, ct)), approximate), dtype)

    ops = torch.ops.fuseops
    return {
        ops.gelu.default: gelu_onnx,
        ops.silu.default: silu_onnx,
        ops.bias_gelu.default: bias_gelu_onnx,
    }


def executorch_decompositions() -> dict:
    """gelu and bias_gelu: ``aten.gelu`` (the erf form) or the tanh form
    written out; silu: ``x * sigmoid(x)``; in float32 (float64 for float64)."""
    from ._executorch import gelu_math, opmath, silu_math

    def gelu_decomposition(input, approximate: str = "none"):
        """``fuseops::gelu``: the erf or tanh form in float32."""
        return gelu_math(input.to(opmath(input.dtype)), approximate, "gelu").to(input.dtype)

    def silu_decomposition(input):
        """``fuseops::silu``: ``x * sigmoid(x)`` in float32."""
        return silu_math(input.to(opmath(input.dtype))).to(input.dtype)

    def bias_gelu_decomposition(input, bias, approximate: str = "none"):
        """``fuseops::bias_gelu``: ``gelu(x + bias)``, the sum kept in float32
        as the op keeps it."""
        ct = opmath(input.dtype)
        y = gelu_math(input.to(ct) + bias.to(ct), approximate, "bias_gelu")
        return y.to(input.dtype)

    ops = torch.ops.fuseops
    return {
        ops.gelu.default: gelu_decomposition,
        ops.silu.default: silu_decomposition,
        ops.bias_gelu.default: bias_gelu_decomposition,
    }


__all__ = ["bias_gelu", "bias_gelu_backward", "gelu", "gelu_backward", "silu", "silu_backward"]
