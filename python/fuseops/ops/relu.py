"""relu: ``max(x, 0)`` and its backward."""

from __future__ import annotations

from typing import Optional

import torch

from ._out import call


def relu(x: torch.Tensor, *, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``max(x, 0)`` elementwise (NaN propagates), differentiable.

    With ``out=`` the result is written into a preallocated tensor (resized if
    its shape differs); like every out= op, that form is not differentiable.
    """
    return call(torch.ops.fuseops.relu, x, out=out)


def relu_backward(
    grad_output: torch.Tensor, result: torch.Tensor, *, out: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """Gradient of relu given its output: ``grad_output`` where ``result > 0``.

    ``out=`` may be ``grad_output`` itself (computed in place), as relu's
    autograd does with a gradient nothing else refers to.
    """
    return call(torch.ops.fuseops.relu_backward, grad_output, result, out=out)


def relu_reference(x: torch.Tensor) -> torch.Tensor:
    # clamp_min keeps NaN, as torch.relu does.
    return x.clamp_min(0)


def relu_backward_reference(grad_output: torch.Tensor, result: torch.Tensor) -> torch.Tensor:
    # `result <= 0` is False for NaN, so a NaN result passes the gradient on.
    return torch.where(result <= 0, torch.zeros_like(grad_output), grad_output)


# --- export: ONNX, ExecuTorch and their test calls (fuseops/ops/_export.py) ---


def onnx_translations() -> dict:
    """relu as ONNX ``Relu``."""
    from ._onnx import cast, dtype_of, op, opmath

    def relu_onnx(input):
        """``fuseops::relu``: ``Relu`` (exact in every dtype; computed in
        float32 for bfloat16/float16, which ONNX Runtime's Relu does not
        take)."""
        dtype = dtype_of(input)
        return cast(op.Relu(cast(input, opmath(dtype))), dtype)

    return {torch.ops.fuseops.relu.default: relu_onnx}


def executorch_decompositions() -> dict:
    """relu as ``where(x < 0, 0, x)``."""

    def relu_decomposition(input):
        """``fuseops::relu``: ``where(x < 0, 0, x)`` (exact in every dtype;
        NaN stays NaN, as the op's, where XNNPACK's float16 clamp returns 0)."""
        return torch.where(input < 0, torch.zeros_like(input), input)

    return {torch.ops.fuseops.relu.default: relu_decomposition}


__all__ = ["relu", "relu_backward"]
