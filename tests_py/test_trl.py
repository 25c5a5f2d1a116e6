"""fuseops.trl: TRL's fused LM head (``ChunkedLogProbFunction``) replaced by
fuseops.linear_cross_entropy_stats, against exact math and against TRL's own
head on the same inputs.

The float64 reference materialises the logits of float64 copies of the
inputs and applies TRL's transform (``logit_scale``, softcap,
``temperature``). Tolerances: float32 products of 32 terms and float32 row
statistics over 300 classes are good to about 1e-6 relative; 1e-5 of the
largest magnitude leaves margin. bfloat16 inputs are exact in float64, but
the chunk's logits are rounded to bfloat16 (2^-9 relative) before the row
statistics, as TRL's tiles are: 2e-2 of the largest magnitude (the logits
reach about 10). Gradients sum over rows (the weight's over 50 rows): the
same bounds times sqrt(rows). ``is_top1`` is compared on the rows whose two
largest reference logits differ by more than the rounding.

Skipped with a message where TRL is missing; ``tools/setup.sh`` installs it
(the ``trainers`` extra).
"""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("trl", reason="trl is not installed (pip install 'fuseops[trainers]')")

import fuseops  # noqa: E402
import fuseops.trl  # noqa: E402
from trl.kernels import ChunkedLogProbFunction  # noqa: E402

ROWS, HIDDEN, VOCAB = 50, 32, 300
OUTPUTS = ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1")
BOUND = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def inputs(dtype, bias=True, seed=0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(ROWS, HIDDEN, generator=gen).to(dtype).requires_grad_()
    weight = (torch.randn(VOCAB, HIDDEN, generator=gen) * 0.5).to(dtype).requires_grad_()
    b = (torch.randn(VOCAB, generator=gen) * 0.5).to(dtype).requires_grad_() if bias else None
    targets = torch.randint(0, VOCAB, (ROWS,), generator=gen)
    return hidden, weight, b, targets


def reference(hidden, weight, bias, targets, temperature, softcap, logit_scale):
    """TRL's five outputs and z in float64, from the materialised logits."""
    y = hidden.double() @ weight.double().T
    if bias is not None:
        y = y + bias.double()
    z = y * logit_scale
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    z = z / temperature
    log_p = torch.log_softmax(z, -1)
    p = log_p.exp()
    return (
        log_p.gather(-1, targets[:, None]).squeeze(-1),
        -(p * log_p).sum(-1),
        torch.logsumexp(2 * log_p, -1),
        z.mean(-1),
        z.argmax(-1) == targets,
    ), z


def run(function, hidden, weight, bias, targets, temperature, softcap, logit_scale):
    return function.apply(
        hidden, weight, bias, targets, temperature, 128, softcap, logit_scale, OUTPUTS
    )


def clear_ties(z, dtype):
    # Two rounding steps of the logits' dtype apart at the largest logit.
    top = z.topk(2, -1).values
    return (top[:, 0] - top[:, 1]) > 2 * torch.finfo(dtype).eps * z.abs().max()


def assert_close(got, want, bound, terms=1):
    scale = max(1.0, want.abs().max().item())
    torch.testing.assert_close(got.double(), want, rtol=0, atol=bound * scale * math.sqrt(terms))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize(
    "temperature,softcap,logit_scale",
    [(1.0, None, 1.0), (0.7, None, 1.0), (1.0, 3.0, 1.0), (0.7, 3.0, 0.5)],
    ids=["plain", "temperature", "softcap", "all"],
)
def test_outputs_and_gradients_match_float64(dtype, temperature, softcap, logit_scale):
    hidden, weight, bias, targets = inputs(dtype)
    bound = BOUND[dtype]
    if dtype == torch.bfloat16 and (temperature, logit_scale) != (1.0, 1.0):
        # The factor scales the bfloat16 hidden states: one more rounding
        # (module docstring of fuseops.trl), 2^-9 of each term.
        bound *= 2
    got = run(
        fuseops.trl.ChunkedLogProbs,
        hidden,
        weight,
        bias,
        targets,
        temperature,
        softcap,
        logit_scale,
    )
    leaves = [t.detach().double().requires_grad_() for t in (hidden, weight, bias)]
    want, z = reference(*leaves, targets, temperature, softcap, logit_scale)
    for name, g, w in zip(OUTPUTS[:4], got[:4], want[:4]):
        assert g.dtype == torch.float32, name
        assert_close(g, w.detach(), bound)
    sure = clear_ties(z.detach(), dtype)
    assert sure.sum() >= 5  # a softcap saturates (ties) many rows
    assert torch.equal(got[4][sure], want[4][sure])

    grad = torch.randn(ROWS, generator=torch.Generator().manual_seed(1))
    got_grads = torch.autograd.grad((got[0] * grad).sum(), (hidden, weight, bias))
    want_grads = torch.autograd.grad((want[0] * grad.double()).sum(), leaves)
    for g, w, terms in zip(got_grads, want_grads, (1, ROWS, ROWS)):
        assert g.dtype == dtype
        assert_close(g, w, bound, terms)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_frozen_head_gradients_match_float64(dtype):
    # LoRA leaves the LM head frozen: only the hidden states' gradient, which
    # fuseops computes in the forward (no recomputed logits).
    hidden, weight, bias, targets = inputs(dtype)
    weight, bias = weight.detach(), bias.detach()
    got = run(fuseops.trl.ChunkedLogProbs, hidden, weight, bias, targets, 0.7, 3.0, 1.0)
    wide = hidden.detach().double().requires_grad_()
    want, _ = reference(wide, weight, bias, targets, 0.7, 3.0, 1.0)
    bound = BOUND[dtype] * (2 if dtype == torch.bfloat16 else 1)
    assert_close(got[0], want[0].detach(), bound)
    assert_close(got[1], want[1].detach(), bound)
    grad = torch.randn(ROWS, generator=torch.Generator().manual_seed(1))
    (got_grad,) = torch.autograd.grad((got[0] * grad).sum(), (hidden,))
    (want_grad,) = torch.autograd.grad((want[0] * grad.double()).sum(), (wide,))
    assert_close(got_grad, want_grad, bound)


def test_matches_trls_own_head():
    # The same call through TRL's head (torch tiles on the CPU): float32
    # results of the same math in another order.
    hidden, weight, bias, targets = inputs(torch.float32)
    args = (targets, 0.7, 3.0, 0.5)
    got = run(fuseops.trl.ChunkedLogProbs, hidden, weight, bias, *args)
    want = run(ChunkedLogProbFunction, hidden, weight, bias, *args)
    for name, g, w in zip(OUTPUTS[:4], got[:4], want[:4]):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5, msg=name)
    assert torch.equal(got[4], want[4])
    got_grads = torch.autograd.grad(got[0].sum(), (hidden, weight, bias))
    want_grads = torch.autograd.grad(want[0].sum(), (hidden, weight, bias))
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_under_autocast_the_products_are_bfloat16():
    # Trainer(bf16=True): float32 hidden states and head, bfloat16 GEMMs, as
    # TRL's head runs them; both round the logits to bfloat16.
    hidden, weight, bias, targets = inputs(torch.float32, bias=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = run(fuseops.trl.ChunkedLogProbs, hidden, weight, None, targets, 1.0, None, 1.0)
        want = run(ChunkedLogProbFunction, hidden, weight, None, targets, 1.0, None, 1.0)
    for name, g, w in zip(OUTPUTS[:4], got[:4], want[:4]):
        assert g.dtype == torch.float32, name
        scale = max(1.0, w.abs().max().item())
        torch.testing.assert_close(g, w, rtol=0, atol=BOUND[torch.bfloat16] * scale, msg=name)


def test_float32_hidden_states_with_a_bfloat16_head():
    # TRL's cast_lm_head_to_fp32: float32 hidden states, the head cast to them.
    hidden, weight, bias, targets = inputs(torch.float32)
    weight16 = weight.detach().bfloat16().requires_grad_()
    got = run(fuseops.trl.ChunkedLogProbs, hidden, weight16, None, targets, 1.0, None, 1.0)
    want, _ = reference(hidden.detach(), weight16.detach(), None, targets, 1.0, None, 1.0)
    assert_close(got[0], want[0], BOUND[torch.float32])
    (grad_weight,) = torch.autograd.grad(got[0].sum(), (weight16,))
    assert grad_weight.dtype == torch.bfloat16


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("head", ["trained", "frozen"])
def test_entropy_gradient_matches_float64(dtype, head):
    # GRPO's entropy bonus: loss = f(log_probs) - c * entropy. The entropy's
    # gradient comes from logits recomputed in the backward, a block at a
    # time; rows with a zero coefficient (padding) are skipped there, and
    # their gradient is the log-probabilities' alone.
    hidden, weight, bias, targets = inputs(dtype)
    if head == "frozen":
        weight, bias = weight.detach(), bias.detach()
    got = run(fuseops.trl.ChunkedLogProbs, hidden, weight, bias, targets, 0.7, 3.0, 1.0)
    leaves = [t.detach().double().requires_grad_(t.requires_grad) for t in (hidden, weight, bias)]
    want, _ = reference(*leaves, targets, 0.7, 3.0, 1.0)
    gen = torch.Generator().manual_seed(2)
    grad_log_probs = torch.randn(ROWS, generator=gen)
    grad_entropy = -1 - 2 * torch.rand(ROWS, generator=gen)
    grad_entropy[::3] = 0
    wrt = [t for t in (hidden, weight, bias) if t.requires_grad]
    got_grads = torch.autograd.grad(
        (got[0] * grad_log_probs).sum() + (got[1] * grad_entropy).sum(), wrt
    )
    want_grads = torch.autograd.grad(
        (want[0] * grad_log_probs.double()).sum() + (want[1] * grad_entropy.double()).sum(),
        [t for t in leaves if t.requires_grad],
        retain_graph=True,
    )
    # The bfloat16 hidden states are scaled by 1 / temperature (one more
    # rounding, as in test_outputs_and_gradients_match_float64).
    bound = BOUND[dtype] * (2 if dtype == torch.bfloat16 else 1)
    for g, w, terms in zip(got_grads, want_grads, (1, ROWS, ROWS)):
        assert g.dtype == dtype
        assert_close(g, w, bound, terms)
    if dtype != torch.float32:
        return
    # The entropy's share is far above float32's bound (bfloat16's is about
    # its size): without it, the check fails.
    (without,) = torch.autograd.grad((want[0] * grad_log_probs.double()).sum(), leaves[:1])
    allowed = bound * max(1.0, want_grads[0].abs().max().item())
    assert (without - want_grads[0]).abs().max() > 5 * allowed


def test_apply_and_revert_swap_trls_head():
    import trl.trainer.utils as trl_utils

    original = trl_utils._ChunkedLogProbFunction
    try:
        fuseops.trl.apply()
        fuseops.trl.apply()
        assert trl_utils._ChunkedLogProbFunction is fuseops.trl.ChunkedLogProbs
    finally:
        fuseops.trl.revert()
    assert trl_utils._ChunkedLogProbFunction is original
