"""fuseops.cross_entropy (and its in-place variant), linear_cross_entropy and
their fuseops.nn modules against float64 math: the numerics (opcheck,
compilers, Meta, pybind and every CPU build are in test_conformance.py, fed
by fuseops/ops/cross_entropy.py's samples).

Tolerances, relative to the float64 result (loss O(1..10), gradients O(1/N)
to O(1)), with an absolute floor scaled by the largest value:
- float32/float64: 1e-5. fuseops accumulates in float32 (float64) over rows
  of up to a few thousand classes: ~1e-6.
- bfloat16/float16: fuseops widens the inputs exactly, computes in float32
  and rounds once, so it matches the float64 result rounded to the dtype
  within one rounding step: 1e-2 (bfloat16), 2e-3 (float16).
- linear_cross_entropy's weight and bias gradients sum over every token:
  the floor grows with sqrt(N). Its bfloat16 results also carry the rounding
  of the chunk's logits to bfloat16 by the GEMM (as an unfused bfloat16
  model's do): 2e-2 of the largest value.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import fuseops
import fuseops.nn
from fuseops import reference

from support.errors import expect_error_mentions
from support.params import DTYPES

TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}

# (reduction, with weight, label_smoothing, z_loss, softcap)
OPTIONS = [
    ("mean", False, 0.0, 0.0, None),
    ("sum", False, 0.0, 0.0, None),
    ("none", False, 0.0, 0.0, None),
    ("mean", True, 0.0, 0.0, None),
    ("mean", False, 0.1, 0.0, None),
    ("mean", True, 0.2, 0.0, None),
    ("sum", False, 0.0, 1e-3, None),
    ("none", False, 0.0, 0.0, 3.0),
    ("mean", True, 0.1, 1e-2, 5.0),
]


def assert_close(got, want, dtype, floor_terms=1.0):
    tol = TOLERANCE[dtype]
    want_d = want.to(dtype).double() if dtype in (torch.bfloat16, torch.float16) else want
    scale = max(1.0, want.abs().nan_to_num(0).max().item()) if want.numel() else 1.0
    torch.testing.assert_close(
        got.double(),
        want_d,
        rtol=tol,
        atol=tol * scale * math.sqrt(floor_terms) * 0.1,
        equal_nan=True,
    )


def make_case(shape, vocab, dtype, device, ignore=True, layout="contiguous"):
    full = torch.randn(*shape, vocab, dtype=torch.float64, device=device) * 3
    if layout == "transposed" and len(shape) == 1:
        logits = full.t().contiguous().t()
    elif layout == "sliced":
        logits = torch.randn(*shape, 2 * vocab, dtype=torch.float64, device=device)[..., ::2] * 3
    else:
        logits = full
    target = torch.randint(0, vocab, shape, device=device)
    if ignore and target.numel() > 2:
        target.view(-1)[::3] = -100
    return logits.to(dtype), target


def float64_loss_and_grad(logits, target, grad_output, **options):
    x = logits.detach().double().requires_grad_()
    loss = reference.cross_entropy(x, target, **options)
    (grad,) = torch.autograd.grad(loss, x, grad_output.double())
    return loss.detach(), grad


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize(
    "shape,vocab,layout",
    [
        ((1,), 1, "contiguous"),
        ((7,), 33, "transposed"),
        ((37,), 1000, "contiguous"),
        ((2, 3), 4099, "sliced"),
    ],
)
def test_matches_float64(device, dtype, options, shape, vocab, layout):
    reduction, with_weight, smoothing, z_loss, softcap = options
    logits, target = make_case(shape, vocab, dtype, device, layout=layout)
    weight = (torch.rand(vocab, device=device) + 0.5) if with_weight else None
    kwargs = dict(
        weight=weight,
        reduction=reduction,
        label_smoothing=smoothing,
        z_loss=z_loss,
        softcap=softcap,
    )
    x = logits.detach().requires_grad_()
    loss = fuseops.cross_entropy(x, target, **kwargs)
    grad_output = torch.randn(loss.shape, device=device, dtype=loss.dtype)
    loss.backward(grad_output)
    want_loss, want_grad = float64_loss_and_grad(logits, target, grad_output, **kwargs)
    assert loss.dtype == dtype and loss.shape == want_loss.shape
    assert_close(loss, want_loss, dtype)
    assert_close(x.grad, want_grad, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_torch_cross_entropy(dtype):
    logits, target = make_case((64,), 500, dtype, "cpu")
    weight = torch.rand(500) + 0.5
    for kwargs in [
        {},
        {"weight": weight},
        {"label_smoothing": 0.1, "weight": weight},
        {"reduction": "sum"},
        {"reduction": "none"},
    ]:
        got = fuseops.cross_entropy(logits, target, **kwargs)
        want = F.cross_entropy(
            logits.double(),
            target,
            **{k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()},
        )
        assert_close(got, want, dtype)


def test_all_ignored_mean_is_nan_and_sum_zero(device):
    logits = torch.randn(4, 9, device=device, requires_grad=True)
    target = torch.full((4,), -100, device=device)
    loss = fuseops.cross_entropy(logits, target)
    assert torch.isnan(loss)
    assert torch.isnan(F.cross_entropy(logits, target))
    assert fuseops.cross_entropy(logits, target, reduction="sum").item() == 0.0
    fuseops.cross_entropy(logits, target, reduction="sum").backward()
    assert torch.equal(logits.grad, torch.zeros_like(logits))


def test_int32_targets_custom_ignore_index_and_empty(device):
    logits, target = make_case((20,), 11, torch.float32, device, ignore=False)
    target[3] = 5
    got = fuseops.cross_entropy(logits, target.int(), ignore_index=5)
    want = F.cross_entropy(logits.double(), target, ignore_index=5)
    assert_close(got, want, torch.float32)
    empty = torch.randn(0, 11, device=device, requires_grad=True)
    for reduction, expected in [("sum", 0.0), ("none", None)]:
        out = fuseops.cross_entropy(
            empty, torch.zeros(0, dtype=torch.long, device=device), reduction=reduction
        )
        if expected is not None:
            assert out.item() == expected
    assert torch.isnan(
        fuseops.cross_entropy(empty, torch.zeros(0, dtype=torch.long, device=device))
    )


def test_masked_classes_at_minus_inf_and_large_logits(device):
    """-Inf logits (a masked vocabulary) give probability 0 and no NaN; logits
    around 100 do not overflow float32 exp (the maximum is subtracted first)."""
    logits, target = make_case((40,), 300, torch.float32, device, ignore=False)
    logits[:, 100:] = -math.inf
    target = target % 100
    logits[:5] += 100.0
    x = logits.clone().requires_grad_()
    loss = fuseops.cross_entropy(x, target, reduction="sum")
    loss.backward()
    want_loss, want_grad = float64_loss_and_grad(
        logits, target, torch.ones((), device=device), reduction="sum"
    )
    assert torch.isfinite(loss) and torch.isfinite(x.grad).all()
    assert_close(loss, want_loss, torch.float32)
    assert_close(x.grad, want_grad, torch.float32)


def test_target_class_gradient_is_exact_in_bfloat16():
    """p_t - 1 with p_t close to 1 is formed in float32: rounding p_t to
    bfloat16 first would give 0 (or a multiple of 2^-8)."""
    logits = torch.zeros(1, 50, dtype=torch.bfloat16)
    logits[0, 7] = 12.0
    target = torch.tensor([7])
    x = logits.clone().requires_grad_()
    fuseops.cross_entropy(x, target, reduction="sum").backward()
    exact = (torch.softmax(logits.double(), -1)[0, 7] - 1).item()
    assert exact != 0.0
    assert x.grad[0, 7].double().item() == pytest.approx(exact, rel=1e-2)


@pytest.mark.parametrize("options", OPTIONS)
def test_gradcheck_float64(options):
    reduction, with_weight, smoothing, z_loss, softcap = options
    logits, target = make_case((6,), 7, torch.float64, "cpu")
    weight = torch.rand(7, dtype=torch.float64) + 0.5 if with_weight else None
    x = logits.requires_grad_()
    assert torch.autograd.gradcheck(
        lambda t: fuseops.cross_entropy(
            t, target, weight, reduction, -100, smoothing, z_loss, softcap
        ),
        (x,),
    )


def test_forward_statistics_feed_backward():
    logits, target = make_case((10,), 30, torch.float32, "cpu")
    loss, lse, total = fuseops.cross_entropy_forward(logits, target, reduction="mean")
    valid = target != -100
    torch.testing.assert_close(lse[valid], torch.logsumexp(logits[valid].double(), -1).float())
    assert (lse[~valid] == 0).all()
    assert total.item() == valid.sum().item() and total.dtype == torch.float32
    g = torch.tensor(2.0)
    grad = fuseops.cross_entropy_backward(
        g, logits, target, None, lse, total, "mean", -100, 0.0, 0.0, None
    )
    _, want = float64_loss_and_grad(logits, target, g)
    assert_close(grad, want, torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_inplace_backward_variant(device, dtype, reduction):
    logits, target = make_case((33,), 257, dtype, device)
    want_loss, want_grad = float64_loss_and_grad(
        logits,
        target,
        torch.full((33,) if reduction == "none" else (), 0.5, device=device),
        reduction=reduction,
        label_smoothing=0.1,
    )
    leaf = torch.zeros_like(logits, requires_grad=True)
    buffer = leaf + logits  # an activation, as an LM head's logits are
    storage = buffer.data_ptr()
    loss = fuseops.cross_entropy(
        buffer, target, reduction=reduction, label_smoothing=0.1, inplace_backward=True
    )
    assert_close(loss, want_loss, dtype)
    # The buffer now holds the gradient of the (unscaled) loss.
    assert not torch.equal(buffer, leaf.detach() + logits)
    loss.backward(torch.full_like(loss, 0.5), retain_graph=True)
    assert_close(leaf.grad, want_grad, dtype)
    assert buffer.data_ptr() == storage
    with pytest.raises(RuntimeError, match="only once"):
        loss.backward(torch.full_like(loss, 0.5))


def test_inplace_backward_non_contiguous_logits():
    logits, target = make_case((9,), 40, torch.float32, "cpu", layout="sliced")
    want_loss, want_grad = float64_loss_and_grad(logits, target, torch.ones(()))
    x = logits.clone().requires_grad_()
    y = x * 1.0
    view = y.t().contiguous().t()  # column-major: written through a copy
    loss = fuseops.cross_entropy(view, target, inplace_backward=True)
    loss.backward()
    assert_close(loss, want_loss, torch.float32)
    assert_close(x.grad, want_grad, torch.float32)


def test_bad_inputs_are_clear_errors():
    logits = torch.randn(4, 10)
    good = torch.tensor([1, 2, 3, 4])
    expect_error_mentions(
        lambda: fuseops.cross_entropy(logits, torch.tensor([1, 10, 0, 0])),
        ["fuseops::cross_entropy", "target", "10", "[0, 10)"],
    )
    expect_error_mentions(
        lambda: fuseops.cross_entropy(logits, torch.tensor([1, -1, 0, 0])),
        ["fuseops::cross_entropy", "target", "-1"],
    )
    expect_error_mentions(
        lambda: fuseops.cross_entropy(logits, torch.rand(4, 10)),
        ["fuseops::cross_entropy", "target", "int64"],
    )
    expect_error_mentions(
        lambda: fuseops.cross_entropy(logits, good[:3]),
        ["fuseops::cross_entropy", "target", "[4]", "[3]"],
    )
    expect_error_mentions(
        lambda: fuseops.cross_entropy(logits.int(), good),
        ["fuseops::cross_entropy", "logits", "Int"],
    )
    expect_error_mentions(
        lambda: fuseops.cross_entropy(logits, good, reduction="avg"),
        ["fuseops::cross_entropy", "reduction", "avg"],
    )
    expect_error_mentions(
        lambda: fuseops.cross_entropy(logits, good, torch.ones(3)),
        ["fuseops::cross_entropy", "weight", "[10]"],
    )
    expect_error_mentions(
        lambda: fuseops.cross_entropy(logits, good, label_smoothing=-0.1),
        ["fuseops::cross_entropy", "label_smoothing"],
    )
    expect_error_mentions(
        lambda: fuseops.cross_entropy(logits, good, softcap=0.0),
        ["fuseops::cross_entropy", "softcap"],
    )
    expect_error_mentions(
        lambda: fuseops.cross_entropy(logits, good, z_loss=-1.0),
        ["fuseops::cross_entropy", "z_loss"],
    )
    expect_error_mentions(
        lambda: fuseops.cross_entropy(
            logits.requires_grad_(), good, torch.ones(10, requires_grad=True)
        ),
        ["fuseops::cross_entropy", "weight", "not differentiable"],
    )
    expect_error_mentions(
        lambda: fuseops.cross_entropy(torch.randn(4, 1).expand(4, 10), good, inplace_backward=True),
        ["fuseops::cross_entropy_inplace", "logits", "overlap"],
    )
    expect_error_mentions(
        lambda: fuseops.cross_entropy(torch.randn(()), torch.tensor(0)),
        ["fuseops::cross_entropy", "logits", "0-dimensional"],
    )


def test_backward_op_has_no_derivative():
    logits, target = make_case((4,), 6, torch.float64, "cpu")
    loss, lse, total = fuseops.cross_entropy_forward(logits, target)
    g = torch.ones((), dtype=torch.float64, requires_grad=True)
    expect_error_mentions(
        lambda: fuseops.cross_entropy_backward(g, logits, target, None, lse, total),
        ["fuseops::cross_entropy_backward", "not differentiable"],
    )


@pytest.mark.slow
def test_compile_fullgraph_forward_and_backward():
    logits, target = make_case((16,), 50, torch.float32, "cpu")
    weight = torch.rand(50) + 0.5

    def fn(x):
        return fuseops.cross_entropy(
            x * 1.5, target, weight, label_smoothing=0.1, z_loss=1e-3, softcap=4.0
        )

    compiled = torch.compile(fn, fullgraph=True)
    x1, x2 = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    compiled(x1).backward()
    fn(x2).backward()
    torch.testing.assert_close(x1.grad, x2.grad)


# --- linear_cross_entropy -------------------------------------------------------


def float64_linear(x, w, b, target, grad_output, **options):
    xd, wd = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    bd = b.detach().double().requires_grad_() if b is not None else None
    loss = reference.linear_cross_entropy(xd, wd, target, bd, **options)
    leaves = [xd, wd] + ([bd] if bd is not None else [])
    return (loss.detach(),) + torch.autograd.grad(loss, leaves, grad_output.double())


LINEAR_OPTIONS = [
    {},
    {"reduction": "sum"},
    {"reduction": "sum", "normalizer": 37.0},
    {"weight": "class", "label_smoothing": 0.1},
    {"z_loss": 1e-3, "softcap": 5.0, "ignore_index": 2},
    {"reduction": "none"},
    {"reduction": "none", "weight": "class", "z_loss": 1e-3, "softcap": 5.0},
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("options", LINEAR_OPTIONS)
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_cross_entropy_matches_unfused_float64(device, dtype, options, with_bias):
    n, h, v = 333, 24, 100  # several chunks of 64+ rows, the last one partial
    x = torch.randn(n, h, device=device).to(dtype)
    w = (torch.randn(v, h, device=device) / h**0.5).to(dtype)
    b = torch.randn(v, device=device).to(dtype) if with_bias else None
    target = torch.randint(0, v, (n,), device=device)
    target[::7] = options.get("ignore_index", -100)
    options = dict(options)
    if options.get("weight") == "class":
        options["weight"] = torch.rand(v, device=device) + 0.5
    xi, wi = x.clone().requires_grad_(), w.clone().requires_grad_()
    bi = b.clone().requires_grad_() if b is not None else None
    loss = fuseops.linear_cross_entropy(xi, wi, target, bi, **options)
    # reduction "none": a different grad_output per row (the recomputing
    # backward scales each row's gradient by its own).
    g = torch.tensor(0.75, device=device) if loss.dim() == 0 else torch.rand(n, device=device) + 0.5
    loss.backward(g.to(loss.dtype))
    want = float64_linear(x, w, b, target, g, **options)
    got = (loss, xi.grad, wi.grad) + ((bi.grad,) if b is not None else ())
    assert loss.dtype == dtype and wi.grad.dtype == dtype
    for index, (gv, wv) in enumerate(zip(got, want)):
        if dtype == torch.bfloat16:
            scale = max(1.0, wv.abs().max().item()) if index == 0 else wv.abs().max().item()
            torch.testing.assert_close(gv.double(), wv, rtol=2e-2, atol=2e-2 * scale)
        else:
            assert_close(gv, wv, dtype, floor_terms=n if index >= 2 else 1)


# reduction "none" with a frozen head (LoRA's LM head): the forward computes
# each row's input gradient (linear_cross_entropy_forward, no recomputing
# backward op), the backward scales it by each row's grad_output, and can run
# again. Bounds as test_linear_cross_entropy_matches_unfused_float64's.
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_bias", [False, True])
def test_none_reduction_with_a_frozen_head_scales_the_forwards_input_gradient(dtype, with_bias):
    n, h, v = 333, 24, 100
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, h, generator=gen).to(dtype)
    w = (torch.randn(v, h, generator=gen) / h**0.5).to(dtype)
    b = torch.randn(v, generator=gen).to(dtype) if with_bias else None
    target = torch.randint(0, v, (n,), generator=gen)
    target[::7] = -100
    xi = x.clone().requires_grad_()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        loss = fuseops.linear_cross_entropy(xi, w, target, b, reduction="none", z_loss=1e-3)
        g = torch.rand(n, generator=gen).to(dtype) + 0.5
        loss.backward(g, retain_graph=True)
    names = {e.name for e in prof.events()}
    assert "fuseops::linear_cross_entropy_forward" in names, sorted(names)
    assert "fuseops::linear_cross_entropy_stats" not in names
    first, xi.grad = xi.grad, None
    want = float64_linear(x, w, b, target, g.float(), reduction="none", z_loss=1e-3)
    for got, expected in ((loss, want[0]), (first, want[1])):
        if dtype == torch.bfloat16:
            scale = max(1.0, expected.abs().max().item())
            torch.testing.assert_close(got.double(), expected, rtol=2e-2, atol=2e-2 * scale)
        else:
            assert_close(got, expected, dtype)
    # Again, with twice the grad_output: twice the gradient, exactly.
    loss.backward(2 * g)
    assert torch.equal(xi.grad, 2 * first)


# The softmax statistics of linear_cross_entropy_stats against float64 on
# the materialised logits: 200 rows of a 70000-class head make 4 chunks of
# 64 rows (the last partial), each read in blocks of 59 rows (4 Mi floats),
# the last block of a chunk short. Bounds as the loss's above: float32 1e-5
# of the largest value, bfloat16 2e-2 (logits rounded to 8 bits before the
# statistics); the gradients, sums over rows, 10 times that.
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("softcap", [None, 4.0])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_linear_cross_entropy_softmax_stats_match_float64(dtype, softcap, reduction):
    n, h, v = 200, 16, 70000
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, h, generator=gen).to(dtype)
    w = torch.randn(v, h, generator=gen).to(dtype)
    target = torch.randint(0, v, (n,), generator=gen)
    target[::9] = -100
    xi, wi = x.clone().requires_grad_(), w.clone().requires_grad_()
    loss, lse, predicted, stats = fuseops.linear_cross_entropy_stats(
        xi, wi, target, reduction=reduction, softcap=softcap, softmax_stats=True
    )
    z = x.double() @ w.double().T
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    log_p = torch.log_softmax(z, -1)
    valid = (target != -100).double()[:, None]
    want = (
        torch.stack(
            [
                -(log_p.exp() * log_p).sum(-1),
                z.mean(-1),
                torch.logsumexp(2 * log_p, -1),
            ],
            -1,
        )
        * valid
    )
    assert stats.shape == (n, 3) and stats.dtype == torch.float32 and not stats.requires_grad
    bound = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(
        stats.double(), want, rtol=0, atol=bound * max(1.0, want.abs().max().item())
    )
    assert predicted.numel() == 0
    # The loss keeps its gradient: the statistics make the backward recompute.
    g = torch.rand(()) if loss.dim() == 0 else torch.rand(n)
    loss.backward(g.to(loss.dtype))
    want_loss = float64_linear(x, w, None, target, g, reduction=reduction, softcap=softcap)
    for got, expected in zip((loss, xi.grad, wi.grad), want_loss):
        scale = max(1.0, expected.abs().max().item())
        torch.testing.assert_close(got.double(), expected, rtol=0, atol=bound * scale * 10)


# bfloat16/float16 products run in float32 on widened operands on CPUs
# without dot-product instructions for the type (linear_loss.h), natively
# elsewhere; the environment variable forces either, so every CPU tests both.
# Tolerances: bfloat16 2e-2 (8 significant bits in the logits and the
# gradients), float16 4e-3 (11 bits), relative to the largest value.
@pytest.mark.parametrize("products", ["float32", "native"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("options", [{}, {"reduction": "none", "z_loss": 1e-3}])
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_cross_entropy_products_widened_or_native(
    monkeypatch, products, dtype, options, with_bias
):
    monkeypatch.setenv("FUSEOPS_REDUCED_GEMMS", "emulated" if products == "float32" else "native")
    tol = 2e-2 if dtype == torch.bfloat16 else 4e-3
    gen = torch.Generator().manual_seed(5)
    # 333 rows: chunks of 64, the last one partial; 5000
    # classes: two blocks of the widened weight (4096 rows at most).
    n, h, v = 333, 24, 5000
    x = torch.randn(n, h, generator=gen).to(dtype)
    w = (torch.randn(v, h, generator=gen) / h**0.5).to(dtype)
    b = torch.randn(v, generator=gen).to(dtype) if with_bias else None
    target = torch.randint(0, v, (n,), generator=gen)
    target[::7] = -100
    xi, wi = x.clone().requires_grad_(), w.clone().requires_grad_()
    bi = b.clone().requires_grad_() if b is not None else None
    loss = fuseops.linear_cross_entropy(xi, wi, target, bi, **options)
    g = torch.tensor(0.75) if loss.dim() == 0 else torch.rand(n, generator=gen) + 0.5
    loss.backward(g.to(dtype))
    want = float64_linear(x, w, b, target, g, **options)
    got = (loss, xi.grad, wi.grad) + ((bi.grad,) if b is not None else ())
    for gv, wv in zip(got, want):
        assert gv.dtype == dtype
        scale = max(wv.abs().max().item(), 1e-30)
        torch.testing.assert_close(gv.double(), wv, rtol=tol, atol=tol * scale)


def test_linear_loss_products_setting_is_checked(monkeypatch):
    monkeypatch.setenv("FUSEOPS_REDUCED_GEMMS", "bf16")
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    w = torch.randn(10, 8, dtype=torch.bfloat16)
    expect_error_mentions(
        lambda: fuseops.linear_cross_entropy(x, w, torch.zeros(4, dtype=torch.long)),
        ["FUSEOPS_REDUCED_GEMMS", "'bf16'"],
    )


def test_linear_cross_entropy_accuracy_report():
    """Error of loss and gradients vs float64 on an LM-head-like problem,
    against the unfused float32 composite's error: fuseops is no worse."""
    torch.manual_seed(1)
    n, h, v = 512, 64, 3000
    x = torch.randn(n, h)
    w = torch.randn(v, h) / h**0.5
    target = torch.randint(0, v, (n,))
    want = float64_linear(x, w, None, target, torch.ones(()))
    xi, wi = x.clone().requires_grad_(), w.clone().requires_grad_()
    loss = fuseops.linear_cross_entropy(xi, wi, target)
    loss.backward()
    xu, wu = x.clone().requires_grad_(), w.clone().requires_grad_()
    unfused = F.cross_entropy(F.linear(xu, wu), target)
    unfused.backward()
    for ours, theirs, exact in zip((loss, xi.grad, wi.grad), (unfused, xu.grad, wu.grad), want):
        err = (ours.double() - exact).abs().max().item() / exact.abs().max().item()
        err_unfused = (theirs.double() - exact).abs().max().item() / exact.abs().max().item()
        assert err < 1e-5
        assert err <= 4 * err_unfused + 1e-7


def test_linear_cross_entropy_errors_and_single_backward():
    x, w, target = (
        torch.randn(5, 4, requires_grad=True),
        torch.randn(9, 4, requires_grad=True),
        torch.randint(0, 9, (5,)),
    )
    expect_error_mentions(
        lambda: fuseops.linear_cross_entropy(x, w, target, reduction="all"),
        ["fuseops::linear_cross_entropy", "reduction", "all"],
    )
    expect_error_mentions(
        lambda: fuseops.linear_cross_entropy(x, w, target, reduction="none", normalizer=2.0),
        ["fuseops::linear_cross_entropy", "normalizer", "none"],
    )
    with torch.no_grad():
        expect_error_mentions(
            lambda: fuseops.linear_cross_entropy_backward(torch.ones(4), x, w, target),
            ["fuseops::linear_cross_entropy_backward", "grad_output", "[]"],
        )
    expect_error_mentions(
        lambda: fuseops.linear_cross_entropy(x, w, target, normalizer=2.0),
        ["fuseops::linear_cross_entropy", "normalizer"],
    )
    expect_error_mentions(
        lambda: fuseops.linear_cross_entropy(x, w[:, :3], target),
        ["fuseops::linear_cross_entropy", "weight", "[V, 4]"],
    )
    expect_error_mentions(
        lambda: fuseops.linear_cross_entropy(x, w, target, torch.randn(8)),
        ["fuseops::linear_cross_entropy", "bias", "[9]"],
    )
    expect_error_mentions(
        lambda: fuseops.linear_cross_entropy(x, w, torch.tensor([0, 1, 2, 3, 9])),
        ["fuseops::linear_cross_entropy", "target", "9"],
    )
    loss = fuseops.linear_cross_entropy(x, w, target)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="only once"):
        loss.backward()


def test_linear_cross_entropy_none_backward_recomputes_and_may_repeat():
    """reduction="none" keeps no precomputed gradient: the backward recomputes
    the logits, so it can run twice (retain_graph) and matches the backward
    op called directly, which also gives the mean's gradients."""
    torch.manual_seed(0)
    x, w = torch.randn(90, 8, requires_grad=True), torch.randn(12, 8, requires_grad=True)
    target = torch.randint(0, 12, (90,))
    target[::5] = -100
    loss = fuseops.linear_cross_entropy(x, w, target, reduction="none", label_smoothing=0.1)
    token_weight = torch.rand(90)
    loss.backward(token_weight, retain_graph=True)
    first = (x.grad.clone(), w.grad.clone())
    loss.backward(token_weight)
    torch.testing.assert_close(x.grad, 2 * first[0])
    torch.testing.assert_close(w.grad, 2 * first[1])
    with torch.no_grad():
        gx, gw, gb = fuseops.linear_cross_entropy_backward(
            token_weight, x, w, target, reduction="none", label_smoothing=0.1
        )
        assert gb.numel() == 0
        torch.testing.assert_close(gx, first[0], rtol=0, atol=0)
        torch.testing.assert_close(gw, first[1], rtol=0, atol=0)
        # The backward op for the mean equals the forward's precomputed gradients.
        _, fx, fw, _, _, _, _ = fuseops.linear_cross_entropy_forward(x, w, target)
        bx, bw, _ = fuseops.linear_cross_entropy_backward(torch.tensor(1.0), x, w, target)
    torch.testing.assert_close(bx, fx)
    torch.testing.assert_close(bw, fw)


def float64_outputs(logits, target, weight, reduction, ignore_index, z_loss, softcap, normalizer):
    """The z-loss term, token accuracy and predicted classes from float64
    logits, as CrossEntropyOutput documents them."""
    logits = logits.double()
    capped = logits if softcap is None else softcap * torch.tanh(logits / softcap)
    valid = target != ignore_index
    z_rows = z_loss * torch.logsumexp(capped, -1).square() * valid
    if reduction == "none":
        z = z_rows
    elif reduction == "sum":
        z = z_rows.sum() / (normalizer or 1.0)
    else:
        w = (
            torch.ones(logits.shape[-1], dtype=torch.float64, device=logits.device)
            if weight is None
            else weight.double()
        )
        z = z_rows.sum() / (w[target.clamp(min=0)] * valid).sum()
    predicted = logits.argmax(-1)
    accuracy = ((predicted == target) & valid).sum() / valid.sum()
    return z, accuracy, predicted


# (reduction, class weight, z_loss, softcap, normalizer)
OUTPUT_OPTIONS = [
    ("mean", False, 1e-3, None, None),
    ("mean", True, 1e-2, 5.0, None),
    ("sum", False, 1e-3, None, 7.0),
    ("none", True, 1e-3, 3.0, None),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("options", OUTPUT_OPTIONS)
@pytest.mark.parametrize("fused_head", [False, True])
def test_z_loss_token_accuracy_and_predicted_tokens(device, dtype, options, fused_head):
    reduction, with_weight, z_loss, softcap, normalizer = options
    n, h, v = 150, 16, 40
    x = torch.randn(n, h, device=device).to(dtype)
    w = (torch.randn(v, h, device=device) * 0.6).to(dtype)
    target = torch.randint(0, v, (n,), device=device)
    target[::6] = -100
    logits = F.linear(x.double(), w.double())
    # Make about half the rows predict their target, so accuracy is neither 0 nor 1.
    target[1::2] = logits[1::2].argmax(-1)
    weight = torch.rand(v, device=device) + 0.5 if with_weight else None
    common = dict(z_loss=z_loss, softcap=softcap, weight=weight, reduction=reduction)
    flags = dict(return_z_loss=True, return_token_accuracy=True, return_predicted_tokens=True)
    if fused_head:
        x.requires_grad_()
        out = fuseops.linear_cross_entropy(x, w, target, normalizer=normalizer, **common, **flags)
        plain = fuseops.linear_cross_entropy(x, w, target, normalizer=normalizer, **common)
    else:
        normalizer = None  # cross_entropy has no normalizer: its plain "sum"
        lg = logits.to(dtype).requires_grad_()
        out = fuseops.cross_entropy(lg, target, **common, **flags)
        plain = fuseops.cross_entropy(lg, target, **common)
    assert isinstance(out, fuseops.CrossEntropyOutput)
    # The loss is the one returned without the flags, bit for bit.
    torch.testing.assert_close(out.loss, plain, rtol=0, atol=0)
    want_z, want_accuracy, want_predicted = float64_outputs(
        logits, target, weight, reduction, -100, z_loss, softcap, normalizer
    )
    assert out.z_loss.dtype == out.loss.dtype and out.z_loss.shape == want_z.shape
    assert not out.z_loss.requires_grad
    # The logsumexp is float32 math on the dtype's logits (bfloat16: the
    # logits themselves are rounded to 2^-9 relative, so lse to ~1e-2).
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.z_loss.double(), want_z, rtol=tol, atol=tol * z_loss)
    # Predictions: the bfloat16 logits can tie or reorder near-equal values,
    # so compare with the argmax of the logits as the op saw them.
    seen = logits.to(dtype).double()
    torch.testing.assert_close(out.predicted_tokens, seen.argmax(-1), rtol=0, atol=0)
    valid = target != -100
    correct = ((seen.argmax(-1) == target) & valid).sum() / valid.sum()
    assert out.token_accuracy.dtype == torch.float32
    assert out.token_accuracy.item() == pytest.approx(correct.item(), abs=1e-7)
    if dtype == torch.float32:
        torch.testing.assert_close(out.predicted_tokens, want_predicted, rtol=0, atol=0)
        assert out.token_accuracy.item() == pytest.approx(want_accuracy.item(), abs=1e-7)
    assert 0.3 < out.token_accuracy.item() < 0.8
    # The loss still carries the gradient.
    out.loss.sum().backward()


def test_loss_outputs_only_as_asked_and_clear_errors():
    logits, target = torch.randn(6, 5), torch.randint(0, 5, (6,))
    out = fuseops.cross_entropy(logits, target, return_token_accuracy=True)
    assert out.z_loss is None and out.predicted_tokens is None
    assert out.token_accuracy is not None
    out = fuseops.linear_cross_entropy(
        torch.randn(6, 3), torch.randn(5, 3), target, return_z_loss=True
    )
    assert out.token_accuracy is None and out.predicted_tokens is None
    assert out.z_loss.item() == 0.0  # z_loss=0: the term is zero, not absent
    all_ignored = torch.full((6,), -100)
    out = fuseops.cross_entropy(logits, all_ignored, return_token_accuracy=True)
    assert math.isnan(out.token_accuracy.item())
    with pytest.raises(ValueError, match="fuseops.cross_entropy: return_z_loss"):
        fuseops.cross_entropy(logits.clone(), target, inplace_backward=True, return_z_loss=True)
    # In place: the predictions are taken before the gradient overwrites the logits.
    buffer = logits.clone().requires_grad_()
    out = fuseops.cross_entropy(
        buffer.clone(), target, inplace_backward=True, return_predicted_tokens=True
    )
    torch.testing.assert_close(out.predicted_tokens, logits.argmax(-1))


@pytest.mark.slow
def test_loss_outputs_and_none_reduction_compile_fullgraph():
    x, w, target = torch.randn(70, 8), torch.randn(12, 8), torch.randint(0, 12, (70,))
    token_weight = torch.rand(70)

    def fn(x, w):
        out = fuseops.linear_cross_entropy(
            x,
            w,
            target,
            reduction="none",
            z_loss=1e-3,
            return_token_accuracy=True,
            return_z_loss=True,
        )
        return (out.loss * token_weight).sum(), out.z_loss, out.token_accuracy

    compiled = torch.compile(fn, fullgraph=True)
    x1, w1 = x.clone().requires_grad_(), w.clone().requires_grad_()
    x2, w2 = x.clone().requires_grad_(), w.clone().requires_grad_()
    got, want = compiled(x1, w1), fn(x2, w2)
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e)
    got[0].backward()
    want[0].backward()
    torch.testing.assert_close(x1.grad, x2.grad)
    torch.testing.assert_close(w1.grad, w2.grad)


@pytest.mark.slow
def test_linear_cross_entropy_compile_fullgraph():
    x, w, target = torch.randn(70, 8), torch.randn(12, 8), torch.randint(0, 12, (70,))

    def fn(x, w):
        return fuseops.linear_cross_entropy(x * 2.0, w, target, label_smoothing=0.1)

    compiled = torch.compile(fn, fullgraph=True)
    x1, w1 = x.clone().requires_grad_(), w.clone().requires_grad_()
    x2, w2 = x.clone().requires_grad_(), w.clone().requires_grad_()
    torch.testing.assert_close(compiled(x1, w1), fn(x2, w2))
    compiled(x1, w1).backward()
    fn(x2, w2).backward()
    torch.testing.assert_close(x1.grad, x2.grad)
    torch.testing.assert_close(w1.grad, w2.grad)


# --- fuseops.nn -------------------------------------------------------------------


def test_cross_entropy_loss_module_matches_torch():
    weight = torch.rand(20) + 0.5
    ours = fuseops.nn.CrossEntropyLoss(weight=weight, ignore_index=3, label_smoothing=0.1)
    theirs = torch.nn.CrossEntropyLoss(weight=weight, ignore_index=3, label_smoothing=0.1)
    logits, target = make_case((30,), 20, torch.float32, "cpu", ignore=False)
    torch.testing.assert_close(ours(logits, target), theirs(logits, target))
    assert fuseops.nn.CrossEntropyLoss(z_loss=1e-3, softcap=3.0)(
        logits, target
    ).item() == pytest.approx(
        reference.cross_entropy(logits.double(), target, z_loss=1e-3, softcap=3.0).item(), rel=1e-5
    )


def test_linear_cross_entropy_loss_module():
    head = torch.nn.Linear(16, 50, bias=False)
    module = fuseops.nn.LinearCrossEntropyLoss(label_smoothing=0.05)
    x, target = torch.randn(20, 16), torch.randint(0, 50, (20,))
    got = module(x, head.weight, target)
    want = F.cross_entropy(head(x), target, label_smoothing=0.05)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_linear_cross_entropy_loss_modules_return_outputs(reduction):
    """The fused module and its plain-torch counterpart return the same
    CrossEntropyOutput (per-token losses and z-loss in the target's shape)."""
    head = torch.nn.Linear(16, 50, bias=False)
    x, target = torch.randn(4, 5, 16), torch.randint(0, 50, (4, 5))
    target[0, :2] = -100
    options = dict(reduction=reduction, z_loss=1e-3, return_z_loss=True, return_token_accuracy=True)
    got = fuseops.nn.LinearCrossEntropyLoss(**options)(x, head.weight, target)
    want = fuseops.nn.TorchLinearCrossEntropyLoss(**options)(x, head.weight, target)
    assert isinstance(got, fuseops.CrossEntropyOutput) and got.predicted_tokens is None
    for g, e in zip(got[:3], want[:3]):
        torch.testing.assert_close(g, e)
    assert got.loss.shape == (target.shape if reduction == "none" else ())
    assert got.z_loss.shape == got.loss.shape
    ce = fuseops.nn.CrossEntropyLoss(reduction=reduction, return_token_accuracy=True)
    out = ce(head(x).movedim(-1, 1), target)
    torch.testing.assert_close(out.token_accuracy, got.token_accuracy)


# --- memory ---------------------------------------------------------------------


def peak_bytes(fn):
    from fuseops.bench.timing import peak_memory

    return peak_memory(fn, torch.device("cpu"))


def test_memory_of_forward_and_backward():
    """fwd+bwd allocates the logits' gradient and per-row vectors only
    (<= 1.1x the logits); the in-place variant allocates no [N, V] tensor;
    linear_cross_entropy stays under 25% of the unfused composite's peak."""
    n, v = 512, 4000
    logits, target = make_case((n,), v, torch.float32, "cpu", ignore=False)
    size = logits.numel() * logits.element_size()

    def functional():
        x = logits.detach().requires_grad_()
        fuseops.cross_entropy(x, target).backward()
        return x.grad

    def inplace():
        x = logits.clone().requires_grad_()
        y = x * 1.0
        return torch.autograd.grad(fuseops.cross_entropy(y, target, inplace_backward=True), y)

    assert peak_bytes(functional) <= 1.1 * size
    # x and y are made by the measured call: two [N, V] tensors, no third.
    assert peak_bytes(inplace) <= 2.1 * size

    h = 256
    x, w = torch.randn(1024, h), torch.randn(v * 2, h) / h**0.5
    tgt = torch.randint(0, v * 2, (1024,))

    def fused():
        xi, wi = x.detach().requires_grad_(), w.detach().requires_grad_()
        fuseops.linear_cross_entropy(xi, wi, tgt).backward()
        return xi.grad, wi.grad

    def unfused():
        xi, wi = x.detach().requires_grad_(), w.detach().requires_grad_()
        F.cross_entropy(F.linear(xi, wi), tgt).backward()
        return xi.grad, wi.grad

    assert peak_bytes(fused) <= 0.25 * peak_bytes(unfused)


def test_no_second_derivatives():
    """create_graph=True is refused rather than given first-order-only graphs."""
    logits, target = make_case((5,), 8, torch.float64, "cpu")
    x = logits.clone().requires_grad_()
    expect_error_mentions(
        lambda: torch.autograd.grad(fuseops.cross_entropy(x, target), x, create_graph=True),
        ["fuseops::cross_entropy_backward", "not differentiable"],
    )
    y = x * 1.0
    expect_error_mentions(
        lambda: torch.autograd.grad(fuseops.cross_entropy_inplace(y, target), x, create_graph=True),
        ["fuseops::cross_entropy_inplace", "create_graph"],
    )
    h, w = torch.randn(5, 3, requires_grad=True), torch.randn(8, 3, requires_grad=True)
    expect_error_mentions(
        lambda: torch.autograd.grad(
            fuseops.linear_cross_entropy(h, w, target), h, create_graph=True
        ),
        ["fuseops::linear_cross_entropy", "create_graph"],
    )
