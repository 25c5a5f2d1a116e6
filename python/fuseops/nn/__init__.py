"""Drop-in replacements for ``torch.nn`` modules, backed by fuseops ops.

Each module subclasses its ``torch.nn`` counterpart and only overrides
``forward``: constructor arguments, parameters and ``state_dict`` keys are the
same, so an existing checkpoint loads unchanged. ``replace_modules(model)``
swaps them into an existing model in place. For gated MLPs, which torch.nn
lacks, ``SwiGLUMLP`` is the plain-torch counterpart that ``SwiGLU`` replaces.
The preference losses fused with the LM head (``FusedLinearDPOLoss`` and
its siblings, over ``fuseops.preference``) replace nothing: they hold a
loss's options.
"""

from __future__ import annotations

from ._replace import Replacement, replace_modules
from .activation import GELU, GeGLU, SiLU, SwiGLU, SwiGLUMLP
from .conv import CausalConv1d
from .loss import (
    CrossEntropyLoss,
    FusedLinearJSDLoss,
    LinearCrossEntropyLoss,
    TorchFusedLinearJSDLoss,
    TorchLinearCrossEntropyLoss,
)
from .norm import LayerNorm, RMSNorm
from .preference import (
    FusedLinearCPOLoss,
    FusedLinearDPOLoss,
    FusedLinearGRPOLoss,
    FusedLinearKTOLoss,
    FusedLinearORPOLoss,
    FusedLinearSimPOLoss,
)
from ..quantization import Int4Linear, Int8Linear, Sparse24Linear
from .rope import RotaryEmbedding, TorchRotaryEmbedding

__all__ = [
    "CausalConv1d",
    "CrossEntropyLoss",
    "FusedLinearCPOLoss",
    "FusedLinearDPOLoss",
    "FusedLinearGRPOLoss",
    "FusedLinearJSDLoss",
    "FusedLinearKTOLoss",
    "FusedLinearORPOLoss",
    "FusedLinearSimPOLoss",
    "GELU",
    "GeGLU",
    "Int4Linear",
    "Int8Linear",
    "LayerNorm",
    "LinearCrossEntropyLoss",
    "RMSNorm",
    "Replacement",
    "RotaryEmbedding",
    "SiLU",
    "Sparse24Linear",
    "SwiGLU",
    "SwiGLUMLP",
    "TorchFusedLinearJSDLoss",
    "TorchLinearCrossEntropyLoss",
    "TorchRotaryEmbedding",
    "replace_modules",
]
