"""Distillation losses on logits: the generalized Jensen-Shannon divergence
(TRL's ``GKDTrainer.generalized_jsd_loss``, Liger-Kernel's JSD) and the KL
divergences at its two ends, over the softmaxes of student and teacher
logits, with its forward (returning the backward's row statistics) and
backward ops."""

from __future__ import annotations

import math
from typing import Optional

import torch

from ._sample import DTYPES, Sample, tensor


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
    ``sum p (log p - log M)`` that :func:`jsd_backward` takes. Only the loss
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


def _student_teacher(rows, vocab, dtype, device, gen):
    student = torch.randn(rows, vocab, dtype=torch.float32, device=device, generator=gen) * 2
    teacher = torch.randn(rows, vocab, dtype=torch.float32, device=device, generator=gen) * 2
    return student.to(dtype), teacher.to(dtype)


def bench_cases():
    from ._bench_case import Case, Traffic

    return [
        Case(
            "jsd",
            "jsd",
            "jsd",
            _student_teacher,
            forward_traffic=Traffic(rows=2),  # student and teacher logits in
            backward_traffic=Traffic(rows=3),  # both in, the student's gradient out
            has_out=False,
            differentiable=(0,),
            # Rows of a 32000-token vocabulary (Llama 2's).
            shapes={
                "quick": [(256, 32000)],
                "standard": [(1024, 32000)],
                "full": [(4096, 32000)],
            },
            description="generalized JSD (beta 0.5) of student and teacher logits, batchmean",
        ),
    ]


def samples(device) -> list[Sample]:
    ops = torch.ops.fuseops
    op = ops.jsd.default

    def t(shape, dtype=torch.float32, layout="contiguous", grad=False, scale=2.0):
        return tensor(shape, dtype, device, layout, grad, scale)

    def label(shape, vocab, ignore=True):
        lbl = torch.randint(0, vocab, shape, device=device)
        if ignore and lbl.numel() > 1:
            lbl.view(-1)[1] = -100
        return lbl

    x, y, lb = t((6, 10)), t((6, 10)), label((6,), 10)
    _, row_stats = jsd_forward(x, y, lb, 0.5, 2.0, -100, "batchmean")
    student = t((6, 10), grad=True)
    result = [
        Sample(op, (x, y, lb, 0.5, 1.0, -100, "batchmean"), jsd),
        Sample(op, (t((6, 10), grad=True), y, lb, 0.1, 2.0, -100, "batchmean"), jsd),
        Sample(
            op,
            (
                t((6, 10), torch.float64, "transposed", True),
                y.double(),
                None,
                0.0,
                1.0,
                -100,
                "sum",
            ),
            jsd,
        ),
        Sample(
            op,
            (
                t((2, 3, 17), torch.bfloat16, "sliced", True),
                t((2, 3, 17), torch.bfloat16),
                label((2, 3), 17),
                1.0,
                0.5,
                -100,
                "none",
            ),
            jsd,
        ),
        Sample(
            op,
            (
                t((4, 9), torch.float16, grad=True),
                t((4, 9), torch.float16, "transposed"),
                label((4,), 9, ignore=False).int(),
                0.5,
                1.0,
                2,
                "mean",
            ),
            jsd,
        ),
        Sample(op, (t((0, 9), grad=True), t((0, 9)), None, 0.5, 1.0, -100, "batchmean"), jsd),
        Sample(
            op,
            (t((5, 8), layout="expanded", grad=True), t((5, 8)), None, 0.5, 1.0, -100, "sum"),
            jsd,
        ),
        Sample(
            op,
            (student, y, lb, 0.0, 1.0, -100, "batchmean"),
            kl_div,
            wrapper_args=(student, y, lb),
        ),
        Sample(ops.jsd_forward.default, (x, y, lb, 0.5, 2.0, -100, "batchmean"), jsd_forward),
        Sample(
            ops.jsd_forward.default,
            (t((6, 10), grad=True), y, None, 1.0, 1.0, -100, "none"),
            jsd_forward,
        ),
        Sample(
            ops.jsd_backward.default,
            (torch.randn((), device=device), x, y, lb, row_stats, 0.5, 2.0, -100, "batchmean"),
            jsd_backward,
        ),
    ]
    # Every CPU build on rows with a vector tail, several tasks per thread,
    # each end of beta and the mixture.
    for dtype in DTYPES:
        for shape, beta in [((3, 7), 0.5), ((37, 1000), 0.0), ((5, 4099), 1.0), ((37, 1000), 0.1)]:
            for reduction in ("batchmean", "none"):
                result.append(
                    Sample(
                        op,
                        (
                            t(shape, dtype, grad=True),
                            t(shape, dtype),
                            label(shape[:1], shape[1]),
                            beta,
                            2.0 if beta == 0.1 else 1.0,
                            -100,
                            reduction,
                        ),
                        jsd,
                        large=True,
                    )
                )
    return result


def fuzz(d) -> Sample:
    """One random call for tests_py/test_fuzz.py (``d``: fuseops.ops._fuzz.Draw)."""
    vocab = d.int(1, 12)
    shape = d.shape(0, 2, hi=6) + (vocab,)
    student = d.tensor(shape, scale=2.0, grad=True)
    teacher = d.tensor(shape, student.dtype, scale=2.0)
    label = d.maybe(lambda: d.integers(shape[:-1], 0, vocab, d.choice((torch.int64, torch.int32))))
    args = (
        student,
        teacher,
        label,
        d.choice((0.0, 0.5, 1.0, 0.1)),
        d.choice((1.0, 2.0, 0.5)),
        d.choice((-100, 0)),
        d.choice(("batchmean", "sum", "mean", "none")),
    )
    return Sample(torch.ops.fuseops.jsd.default, args, jsd)


# --- export (fuseops/ops/_export.py) ---

NOT_EXPORTED = {("jsd",): "a loss (distillation training); an inference graph returns logits"}


def autocast_cases() -> list:
    """jsd under CPU autocast against TRL's generalized JSD (GKDTrainer.generalized_jsd_loss, beta 0.5) spelled with torch's kl_div, which autocast runs in float32; a bfloat16 student with a float32 teacher included (tests_py/test_autocast.py)."""
    import torch.nn.functional as F

    from ._autocast import D, LOW, AutocastCase, rand

    def jsd_torch(student, teacher, beta=0.5):
        s, t = F.log_softmax(student, -1), F.log_softmax(teacher, -1)
        m = torch.logsumexp(torch.stack([s + math.log1p(-beta), t + math.log(beta)]), 0)
        kl_teacher = F.kl_div(m, t, reduction="sum", log_target=True)
        kl_student = F.kl_div(m, s, reduction="sum", log_target=True)
        return (beta * kl_teacher + (1 - beta) * kl_student) / student.shape[0]

    return [
        AutocastCase(
            "jsd",
            lambda s, t: jsd(s, t),
            jsd_torch,
            [(rand(4, D), rand(4, D)), (rand(4, D, dtype=LOW), rand(4, D))],
        )
    ]


__all__ = ["jsd", "jsd_backward", "jsd_forward", "kl_div"]
