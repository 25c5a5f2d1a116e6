"""Distillation losses on logits: the generalized Jensen-Shannon divergence
(TRL's ``GKDTrainer.generalized_jsd_loss``, Liger-Kernel's JSD) and the KL
divergences at its two ends, over the softmaxes of student and teacher
logits, with its forward (returning the backward's row statistics) and
backward ops; and fused_linear_jsd, the same loss of two LM heads' logits
without forming them (Liger-Kernel's FusedLinearJSD), with its forward
(loss and gradients) and recomputing backward ops."""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F


def jsd(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    label: Optional[torch.Tensor] = None,
    beta: float = 0.5,
    temperature: float = 1.0,
    ignore_index: int = -100,
    reduction: str = "batchmean",
) -> torch.Tensor:
    """The generalized JSD of TRL's ``GKDTrainer.generalized_jsd_loss``
    between ``softmax(student_logits / temperature)`` and
    ``softmax(teacher_logits / temperature)`` over the last dimension
    (``[..., V]``, one dtype; computed in float32, float64 for float64): per
    row, ``beta=0`` gives the forward KL(teacher || student), ``beta=1`` the
    reverse KL(student || teacher), and ``0 < beta < 1``
    ``beta KL(teacher || M) + (1 - beta) KL(student || M)`` with
    ``M = beta teacher + (1 - beta) student``. Rows whose ``label`` (``[...]``,
    int64 or int32) is ``ignore_index`` count for nothing. ``reduction``:
    ``"batchmean"`` (sum over the counted rows / their number), ``"sum"``,
    ``"mean"`` (sum / (counted rows * V)), ``"none"`` (one loss per row,
    ``[...]``, 0 on ignored rows); with no counted row ``"batchmean"`` and
    ``"mean"`` give 0 (gradient 0). The loss has the logits' dtype.
    Differentiable in ``student_logits``; a ``teacher_logits`` that requires
    grad is refused (detach it)."""
    return torch.ops.fuseops.jsd(
        student_logits, teacher_logits, label, beta, temperature, ignore_index, reduction
    )


def kl_div(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    label: Optional[torch.Tensor] = None,
    *,
    temperature: float = 1.0,
    ignore_index: int = -100,
    reduction: str = "batchmean",
    reverse: bool = False,
) -> torch.Tensor:
    """The KL divergence KL(teacher || student) of the softmaxes of the
    logits (``reverse=True``: KL(student || teacher)): :func:`jsd` with
    ``beta=0`` (``beta=1``), every other argument as there. Unlike
    ``torch.nn.functional.kl_div``, it takes logits (not log-probabilities)
    in the order (student, teacher)."""
    return torch.ops.fuseops.jsd(
        student_logits,
        teacher_logits,
        label,
        1.0 if reverse else 0.0,
        temperature,
        ignore_index,
        reduction,
    )


def jsd_forward(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    label: Optional[torch.Tensor] = None,
    beta: float = 0.5,
    temperature: float = 1.0,
    ignore_index: int = -100,
    reduction: str = "batchmean",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss, row_stats)``: the loss of :func:`jsd` and, per row of ``V``
    (``[N, 3]``, float32; float64 for float64 logits; zeros on ignored
    rows), the logsumexps of ``student_logits / temperature`` and of
    ``teacher_logits / temperature`` and the student's sum
    ``sum p (log p - log M)`` divided by ``sum p`` as computed (1 up to
    rounding; the division cancels the logsumexp's rounding in the
    gradient), that :func:`jsd_backward` takes. Only the loss
    is differentiable."""
    return torch.ops.fuseops.jsd_forward(
        student_logits, teacher_logits, label, beta, temperature, ignore_index, reduction
    )


def jsd_backward(
    grad_output: torch.Tensor,
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    label: Optional[torch.Tensor],
    row_stats: torch.Tensor,
    beta: float = 0.5,
    temperature: float = 1.0,
    ignore_index: int = -100,
    reduction: str = "batchmean",
) -> torch.Tensor:
    """The gradient of :func:`jsd` with respect to ``student_logits`` for
    ``grad_output`` of the loss's shape, in one pass from
    :func:`jsd_forward`'s ``row_stats``; not differentiable."""
    return torch.ops.fuseops.jsd_backward(
        grad_output,
        student_logits,
        teacher_logits,
        label,
        row_stats,
        beta,
        temperature,
        ignore_index,
        reduction,
    )


def _check_rows_shape(name: str, shape: torch.Size, rows_shape: torch.Size) -> None:
    if shape != rows_shape:
        raise RuntimeError(
            f"fuseops::fused_linear_jsd: argument '{name}' must have the rows' shape "
            f"{list(rows_shape)} (that of 'student_input' without its last dimension), "
            f"got {list(shape)}"
        )


def fused_linear_jsd(
    student_input: torch.Tensor,
    student_weight: torch.Tensor,
    teacher_input: torch.Tensor,
    teacher_weight: torch.Tensor,
    label: Optional[torch.Tensor] = None,
    beta: float = 0.5,
    temperature: float = 1.0,
    ignore_index: int = -100,
    reduction: str = "batchmean",
) -> torch.Tensor:
    """:func:`jsd` of ``F.linear(student_input, student_weight)`` and
    ``F.linear(teacher_input, teacher_weight)`` (Liger-Kernel's
    FusedLinearJSD) without the ``[N, V]`` logits: ``student_input``
    ``[N, Hs]`` (or ``[B, T, Hs]``, flattened), ``student_weight`` ``[V, Hs]``,
    ``teacher_input`` ``[N, Ht]``, ``teacher_weight`` ``[V, Ht]``, one dtype;
    ``label``, ``beta``, ``temperature``, ``ignore_index`` and ``reduction``
    as in :func:`jsd` (``"none"``: a loss per row, of the inputs' leading
    shape). Rows go in chunks whose two logits take about four times the
    memory of ``student_input`` each, so the
    memory beyond inputs and gradients is O(chunk x V). Differentiable in
    ``student_input`` and ``student_weight`` (whose gradient accumulates in
    float32); with ``"batchmean"``, ``"sum"`` or ``"mean"`` the gradients
    are computed in the forward and scaled by grad_output in the backward,
    which runs at most once; with ``"none"`` the backward recomputes the
    logits. A teacher input or weight that requires grad is refused."""
    # [B, T, H] hidden states as the op's [N, H] rows (and [B, T] labels as
    # [N]); anything else goes to the op as given, for it to check.
    rows_shape = None
    if isinstance(student_input, torch.Tensor) and student_input.dim() > 2:
        rows_shape = student_input.shape[:-1]
        student_input = student_input.reshape(-1, student_input.shape[-1])
        if isinstance(teacher_input, torch.Tensor):
            _check_rows_shape("teacher_input", teacher_input.shape[:-1], rows_shape)
            teacher_input = teacher_input.reshape(-1, teacher_input.shape[-1])
        if isinstance(label, torch.Tensor):
            _check_rows_shape("label", label.shape, rows_shape)
            label = label.reshape(-1)
    loss = torch.ops.fuseops.fused_linear_jsd(
        student_input,
        student_weight,
        teacher_input,
        teacher_weight,
        label,
        beta,
        temperature,
        ignore_index,
        reduction,
    )
    return loss.reshape(rows_shape) if rows_shape is not None and reduction == "none" else loss


def fused_linear_jsd_forward(
    student_input: torch.Tensor,
    student_weight: torch.Tensor,
    teacher_input: torch.Tensor,
    teacher_weight: torch.Tensor,
    label: Optional[torch.Tensor] = None,
    beta: float = 0.5,
    temperature: float = 1.0,
    ignore_index: int = -100,
    reduction: str = "batchmean",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(loss, grad_student_input, grad_student_weight)`` of
    :func:`fused_linear_jsd` (``[N, H]`` inputs) for a grad_output of 1 (of
    ones with ``reduction="none"``); not differentiable."""
    return torch.ops.fuseops.fused_linear_jsd_forward(
        student_input,
        student_weight,
        teacher_input,
        teacher_weight,
        label,
        beta,
        temperature,
        ignore_index,
        reduction,
    )


def fused_linear_jsd_backward(
    grad_output: torch.Tensor,
    student_input: torch.Tensor,
    student_weight: torch.Tensor,
    teacher_input: torch.Tensor,
    teacher_weight: torch.Tensor,
    label: Optional[torch.Tensor],
    beta: float = 0.5,
    temperature: float = 1.0,
    ignore_index: int = -100,
    reduction: str = "batchmean",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(grad_student_input, grad_student_weight)`` of
    :func:`fused_linear_jsd` (``[N, H]`` inputs) for ``grad_output`` of the
    loss's shape, recomputing the logits chunk by chunk; not
    differentiable."""
    return torch.ops.fuseops.fused_linear_jsd_backward(
        grad_output,
        student_input,
        student_weight,
        teacher_input,
        teacher_weight,
        label,
        beta,
        temperature,
        ignore_index,
        reduction,
    )


def jsd_reference(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    label: Optional[torch.Tensor] = None,
    beta: float = 0.5,
    temperature: float = 1.0,
    ignore_index: int = -100,
    reduction: str = "batchmean",
) -> torch.Tensor:
    dtype = student_logits.dtype
    # float32 math for bfloat16/float16, as the op.
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    s = torch.log_softmax(student_logits.to(wide) / temperature, -1)
    t = torch.log_softmax(teacher_logits.to(wide) / temperature, -1)

    def weighted(log_prob, diff):
        # p * diff, 0 where p is 0 (the limit of p log p: -Inf logits).
        prob = log_prob.exp()
        return torch.where(prob == 0, torch.zeros_like(prob), prob * diff)

    if beta == 0:
        rows = weighted(t, t - s).sum(-1)
    elif beta == 1:
        rows = weighted(s, s - t).sum(-1)
    else:
        m = torch.logaddexp(t + math.log(beta), s + math.log1p(-beta))
        rows = beta * weighted(t, t - m).sum(-1) + (1 - beta) * weighted(s, s - m).sum(-1)
    if label is not None:
        # The label may arrive as floats from a harness that widens every input.
        valid = label.long() != ignore_index
        rows = torch.where(valid, rows, torch.zeros_like(rows))
        counted = valid.sum().clamp_min(1).to(wide)
    else:
        counted = torch.tensor(max(rows.numel(), 1), dtype=wide)
    if reduction == "none":
        return rows.to(dtype)
    total = rows.sum()
    if reduction == "sum":
        return total.to(dtype)
    if reduction not in ("mean", "batchmean"):
        raise ValueError(f"jsd_reference: unknown reduction {reduction!r}")
    divisor = counted * student_logits.shape[-1] if reduction == "mean" else counted
    return (total / divisor).to(dtype)


def fused_linear_jsd_reference(
    student_input: torch.Tensor,
    student_weight: torch.Tensor,
    teacher_input: torch.Tensor,
    teacher_weight: torch.Tensor,
    label: Optional[torch.Tensor] = None,
    beta: float = 0.5,
    temperature: float = 1.0,
    ignore_index: int = -100,
    reduction: str = "batchmean",
) -> torch.Tensor:
    # Both logits materialised, then the loss: what the op replaces.
    return jsd_reference(
        F.linear(student_input, student_weight),
        F.linear(teacher_input, teacher_weight),
        label,
        beta,
        temperature,
        ignore_index,
        reduction,
    )


# --- export (fuseops/ops/_export.py) ---

NOT_EXPORTED = {
    ("jsd", "fused_linear_jsd"): "losses (distillation training); an inference graph returns logits"
}


#: Ops whose results depend on the thread count (python/README.md, "Threads
#: and determinism"): fused_linear_jsd's chunks are ATen's matrix products,
#: which split their sums by the threads for a few rows of a long vocabulary.
THREAD_COUNT_DEPENDENT = ("fused_linear_jsd",)


__all__ = [
    "fused_linear_jsd",
    "fused_linear_jsd_backward",
    "fused_linear_jsd_forward",
    "jsd",
    "jsd_backward",
    "jsd_forward",
    "kl_div",
]
