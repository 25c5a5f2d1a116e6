"""fuseops.nn losses: ``CrossEntropyLoss`` and the fused LM head
``LinearCrossEntropyLoss`` (with its plain-torch counterpart)."""

from __future__ import annotations

from typing import Optional

import torch

from ..ops.cross_entropy import cross_entropy, cross_entropy_reference, linear_cross_entropy
from ._replace import _replaces


@_replaces(torch.nn.CrossEntropyLoss)
class CrossEntropyLoss(torch.nn.CrossEntropyLoss):
    """torch.nn.CrossEntropyLoss computed by fuseops.cross_entropy (forward and
    backward), plus ``z_loss``, ``softcap`` and ``inplace_backward`` (see
    fuseops.cross_entropy; ``inplace_backward=True`` overwrites the input
    logits with their gradient). Class indices in the class dimension
    (dimension 1, as in torch; moved last for inputs of more than 2
    dimensions) are fused; probability targets take torch's own path (without
    z_loss or softcap, which they do not support)."""

    def __init__(
        self,
        weight: Optional[torch.Tensor] = None,
        size_average=None,
        ignore_index: int = -100,
        reduce=None,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
        z_loss: float = 0.0,
        softcap: Optional[float] = None,
        inplace_backward: bool = False,
    ) -> None:
        super().__init__(weight, size_average, ignore_index, reduce, reduction, label_smoothing)
        self.z_loss = z_loss
        self.softcap = softcap
        self.inplace_backward = inplace_backward

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        # Instances converted by replace_modules lack the extensions' attributes.
        z_loss = getattr(self, "z_loss", 0.0)
        softcap = getattr(self, "softcap", None)
        if target.is_floating_point():
            if z_loss or softcap is not None:
                raise ValueError(
                    "fuseops.nn.CrossEntropyLoss: z_loss and softcap need class-index targets"
                )
            return super().forward(input, target)
        logits = input.movedim(1, -1) if input.dim() > 2 else input
        return cross_entropy(
            logits,
            target,
            self.weight,
            self.reduction,
            self.ignore_index,
            self.label_smoothing,
            z_loss,
            softcap,
            inplace_backward=getattr(self, "inplace_backward", False),
        )

    def extra_repr(self) -> str:
        return f"z_loss={self.z_loss}, softcap={self.softcap}, inplace_backward={self.inplace_backward}"


class TorchLinearCrossEntropyLoss(torch.nn.Module):
    """An LM head's projection and cross-entropy in plain torch:
    ``forward(input, linear_weight, target, linear_bias=None,
    normalizer=None)`` with ``input`` ``[..., H]``, the output projection's
    ``linear_weight`` ``[V, H]`` (and bias) and ``target`` ``[...]`` forms the
    logits ``F.linear(input, linear_weight, linear_bias)``, upcasts them to
    float32 (as Hugging Face's causal-LM loss does) and takes their
    cross-entropy (``fuseops.reference.cross_entropy``: torch's options plus
    ``z_loss`` and ``softcap``). ``reduction`` is "mean" or "sum";
    ``normalizer`` (with "sum") divides the loss. This is the module a model
    builds to be plain torch and still be found by ``replace_modules``, which
    swaps it for ``LinearCrossEntropyLoss``."""

    def __init__(
        self,
        weight: Optional[torch.Tensor] = None,
        ignore_index: int = -100,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
        z_loss: float = 0.0,
        softcap: Optional[float] = None,
    ) -> None:
        super().__init__()
        self.register_buffer("weight", weight)
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.label_smoothing = label_smoothing
        self.z_loss = z_loss
        self.softcap = softcap

    def forward(
        self,
        input: torch.Tensor,
        linear_weight: torch.Tensor,
        target: torch.Tensor,
        linear_bias: Optional[torch.Tensor] = None,
        normalizer: Optional[float] = None,
    ) -> torch.Tensor:
        logits = torch.nn.functional.linear(input, linear_weight, linear_bias).float()
        weight = None if self.weight is None else self.weight.float()
        loss = cross_entropy_reference(
            logits.reshape(-1, logits.shape[-1]),
            target.reshape(-1),
            weight,
            self.reduction,
            self.ignore_index,
            self.label_smoothing,
            self.z_loss,
            self.softcap,
        )
        return loss / normalizer if normalizer is not None else loss

    def extra_repr(self) -> str:
        return (
            f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, "
            f"label_smoothing={self.label_smoothing}, z_loss={self.z_loss}, "
            f"softcap={self.softcap}"
        )


@_replaces(TorchLinearCrossEntropyLoss)
class LinearCrossEntropyLoss(TorchLinearCrossEntropyLoss):
    """An LM head's projection and cross-entropy in one op,
    ``fuseops.linear_cross_entropy``: ``TorchLinearCrossEntropyLoss`` (same
    constructor and forward) without forming the ``[tokens, V]`` logits; the
    logits' statistics and gradients are computed in float32 whatever the
    input dtype."""

    def forward(
        self,
        input: torch.Tensor,
        linear_weight: torch.Tensor,
        target: torch.Tensor,
        linear_bias: Optional[torch.Tensor] = None,
        normalizer: Optional[float] = None,
    ) -> torch.Tensor:
        return linear_cross_entropy(
            input.reshape(-1, input.shape[-1]),
            linear_weight,
            target.reshape(-1),
            linear_bias,
            self.weight,
            self.reduction,
            self.ignore_index,
            self.label_smoothing,
            self.z_loss,
            self.softcap,
            normalizer,
        )
