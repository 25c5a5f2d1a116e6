"""fuseops.nn activations and gated MLPs: ``GELU``, ``SiLU``, ``SwiGLU`` (and its
plain-torch counterpart ``SwiGLUMLP``), ``GeGLU``."""

from __future__ import annotations

from typing import Optional

import torch

from ..ops.activation import gelu, silu
from ..ops.gated_activation import geglu, swiglu
from ._replace import _replaces


@_replaces(torch.nn.GELU)
class GELU(torch.nn.GELU):
    """torch.nn.GELU computed by fuseops.gelu (forward and backward)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return gelu(input, self.approximate)


@_replaces(torch.nn.SiLU, supported=lambda m: not m.inplace)
class SiLU(torch.nn.SiLU):
    """torch.nn.SiLU computed by fuseops.silu (forward and backward).

    ``inplace=True`` is not fused (replace_modules leaves such modules alone;
    constructed directly, it takes torch's in-place path)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if self.inplace:
            return super().forward(input)
        return silu(input)


class _GatedMLP(torch.nn.Module):
    """Llama-style gated MLP: ``down_proj(act(gate_proj(x)) * up_proj(x))``."""

    def __init__(
        self,
        in_features: int,
        hidden_features: int,
        out_features: Optional[int] = None,
        bias: bool = False,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        out_features = in_features if out_features is None else out_features
        self.gate_proj = torch.nn.Linear(in_features, hidden_features, bias=bias, **factory)
        self.up_proj = torch.nn.Linear(in_features, hidden_features, bias=bias, **factory)
        self.down_proj = torch.nn.Linear(hidden_features, out_features, bias=bias, **factory)


class SwiGLUMLP(_GatedMLP):
    """SwiGLU MLP block in plain torch:
    ``down_proj(F.silu(gate_proj(x)) * up_proj(x))``. torch.nn has no gated
    MLP module, so this is the one a model builds to be plain torch and still
    be found by ``replace_modules``, which swaps it for ``SwiGLU``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


@_replaces(SwiGLUMLP)
class SwiGLU(SwiGLUMLP):
    """SwiGLU MLP block: ``down_proj(silu(gate_proj(x)) * up_proj(x))``, with
    the activation-times-up step fused (parameter names as Llama's
    ``LlamaMLP``, so its checkpoints load)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))


class GeGLU(_GatedMLP):
    """GeGLU MLP block: ``down_proj(gelu(gate_proj(x), approximate) * up_proj(x))``."""

    def __init__(
        self,
        in_features: int,
        hidden_features: int,
        out_features: Optional[int] = None,
        bias: bool = False,
        approximate: str = "none",
        device=None,
        dtype=None,
    ) -> None:
        super().__init__(in_features, hidden_features, out_features, bias, device, dtype)
        if approximate not in ("none", "tanh"):
            raise ValueError(
                f"fuseops.nn.GeGLU: approximate must be 'none' or 'tanh', got {approximate!r}"
            )
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(geglu(self.gate_proj(x), self.up_proj(x), self.approximate))

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"
