"""fuseops.nn normalization layers: ``LayerNorm``, ``RMSNorm``."""

from __future__ import annotations


import torch

from ..ops.layer_norm import layer_norm
from ..ops.rms_norm import rms_norm
from ._replace import _replaces


@_replaces(torch.nn.LayerNorm, supported=lambda m: len(m.normalized_shape) == 1)
class LayerNorm(torch.nn.LayerNorm):
    """torch.nn.LayerNorm computed by fuseops.layer_norm (forward and backward).

    Normalization over more than the last dimension, or an input whose dtype
    differs from the parameters' (which fuseops.layer_norm rejects), takes
    torch's own path, so the module accepts everything torch.nn.LayerNorm does.
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        params_match = all(p is None or p.dtype == input.dtype for p in (self.weight, self.bias))
        if len(self.normalized_shape) != 1 or not params_match:
            return super().forward(input)
        return layer_norm(input, self.weight, self.bias, self.eps)


@_replaces(torch.nn.RMSNorm, supported=lambda m: len(m.normalized_shape) == 1)
class RMSNorm(torch.nn.RMSNorm):
    """torch.nn.RMSNorm computed by fuseops.rms_norm (forward and backward).

    Normalization over more than the last dimension takes torch's own path,
    so the module accepts everything torch.nn.RMSNorm does.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if len(self.normalized_shape) != 1:
            return super().forward(x)
        return rms_norm(x, self.weight, self.eps)
