"""Plain-PyTorch reference implementations of every fuseops op.

Tests compare fuseops against these, and the benchmark times them (eager and
under torch.compile) as the peers fuseops must beat. They favour clarity over
speed and compute in the input dtype, as user code would.
"""

from __future__ import annotations

import torch


def relu(x: torch.Tensor) -> torch.Tensor:
    # clamp_min keeps NaN, as torch.relu does.
    return x.clamp_min(0)


def relu_backward(grad_output: torch.Tensor, result: torch.Tensor) -> torch.Tensor:
    # `result <= 0` is False for NaN, so a NaN result passes the gradient on.
    return torch.where(result <= 0, torch.zeros_like(grad_output), grad_output)
