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
    # (4, 4099) at temperature 0.25: scaled logits near 50, a logsumexp
    # whose float32 rounding (4e-6) would, without the kernels' normalized
    # K_s (jsd_kernel.cpp), move reverse-KL and mixture gradients by up to
    # 2.4x the tolerance on every CPU build.
    cases = [((7, 33), 1.0), ((2, 5, 1000), 2.0), ((3, 4099), 0.5), ((4, 4099), 0.25)]
    for shape, temperature in cases:
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


# --- fused_linear_jsd ----------------------------------------------------------
#
# Against the same float64 formula on the float64 logits of the same inputs
# (formula(F.linear(xs, ws), F.linear(xt, wt))). Tolerances:
# - float32/float64: 1e-5 relative (the loss: its largest value's; the
#   gradients: each one's largest value), as jsd's: the GEMMs add a float32
#   sum over H <= 24 products per logit (~1e-7) before the same row math.
# - bfloat16: 2e-2 relative to each result's largest value. The GEMMs'
#   results (the logits, then the gradients) are rounded to bfloat16 (2^-9
#   relative each: a logit of ~3 moves by ~6e-3, which moves a row's loss by
#   up to that much), the logits' gradient is rounded before its GEMMs too:
#   two or three roundings of 2^-9 on the way, so ~1e-2 with a margin of 2.


def layers(rows, hidden_s, hidden_t, vocab, dtype=torch.float32, device="cpu", seed=0):
    """Student and teacher hidden states ([rows, H]) and heads ([V, H]) whose
    logits are of order 3, as jsd's test logits."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype).to(device)

    return (
        r(*rows, hidden_s),
        r(vocab, hidden_s, scale=3.0 / hidden_s**0.5),
        r(*rows, hidden_t),
        r(vocab, hidden_t, scale=3.0 / hidden_t**0.5),
    )


def float64_fused(xs, ws, xt, wt, label, beta, temperature, reduction, grad_output):
    """The float64 formula's loss and its gradients for student_input and
    student_weight (grad_output times d loss)."""
    xd, wd = xs.detach().double().requires_grad_(), ws.detach().double().requires_grad_()
    loss = formula(
        F.linear(xd, wd),
        F.linear(xt.double(), wt.double()),
        label,
        beta,
        temperature,
        reduction=reduction,
    )
    gx, gw = torch.autograd.grad(loss, (xd, wd), grad_output.double())
    return loss.detach(), gx, gw


def assert_close_to_largest(got, want, tol):
    scale = max(want.abs().max().item(), 1e-30) if want.numel() else 1.0
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("beta", BETAS)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_fused_linear_jsd_matches_the_float64_formula(device, dtype, beta, reduction):
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    # 333 rows: several chunks of 64+ rows, the last one partial; [2, 5]:
    # 3-D hidden states, flattened; the two heads of different widths.
    for rows, hs, ht, vocab, temperature in [
        ((333,), 24, 16, 100, 1.0),
        ((2, 5), 8, 12, 1000, 2.0),
    ]:
        xs, ws, xt, wt = layers(rows, hs, ht, vocab, dtype, device, seed=30)
        label = torch.randint(0, vocab, rows, generator=torch.Generator().manual_seed(31))
        label.view(-1)[::7] = -100
        label = label.to(device)
        xi, wi = xs.clone().requires_grad_(), ws.clone().requires_grad_()
        loss = fuseops.fused_linear_jsd(xi, wi, xt, wt, label, beta, temperature, -100, reduction)
        assert loss.dtype == dtype and loss.shape == (rows if reduction == "none" else ())
        # A grad_output per row for "none" (the recomputing backward scales
        # each row by its own), a scalar other than 1 otherwise.
        g = torch.rand(rows, generator=torch.Generator().manual_seed(32)) + 0.5
        g = (g if reduction == "none" else torch.tensor(0.75)).to(device)
        loss.backward(g.to(dtype))
        want_loss, want_gx, want_gw = float64_fused(
            xs, ws, xt, wt, label, beta, temperature, reduction, g
        )
        assert xi.grad.dtype == dtype and wi.grad.dtype == dtype
        scale = max(1.0, want_loss.abs().max().item())
        torch.testing.assert_close(loss.double(), want_loss, rtol=tol, atol=tol * scale * 0.1)
        assert_close_to_largest(xi.grad, want_gx, tol)
        assert_close_to_largest(wi.grad, want_gw, tol)
        # The ignored rows' inputs get no gradient.
        assert (xi.grad.view(-1, hs)[::7] == 0).all()


@pytest.mark.parametrize("products", ["float32", "native"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fused_linear_jsd_products_widened_or_native(monkeypatch, products, dtype):
    """Both ways of the bfloat16/float16 products (float32 on widened
    operands, or the type's own GEMMs; linear_loss.h), forced by the
    environment, against the float64 formula: 2e-2 in bfloat16, 4e-3 in
    float16 (8 and 11 significant bits), relative to the largest value."""
    monkeypatch.setenv("FUSEOPS_REDUCED_GEMMS", "emulated" if products == "float32" else "native")
    tol = 2e-2 if dtype == torch.bfloat16 else 4e-3
    # 5000 classes: two blocks of the widened weights.
    xs, ws, xt, wt = layers((333,), 24, 16, 5000, dtype, "cpu", seed=33)
    label = torch.randint(0, 5000, (333,), generator=torch.Generator().manual_seed(34))
    label[::7] = -100
    xi, wi = xs.clone().requires_grad_(), ws.clone().requires_grad_()
    loss = fuseops.fused_linear_jsd(xi, wi, xt, wt, label, 0.5, 2.0, -100, "sum")
    loss.backward(torch.tensor(0.75, dtype=dtype))
    want_loss, want_gx, want_gw = float64_fused(
        xs, ws, xt, wt, label, 0.5, 2.0, "sum", torch.tensor(0.75)
    )
    assert_close_to_largest(loss, want_loss, tol)
    assert_close_to_largest(xi.grad, want_gx, tol)
    assert_close_to_largest(wi.grad, want_gw, tol)


def numerical_gradient(fn, t, eps=1e-6):
    """Central differences of the scalar fn() in every element of t
    (float64), one at a time."""
    grad = torch.zeros_like(t)
    flat, gflat = t.detach().view(-1), grad.view(-1)
    for i in range(flat.numel()):
        old = flat[i].item()
        flat[i] = old + eps
        up = fn().item()
        flat[i] = old - eps
        down = fn().item()
        flat[i] = old
        gflat[i] = (up - down) / (2 * eps)
    return grad


@pytest.mark.parametrize("beta", BETAS)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_fused_linear_jsd_gradcheck_float64(beta, reduction):
    """float64 gradients against finite differences: torch's gradcheck for
    "none" (whose backward recomputes and may run again), central
    differences of the loss otherwise (the gradients come from the forward
    and the backward runs once per forward, which gradcheck's reentrancy
    check would repeat)."""
    xs, ws, xt, wt = layers((5,), 3, 4, 6, torch.float64, seed=33)
    label = torch.tensor([1, -100, 0, 5, 2])
    xs.requires_grad_()
    ws.requires_grad_()

    def fn(x, w):
        return fuseops.fused_linear_jsd(x, w, xt, wt, label, beta, 1.5, -100, reduction)

    if reduction == "none":
        assert torch.autograd.gradcheck(fn, (xs, ws))
        return
    gx, gw = torch.autograd.grad(fn(xs, ws), (xs, ws))
    with torch.no_grad():
        for t, got in ((xs, gx), (ws, gw)):
            want = numerical_gradient(lambda: fn(xs, ws), t)
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-8)


def test_fused_linear_jsd_forward_and_backward_ops_agree():
    """The forward op's gradients (grad_output 1) are the backward op's for
    a grad_output of 1; "none" recomputes and may run twice."""
    xs, ws, xt, wt = layers((90,), 8, 6, 12, seed=34)
    label = torch.randint(0, 12, (90,), generator=torch.Generator().manual_seed(35))
    label[::5] = -100
    with torch.no_grad():
        loss, fx, fw = fuseops.fused_linear_jsd_forward(xs, ws, xt, wt, label, 0.3, 2.0)
        bx, bw = fuseops.fused_linear_jsd_backward(
            torch.tensor(1.0), xs, ws, xt, wt, label, 0.3, 2.0, -100, "batchmean"
        )
        torch.testing.assert_close(loss, fuseops.fused_linear_jsd(xs, ws, xt, wt, label, 0.3, 2.0))
    torch.testing.assert_close(bx, fx)
    torch.testing.assert_close(bw, fw)
    xi, wi = xs.clone().requires_grad_(), ws.clone().requires_grad_()
    loss = fuseops.fused_linear_jsd(xi, wi, xt, wt, label, reduction="none")
    token_weight = torch.rand(90)
    loss.backward(token_weight, retain_graph=True)
    first = (xi.grad.clone(), wi.grad.clone())
    loss.backward(token_weight)
    torch.testing.assert_close(xi.grad, 2 * first[0])
    torch.testing.assert_close(wi.grad, 2 * first[1])
    xi, wi = xs.clone().requires_grad_(), ws.clone().requires_grad_()
    loss = fuseops.fused_linear_jsd(xi, wi, xt, wt, label)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="only once"):
        loss.backward()
    expect_error_mentions(
        lambda: torch.autograd.grad(
            fuseops.fused_linear_jsd(xi, wi, xt, wt, label), xi, create_graph=True
        ),
        ["fuseops::fused_linear_jsd", "create_graph"],
    )


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_fused_linear_jsd_no_counted_row(reduction):
    xs, ws, xt, wt = layers((4,), 3, 3, 5, seed=36)
    xs.requires_grad_()
    label = torch.full((4,), -100)
    loss = fuseops.fused_linear_jsd(xs, ws, xt, wt, label, reduction=reduction)
    assert (loss == 0).all()
    loss.sum().backward()
    assert (xs.grad == 0).all()


def test_fused_linear_jsd_teacher_that_requires_grad_is_refused():
    xs, ws, xt, wt = layers((3,), 4, 4, 8, seed=37)
    xs.requires_grad_()
    for name, teacher in (
        ("'teacher_input'", (xt.clone().requires_grad_(), wt)),
        ("'teacher_weight'", (xt, wt.clone().requires_grad_())),
    ):
        expect_error_mentions(
            lambda: fuseops.fused_linear_jsd(xs, ws, *teacher),
            ["fuseops::fused_linear_jsd", name, "requires grad"],
        )
    fuseops.fused_linear_jsd(xs, ws, xt, wt).backward()
    with torch.no_grad():
        fuseops.fused_linear_jsd(xs, ws, xt.requires_grad_(), wt)


def test_fused_linear_jsd_bad_inputs_name_the_op_and_the_argument():
    xs, ws, xt, wt = layers((4,), 3, 5, 10, seed=38)
    op = fuseops.fused_linear_jsd
    cases = [
        (lambda: op(xs, ws[:, :2], xt, wt), ["'student_weight'", "[V, 3]"]),
        (lambda: op(xs, ws, xt, wt[:, :2]), ["'teacher_weight'", "[V, 5]"]),
        (lambda: op(xs, ws, xt[:3], wt), ["'teacher_input'", "4 rows"]),
        (lambda: op(xs, ws, xt, wt[:9]), ["'teacher_weight'", "10 rows"]),
        (lambda: op(xs, ws, xt.double(), wt.double()), ["'teacher_input'", "dtype"]),
        (lambda: op(xs, ws.double(), xt, wt), ["'student_weight'", "dtype"]),
        (lambda: op(xs[0], ws, xt, wt), ["'student_input'", "[N, H]"]),
        (lambda: op(xs.int(), ws, xt, wt), ["'student_input'", "dtype"]),
        (lambda: op(xs, ws[:0], xt, wt[:0]), ["'student_weight'", "class"]),
        (lambda: op(xs, ws, xt, wt, torch.zeros(4)), ["'label'", "int64"]),
        (lambda: op(xs, ws, xt, wt, torch.zeros(5, dtype=torch.long)), ["'label'", "[4]"]),
        (lambda: op(xs, ws, xt, wt, None, 1.5), ["'beta'", "1.5"]),
        (lambda: op(xs, ws, xt, wt, None, 0.5, 0.0), ["'temperature'", "> 0"]),
        (lambda: op(xs, ws, xt, wt, reduction="avg"), ["'reduction'", "'avg'", "batchmean"]),
        (lambda: op(xs, ws, xt.to("meta"), wt.to("meta")), ["'teacher_input'", "device"]),
    ]
    for call, fragments in cases:
        expect_error_mentions(call, ["fuseops::fused_linear_jsd", *fragments])
    expect_error_mentions(
        lambda: fuseops.fused_linear_jsd_backward(
            torch.ones(4), xs, ws, xt, wt, None, 0.5, 1.0, -100, "sum"
        ),
        ["fuseops::fused_linear_jsd_backward", "'grad_output'", "shape"],
    )


def test_fused_linear_jsd_peak_memory_is_a_chunk_of_logits():
    """Forward and backward allocate O(chunk x V), not [N, V]: under a
    quarter of the two materialised logits' bytes, and of the peak of the
    composition that materialises them."""
    from fuseops.bench.timing import peak_memory

    n, h, v = 2048, 64, 4000
    xs, ws, xt, wt = layers((n,), h, h, v, seed=39)
    logits_bytes = 2 * n * v * 4

    def fused():
        xi, wi = xs.detach().requires_grad_(), ws.detach().requires_grad_()
        fuseops.fused_linear_jsd(xi, wi, xt, wt).backward()
        return xi.grad, wi.grad

    def unfused():
        xi, wi = xs.detach().requires_grad_(), ws.detach().requires_grad_()
        fuseops.jsd(F.linear(xi, wi), F.linear(xt, wt)).backward()
        return xi.grad, wi.grad

    fused_peak = peak_memory(fused, torch.device("cpu"))
    assert fused_peak <= 0.25 * logits_bytes
    assert fused_peak <= 0.25 * peak_memory(unfused, torch.device("cpu"))


@pytest.mark.slow
def test_fused_linear_jsd_compile_fullgraph():
    xs, ws, xt, wt = layers((70,), 8, 6, 12, seed=40)
    label = torch.randint(0, 12, (70,), generator=torch.Generator().manual_seed(41))

    def fn(x, w):
        return fuseops.fused_linear_jsd(x * 2.0, w, xt, wt, label, 0.5, 2.0)

    compiled = torch.compile(fn, fullgraph=True)
    x1, w1 = xs.clone().requires_grad_(), ws.clone().requires_grad_()
    x2, w2 = xs.clone().requires_grad_(), ws.clone().requires_grad_()
    torch.testing.assert_close(compiled(x1, w1), fn(x2, w2))
    compiled(x1, w1).backward()
    fn(x2, w2).backward()
    torch.testing.assert_close(x1.grad, x2.grad)
    torch.testing.assert_close(w1.grad, w2.grad)


def test_fused_linear_jsd_loss_module_matches_its_torch_counterpart():
    """fuseops.nn.FusedLinearJSDLoss and TorchFusedLinearJSDLoss (which
    replace_modules swaps for it) agree on [B, T, H] hidden states, per-token
    losses in the labels' shape."""
    xs, ws, xt, wt = layers((3, 7), 16, 12, 50, seed=42)
    label = torch.randint(0, 50, (3, 7), generator=torch.Generator().manual_seed(43))
    label[0, :2] = -100
    for reduction in REDUCTIONS:
        options = dict(beta=0.3, temperature=2.0, reduction=reduction)
        fused = fuseops.nn.FusedLinearJSDLoss(**options)
        plain = fuseops.nn.TorchFusedLinearJSDLoss(**options)
        x1, x2 = xs.clone().requires_grad_(), xs.clone().requires_grad_()
        got, want = fused(x1, ws, xt, wt, label), plain(x2, ws, xt, wt, label)
        assert got.shape == (label.shape if reduction == "none" else ())
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        got.sum().backward()
        want.sum().backward()
        torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-5, atol=1e-7)
    model = torch.nn.Sequential(fuseops.nn.TorchFusedLinearJSDLoss(beta=0.1))
    fuseops.nn.replace_modules(model)
    assert type(model[0]) is fuseops.nn.FusedLinearJSDLoss and model[0].beta == 0.1


@pytest.mark.parametrize("beta", BETAS)
@pytest.mark.parametrize("reduction", ["batchmean", "sum", "mean"])
def test_fused_linear_jsd_matches_trl_on_materialised_logits(beta, reduction):
    """TRL's generalized_jsd_loss on the [B, T, V] logits the two heads make,
    with labels, against the fused op on the hidden states: loss and the
    student's gradients."""
    trl_loss = _trl_loss()
    xs, ws, xt, wt = layers((2, 5), 16, 12, 64, seed=44)
    labels = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(45))
    labels[0, :2] = -100
    results = []
    for fn in (
        lambda x, w: trl_loss(F.linear(x, w), F.linear(xt, wt), labels, beta, 2.0, reduction),
        lambda x, w: fuseops.fused_linear_jsd(x, w, xt, wt, labels, beta, 2.0, -100, reduction),
    ):
        x, w = xs.clone().requires_grad_(), ws.clone().requires_grad_()
        loss = fn(x, w)
        loss.backward()
        results.append((loss.detach(), x.grad, w.grad))
    (want, want_gx, want_gw), (got, got_gx, got_gw) = results
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got_gx, want_gx, rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(got_gw, want_gw, rtol=1e-4, atol=1e-7)
