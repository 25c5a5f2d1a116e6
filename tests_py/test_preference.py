"""fuseops.preference: DPO (sigmoid, cDPO smoothing, hinge, IPO), SimPO,
CPO and ORPO fused with the LM head, and token_log_probs under them.

Each is checked against its formula (the papers', in TRL's form) evaluated
in float64 on materialized logits, ``log_softmax(x @ W.T + b)``: the loss
and the gradients of the hidden states and the head. float32 runs differ
from that by float32 rounding of the per-token statistics and of the
sequence sums (a few 1e-7 relative per term; bound 1e-5 relative to the
largest value, as the cross-entropy tests); bfloat16 inputs carry their
own rounding, 2^-9 relative per logit, so the bound there is 2e-2.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fuseops
from fuseops import preference

B, T, H, V = 3, 7, 16, 50


def batch(dtype=torch.float32, seed=0, bias=False):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2 * B, T, H, generator=gen).to(dtype)
    w = (torch.randn(V, H, generator=gen) / H**0.5).to(dtype)
    b = torch.randn(V, generator=gen).to(dtype) if bias else None
    target = torch.randint(0, V, (2 * B, T), generator=gen)
    target[:, :2] = -100  # the prompt
    target[1, -1] = -100  # padding
    return x, w, b, target


def float64_token_logps(x, w, b, target, temperature=1.0):
    logits = F.linear(x.double(), w.double(), None if b is None else b.double()) / temperature
    mask = target != -100
    picked = logits.log_softmax(-1).gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return picked * mask


def sums(x, w, b, target):
    lp = float64_token_logps(x, w, b, target)
    counts = (target != -100).sum(-1).double()
    return lp.sum(-1)[:B], lp.sum(-1)[B:], counts[:B], counts[B:]


def logsig(z):
    return F.logsigmoid(z)


def dpo_reference(x, w, b, target, ref, beta, loss_type, smoothing):
    c, r, nc, nr = sums(x, w, b, target)
    ref_c, ref_r = ref
    cr, rr = c - ref_c, r - ref_r
    if loss_type == "sigmoid":
        z = beta * (cr - rr)
        losses = -(1 - smoothing) * logsig(z) - smoothing * logsig(-z)
    elif loss_type == "hinge":
        losses = torch.relu(1 - beta * (cr - rr))
    else:
        losses = (cr / nc - rr / nr - 1 / (2 * beta)) ** 2
    return losses.mean()


def simpo_reference(x, w, b, target, beta, gamma, smoothing):
    c, r, nc, nr = sums(x, w, b, target)
    z = beta * (c / nc - r / nr) - gamma
    return (-(1 - smoothing) * logsig(z) - smoothing * logsig(-z)).mean()


def cpo_reference(x, w, b, target, beta, alpha, average):
    c, r, nc, nr = sums(x, w, b, target)
    nll = -c.sum() / nc.sum()
    if average:
        c, r = c / nc, r / nr
    return -logsig(beta * (c - r)).mean() + alpha * nll


def orpo_reference(x, w, b, target, beta):
    c, r, nc, nr = sums(x, w, b, target)
    nll = -c.sum() / nc.sum()
    pc, pr = c / nc, r / nr  # average log-probabilities
    log_odds = (pc - pr) - (torch.log(1 - torch.exp(pc)) - torch.log(1 - torch.exp(pr)))
    return nll - beta * logsig(log_odds).mean()


REF = (torch.tensor([-40.0, -35.0, -20.0]).double(), torch.tensor([-38.0, -41.0, -22.0]).double())

CASES = {
    "dpo sigmoid": (
        lambda x, w, b, t: (
            preference.fused_linear_dpo(
                x, w, t, REF[0].float(), REF[1].float(), linear_bias=b, beta=0.1
            ).loss
        ),
        lambda x, w, b, t: dpo_reference(x, w, b, t, REF, 0.1, "sigmoid", 0.0),
    ),
    "dpo cdpo": (
        lambda x, w, b, t: (
            preference.fused_linear_dpo(
                x,
                w,
                t,
                REF[0].float(),
                REF[1].float(),
                linear_bias=b,
                beta=0.5,
                label_smoothing=0.2,
            ).loss
        ),
        lambda x, w, b, t: dpo_reference(x, w, b, t, REF, 0.5, "sigmoid", 0.2),
    ),
    "dpo hinge": (
        lambda x, w, b, t: (
            preference.fused_linear_dpo(
                x, w, t, REF[0].float(), REF[1].float(), linear_bias=b, beta=0.05, loss_type="hinge"
            ).loss
        ),
        lambda x, w, b, t: dpo_reference(x, w, b, t, REF, 0.05, "hinge", 0.0),
    ),
    "dpo ipo": (
        lambda x, w, b, t: (
            preference.fused_linear_dpo(
                x, w, t, REF[0].float(), REF[1].float(), linear_bias=b, beta=0.1, loss_type="ipo"
            ).loss
        ),
        lambda x, w, b, t: dpo_reference(x, w, b, t, REF, 0.1, "ipo", 0.0),
    ),
    "simpo": (
        lambda x, w, b, t: (
            preference.fused_linear_simpo(
                x, w, t, linear_bias=b, beta=2.0, gamma=0.5, label_smoothing=0.1
            ).loss
        ),
        lambda x, w, b, t: simpo_reference(x, w, b, t, 2.0, 0.5, 0.1),
    ),
    "cpo": (
        lambda x, w, b, t: preference.fused_linear_cpo(x, w, t, linear_bias=b, beta=0.1).loss,
        lambda x, w, b, t: cpo_reference(x, w, b, t, 0.1, 1.0, False),
    ),
    "cpo averaged": (
        lambda x, w, b, t: (
            preference.fused_linear_cpo(
                x, w, t, linear_bias=b, beta=0.3, alpha=0.5, average_log_prob=True
            ).loss
        ),
        lambda x, w, b, t: cpo_reference(x, w, b, t, 0.3, 0.5, True),
    ),
    "orpo": (
        lambda x, w, b, t: preference.fused_linear_orpo(x, w, t, linear_bias=b, beta=0.1).loss,
        lambda x, w, b, t: orpo_reference(x, w, b, t, 0.1),
    ),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("name", sorted(CASES))
def test_loss_and_gradients_match_the_float64_formula(name, bias, dtype):
    ours, theirs = CASES[name]
    x, w, b, target = batch(dtype, seed=len(name), bias=bias)
    leaves = [x.clone().requires_grad_(), w.clone().requires_grad_()]
    if b is not None:
        leaves.append(b.clone().requires_grad_())
    loss = ours(*leaves[:2], leaves[2] if b is not None else None, target)
    loss.backward()
    wide = [t.detach().double().requires_grad_() for t in leaves]
    want = theirs(*wide[:2], wide[2] if b is not None else None, target)
    want_grads = torch.autograd.grad(want, wide)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(loss.double(), want, rtol=tol, atol=tol)
    for got, exact in zip([t.grad for t in leaves], want_grads):
        scale = exact.abs().max().item()
        torch.testing.assert_close(got.double(), exact, rtol=tol, atol=tol * scale)


def test_token_log_probs_with_temperature_and_flat_input():
    x, w, b, target = batch(bias=True)
    got = preference.token_log_probs(x.reshape(-1, H), w, target, b, temperature=0.7)
    assert got.shape == target.shape
    torch.testing.assert_close(
        got.double(), float64_token_logps(x, w, b, target, 0.7), rtol=1e-5, atol=1e-5
    )
    with pytest.raises(ValueError, match="temperature must be > 0"):
        preference.token_log_probs(x, w, target, temperature=0.0)


def test_token_log_probs_are_float32_for_bfloat16_input():
    # Not rounded to bfloat16 (2^-9 of a value of about -4 per token, which a
    # sequence's sum accumulates): float32 values near the float64 ones of
    # the same bfloat16 inputs (2e-2: the chunk's logits may be rounded to
    # bfloat16 before the logsumexp where the CPU multiplies in bfloat16).
    x, w, b, target = batch(torch.bfloat16, bias=True)
    got = preference.token_log_probs(x, w, target, b)
    assert got.dtype == torch.float32
    want = float64_token_logps(x, w, b, target)
    torch.testing.assert_close(got.double(), want, rtol=0, atol=2e-2)
    counted = target != -100
    assert (got[counted] != got[counted].bfloat16().float()).float().mean() > 0.9
    assert torch.equal(got[~counted], torch.zeros_like(got[~counted]))


def test_dpo_reference_model_given_or_computed_and_logged_values():
    x, w, _, target = batch()
    ref_x, ref_w = x + 0.1, w * 0.9
    ref_c, ref_r, _, _ = sums(ref_x, ref_w, None, target)
    given = preference.fused_linear_dpo(x, w, target, ref_c.float(), ref_r.float())
    computed = preference.fused_linear_dpo(x, w, target, ref_input=ref_x, ref_weight=ref_w)
    torch.testing.assert_close(given.loss, computed.loss)
    c, r, _, _ = sums(x, w, None, target)
    torch.testing.assert_close(computed.chosen_logps.double(), c, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        computed.chosen_rewards.double(), 0.1 * (c - ref_c), rtol=1e-4, atol=1e-5
    )
    torch.testing.assert_close(
        computed.rejected_rewards.double(), 0.1 * (r - ref_r), rtol=1e-4, atol=1e-5
    )
    assert not computed.chosen_rewards.requires_grad
    with pytest.raises(ValueError, match="ref_chosen_logps and ref_rejected_logps, or ref_input"):
        preference.fused_linear_dpo(x, w, target)
    with pytest.raises(ValueError, match="loss_type must be"):
        preference.fused_linear_dpo(x, w, target, ref_c.float(), ref_r.float(), loss_type="kto")
    with pytest.raises(ValueError, match=r"target must be \[2B, T\]"):
        preference.fused_linear_simpo(x[:3], w, target[:3])


def test_no_logits_are_formed_and_compile_fullgraph():
    x, w, _, target = batch()

    def step(x, w):
        return preference.fused_linear_dpo(x, w, target, REF[0].float(), REF[1].float()).loss

    with torch.profiler.profile() as prof:
        x1 = x.clone().requires_grad_()
        step(x1, w).backward()
    names = {e.key for e in prof.key_averages()}
    assert (
        "fuseops::linear_cross_entropy_stats" in names or "fuseops::linear_cross_entropy" in names
    )
    assert "aten::log_softmax" not in names and "aten::_log_softmax" not in names
    compiled = torch.compile(step, fullgraph=True)
    x2 = x.clone().requires_grad_()
    torch.testing.assert_close(compiled(x2, w), step(x.clone(), w))
    compiled(x2, w).backward()
    torch.testing.assert_close(x2.grad, x1.grad)


def grpo_reference(x, w, target, advantages, old, ref, beta, loss_type, level, eps, correct=True):
    logp = float64_token_logps(x, w, None, target)
    mask = (target != -100).double()
    log_ratio = logp - old
    if level == "sequence":
        log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1)).unsqueeze(-1)
    ratio = torch.exp(log_ratio)
    a = advantages.double().unsqueeze(-1)
    per_token = -torch.min(ratio * a, torch.clamp(ratio, 1 - eps, 1 + eps) * a)
    if beta:
        # k3 KL, weighted by the (differentiable) ratio: TRL's bias correction.
        per_token_kl = torch.exp(ref - logp) - (ref - logp) - 1
        per_token = per_token + beta * per_token_kl * (ratio if correct else 1)
    if loss_type == "grpo":
        return ((per_token * mask).sum(-1) / mask.sum(-1)).mean()
    if loss_type == "dr_grpo":
        return (per_token * mask).sum() / (target.numel())
    return (per_token * mask).sum() / mask.sum()  # dapo and bnpo: one batch


@pytest.mark.parametrize("loss_type", ["dapo", "bnpo", "grpo", "dr_grpo"])
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("beta,correct", [(0.0, True), (0.04, True), (0.04, False)])
def test_grpo_loss_and_gradients_match_the_float64_formula(loss_type, level, beta, correct):
    x, w, _, target = batch(seed=9)
    gen = torch.Generator().manual_seed(1)
    advantages = torch.randn(2 * B, generator=gen)
    exact = float64_token_logps(x, w, None, target)
    # The sampling policy and the reference a little off the current one, so
    # that some ratios are clipped and the KL is not 0.
    old = (exact + 0.3 * torch.randn(exact.shape, generator=gen).double()) * (target != -100)
    ref = (exact + 0.2 * torch.randn(exact.shape, generator=gen).double()) * (target != -100)
    xi, wi = x.clone().requires_grad_(), w.clone().requires_grad_()
    out = preference.fused_linear_grpo(
        xi,
        wi,
        target,
        advantages,
        old.float(),
        ref.float(),
        beta=beta,
        loss_type=loss_type,
        importance_sampling_level=level,
        use_bias_correction_kl=correct,
    )
    out.loss.backward()
    xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
    want = grpo_reference(
        xd, wd, target, advantages, old, ref, beta, loss_type, level, 0.2, correct
    )
    gx, gw = torch.autograd.grad(want, (xd, wd))
    torch.testing.assert_close(out.loss.double(), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(xi.grad.double(), gx, rtol=1e-5, atol=1e-5 * gx.abs().max().item())
    torch.testing.assert_close(wi.grad.double(), gw, rtol=1e-5, atol=1e-5 * gw.abs().max().item())
    if level == "token":
        assert 0 < out.clip_fraction.item() < 1
    assert (out.kl.item() > 0) == (beta > 0)
    torch.testing.assert_close(out.token_logps.double(), exact, rtol=1e-5, atol=1e-5)


def test_grpo_on_policy_ratio_is_one_and_errors():
    x, w, _, target = batch(seed=2)
    advantages = torch.tensor([1.0, -1.0, 0.5, 0.0, 2.0, -0.5])
    xi = x.clone().requires_grad_()
    out = preference.fused_linear_grpo(xi, w, target, advantages, loss_type="bnpo")
    mask = (target != -100).float()
    # Ratio 1: the loss is -mean(A) over tokens and its gradient is the
    # policy gradient -A * d logp.
    want = -(advantages.unsqueeze(-1) * mask).sum() / mask.sum()
    torch.testing.assert_close(out.loss, want)
    assert out.clip_fraction.item() == 0.0
    with pytest.raises(ValueError, match="beta != 0 needs ref_logps"):
        preference.fused_linear_grpo(x, w, target, advantages, beta=0.1)
    with pytest.raises(ValueError, match="loss_type must be"):
        preference.fused_linear_grpo(x, w, target, advantages, loss_type="ppo")
    with pytest.raises(ValueError, match=r"advantages \[B\]"):
        preference.fused_linear_grpo(x, w, target, advantages[:3])


@pytest.mark.parametrize("loss_type", ["kto", "apo_zero_unpaired"])
def test_kto_loss_and_gradients_match_the_float64_formula(loss_type):
    x, w, _, target = batch(seed=4)
    desirable = torch.tensor([True, False, True, True, False, False])
    ref = torch.tensor([-60.0, -40.0, -55.0, -70.0, -45.0, -50.0]).double()
    kl = torch.tensor(0.7)
    xi, wi = x.clone().requires_grad_(), w.clone().requires_grad_()
    out = preference.fused_linear_kto(
        xi,
        wi,
        target,
        desirable,
        ref.float(),
        kl=kl,
        beta=0.1,
        desirable_weight=1.0,
        undesirable_weight=1.5,
        loss_type=loss_type,
    )
    out.loss.backward()
    xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
    r = float64_token_logps(xd, wd, None, target).sum(-1) - ref
    z = 0.7 if loss_type == "kto" else 0.0
    good = 1 - torch.sigmoid(0.1 * (r - z))
    bad = 1 - torch.sigmoid(0.1 * (z - r)) if loss_type == "kto" else torch.sigmoid(0.1 * r)
    want = torch.where(desirable, good, 1.5 * bad).mean()
    gx, gw = torch.autograd.grad(want, (xd, wd))
    torch.testing.assert_close(out.loss.double(), want, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(xi.grad.double(), gx, rtol=1e-5, atol=1e-5 * gx.abs().max().item())
    torch.testing.assert_close(wi.grad.double(), gw, rtol=1e-5, atol=1e-5 * gw.abs().max().item())
    assert out.chosen_rewards.shape == (3,) and out.rejected_rewards.shape == (3,)
    torch.testing.assert_close(
        out.chosen_rewards.double(), 0.1 * r[desirable].detach(), rtol=1e-4, atol=1e-5
    )
    with pytest.raises(ValueError, match="give ref_logps, or ref_input"):
        preference.fused_linear_kto(x, w, target, desirable)


def test_exported_from_the_package():
    assert fuseops.preference.fused_linear_dpo is preference.fused_linear_dpo


def test_simpo_cpo_and_orpo_are_trls_losses():
    # TRL's own loss methods (CPOTrainer.cpo_loss with loss types "sigmoid"
    # and "simpo", ORPOTrainer.odds_ratio_loss) on the float64 sequence
    # log-probabilities of the materialized logits, against fuseops' fused
    # losses on the hidden states (float32: 1e-5, as above). They read only
    # their settings from the trainer, given here as attributes.
    from types import SimpleNamespace

    cpo = pytest.importorskip("trl.experimental.cpo.cpo_trainer", reason="trl is not installed")
    orpo = pytest.importorskip("trl.experimental.orpo.orpo_trainer", reason="trl is not installed")
    x, w, b, target = batch(bias=True)
    c, r, nc, nr = sums(x, w, b, target)
    nll = -c.sum() / nc.sum()
    device = SimpleNamespace(device=torch.device("cpu"))

    def settings(**kw):
        base = dict(alpha=0.0, label_smoothing=0.0, simpo_gamma=0.5, accelerator=device)
        return SimpleNamespace(**{**base, **kw})

    trl_cpo = (
        cpo.CPOTrainer.cpo_loss(settings(beta=0.3, loss_type="sigmoid", label_smoothing=0.1), c, r)[
            0
        ].mean()
        + 0.5 * nll
    )
    got = preference.fused_linear_cpo(
        x, w, target, linear_bias=b, beta=0.3, alpha=0.5, label_smoothing=0.1
    )
    torch.testing.assert_close(got.loss.double(), trl_cpo, rtol=1e-5, atol=1e-5)

    # SimPO: CPO's trainer with loss_type "simpo" averages the log-probabilities.
    trl_simpo = cpo.CPOTrainer.cpo_loss(
        settings(beta=2.0, loss_type="simpo", label_smoothing=0.1), c / nc, r / nr
    )[0].mean()
    got = preference.fused_linear_simpo(
        x, w, target, linear_bias=b, beta=2.0, gamma=0.5, label_smoothing=0.1
    )
    torch.testing.assert_close(got.loss.double(), trl_simpo, rtol=1e-5, atol=1e-5)

    # ORPO's trainer: the chosen tokens' cross-entropy minus the mean of
    # beta * logsigmoid(log odds ratio) of the averaged log-probabilities.
    losses = orpo.ORPOTrainer.odds_ratio_loss(
        SimpleNamespace(beta=0.1, accelerator=device), c / nc, r / nr
    )[0]
    got = preference.fused_linear_orpo(x, w, target, linear_bias=b, beta=0.1)
    torch.testing.assert_close(got.loss.double(), nll - losses.mean(), rtol=1e-5, atol=1e-5)


def test_nn_modules_call_their_losses_with_their_options():
    x, w, b, target = batch(bias=True)
    ref = (REF[0].float(), REF[1].float())
    gen = torch.Generator().manual_seed(3)
    advantages = torch.randn(2 * B, generator=gen)
    desirable = torch.tensor([True, False, True, True, False, False])
    cases = [
        (fuseops.nn.FusedLinearDPOLoss, preference.fused_linear_dpo, ref, {"beta": 0.3}),
        (fuseops.nn.FusedLinearSimPOLoss, preference.fused_linear_simpo, (), {"gamma": 0.9}),
        (fuseops.nn.FusedLinearCPOLoss, preference.fused_linear_cpo, (), {"alpha": 0.2}),
        (fuseops.nn.FusedLinearORPOLoss, preference.fused_linear_orpo, (), {"beta": 0.7}),
        (
            fuseops.nn.FusedLinearKTOLoss,
            preference.fused_linear_kto,
            (desirable, torch.linspace(-40, -20, 2 * B)),
            {"desirable_weight": 2.0},
        ),
        (
            fuseops.nn.FusedLinearGRPOLoss,
            preference.fused_linear_grpo,
            (advantages,),
            {"loss_type": "dr_grpo", "max_completion_length": 3},
        ),
    ]
    for module_class, function, extra, options in cases:
        module = module_class(**options)
        got = module(x, w, target, *extra, linear_bias=b)
        want = function(x, w, target, *extra, linear_bias=b, **options)
        assert torch.equal(got.loss, want.loss), module_class.__name__
        # The option is used: the function's default gives another loss.
        default = function(x, w, target, *extra, linear_bias=b)
        assert not torch.equal(got.loss, default.loss), module_class.__name__
        assert all(f"{name}=" in repr(module) for name in options)
    with pytest.raises(TypeError, match=r"FusedLinearDPOLoss: unknown option\(s\) betta"):
        fuseops.nn.FusedLinearDPOLoss(betta=0.1)
    with pytest.raises(TypeError, match="unknown option"):
        fuseops.nn.FusedLinearDPOLoss(ref_weight=w)  # a tensor goes to forward
