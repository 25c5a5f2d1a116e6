"""Plain-PyTorch reference implementations of every fuseops op.

Tests compare fuseops against these, and the benchmark times them (eager and
under torch.compile) as the peers fuseops must beat. They favour clarity over
speed and compute in the input dtype, as user code would.
"""

from __future__ import annotations

import math
from typing import Optional

import torch


def relu(x: torch.Tensor) -> torch.Tensor:
    # clamp_min keeps NaN, as torch.relu does.
    return x.clamp_min(0)


def relu_backward(grad_output: torch.Tensor, result: torch.Tensor) -> torch.Tensor:
    # `result <= 0` is False for NaN, so a NaN result passes the gradient on.
    return torch.where(result <= 0, torch.zeros_like(grad_output), grad_output)


def _rms_norm_eps(x: torch.Tensor, eps: Optional[float]) -> float:
    # F.rms_norm's default: the machine epsilon of the computation dtype.
    if eps is not None:
        return eps
    return torch.finfo(torch.float64 if x.dtype == torch.float64 else torch.float32).eps


def rms_norm(
    x: torch.Tensor, weight: Optional[torch.Tensor] = None, eps: Optional[float] = None
) -> torch.Tensor:
    # As Llama-style model code writes it: bfloat16/float16 are upcast to
    # float32 for the mean of squares (in half precision it loses the row).
    xf = x.float() if x.dtype in (torch.bfloat16, torch.float16) else x
    y = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + _rms_norm_eps(x, eps))
    if weight is not None:
        y = y * weight
    return y.to(x.dtype)


def rms_norm_backward(
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
        grad_weight = (g * x_hat).reshape(-1, x.shape[-1]).sum(0).to(weight.dtype)
    return grad_input.to(x.dtype), grad_weight


def fused_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    eps: Optional[float] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual)."""
    new_residual = x + residual
    return rms_norm(new_residual, weight, eps), new_residual


def layer_norm(
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


def layer_norm_backward(
    grad_output: torch.Tensor,
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    mean: torch.Tensor,
    rstd: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # With x_hat = (x - mean) * rstd and g = grad_output * weight:
    # grad_input = rstd * (g - mean(g) - x_hat * mean(g * x_hat)).
    x_hat = (x - mean.unsqueeze(-1)) * rstd.unsqueeze(-1)
    g = grad_output * weight if weight is not None else grad_output
    grad_input = rstd.unsqueeze(-1) * (
        g - g.mean(dim=-1, keepdim=True) - x_hat * (g * x_hat).mean(dim=-1, keepdim=True)
    )
    rows = tuple(range(x.dim() - 1))
    grad_weight = (grad_output * x_hat).sum(dim=rows) if rows else grad_output * x_hat
    grad_bias = grad_output.sum(dim=rows) if rows else grad_output.clone()
    return grad_input.to(x.dtype), grad_weight.to(x.dtype), grad_bias.to(x.dtype)


def gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    # The textbook formulas, as model code writes them (e.g. "gelu_new").
    if approximate == "tanh":
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))
        return 0.5 * x * (1.0 + torch.tanh(inner))
    if approximate != "none":
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def gelu_backward(
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


def silu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(x)


def silu_backward(grad_output: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    s = torch.sigmoid(x)
    return grad_output * s * (1 + x * (1 - s))


def bias_gelu(x: torch.Tensor, bias: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    return gelu(x + bias, approximate)


def bias_gelu_backward(
    grad_output: torch.Tensor, x: torch.Tensor, bias: torch.Tensor, approximate: str = "none"
) -> tuple[torch.Tensor, torch.Tensor]:
    grad_input = gelu_backward(grad_output, x + bias, approximate)
    return grad_input, grad_input.reshape(-1, x.shape[-1]).sum(0)


def _split_packed(gate: torch.Tensor, up: Optional[torch.Tensor]):
    # A packed [..., 2*H] input holds the gate first, then up.
    return gate.chunk(2, dim=-1) if up is None else (gate, up)


def swiglu(gate: torch.Tensor, up: Optional[torch.Tensor] = None) -> torch.Tensor:
    # As Llama's MLP writes it: F.silu(gate_proj(x)) * up_proj(x).
    gate, up = _split_packed(gate, up)
    return torch.nn.functional.silu(gate) * up


def geglu(
    gate: torch.Tensor, up: Optional[torch.Tensor] = None, approximate: str = "none"
) -> torch.Tensor:
    gate, up = _split_packed(gate, up)
    return torch.nn.functional.gelu(gate, approximate=approximate) * up
