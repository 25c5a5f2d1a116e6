"""fuseops.nn losses: ``CrossEntropyLoss``, the fused LM head
``LinearCrossEntropyLoss`` and the fused distillation loss of two LM heads
``FusedLinearJSDLoss`` (each fused one with its plain-torch counterpart)."""

from __future__ import annotations

from typing import Optional

import torch

from ..ops.cross_entropy import (
    CrossEntropyOutput,
    _outputs,
    cross_entropy,
    cross_entropy_reference,
    linear_cross_entropy,
)
from ..ops.jsd import fused_linear_jsd, fused_linear_jsd_reference
from ._replace import _replaces


@_replaces(torch.nn.CrossEntropyLoss)
class CrossEntropyLoss(torch.nn.CrossEntropyLoss):
    """torch.nn.CrossEntropyLoss computed by fuseops.cross_entropy (forward and
    backward), plus ``z_loss``, ``softcap`` and ``inplace_backward`` (see
    fuseops.cross_entropy; ``inplace_backward=True`` overwrites the input
    logits with their gradient). Class indices in the class dimension
    (dimension 1, as in torch; moved last for inputs of more than 2
    dimensions) are fused; probability targets take torch's own path (without
    z_loss or softcap, which they do not support). ``return_z_loss`` and
    ``return_token_accuracy`` make the forward return a
    ``fuseops.CrossEntropyOutput`` (see fuseops.cross_entropy)."""

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
        return_z_loss: bool = False,
        return_token_accuracy: bool = False,
    ) -> None:
        super().__init__(weight, size_average, ignore_index, reduce, reduction, label_smoothing)
        self.z_loss = z_loss
        self.softcap = softcap
        self.inplace_backward = inplace_backward
        self.return_z_loss = return_z_loss
        self.return_token_accuracy = return_token_accuracy

    def forward(self, input: torch.Tensor, target: torch.Tensor):
        # Instances converted by replace_modules lack the extensions' attributes.
        z_loss = getattr(self, "z_loss", 0.0)
        softcap = getattr(self, "softcap", None)
        if target.is_floating_point():
            if z_loss or softcap is not None or _flags(self):
                raise ValueError(
                    "fuseops.nn.CrossEntropyLoss: z_loss, softcap, return_z_loss and "
                    "return_token_accuracy need class-index targets"
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
            return_z_loss=_flags(self)[0],
            return_token_accuracy=_flags(self)[1],
        )

    def extra_repr(self) -> str:
        return (
            f"z_loss={self.z_loss}, softcap={self.softcap}, "
            f"inplace_backward={self.inplace_backward}{_flags_repr(self)}"
        )


def _flags(module: torch.nn.Module) -> tuple[bool, bool]:
    """(return_z_loss, return_token_accuracy); False on instances converted by
    replace_modules, which lack the attributes."""
    return (
        getattr(module, "return_z_loss", False),
        getattr(module, "return_token_accuracy", False),
    )


def _flags_repr(module: torch.nn.Module) -> str:
    z, accuracy = _flags(module)
    return (", return_z_loss=True" if z else "") + (
        ", return_token_accuracy=True" if accuracy else ""
    )


def _torch_linear_cross_entropy(
    input: torch.Tensor,
    linear_weight: torch.Tensor,
    target: torch.Tensor,
    linear_bias: Optional[torch.Tensor],
    weight: Optional[torch.Tensor],
    reduction: str,
    ignore_index: int,
    label_smoothing: float,
    z_loss: float,
    softcap: Optional[float],
    normalizer: Optional[float],
    *,
    return_z_loss: bool,
    return_token_accuracy: bool,
):
    """``linear_cross_entropy`` of ``[N, H]`` rows and ``[N]`` targets in
    plain torch: the logits formed and upcast to float32, their
    ``fuseops.reference.cross_entropy``, and the z-loss term and token
    accuracy from them."""
    logits = torch.nn.functional.linear(input, linear_weight, linear_bias).float()
    weight = None if weight is None else weight.float()
    loss = cross_entropy_reference(
        logits, target, weight, reduction, ignore_index, label_smoothing, z_loss, softcap
    )
    loss = loss / normalizer if normalizer is not None else loss
    if not (return_z_loss or return_token_accuracy):
        return loss
    with torch.no_grad():
        capped = logits if softcap is None else softcap * torch.tanh(logits / softcap)
        lse = torch.logsumexp(capped, -1) * (target != ignore_index)
        predicted = logits.argmax(-1)
    return _outputs(
        loss,
        lse,
        predicted,
        target,
        weight,
        reduction,
        ignore_index,
        z_loss,
        normalizer,
        return_z_loss,
        return_token_accuracy,
        False,
    )


class TorchLinearCrossEntropyLoss(torch.nn.Module):
    """An LM head's projection and cross-entropy in plain torch:
    ``forward(input, linear_weight, target, linear_bias=None,
    normalizer=None)`` with ``input`` ``[..., H]``, the output projection's
    ``linear_weight`` ``[V, H]`` (and bias) and ``target`` ``[...]`` forms the
    logits ``F.linear(input, linear_weight, linear_bias)``, upcasts them to
    float32 (as Hugging Face's causal-LM loss does) and takes their
    cross-entropy (``fuseops.reference.cross_entropy``: torch's options plus
    ``z_loss`` and ``softcap``). ``reduction`` is "mean", "sum" or "none"
    (a loss per token, of ``target``'s shape); ``normalizer`` (with "sum")
    divides the loss. ``return_z_loss`` and ``return_token_accuracy`` make
    the forward return a ``fuseops.CrossEntropyOutput`` with the z-loss term
    and the token accuracy (see fuseops.linear_cross_entropy). This is the module a model
    builds to be plain torch and still be found by ``replace_modules``, which
    swaps it for ``LinearCrossEntropyLoss``."""

    #: The loss of the flattened rows (``linear_cross_entropy``'s arguments).
    _loss = staticmethod(_torch_linear_cross_entropy)

    def __init__(
        self,
        weight: Optional[torch.Tensor] = None,
        ignore_index: int = -100,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
        z_loss: float = 0.0,
        softcap: Optional[float] = None,
        return_z_loss: bool = False,
        return_token_accuracy: bool = False,
    ) -> None:
        super().__init__()
        self.register_buffer("weight", weight)
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.label_smoothing = label_smoothing
        self.z_loss = z_loss
        self.softcap = softcap
        self.return_z_loss = return_z_loss
        self.return_token_accuracy = return_token_accuracy

    def forward(
        self,
        input: torch.Tensor,
        linear_weight: torch.Tensor,
        target: torch.Tensor,
        linear_bias: Optional[torch.Tensor] = None,
        normalizer: Optional[float] = None,
    ):
        return_z_loss, return_accuracy = _flags(self)
        result = self._loss(
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
            return_z_loss=return_z_loss,
            return_token_accuracy=return_accuracy,
        )
        if isinstance(result, CrossEntropyOutput):
            if self.reduction == "none":
                result = result._replace(loss=result.loss.reshape(target.shape))
            return _reshaped(result, target.shape)
        return result.reshape(target.shape) if self.reduction == "none" else result

    def extra_repr(self) -> str:
        return (
            f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, "
            f"label_smoothing={self.label_smoothing}, z_loss={self.z_loss}, "
            f"softcap={self.softcap}{_flags_repr(self)}"
        )


def _reshaped(output: CrossEntropyOutput, shape: torch.Size) -> CrossEntropyOutput:
    """A per-token z-loss term back in the target's shape."""
    if output.z_loss is not None and output.z_loss.dim() > 0:
        return output._replace(z_loss=output.z_loss.reshape(shape))
    return output


@_replaces(TorchLinearCrossEntropyLoss)
class LinearCrossEntropyLoss(TorchLinearCrossEntropyLoss):
    """An LM head's projection and cross-entropy in one op,
    ``fuseops.linear_cross_entropy``: ``TorchLinearCrossEntropyLoss`` (same
    constructor and forward) without forming the ``[tokens, V]`` logits; the
    logits' statistics and gradients are computed in float32 whatever the
    input dtype."""

    _loss = staticmethod(linear_cross_entropy)


class TorchFusedLinearJSDLoss(torch.nn.Module):
    """The distillation loss of a student's and a teacher's LM heads in plain
    torch: ``forward(student_input, student_weight, teacher_input,
    teacher_weight, label=None)`` with hidden states ``[..., Hs]`` and
    ``[..., Ht]`` and head weights ``[V, Hs]`` and ``[V, Ht]`` forms both
    logits with ``F.linear`` and takes their generalized JSD
    (``fuseops.reference.jsd``, TRL's ``GKDTrainer.generalized_jsd_loss``:
    ``beta`` 0 and 1 the forward and reverse KL, ``temperature``, rows whose
    ``label`` is ``ignore_index`` left out, ``reduction`` "batchmean", "sum",
    "mean" or "none"). This is the module a model builds to be plain torch
    and still be found by ``replace_modules``, which swaps it for
    ``FusedLinearJSDLoss``."""

    #: The loss of both heads (``fused_linear_jsd``'s arguments).
    _loss = staticmethod(fused_linear_jsd_reference)

    def __init__(
        self,
        beta: float = 0.5,
        temperature: float = 1.0,
        ignore_index: int = -100,
        reduction: str = "batchmean",
    ) -> None:
        super().__init__()
        self.beta = beta
        self.temperature = temperature
        self.ignore_index = ignore_index
        self.reduction = reduction

    def forward(
        self,
        student_input: torch.Tensor,
        student_weight: torch.Tensor,
        teacher_input: torch.Tensor,
        teacher_weight: torch.Tensor,
        label: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        return self._loss(
            student_input,
            student_weight,
            teacher_input,
            teacher_weight,
            label,
            self.beta,
            self.temperature,
            self.ignore_index,
            self.reduction,
        )


@_replaces(TorchFusedLinearJSDLoss)
class FusedLinearJSDLoss(TorchFusedLinearJSDLoss):
    """Liger-Kernel's ``LigerFusedLinearJSD`` on fuseops:
    ``TorchFusedLinearJSDLoss`` (same constructor and forward) in one op,
    ``fuseops.fused_linear_jsd``, without forming either ``[tokens, V]``
    logits; statistics and gradients computed in float32 whatever the input
    dtype. The teacher's tensors must not require grad (run the teacher
    under ``torch.no_grad()``)."""

    _loss = staticmethod(fused_linear_jsd)
