"""fuseops.nn causal depthwise convolution: ``CausalConv1d``."""

from __future__ import annotations

from typing import Optional

import torch

from ..ops.causal_conv1d import causal_conv1d


class CausalConv1d(torch.nn.Conv1d):
    """Mamba's depthwise causal convolution, computed by fuseops.causal_conv1d
    (forward and backward): ``CausalConv1d(dim, width, bias=True,
    activation=None | "silu")``, ``forward(x, initial_states=None)`` with x
    of shape ``(batch, dim, seqlen)`` (contiguous or channel-last) returns
    ``(batch, dim, seqlen)``.

    Its parameters are those of the ``torch.nn.Conv1d(dim, dim, width,
    groups=dim, padding=width - 1, bias=bias)`` that Mamba builds (weight
    ``(dim, 1, width)``, same initialisation and ``state_dict`` keys), so a
    Mamba block's ``conv1d`` weights load unchanged. Unlike that module,
    whose output has ``seqlen + width - 1`` steps that Mamba slices to
    ``seqlen``, the result is already causal and ``seqlen`` long, so
    ``replace_modules`` does not swap plain ``Conv1d`` modules for it.
    """

    def __init__(
        self,
        dim: int,
        width: int = 4,
        bias: bool = True,
        activation: Optional[str] = None,
        device=None,
        dtype=None,
    ) -> None:
        if activation not in (None, "silu", "swish"):
            raise ValueError(
                f"fuseops.nn.CausalConv1d: activation must be None, 'silu' or 'swish', got {activation!r}"
            )
        super().__init__(
            dim, dim, width, groups=dim, padding=width - 1, bias=bias, device=device, dtype=dtype
        )
        self.activation = activation

    def forward(
        self, x: torch.Tensor, initial_states: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        return causal_conv1d(
            x, self.weight.squeeze(1), self.bias, initial_states, activation=self.activation
        )

    def extra_repr(self) -> str:
        return super().extra_repr() + f", activation={self.activation!r}"
