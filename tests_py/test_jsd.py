"""fuseops.jsd and fuseops.kl_div against float64 math written from the
formulas (python/README.md, "Distillation losses"), and against TRL's
GKDTrainer.generalized_jsd_loss where TRL is installed: the numerics
(opcheck, compilers, Meta, pybind and every CPU build are in
test_conformance.py, fed by fuseops/ops/jsd.py's samples).

Tolerances, relative to the float64 result computed from the same inputs,
with an absolute floor of a tenth of the tolerance times max(1, largest
value):
- float32/float64: 1e-5. fuseops accumulates in float32 (float64) over rows
  of up to a thousand classes, a few roundings per term: ~1e-6.
- bfloat16/float16: the inputs are widened exactly and every operation is in
  float32; only the result is rounded, once (2^-9 relative in bfloat16,
  2^-12 in float16, half an ulp), so the float64 result rounded to the dtype
  is within one ulp: 1e-2 (bfloat16, 2^-7 = 7.8e-3 for one ulp) and 2e-3
  (float16, 2^-10 = 9.8e-4).
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

import fuseops

from support.errors import expect_error_mentions
from support.params import DTYPES

TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}
BETAS = [0.0, 0.5, 1.0, 0.1]
REDUCTIONS = ["batchmean", "sum", "mean", "none"]


def formula(
    student,
    teacher,
    label=None,
    beta=0.5,
    temperature=1.0,
    ignore_index=-100,
    reduction="batchmean",
):
    """The loss in float64, spelled out: log-softmaxes s and t, the mixture
    log M = log(beta e^t + (1 - beta) e^s) as logaddexp (the linear sum
    underflows for logits of 1e4), the per-row sums, the reduction over the
    counted rows."""
    s = torch.log_softmax(student.double() / temperature, -1)
    t = torch.log_softmax(teacher.double() / temperature, -1)
    p, q = s.exp(), t.exp()
    if beta == 0:
        rows = (q * (t - s)).sum(-1)
    elif beta == 1:
        rows = (p * (s - t)).sum(-1)
    else:
        log_m = torch.logaddexp(t + math.log(beta), s + math.log1p(-beta))
        rows = beta * (q * (t - log_m)).sum(-1) + (1 - beta) * (p * (s - log_m)).sum(-1)
    counted = torch.ones_like(rows, dtype=torch.bool) if label is None else label != ignore_index
    rows = torch.where(counted, rows, torch.zeros_like(rows))
    n = max(int(counted.sum()), 1)
    if reduction == "none":
        return rows
    if reduction == "sum":
        return rows.sum()
    if reduction == "mean":
        return rows.sum() / (n * student.shape[-1])
    return rows.sum() / n


def assert_close(got, want, dtype):
    tol = TOLERANCE[dtype]
    want_d = want.to(dtype).double() if dtype in (torch.bfloat16, torch.float16) else want
    scale = max(1.0, want.abs().nan_to_num(0).max().item()) if want.numel() else 1.0
    torch.testing.assert_close(
        got.double(), want_d.double(), rtol=tol, atol=tol * scale * 0.1, equal_nan=True
    )


def logits(*shape, dtype=torch.float32, device="cpu", scale=3.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype).to(device)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("beta", BETAS)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_loss_and_gradient_match_the_float64_formula(device, dtype, beta, reduction):
    for shape, temperature in [((7, 33), 1.0), ((2, 5, 1000), 2.0), ((3, 4099), 0.5)]:
        student = logits(*shape, dtype=dtype, device=device, seed=1).requires_grad_()
        teacher = logits(*shape, dtype=dtype, device=device, seed=2)
        label = torch.randint(0, shape[-1], shape[:-1], generator=torch.Generator().manual_seed(3))
        label.view(-1)[1] = -100
        label = label.to(device)
        loss = fuseops.jsd(student, teacher, label, beta, temperature, reduction=reduction)
        assert loss.dtype == dtype
        assert loss.shape == (shape[:-1] if reduction == "none" else ())
        wide = student.detach().double().requires_grad_()
        want = formula(wide, teacher, label, beta, temperature, reduction=reduction)
        assert_close(loss, want, dtype)
        upstream = torch.randn(loss.shape, generator=torch.Generator().manual_seed(4))
        (grad,) = torch.autograd.grad(loss, student, upstream.to(dtype).to(device))
        (want_grad,) = torch.autograd.grad(want, wide, upstream.double().to(device))
        assert grad.dtype == dtype
        assert_close(grad, want_grad, dtype)
        assert (grad.view(-1, shape[-1])[1] == 0).all()  # the ignored row


@pytest.mark.parametrize("beta", BETAS)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_gradcheck_float64(beta, reduction):
    teacher = logits(4, 6, dtype=torch.float64, seed=5)
    label = torch.tensor([1, -100, 0, 5])
    student = logits(4, 6, dtype=torch.float64, seed=6).requires_grad_()
    assert torch.autograd.gradcheck(
        lambda x: fuseops.jsd(x, teacher, label, beta, 1.5, reduction=reduction), (student,)
    )


def test_ignored_rows_count_for_nothing():
    student, teacher = logits(6, 40, seed=7), logits(6, 40, seed=8)
    label = torch.tensor([3, -100, 7, -100, 0, 1])
    kept = label != -100
    for beta in BETAS:
        for reduction in REDUCTIONS:
            got = fuseops.jsd(student, teacher, label, beta, reduction=reduction)
            subset = fuseops.jsd(student[kept], teacher[kept], None, beta, reduction=reduction)
            if reduction == "none":
                assert (got[~kept] == 0).all()
                torch.testing.assert_close(got[kept], subset, rtol=0, atol=0)
            else:
                torch.testing.assert_close(got, subset, rtol=1e-6, atol=1e-7)
    # A custom ignore_index.
    got = fuseops.jsd(student, teacher, label, ignore_index=7)
    assert got.isfinite()
    kept = label != 7
    want = fuseops.jsd(student[kept], teacher[kept])
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_no_counted_row_gives_zero_and_a_zero_gradient(reduction):
    """batchmean and mean over no counted row are 0, not NaN (TRL's
    batchmean clamps its divisor to 1 the same way)."""
    student = logits(3, 10, seed=9).requires_grad_()
    label = torch.full((3,), -100)
    loss = fuseops.jsd(student, logits(3, 10, seed=10), label, reduction=reduction)
    assert (loss == 0).all()
    loss.sum().backward()
    assert (student.grad == 0).all()
    empty = torch.zeros(0, 10, requires_grad=True)
    loss = fuseops.jsd(empty, torch.zeros(0, 10), reduction=reduction)
    assert loss.shape == ((0,) if reduction == "none" else ())
    loss.sum().backward()
    assert empty.grad.shape == (0, 10)


def test_kl_div_is_jsd_at_its_ends_and_torch_kl_div():
    student, teacher = logits(5, 30, seed=11), logits(5, 30, seed=12)
    s, t = F.log_softmax(student, -1), F.log_softmax(teacher, -1)
    forward = F.kl_div(s, t, reduction="batchmean", log_target=True)
    reverse = F.kl_div(t, s, reduction="batchmean", log_target=True)
    torch.testing.assert_close(fuseops.kl_div(student, teacher), forward, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(
        fuseops.kl_div(student, teacher, reverse=True), reverse, rtol=1e-5, atol=1e-6
    )
    torch.testing.assert_close(
        fuseops.kl_div(student, teacher, temperature=2.0, reduction="sum"),
        fuseops.jsd(student, teacher, None, 0.0, 2.0, reduction="sum"),
        rtol=0,
        atol=0,
    )
    # torch's "mean" divides by every element, as fuseops' does (torch warns
    # that it may change this).
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "reduction: 'mean' divides the total loss")
        want = F.kl_div(s, t, reduction="mean", log_target=True)
    torch.testing.assert_close(
        fuseops.kl_div(student, teacher, reduction="mean"), want, rtol=1e-5, atol=1e-7
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("beta", BETAS)
def test_large_and_masked_logits_stay_finite(dtype, beta):
    """Logits of 1e4 (the softmax is one-hot to float32 precision) and
    classes masked with -Inf in both models (their terms are 0, the limit of
    p log p) give finite losses and gradients equal to the formula's."""
    student = logits(4, 100, dtype=dtype, scale=1e4, seed=13).requires_grad_()
    teacher = logits(4, 100, dtype=dtype, scale=1e4, seed=14)
    for temperature in (1.0, 3.0):
        loss = fuseops.jsd(student, teacher, None, beta, temperature)
        (grad,) = torch.autograd.grad(loss, student)
        assert loss.isfinite() and grad.isfinite().all()
        wide = student.detach().double().requires_grad_()
        want = formula(wide, teacher, None, beta, temperature)
        (want_grad,) = torch.autograd.grad(want, wide)
        # Terms of e^-1e4: the result is a difference of large logits.
        scale = max(1.0, want.abs().item())
        tol = max(TOLERANCE[dtype], 1e-5) * scale
        assert abs(loss.double().item() - want.item()) <= tol + 1e-6 * scale
        torch.testing.assert_close(grad.double(), want_grad.to(dtype).double(), rtol=0, atol=tol)
    masked_s, masked_t = logits(3, 20, dtype=dtype, seed=15), logits(3, 20, dtype=dtype, seed=16)
    masked_s[:, 5:9] = -math.inf
    masked_t[:, 5:9] = -math.inf
    masked_s.requires_grad_()
    loss = fuseops.jsd(masked_s, masked_t, None, beta)
    (grad,) = torch.autograd.grad(loss, masked_s)
    assert loss.isfinite() and grad.isfinite().all() and (grad[:, 5:9] == 0).all()
    kept = [c for c in range(20) if not 5 <= c < 9]
    want = formula(masked_s.detach()[:, kept], masked_t[:, kept], None, beta)
    assert_close(loss, want, dtype)


def test_teacher_that_requires_grad_is_refused():
    student = logits(3, 8, seed=17).requires_grad_()
    teacher = logits(3, 8, seed=18).requires_grad_()
    for call in (
        lambda: fuseops.jsd(student, teacher),
        lambda: fuseops.kl_div(student, teacher),
        lambda: fuseops.jsd_forward(student, teacher),
    ):
        expect_error_mentions(call, ["fuseops::jsd", "'teacher_logits'", "requires grad"])
    # A detached teacher, or no gradient recorded at all, is fine.
    fuseops.jsd(student, teacher.detach()).backward()
    with torch.no_grad():
        fuseops.jsd(student, teacher)


def test_bad_inputs_name_the_op_and_the_argument():
    x = logits(4, 10, seed=19)
    cases = [
        (lambda: fuseops.jsd(x, logits(4, 9)), ["'teacher_logits'", "shape"]),
        (lambda: fuseops.jsd(x, x.double()), ["'teacher_logits'", "dtype"]),
        (lambda: fuseops.jsd(x.int(), x), ["'student_logits'", "dtype"]),
        (lambda: fuseops.jsd(torch.zeros(4, 0), torch.zeros(4, 0)), ["'student_logits'", "class"]),
        (lambda: fuseops.jsd(torch.tensor(1.0), torch.tensor(1.0)), ["'student_logits'", "dim"]),
        (lambda: fuseops.jsd(x, x, torch.zeros(4)), ["'label'", "int64"]),
        (lambda: fuseops.jsd(x, x, torch.zeros(5, dtype=torch.long)), ["'label'", "[4]"]),
        (lambda: fuseops.jsd(x, x, None, 1.5), ["'beta'", "1.5"]),
        (lambda: fuseops.jsd(x, x, None, -0.1), ["'beta'", "-0.1"]),
        (lambda: fuseops.jsd(x, x, None, math.nan), ["'beta'", "nan"]),
        (lambda: fuseops.jsd(x, x, None, 0.5, 0.0), ["'temperature'", "> 0"]),
        (lambda: fuseops.jsd(x, x, None, 0.5, -1.0), ["'temperature'", "-1"]),
        (lambda: fuseops.jsd(x, x, None, 0.5, 1e300), ["'temperature'", "float32"]),
        (lambda: fuseops.jsd(x, x, reduction="avg"), ["'reduction'", "'avg'", "batchmean"]),
        (lambda: fuseops.kl_div(x, x, reduction="avg"), ["'reduction'", "'avg'"]),
        (lambda: fuseops.jsd(x, x.to("meta")), ["'teacher_logits'", "device"]),
    ]
    for call, fragments in cases:
        expect_error_mentions(call, ["fuseops::jsd", *fragments])
    _, stats = fuseops.jsd_forward(x, x)
    expect_error_mentions(
        lambda: fuseops.jsd_backward(torch.ones(4), x, x, None, stats),
        ["fuseops::jsd_backward", "'grad_output'", "shape"],
    )
    expect_error_mentions(
        lambda: fuseops.jsd_backward(torch.ones(()), x, x, None, stats[:2]),
        ["fuseops::jsd_backward", "'row_stats'", "[4, 3]"],
    )


def test_row_stats_hold_the_logsumexps():
    student, teacher = logits(3, 50, seed=20), logits(3, 50, seed=21)
    loss, stats = fuseops.jsd_forward(student, teacher, None, 1.0, 2.0, reduction="none")
    assert stats.shape == (3, 3) and stats.dtype == torch.float32
    torch.testing.assert_close(stats[:, 0], torch.logsumexp(student / 2, -1))
    torch.testing.assert_close(stats[:, 1], torch.logsumexp(teacher / 2, -1))
    torch.testing.assert_close(stats[:, 2], loss)  # reverse KL: the student's sum is the loss


def _trl_loss():
    gkd = pytest.importorskip(
        "trl.experimental.gkd",
        reason="TRL is not installed (pip install 'trl==1.16.0', the trainers extra)",
    )
    return gkd.GKDTrainer.generalized_jsd_loss


@pytest.mark.parametrize("beta", BETAS)
@pytest.mark.parametrize("temperature", [1.0, 2.0])
@pytest.mark.parametrize("reduction", ["batchmean", "sum", "mean"])
def test_matches_trl_generalized_jsd_loss(beta, temperature, reduction):
    """The same loss and student gradient as TRL's for [B, T, V] logits with
    labels (-100 on padding), TRL's form of the call; without labels TRL's
    batchmean divides by B, fuseops' by the B * T rows (python/README.md)."""
    trl_loss = _trl_loss()
    student = logits(2, 5, 64, seed=22)
    teacher = logits(2, 5, 64, seed=23)
    labels = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(24))
    labels[0, :2] = -100
    labels[1, 4] = -100
    results = []
    for fn in (
        lambda x: trl_loss(x, teacher, labels, beta, temperature, reduction),
        lambda x: fuseops.jsd(x, teacher, labels, beta, temperature, reduction=reduction),
    ):
        x = student.clone().requires_grad_()
        loss = fn(x)
        loss.backward()
        results.append((loss.detach(), x.grad))
    (want, want_grad), (got, got_grad) = results
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-4, atol=1e-7)
    # Rows of 2-D logits without labels: TRL's batchmean divides by N, as ours.
    flat_s, flat_t = student.view(10, 64), teacher.view(10, 64)
    torch.testing.assert_close(
        fuseops.jsd(flat_s, flat_t, None, beta, temperature, reduction=reduction),
        trl_loss(flat_s, flat_t, None, beta, temperature, reduction),
        rtol=1e-5,
        atol=1e-6,
    )
