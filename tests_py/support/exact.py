"""The activations and their derivatives evaluated elementwise in float64
with IEEE special-value rules (numpy and math.erf, not ATen): the exact math
fuseops' kernels follow, NaN/Inf included. ATen is not the judge of special
values: its answers differ between its own CPU builds (its AVX-512 float32
gelu(+Inf) is NaN, the formula and fuseops say +Inf)."""

from __future__ import annotations

import math

import numpy as np
import torch

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_KAPPA = 0.044715


def _elementwise(f, x: torch.Tensor) -> torch.Tensor:
    values = x.detach().double().cpu().numpy()
    with np.errstate(all="ignore"):
        return torch.from_numpy(np.asarray(f(values), dtype=np.float64))


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


_erf = np.vectorize(math.erf, otypes=[np.float64])


def _value(approximate: str):
    if approximate == "silu":
        return lambda x: x * _sigmoid(x)
    if approximate == "none":
        return lambda x: x * 0.5 * (1.0 + _erf(x / math.sqrt(2.0)))
    # 0.5 (1 + tanh(u)) = sigmoid(2u), without the cancellation for x < 0.
    return lambda x: x * _sigmoid(2.0 * _SQRT_2_OVER_PI * (x + _KAPPA * x**3))


def _derivative(approximate: str):
    if approximate == "silu":
        return lambda x: _sigmoid(x) * (1.0 + x * (1.0 - _sigmoid(x)))
    if approximate == "none":
        return lambda x: (
            0.5 * (1.0 + _erf(x / math.sqrt(2.0)))
            + x * np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
        )

    def tanh_derivative(x):
        s = _sigmoid(2.0 * _SQRT_2_OVER_PI * (x + _KAPPA * x**3))
        return s + 2.0 * x * s * (1.0 - s) * _SQRT_2_OVER_PI * (1.0 + 3.0 * _KAPPA * x * x)

    return tanh_derivative


def activation(x: torch.Tensor, approximate: str) -> torch.Tensor:
    """silu (approximate="silu") or gelu (approximate="none"/"tanh") of x, in float64."""
    return _elementwise(_value(approximate), x)


def activation_derivative(x: torch.Tensor, approximate: str) -> torch.Tensor:
    """d/dx of `activation`, in float64."""
    return _elementwise(_derivative(approximate), x)
