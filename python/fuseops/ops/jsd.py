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


def _student_teacher(rows, vocab, dtype, device, gen):
    student = torch.randn(rows, vocab, dtype=torch.float32, device=device, generator=gen) * 2
    teacher = torch.randn(rows, vocab, dtype=torch.float32, device=device, generator=gen) * 2
    return student.to(dtype), teacher.to(dtype)


def _linear_layers(rows, vocab, dtype, device, gen):
    # rows x vocab, the shape of the two logits that are never formed; both
    # heads of hidden size min(2048, vocab), an LM head's.
    hidden = min(2048, vocab)

    def r(*shape, scale=1.0):
        return (torch.randn(*shape, device=device, generator=gen) * scale).to(dtype)

    return (
        r(rows, hidden),
        r(vocab, hidden, scale=hidden**-0.5),
        r(rows, hidden),
        r(vocab, hidden, scale=hidden**-0.5),
    )


def bench_cases():
    from ._bench_case import Case, Traffic

    return [
        Case(
            "fused_linear_jsd",
            "fused_linear_jsd",
            "fused_linear_jsd",
            _linear_layers,
            # Bound by its GEMMs, not by memory; the least traffic counted is
            # the two heads [V, H] (H = 2048 "vectors" of V each), read in the
            # forward, read and the student's gradient written in the
            # backward.
            forward_traffic=Traffic(rows=0, vectors=2 * 2048),
            backward_traffic=Traffic(rows=0, vectors=3 * 2048),
            has_out=False,
            differentiable=(0, 1),
            variant=True,
            shapes={
                "quick": [(256, 8000)],
                "standard": [(1024, 32000)],
                "full": [(4096, 32000)],
            },
            description="student and teacher LM heads x [rows, min(2048, V)] @ W.T, then "
            "generalized JSD (beta 0.5), batchmean",
        ),
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
    result += _fused_linear_samples(t, label)
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


def _fused_linear_samples(t, label) -> list[Sample]:
    ops = torch.ops.fuseops
    op = ops.fused_linear_jsd.default
    # 70 rows of a vocabulary of 40: two chunks of at least 64 rows, the
    # second one short.
    xs, ws = t((70, 8), grad=True, scale=1.0), t((40, 8), grad=True, scale=0.5)
    xt, wt = t((70, 5), scale=1.0), t((40, 5), scale=0.5)
    lb = label((70,), 40)
    result = [
        Sample(op, (xs, ws, xt, wt, lb, 0.5, 1.0, -100, "batchmean"), fused_linear_jsd),
        Sample(op, (xs, ws, xt, wt, None, 0.0, 2.0, -100, "sum"), fused_linear_jsd),
        Sample(op, (xs, ws, xt, wt, lb, 1.0, 1.0, -100, "none"), fused_linear_jsd),
        Sample(
            op,
            (
                t((9, 6), torch.float64, "transposed", True),
                t((11, 6), torch.float64, "sliced", True),
                t((9, 4), torch.float64, "transposed"),
                t((11, 4), torch.float64),
                label((9,), 11).int(),
                0.1,
                0.5,
                -100,
                "mean",
            ),
            fused_linear_jsd,
        ),
        Sample(
            op,
            (
                t((6, 8), torch.bfloat16, grad=True, scale=1.0),
                t((10, 8), torch.bfloat16, "transposed", True, scale=0.5),
                t((6, 8), torch.bfloat16, scale=1.0),
                t((10, 8), torch.bfloat16, scale=0.5),
                label((6,), 10),
                0.5,
                1.0,
                -100,
                "none",
            ),
            fused_linear_jsd,
        ),
        Sample(
            op,
            (t((0, 8), grad=True), t((10, 8), grad=True), t((0, 8)), t((10, 8))),
            fused_linear_jsd,
        ),
        Sample(
            ops.fused_linear_jsd_forward.default,
            (xs.detach(), ws.detach(), xt, wt, lb, 0.5, 1.0, -100, "batchmean"),
            fused_linear_jsd_forward,
        ),
    ]
    for grad, reduction in (
        (torch.randn((), device=xs.device), "mean"),
        (torch.randn(70, device=xs.device), "none"),
    ):
        result.append(
            Sample(
                ops.fused_linear_jsd_backward.default,
                (grad, xs.detach(), ws.detach(), xt, wt, lb, 0.5, 2.0, -100, reduction),
                fused_linear_jsd_backward,
            )
        )
    # Every CPU build: the row kernel on rows with a vector tail, chunks of
    # several rows, each end of beta and the mixture, against the float64
    # reference. float32/float64 only: bfloat16/float16 logits leave their
    # GEMM rounded (as the unfused composition's do), so the gradients'
    # elements where the row terms cancel differ from the exact float64
    # logits' by more than one rounding; the reduced dtypes' builds are
    # compared with each other by the bfloat16 sample above, their numerics
    # in tests_py/test_jsd.py.
    for dtype in (torch.float32, torch.float64):
        for (rows, vocab), beta in [((37, 1000), 0.0), ((70, 515), 0.5), ((5, 4099), 1.0)]:
            result.append(
                Sample(
                    op,
                    (
                        t((rows, 16), dtype, grad=True, scale=1.0),
                        t((vocab, 16), dtype, grad=True, scale=0.5),
                        t((rows, 8), dtype, scale=1.0),
                        t((vocab, 8), dtype, scale=0.5),
                        label((rows,), vocab),
                        beta,
                        1.0,
                        -100,
                        "batchmean",
                    ),
                    fused_linear_jsd,
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
    if d.flag():
        return Sample(torch.ops.fuseops.jsd.default, args, jsd)
    rows, hidden_s, hidden_t = d.size(), d.int(1, 9), d.int(1, 9)
    student_input = d.tensor((rows, hidden_s), grad=True)
    layers = (
        student_input,
        d.tensor((vocab, hidden_s), student_input.dtype, 0.5, grad=True),
        d.tensor((rows, hidden_t), student_input.dtype),
        d.tensor((vocab, hidden_t), student_input.dtype, 0.5),
        d.maybe(lambda: d.integers((rows,), 0, vocab, d.choice((torch.int64, torch.int32)))),
    )
    return Sample(torch.ops.fuseops.fused_linear_jsd.default, layers + args[3:], fused_linear_jsd)


# --- export (fuseops/ops/_export.py) ---

NOT_EXPORTED = {
    ("jsd", "fused_linear_jsd"): "losses (distillation training); an inference graph returns logits"
}


def autocast_cases() -> list:
    """jsd under CPU autocast against TRL's generalized JSD (GKDTrainer.generalized_jsd_loss, beta 0.5) spelled with torch's kl_div, which autocast runs in float32; a bfloat16 student with a float32 teacher included; fused_linear_jsd against that loss of the two F.linear logits, as Trainer(bf16=True) runs LM heads (tests_py/test_autocast.py)."""
    import torch.nn.functional as F

    from ._autocast import D, LOW, AutocastCase, rand

    def jsd_torch(student, teacher, beta=0.5):
        s, t = F.log_softmax(student, -1), F.log_softmax(teacher, -1)
        m = torch.logsumexp(torch.stack([s + math.log1p(-beta), t + math.log(beta)]), 0)
        kl_teacher = F.kl_div(m, t, reduction="sum", log_target=True)
        kl_student = F.kl_div(m, s, reduction="sum", log_target=True)
        return (beta * kl_teacher + (1 - beta) * kl_student) / student.shape[0]

    def label(rows: int = 8) -> torch.Tensor:
        labels = torch.randint(0, 2 * D, (rows,))
        labels[0] = -100
        return labels

    def fused_linear_torch(xs, ws, xt, wt, lbl):
        # The logits F.linear forms under autocast, the counted rows' JSD.
        counted = lbl != -100
        return jsd_torch(F.linear(xs, ws)[counted], F.linear(xt, wt)[counted])

    return [
        AutocastCase(
            "jsd",
            lambda s, t: jsd(s, t),
            jsd_torch,
            [(rand(4, D), rand(4, D)), (rand(4, D, dtype=LOW), rand(4, D))],
        ),
        AutocastCase(
            "fused_linear_jsd",
            lambda xs, ws, xt, wt, lbl: fused_linear_jsd(xs, ws, xt, wt, lbl),
            fused_linear_torch,
            [
                # bfloat16 hidden states, float32 heads (Trainer(bf16=True));
                # all float32; all bfloat16.
                (
                    rand(8, D, dtype=LOW),
                    rand(2 * D, D),
                    rand(8, D, dtype=LOW),
                    rand(2 * D, D),
                    label(),
                ),
                (rand(8, D), rand(2 * D, D), rand(8, D), rand(2 * D, D), label()),
                (
                    rand(8, D, dtype=LOW),
                    rand(2 * D, D, dtype=LOW),
                    rand(8, D, dtype=LOW),
                    rand(2 * D, D, dtype=LOW),
                    label(),
                ),
            ],
        ),
    ]


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


def row_reduction_cases() -> list:
    """jsd's batchmean loss sums over rows (tests_py/test_threads.py)."""
    from ._threads import RowReductionCase, leaves

    student, teacher = leaves((4096, 1000), (4096, 1000))
    teacher = teacher.detach()
    label = torch.randint(0, 1000, (4096,), generator=torch.Generator().manual_seed(0))
    return [RowReductionCase("jsd", lambda: jsd(student, teacher, label), (student,))]
