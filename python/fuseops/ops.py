"""The public fuseops ops: thin wrappers over ``torch.ops.fuseops``."""

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
