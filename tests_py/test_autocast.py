"""fuseops ops under torch.autocast("cpu", dtype=torch.bfloat16) give the
dtype PyTorch's own analogous ops give under the same autocast, and their
values within bfloat16 rounding (python/README.md, "Autocast").

The analogues, and torch 2.13's CPU policy for them: layer_norm and rms_norm
fall through (a bfloat16 input with float32 parameters returns bfloat16);
gelu, silu and relu fall through; the add of bias_gelu / fused_add_rms_norm
and the multiply of swiglu / geglu promote mixed inputs to float32; conv1d
runs in the autocast dtype; cross_entropy and kl_div (jsd's analogue) run
in float32. The cases below feed each op what it meets in an
autocast model: float32 activations, bfloat16 activations (after a Linear)
with float32 parameters, and mixed pairs."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

import fuseops

LOW = torch.bfloat16
D = 16


def causal_conv1d_torch(x, weight, bias, activation=None):
    out = F.conv1d(
        x, weight.unsqueeze(1), bias, padding=weight.shape[-1] - 1, groups=weight.shape[0]
    )[..., : x.shape[-1]]
    return F.silu(out) if activation == "silu" else out


def fused_add_rms_norm_torch(x, residual, weight):
    new_residual = x + residual
    return F.rms_norm(new_residual, (D,), weight, 1e-6), new_residual


def rand(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


def weight(dtype=torch.float32):
    return (torch.rand(D) + 0.5).to(dtype)


# name -> (fuseops call, torch call, inputs): inputs is a list of argument
# tuples (the same arguments go to both calls).
CASES = {
    "layer_norm": (
        lambda x, w, b: fuseops.layer_norm(x, w, b, 1e-5),
        lambda x, w, b: F.layer_norm(x, (D,), w, b, 1e-5),
        [(rand(4, D), weight(), rand(D)), (rand(4, D, dtype=LOW), weight(), rand(D))],
    ),
    "rms_norm": (
        lambda x, w: fuseops.rms_norm(x, w, 1e-6),
        lambda x, w: F.rms_norm(x, (D,), w, 1e-6),
        [(rand(4, D), weight()), (rand(4, D, dtype=LOW), weight())],
    ),
    "fused_add_rms_norm": (
        lambda x, r, w: fuseops.fused_add_rms_norm(x, r, w, 1e-6),
        fused_add_rms_norm_torch,
        [
            (rand(4, D), rand(4, D), weight()),
            (rand(4, D, dtype=LOW), rand(4, D), weight()),
            (rand(4, D, dtype=LOW), rand(4, D, dtype=LOW), weight()),
        ],
    ),
    "gelu": (
        lambda x: fuseops.gelu(x),
        lambda x: F.gelu(x),
        [(rand(4, D),), (rand(4, D, dtype=LOW),)],
    ),
    "silu": (fuseops.silu, F.silu, [(rand(4, D),), (rand(4, D, dtype=LOW),)]),
    "relu": (fuseops.relu, F.relu, [(rand(4, D),), (rand(4, D, dtype=LOW),)]),
    "bias_gelu": (
        lambda x, b: fuseops.bias_gelu(x, b, "tanh"),
        lambda x, b: F.gelu(x + b, approximate="tanh"),
        [
            (rand(4, D), rand(D)),
            (rand(4, D, dtype=LOW), rand(D)),
            (rand(4, D, dtype=LOW), rand(D, dtype=LOW)),
        ],
    ),
    "swiglu": (
        fuseops.swiglu,
        lambda g, u: F.silu(g) * u,
        [
            (rand(4, D), rand(4, D)),
            (rand(4, D, dtype=LOW), rand(4, D)),
            (rand(4, D, dtype=LOW), rand(4, D, dtype=LOW)),
        ],
    ),
    "geglu": (
        fuseops.geglu,
        lambda g, u: F.gelu(g) * u,
        [(rand(4, D), rand(4, D)), (rand(4, D, dtype=LOW), rand(4, D))],
    ),
    # A decode step's product (the streaming kernel in bfloat16) and a
    # prefill's, float32 weights cast as torch casts linear's.
    "linear": (
        fuseops.linear,
        F.linear,
        [
            (rand(2, D), rand(3 * D, D), rand(3 * D)),
            (rand(2, D, dtype=LOW), rand(3 * D, D), None),
            (rand(40, D, dtype=LOW), rand(3 * D, D), rand(3 * D)),
        ],
    ),
    "causal_conv1d": (
        lambda x, w, b: fuseops.causal_conv1d(x, w, b, activation="silu"),
        lambda x, w, b: causal_conv1d_torch(x, w, b, "silu"),
        [(rand(2, D, 10), rand(D, 4), rand(D)), (rand(2, D, 10, dtype=LOW), rand(D, 4), rand(D))],
    ),
    # The composition it replaces, as Trainer(bf16=True) runs an LM head: a
    # float32 head weight with bfloat16 or float32 hidden states.
    "linear_cross_entropy": (
        lambda x, w, b, t: fuseops.linear_cross_entropy(x, w, t, b, label_smoothing=0.1),
        lambda x, w, b, t: F.cross_entropy(F.linear(x, w, b), t, label_smoothing=0.1),
        [
            (rand(8, D, dtype=LOW), rand(2 * D, D), None, torch.randint(0, 2 * D, (8,))),
            (rand(8, D), rand(2 * D, D), rand(2 * D), torch.randint(0, 2 * D, (8,))),
            (rand(8, D, dtype=LOW), rand(2 * D, D, dtype=LOW), None, torch.randint(0, 2 * D, (8,))),
        ],
    ),
    # With the loss outputs (linear_cross_entropy_stats): the loss and the
    # z-loss term in float32, the accuracy of the bfloat16 logits.
    "linear_cross_entropy_stats": (
        lambda x, w, b, t: tuple(
            fuseops.linear_cross_entropy(
                x, w, t, b, z_loss=1e-3, return_z_loss=True, return_token_accuracy=True
            )[:3]
        ),
        lambda x, w, b, t: linear_loss_outputs_torch(x, w, b, t, 1e-3),
        [
            (rand(8, D, dtype=LOW), rand(2 * D, D), None, torch.randint(0, 2 * D, (8,))),
            (rand(8, D), rand(2 * D, D), rand(2 * D), torch.randint(0, 2 * D, (8,))),
        ],
    ),
    # TRL's generalized JSD (GKDTrainer.generalized_jsd_loss, beta 0.5)
    # spelled with torch's kl_div, which autocast runs in float32; a bfloat16
    # student with a float32 teacher included.
    "jsd": (
        lambda s, t: fuseops.jsd(s, t),
        lambda s, t: jsd_torch(s, t),
        [(rand(4, D), rand(4, D)), (rand(4, D, dtype=LOW), rand(4, D))],
    ),
    "cross_entropy": (
        lambda x, t: fuseops.cross_entropy(x, t, label_smoothing=0.1),
        lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1),
        [
            (rand(4, D), torch.randint(0, D, (4,))),
            (rand(4, D, dtype=LOW), torch.randint(0, D, (4,))),
        ],
    ),
}


def jsd_torch(student, teacher, beta=0.5):
    s, t = F.log_softmax(student, -1), F.log_softmax(teacher, -1)
    m = torch.logsumexp(torch.stack([s + math.log1p(-beta), t + math.log(beta)]), 0)
    kl_teacher = F.kl_div(m, t, reduction="sum", log_target=True)
    kl_student = F.kl_div(m, s, reduction="sum", log_target=True)
    return (beta * kl_teacher + (1 - beta) * kl_student) / student.shape[0]


def linear_loss_outputs_torch(x, w, b, t, z_loss):
    """(loss, z-loss term, token accuracy) of F.cross_entropy on the logits
    F.linear forms under autocast."""
    logits = F.linear(x, w, b)
    lse = torch.logsumexp(logits.float(), -1)
    z = z_loss * lse.square().mean()
    loss = F.cross_entropy(logits, t) + z
    accuracy = (logits.argmax(-1) == t).float().mean()
    return loss, z, accuracy


def outputs(result) -> tuple[torch.Tensor, ...]:
    return result if isinstance(result, tuple) else (result,)


@pytest.mark.parametrize("name", sorted(CASES))
def test_autocast_cpu_matches_torch(name):
    ours, theirs, inputs = CASES[name]
    for args in inputs:
        with torch.autocast("cpu", dtype=LOW), warnings.catch_warnings():
            # torch's rms_norm warns that it cannot fuse mixed dtypes.
            warnings.filterwarnings("ignore", "Mismatch dtype between input and weight")
            got, expected = outputs(ours(*args)), outputs(theirs(*args))
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        described = [f"{a.dtype}{list(a.shape)}" for a in tensors]
        assert [g.dtype for g in got] == [e.dtype for e in expected], (name, described)
        for g, e in zip(got, expected):
            # Where a bfloat16 is involved, both round to it (2^-8 relative)
            # at different points (fuseops widens once; torch rounds its
            # intermediates, e.g. silu(gate) before the float32 multiply,
            # or the logits before the float32 loss): a few bfloat16 ulps.
            # All-float32 calls agree to float32 accumulation.
            reduced = name.startswith("linear_cross_entropy") or any(
                t.dtype == LOW for t in (*tensors, g, e)
            )
            tolerance = {"rtol": 3e-2, "atol": 3e-2} if reduced else {"rtol": 1e-5, "atol": 1e-5}
            torch.testing.assert_close(g, e, **tolerance, msg=f"{name} {described}")


def test_autocast_linear_cross_entropy_gradients_match_the_composition():
    """Under autocast the fused LM head's gradients are those of
    cross_entropy(linear(...)): float32 parameters get float32 gradients,
    bfloat16 hidden states a bfloat16 one, values within bfloat16 rounding
    of the GEMM inputs (both compute the GEMMs in bfloat16)."""
    torch.manual_seed(0)
    hidden = rand(16, D, dtype=LOW)
    head, bias = rand(4 * D, D), rand(4 * D)
    target = torch.randint(0, 4 * D, (16,))
    target[3] = -100
    grads = []
    for loss_fn in (
        lambda x, w, b: fuseops.linear_cross_entropy(x, w, target, b),
        lambda x, w, b: F.cross_entropy(F.linear(x, w, b), target),
    ):
        x, w, b = (t.clone().requires_grad_() for t in (hidden, head, bias))
        with torch.autocast("cpu", dtype=LOW):
            loss = loss_fn(x, w, b)
        assert loss.dtype == torch.float32
        loss.backward()
        grads.append((loss.detach(), x.grad, w.grad, b.grad))
    for got, expected, dtype in zip(*grads, (torch.float32, LOW, torch.float32, torch.float32)):
        assert got.dtype == expected.dtype == dtype
        torch.testing.assert_close(got, expected, rtol=3e-2, atol=3e-3)


def test_autocast_fused_lm_head_module():
    """fuseops.nn.LinearCrossEntropyLoss under autocast: a float32 head
    weight with bfloat16 hidden states (the error before autocast support:
    'weight' must have the input's dtype)."""
    loss_fn = fuseops.nn.LinearCrossEntropyLoss()
    hidden, head = rand(8, D, dtype=LOW), rand(2 * D, D)
    target = torch.randint(0, 2 * D, (8,))
    with torch.autocast("cpu", dtype=LOW):
        got = loss_fn(hidden, head, target)
        expected = F.cross_entropy(F.linear(hidden, head), target)
    assert got.dtype == expected.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=3e-2, atol=3e-2)


def test_autocast_leaves_rope_to_the_inputs():
    """rope falls through: its float32 cos/sin cache is meant for reduced
    query/key (the rotation is computed in float32), and the result keeps the
    query's dtype, as Hugging Face's rotary casts the cache to it."""
    cos, sin = fuseops.rope_cache(8, 16)
    q, k = rand(2, 6, 4, 8, dtype=LOW), rand(2, 6, 2, 8, dtype=LOW)
    positions = torch.arange(6).expand(2, 6)
    expected = fuseops.rope(q, k, cos, sin, positions)
    with torch.autocast("cpu", dtype=LOW):
        got = fuseops.rope(q, k, cos, sin, positions)
    for g, e in zip(got, expected):
        assert g.dtype == LOW
        torch.testing.assert_close(g, e, rtol=0, atol=0)


def test_autocast_gradients_reach_float32_parameters():
    """The casts are recorded by autograd: float32 parameters get float32
    gradients, as for torch's ops under autocast."""
    w, b = weight().requires_grad_(), rand(D).requires_grad_()
    cw = rand(D, 4).requires_grad_()
    x = rand(2, D, 10, dtype=LOW).requires_grad_()
    with torch.autocast("cpu", dtype=LOW):
        h = fuseops.causal_conv1d(x, cw)
        y = fuseops.layer_norm(h.transpose(1, 2), w, b, 1e-5)
    y.float().square().sum().backward()
    for p in (w, b, cw):
        assert p.grad is not None and p.grad.dtype == torch.float32
        assert p.grad.abs().sum() > 0
    assert x.grad.dtype == LOW


def test_out_overloads_are_not_cast():
    """out= writes where the caller chose: under autocast a float32 out= of a
    float32 call stays float32 (causal_conv1d would otherwise compute in
    bfloat16 and refuse the float32 out)."""
    x, w = rand(2, D, 10), rand(D, 4)
    out = torch.empty(2, D, 10)
    with torch.autocast("cpu", dtype=LOW):
        fuseops.causal_conv1d(x, w, out=out)
    torch.testing.assert_close(out, fuseops.causal_conv1d(x, w), rtol=0, atol=0)


def conformance_samples():
    from fuseops.ops import MODULES

    return [s for module in MODULES for s in module.samples("cpu") if not s.large]


def has_autocast_kernel(op: torch._ops.OpOverload) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "AutocastCPU")


def test_every_op_runs_under_autocast_and_only_cast_ops_change():
    """Every overload of every op (its conformance samples, so a new op is
    covered without a line here) runs under CPU autocast; an overload with no
    autocast kernel (out=, backward ops, ops that fall through) gives exactly
    what it gives outside autocast."""
    samples = conformance_samples()
    cast = {s.op.name() for s in samples if has_autocast_kernel(s.op)}
    # The CPU policy registers kernels for exactly these functional ops
    # (rms_norm falls through on CPU, casting only on CUDA).
    assert cast == {
        f"fuseops::{name}"
        for name in (
            "layer_norm",
            "fused_add_rms_norm",
            "bias_gelu",
            "swiglu",
            "geglu",
            "causal_conv1d",
            "linear",
            "cross_entropy",
            "linear_cross_entropy",
            "linear_cross_entropy_stats",
            "jsd",
        )
    }, cast
    for sample in samples:

        def call():
            # Copies: some overloads write into their arguments
            # (causal_conv1d_update's conv_state, out=).
            args = [a.detach().clone() if isinstance(a, torch.Tensor) else a for a in sample.args]
            kwargs = {k: v.clone() for k, v in sample.kwargs.items()}
            result = sample.op(*args, **kwargs)
            return outputs(result) if result is not None else tuple(kwargs.values())

        with torch.autocast("cpu", dtype=LOW):
            got = call()
        if not has_autocast_kernel(sample.op):
            for g, e in zip(got, call(), strict=True):
                torch.testing.assert_close(g, e, rtol=0, atol=0, equal_nan=True, msg=repr(sample))
