"""Fused softmax + cross-entropy over the last dimension, its forward/backward
ops, the variant that writes the gradient into the logits, and
linear_cross_entropy (the LM head's projection and cross-entropy without the
[N, V] logits). One op family: linear_cross_entropy runs cross_entropy's row
kernel on chunks of logits computed by GEMMs."""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F


class CrossEntropyOutput(NamedTuple):
    """What :func:`cross_entropy` and :func:`linear_cross_entropy` return when
    one of their ``return_*`` flags is set; a field not asked for is None.

    - ``loss``: the loss, as without the flags (z-loss term included).
    - ``z_loss``: the z-loss term alone, ``z_loss * logsumexp(z)**2`` per
      non-ignored row, reduced as the loss is (``"mean"``: divided by the
      summed class weights of the non-ignored targets, the loss's divisor,
      which is the count of those targets without class weights; ``"sum"``:
      divided by ``normalizer`` when given; ``"none"``: per row, 0 on ignored
      rows), in the loss's dtype; not differentiable (the loss carries its
      gradient).
    - ``token_accuracy``: the fraction of non-ignored rows whose predicted
      class is the target (0-d float32; NaN when every target is ignored).
    - ``predicted_tokens``: the predicted class of every row, the argmax of
      its logits (first index among ties), shape of ``target``, int64. With a
      ``softcap`` it is the argmax of the logits before the cap (the cap is
      monotone: it can only tie values that differ in the logits)."""

    loss: torch.Tensor
    z_loss: Optional[torch.Tensor] = None
    token_accuracy: Optional[torch.Tensor] = None
    predicted_tokens: Optional[torch.Tensor] = None


def _outputs(
    loss: torch.Tensor,
    lse: torch.Tensor,
    predicted: Optional[torch.Tensor],
    target: torch.Tensor,
    weight: Optional[torch.Tensor],
    reduction: str,
    ignore_index: int,
    z_loss: float,
    normalizer: Optional[float],
    return_z_loss: bool,
    return_token_accuracy: bool,
    return_predicted_tokens: bool,
) -> CrossEntropyOutput:
    """The CrossEntropyOutput of a call from its loss, its per-row logsumexp
    (0 on ignored rows) and its predicted classes."""
    valid = target != ignore_index
    z = None
    if return_z_loss:
        rows = (z_loss * lse.detach().square()).reshape(target.shape)
        if reduction == "none":
            z = rows
        elif reduction == "sum":
            z = rows.sum() / normalizer if normalizer is not None else rows.sum()
        else:
            if weight is None:
                divisor = valid.sum()
            else:
                divisor = (weight.to(lse.dtype)[target.long().clamp(min=0)] * valid).sum()
            z = rows.sum() / divisor
        z = z.to(loss.dtype)
    accuracy = None
    if return_token_accuracy:
        assert predicted is not None
        correct = ((predicted == target) & valid).sum()
        accuracy = correct.float() / valid.sum().float()
    tokens = None
    if return_predicted_tokens:
        assert predicted is not None
        tokens = predicted.reshape(target.shape)
    return CrossEntropyOutput(loss, z, accuracy, tokens)


def cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    reduction: str = "mean",
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    softcap: Optional[float] = None,
    *,
    inplace_backward: bool = False,
    return_z_loss: bool = False,
    return_token_accuracy: bool = False,
    return_predicted_tokens: bool = False,
):
    """``F.cross_entropy(logits, target, weight, ignore_index=ignore_index,
    reduction=reduction, label_smoothing=label_smoothing)`` with the classes in
    the **last** dimension: ``logits`` ``[..., V]`` (float32/float64/bfloat16/
    float16, computed in float32), ``target`` ``[...]`` class indices (int64
    or int32). ``mean`` divides by the summed weights of the non-ignored
    targets (NaN if all are ignored), as torch does. Extensions:
    ``z_loss`` adds ``z_loss * logsumexp(z)**2`` to each non-ignored row
    (PaLM's auxiliary loss; not multiplied by the class weight), ``softcap``
    ``c`` uses ``z = c * tanh(logits / c)`` as the logits.

    ``inplace_backward=True`` saves the ``[..., V]`` gradient allocation: the
    forward writes the gradient into ``logits`` (its values are gone after
    the call; nothing else may use them) and the backward scales it there by
    grad_output; that backward runs at most once. Differentiable in
    ``logits`` (not in ``weight``).

    ``return_z_loss``, ``return_token_accuracy``, ``return_predicted_tokens``:
    return a :class:`CrossEntropyOutput` with those fields too (the z-loss
    term from the logsumexp the loss computes; the predicted classes from an
    argmax of ``logits``, before an in-place backward overwrites them).
    ``return_z_loss`` needs ``inplace_backward=False``."""
    ops = torch.ops.fuseops
    options = (weight, reduction, ignore_index, label_smoothing, z_loss, softcap)
    if not (return_z_loss or return_token_accuracy or return_predicted_tokens):
        op = ops.cross_entropy_inplace if inplace_backward else ops.cross_entropy
        return op(logits, target, *options)
    predicted = None
    if return_token_accuracy or return_predicted_tokens:
        with torch.no_grad():
            predicted = logits.argmax(-1)
    if inplace_backward:
        if return_z_loss:
            raise ValueError(
                "fuseops.cross_entropy: return_z_loss=True needs inplace_backward=False (the "
                "in-place op does not keep the logsumexp the z-loss is made of)"
            )
        loss = ops.cross_entropy_inplace(logits, target, *options)
        lse = loss.new_zeros(())
    else:
        loss, lse, _ = ops.cross_entropy_forward(logits, target, *options)
    return _outputs(
        loss,
        lse,
        predicted,
        target,
        weight,
        reduction,
        ignore_index,
        z_loss,
        None,
        return_z_loss,
        return_token_accuracy,
        return_predicted_tokens,
    )


def cross_entropy_inplace(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    reduction: str = "mean",
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    softcap: Optional[float] = None,
) -> torch.Tensor:
    """``cross_entropy(..., inplace_backward=True)``: the loss, with the
    gradient of the loss written into ``logits`` (see :func:`cross_entropy`)."""
    return torch.ops.fuseops.cross_entropy_inplace(
        logits, target, weight, reduction, ignore_index, label_smoothing, z_loss, softcap
    )


def cross_entropy_forward(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    reduction: str = "mean",
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    softcap: Optional[float] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(loss, lse, total_weight)``: the loss of :func:`cross_entropy`, the
    per-row logsumexp of the (softcapped) logits (shape ``target.shape``,
    float32; float64 for float64 logits; 0 on ignored rows) and the summed
    weights of the non-ignored targets (0-d, the mean's divisor), which
    :func:`cross_entropy_backward` takes. Only the loss is differentiable."""
    return torch.ops.fuseops.cross_entropy_forward(
        logits, target, weight, reduction, ignore_index, label_smoothing, z_loss, softcap
    )


def cross_entropy_backward(
    grad_output: torch.Tensor,
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: Optional[torch.Tensor],
    lse: torch.Tensor,
    total_weight: torch.Tensor,
    reduction: str = "mean",
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    softcap: Optional[float] = None,
) -> torch.Tensor:
    """The gradient of :func:`cross_entropy` with respect to ``logits``, in
    one pass: the softmax is recomputed from ``logits`` and ``lse``."""
    return torch.ops.fuseops.cross_entropy_backward(
        grad_output,
        logits,
        target,
        weight,
        lse,
        total_weight,
        reduction,
        ignore_index,
        label_smoothing,
        z_loss,
        softcap,
    )


def linear_cross_entropy(
    input: torch.Tensor,
    linear_weight: torch.Tensor,
    target: torch.Tensor,
    linear_bias: Optional[torch.Tensor] = None,
    weight: Optional[torch.Tensor] = None,
    reduction: str = "mean",
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    softcap: Optional[float] = None,
    normalizer: Optional[float] = None,
    *,
    return_z_loss: bool = False,
    return_token_accuracy: bool = False,
    return_predicted_tokens: bool = False,
):
    """``cross_entropy(F.linear(input, linear_weight, linear_bias), target,
    weight, ...)`` (arguments named as ``F.linear_cross_entropy``) without the
    ``[N, V]`` logits: ``input`` ``[N, H]``, ``linear_weight`` ``[V, H]``,
    ``target`` ``[N]``. Tokens go in chunks whose logits are about 4 times the size
    of ``input``. With ``reduction`` ``"mean"`` or ``"sum"`` the gradients are
    computed in the forward (``linear_weight``'s accumulated in float32) and
    scaled by grad_output in the backward, which runs at most once; with
    ``"none"`` (a loss per token, ``[N]``) the backward recomputes each
    chunk's logits (one GEMM more, any number of backward passes), which also
    makes a per-token weighting ``(loss * token_weight).sum()`` exact; with
    ``"none"`` and a frozen head (``linear_weight`` and ``linear_bias`` not
    requiring gradients, as LoRA leaves an LM head) the forward computes each
    token's input gradient and the backward only scales it (two GEMMs per
    chunk instead of three). With
    ``"sum"``, ``normalizer`` divides loss and gradients (gradient
    accumulation over micro-batches). Every option of :func:`cross_entropy`
    applies. Differentiable in ``input``, ``linear_weight``, ``linear_bias``.

    ``return_z_loss``, ``return_token_accuracy``, ``return_predicted_tokens``:
    return a :class:`CrossEntropyOutput` with those fields too, computed in
    the same pass over the chunks (the predicted classes are the argmax of
    each chunk's logits, taken before the gradient overwrites them)."""
    options = (
        weight,
        reduction,
        ignore_index,
        label_smoothing,
        z_loss,
        softcap,
        normalizer,
    )
    if not (return_z_loss or return_token_accuracy or return_predicted_tokens):
        return torch.ops.fuseops.linear_cross_entropy(
            input, linear_weight, linear_bias, target, *options
        )
    loss, lse, predicted, _ = torch.ops.fuseops.linear_cross_entropy_stats(
        input,
        linear_weight,
        linear_bias,
        target,
        *options,
        return_token_accuracy or return_predicted_tokens,
    )
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
        return_predicted_tokens,
    )


#: linear_cross_entropy_stats is linear_cross_entropy with more outputs: its
#: gradients are that op's backward.
BACKWARD_OPS: dict[str, Optional[str]] = {
    "linear_cross_entropy_stats": "linear_cross_entropy_backward"
}


def linear_cross_entropy_stats(
    input: torch.Tensor,
    linear_weight: torch.Tensor,
    target: torch.Tensor,
    linear_bias: Optional[torch.Tensor] = None,
    weight: Optional[torch.Tensor] = None,
    reduction: str = "mean",
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    softcap: Optional[float] = None,
    normalizer: Optional[float] = None,
    predict: bool = False,
    softmax_stats: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(loss, lse, predicted, softmax_stats)``: the loss of
    :func:`linear_cross_entropy` (differentiable as there), the per-row
    logsumexp of the (softcapped) logits (``[N]`` float32, float64 for float64
    input, 0 on ignored rows), when ``predict`` the argmax of every row's
    logits (``[N]`` int64, the first of equal maxima; empty otherwise), and
    when ``softmax_stats`` three statistics of every row's distribution, of
    ``z = softcap(logits)`` and ``p = softmax(z)``: column 0 the entropy
    ``-sum p log p``, column 1 the mean logit ``sum z / V``, column 2
    ``log sum p**2`` (``[N, 3]`` in ``lse``'s dtype, 0 on ignored rows, not
    differentiable; ``[0, 3]`` otherwise). The statistics cost one more read
    of each chunk's logits (in blocks of rows with float32 temporaries of
    about 16 MiB each). :func:`linear_cross_entropy`'s ``return_*`` flags
    and ``fuseops.trl`` are built on it."""
    return torch.ops.fuseops.linear_cross_entropy_stats(
        input,
        linear_weight,
        linear_bias,
        target,
        weight,
        reduction,
        ignore_index,
        label_smoothing,
        z_loss,
        softcap,
        normalizer,
        predict,
        softmax_stats,
    )


def linear_cross_entropy_forward(
    input: torch.Tensor,
    linear_weight: torch.Tensor,
    target: torch.Tensor,
    linear_bias: Optional[torch.Tensor] = None,
    weight: Optional[torch.Tensor] = None,
    reduction: str = "mean",
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    softcap: Optional[float] = None,
    normalizer: Optional[float] = None,
    predict: bool = False,
    weight_grad: bool = True,
    softmax_stats: bool = False,
) -> tuple[
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
]:
    """``(loss, grad_input, grad_linear_weight, grad_linear_bias, lse,
    predicted, softmax_stats)`` of :func:`linear_cross_entropy` for a
    grad_output of 1 (of ones with ``reduction="none"``: row ``i`` of
    ``grad_input`` is then the gradient of loss ``i`` alone;
    ``grad_linear_bias`` is empty without a bias; both head gradients are
    empty without ``weight_grad``, a frozen head, which saves a GEMM per
    chunk), then ``lse``, ``predicted`` and ``softmax_stats`` as
    :func:`linear_cross_entropy_stats` gives them; not differentiable."""
    return torch.ops.fuseops.linear_cross_entropy_forward(
        input,
        linear_weight,
        linear_bias,
        target,
        weight,
        reduction,
        ignore_index,
        label_smoothing,
        z_loss,
        softcap,
        normalizer,
        predict,
        weight_grad,
        softmax_stats,
    )


def linear_cross_entropy_backward(
    grad_output: torch.Tensor,
    input: torch.Tensor,
    linear_weight: torch.Tensor,
    target: torch.Tensor,
    linear_bias: Optional[torch.Tensor] = None,
    weight: Optional[torch.Tensor] = None,
    reduction: str = "mean",
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    softcap: Optional[float] = None,
    normalizer: Optional[float] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(grad_input, grad_linear_weight, grad_linear_bias)`` of
    :func:`linear_cross_entropy` for ``grad_output`` of the loss's shape
    (``[N]`` with ``reduction="none"``: a weight per token), recomputing the
    logits chunk by chunk (``grad_linear_bias`` is empty without a bias); not
    differentiable."""
    return torch.ops.fuseops.linear_cross_entropy_backward(
        grad_output,
        input,
        linear_weight,
        linear_bias,
        target,
        weight,
        reduction,
        ignore_index,
        label_smoothing,
        z_loss,
        softcap,
        normalizer,
    )


def cross_entropy_reference(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    reduction: str = "mean",
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    softcap: Optional[float] = None,
) -> torch.Tensor:
    # The target may arrive as floats from a harness that widens every input.
    target = target.long()
    if weight is not None:
        weight = weight.to(logits.dtype)
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    flat = logits.reshape(-1, logits.shape[-1])
    loss = F.cross_entropy(
        flat,
        target.reshape(-1),
        weight,
        ignore_index=ignore_index,
        reduction=reduction,
        label_smoothing=label_smoothing,
    )
    if z_loss:
        lse = torch.logsumexp(flat, dim=-1)
        valid = target.reshape(-1) != ignore_index
        z = z_loss * lse.square() * valid
        if reduction == "none":
            loss = loss + z
        elif reduction == "sum":
            loss = loss + z.sum()
        else:
            divisor = valid.sum() if weight is None else weight[target.reshape(-1)[valid]].sum()
            loss = loss + z.sum() / divisor
    return loss.reshape(target.shape) if reduction == "none" else loss


def cross_entropy_inplace_reference(*args) -> torch.Tensor:
    # The loss; the gradient the op leaves in the logits is test_cross_entropy's.
    return cross_entropy_reference(*args)


def linear_cross_entropy_reference(
    input: torch.Tensor,
    linear_weight: torch.Tensor,
    target: torch.Tensor,
    linear_bias: Optional[torch.Tensor] = None,
    weight: Optional[torch.Tensor] = None,
    reduction: str = "mean",
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    softcap: Optional[float] = None,
    normalizer: Optional[float] = None,
) -> torch.Tensor:
    loss = cross_entropy_reference(
        F.linear(input, linear_weight, linear_bias),
        target,
        weight,
        reduction,
        ignore_index,
        label_smoothing,
        z_loss,
        softcap,
    )
    return loss / normalizer if normalizer is not None else loss


# --- export (fuseops/ops/_export.py) ---

NOT_EXPORTED = {
    (
        "cross_entropy",
        "cross_entropy_inplace",
        "linear_cross_entropy",
        "linear_cross_entropy_stats",
    ): "losses (training); an inference graph returns logits",
}


__all__ = [
    "CrossEntropyOutput",
    "cross_entropy",
    "cross_entropy_backward",
    "cross_entropy_forward",
    "cross_entropy_inplace",
    "linear_cross_entropy",
    "linear_cross_entropy_backward",
    "linear_cross_entropy_forward",
    "linear_cross_entropy_stats",
]
