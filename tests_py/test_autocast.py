"""fuseops ops under torch.autocast("cpu", dtype=torch.bfloat16) give the
dtype PyTorch's own analogous ops give under the same autocast, and their
values within bfloat16 rounding (python/README.md, "Autocast").

The analogues, and torch 2.13's CPU policy for them: layer_norm and rms_norm
fall through (a bfloat16 input with float32 parameters returns bfloat16);
gelu, silu and relu fall through; the add of bias_gelu / fused_add_rms_norm
and the multiply of swiglu / geglu promote mixed inputs to float32; conv1d
runs in the autocast dtype; cross_entropy and kl_div (jsd's analogue) run
in float32. The parity cases, each beside its op (``autocast_cases()`` in
``fuseops/ops/cases/<op>.py``, ``fuseops/ops/cases/_autocast.py``), feed each op what it
meets in an autocast model: float32 activations, bfloat16 activations
(after a Linear) with float32 parameters, and mixed pairs."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import fuseops
from fuseops.ops.cases import MODULES
from fuseops.ops.cases._autocast import D, LOW, rand, weight

# Each op's parity cases (autocast_cases() in fuseops/ops/cases/<op>.py), by op.
CASES: dict[str, list] = {}
for _module in MODULES:
    for _case in getattr(_module, "autocast_cases", list)():
        CASES.setdefault(_case.name, []).append(_case)


def outputs(result) -> tuple[torch.Tensor, ...]:
    return result if isinstance(result, tuple) else (result,)


@pytest.mark.parametrize("name", sorted(CASES))
def test_autocast_cpu_matches_torch(name):
    for case in CASES[name]:
        check_case(name, case.ours, case.theirs, case.inputs)


def check_case(name, ours, theirs, inputs):
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
            # All-float32 calls agree to float32 accumulation, but for the
            # losses fused with linear layers, whose GEMMs autocast runs in
            # bfloat16 whatever their inputs.
            reduced = name.startswith(("linear_cross_entropy", "fused_linear_jsd")) or any(
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
    # Every functional op with an autocast kernel has parity cases beside it
    # (its module's autocast_cases()), which test_autocast_cpu_matches_torch
    # runs; rms_norm falls through on CPU, casting only on CUDA.
    assert cast, "no op has a CPU autocast kernel"
    missing = {name.split("::", 1)[1] for name in cast} - set(CASES)
    assert not missing, f"ops with an autocast kernel but no autocast_cases(): {missing}"
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
