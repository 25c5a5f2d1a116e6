"""The test and bench cases of :mod:`fuseops.ops.jsd` (see
:mod:`fuseops.ops.cases`): kept out of ``import fuseops``."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .. import jsd as family
from ._sample import DTYPES, Sample, tensor


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
    _, row_stats = family.jsd_forward(x, y, lb, 0.5, 2.0, -100, "batchmean")
    student = t((6, 10), grad=True)
    result = [
        Sample(op, (x, y, lb, 0.5, 1.0, -100, "batchmean"), family.jsd),
        Sample(op, (t((6, 10), grad=True), y, lb, 0.1, 2.0, -100, "batchmean"), family.jsd),
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
            family.jsd,
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
            family.jsd,
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
            family.jsd,
        ),
        Sample(
            op, (t((0, 9), grad=True), t((0, 9)), None, 0.5, 1.0, -100, "batchmean"), family.jsd
        ),
        Sample(
            op,
            (t((5, 8), layout="expanded", grad=True), t((5, 8)), None, 0.5, 1.0, -100, "sum"),
            family.jsd,
        ),
        Sample(
            op,
            (student, y, lb, 0.0, 1.0, -100, "batchmean"),
            family.kl_div,
            wrapper_args=(student, y, lb),
        ),
        Sample(
            ops.jsd_forward.default, (x, y, lb, 0.5, 2.0, -100, "batchmean"), family.jsd_forward
        ),
        Sample(
            ops.jsd_forward.default,
            (t((6, 10), grad=True), y, None, 1.0, 1.0, -100, "none"),
            family.jsd_forward,
        ),
        Sample(
            ops.jsd_backward.default,
            (torch.randn((), device=device), x, y, lb, row_stats, 0.5, 2.0, -100, "batchmean"),
            family.jsd_backward,
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
                        family.jsd,
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
        Sample(op, (xs, ws, xt, wt, lb, 0.5, 1.0, -100, "batchmean"), family.fused_linear_jsd),
        Sample(op, (xs, ws, xt, wt, None, 0.0, 2.0, -100, "sum"), family.fused_linear_jsd),
        Sample(op, (xs, ws, xt, wt, lb, 1.0, 1.0, -100, "none"), family.fused_linear_jsd),
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
            family.fused_linear_jsd,
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
            family.fused_linear_jsd,
        ),
        Sample(
            op,
            (t((0, 8), grad=True), t((10, 8), grad=True), t((0, 8)), t((10, 8))),
            family.fused_linear_jsd,
        ),
        Sample(
            ops.fused_linear_jsd_forward.default,
            (xs.detach(), ws.detach(), xt, wt, lb, 0.5, 1.0, -100, "batchmean"),
            family.fused_linear_jsd_forward,
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
                family.fused_linear_jsd_backward,
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
                    family.fused_linear_jsd,
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
        return Sample(torch.ops.fuseops.jsd.default, args, family.jsd)
    rows, hidden_s, hidden_t = d.size(), d.int(1, 9), d.int(1, 9)
    student_input = d.tensor((rows, hidden_s), grad=True)
    layers = (
        student_input,
        d.tensor((vocab, hidden_s), student_input.dtype, 0.5, grad=True),
        d.tensor((rows, hidden_t), student_input.dtype),
        d.tensor((vocab, hidden_t), student_input.dtype, 0.5),
        d.maybe(lambda: d.integers((rows,), 0, vocab, d.choice((torch.int64, torch.int32)))),
    )
    return Sample(
        torch.ops.fuseops.fused_linear_jsd.default, layers + args[3:], family.fused_linear_jsd
    )


def autocast_cases() -> list:
    """jsd under CPU autocast against TRL's generalized JSD (GKDTrainer.generalized_jsd_loss, beta 0.5) spelled with torch's kl_div, which autocast runs in float32; a bfloat16 student with a float32 teacher included; fused_linear_jsd against that loss of the two F.linear logits, as Trainer(bf16=True) runs LM heads (tests_py/test_autocast.py)."""

    from ._autocast import LOW, AutocastCase, D, rand

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
            lambda s, t: family.jsd(s, t),
            jsd_torch,
            [(rand(4, D), rand(4, D)), (rand(4, D, dtype=LOW), rand(4, D))],
        ),
        AutocastCase(
            "fused_linear_jsd",
            lambda xs, ws, xt, wt, lbl: family.fused_linear_jsd(xs, ws, xt, wt, lbl),
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


def row_reduction_cases() -> list:
    """jsd's batchmean loss sums over rows (tests_py/test_threads.py)."""
    from ._threads import RowReductionCase, leaves

    student, teacher = leaves((4096, 1000), (4096, 1000))
    teacher = teacher.detach()
    label = torch.randint(0, 1000, (4096,), generator=torch.Generator().manual_seed(0))
    return [RowReductionCase("jsd", lambda: family.jsd(student, teacher, label), (student,))]
