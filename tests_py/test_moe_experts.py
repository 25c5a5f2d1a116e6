"""fuseops.moe_experts (the routed experts of a mixture-of-experts layer)
against the float64 reference and transformers' own experts: the numerics
(opcheck, compilers, Meta, pybind and every CPU build are in
test_conformance.py, fed by fuseops/ops/moe_experts.py's samples).

Tolerances: float32/float64 within 1e-5 of the largest value (float32
products of rows of a few dozen to a few hundred terms); bfloat16/float16
compute in float32 on the rounded inputs and round each result once, so the
float64 reference runs on the same rounded inputs and the bound is two
units of the dtype's last place of the largest value.
"""

from __future__ import annotations

import pytest
import torch

import fuseops
from fuseops import reference

from support.errors import expect_error_mentions
from support.params import DTYPES

TOL = {torch.float32: 1e-5, torch.float64: 1e-5, torch.bfloat16: 2**-6, torch.float16: 2**-9}


def routed(tokens, hidden, inter, experts, top_k, dtype, device="cpu", grad=True):
    """Inputs of one call; experts' matrices of std 1/sqrt(fan-in), so that
    results are of order 1."""
    gen = torch.Generator().manual_seed(tokens * 31 + hidden)

    def randn(*shape, scale=1.0):
        return (torch.randn(shape, generator=gen, dtype=torch.float64) * scale).to(device)

    index = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)]).to(
        device
    )
    weights = torch.rand(tokens, top_k, generator=gen, dtype=torch.float64).to(device)
    args = (
        randn(tokens, hidden).to(dtype),
        index,
        weights.to(dtype),
        randn(experts, 2 * inter, hidden, scale=hidden**-0.5).to(dtype),
        randn(experts, hidden, inter, scale=inter**-0.5).to(dtype),
    )
    return tuple(a.requires_grad_(grad) if a.is_floating_point() else a for a in args)


def float64_copies(args):
    return tuple(
        a.detach().double().requires_grad_(a.requires_grad) if a.is_floating_point() else a
        for a in args
    )


def assert_close(got, want, dtype):
    assert got.dtype == dtype and got.shape == want.shape
    scale = max(1.0, want.abs().max().item()) if want.numel() else 1.0
    torch.testing.assert_close(got.double(), want.double(), rtol=0, atol=TOL[dtype] * scale)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", ["silu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize(
    "tokens, hidden, inter, experts, top_k",
    [(1, 16, 8, 4, 2), (37, 24, 20, 5, 3), (200, 64, 96, 8, 2), (64, 33, 17, 3, 1)],
)
def test_forward_and_gradients_match_float64(
    device, dtype, activation, tokens, hidden, inter, experts, top_k
):
    args = routed(tokens, hidden, inter, experts, top_k, dtype, device)
    out = fuseops.moe_experts(*args, activation)
    grad = torch.randn_like(out)
    grads = torch.autograd.grad(out, [args[0], args[2], args[3], args[4]], grad)
    wide = float64_copies(args)
    want = reference.moe_experts(*wide, activation)
    want_grads = torch.autograd.grad(want, [wide[0], wide[2], wide[3], wide[4]], grad.double())
    assert_close(out, want, dtype)
    for g, w in zip(grads, want_grads):
        assert_close(g, w, dtype)


def test_transposed_weights_are_read_in_place(device):
    """transformers' transposed experts layout ([E, H, 2I] stored) passed as
    a view: the same result as the contiguous weights."""
    x, index, weights, gate_up, down = routed(23, 16, 12, 4, 2, torch.float32, device, grad=False)
    transposed_gate_up = gate_up.transpose(1, 2).contiguous().transpose(1, 2)
    transposed_down = down.transpose(1, 2).contiguous().transpose(1, 2)
    assert not transposed_gate_up.is_contiguous()
    torch.testing.assert_close(
        fuseops.moe_experts(x, index, weights, transposed_gate_up, transposed_down),
        fuseops.moe_experts(x, index, weights, gate_up, down),
        rtol=1e-6,
        atol=1e-6,
    )


def test_gradcheck(device):
    args = routed(9, 6, 5, 4, 2, torch.float64, device)
    assert torch.autograd.gradcheck(lambda *a: fuseops.moe_experts(*a), args)


def test_a_token_routed_twice_to_one_expert_counts_twice(device):
    x, index, weights, gate_up, down = routed(4, 8, 6, 3, 2, torch.float64, device, grad=False)
    index[:, 1] = index[:, 0]
    single = fuseops.moe_experts(x, index[:, :1], weights[:, :1] + weights[:, 1:], gate_up, down)
    torch.testing.assert_close(fuseops.moe_experts(x, index, weights, gate_up, down), single)


def test_frozen_experts_skip_their_gradients(device):
    x, index, weights, gate_up, down = routed(12, 8, 6, 3, 2, torch.float32, device)
    gate_up.requires_grad_(False)
    down.requires_grad_(False)
    out = fuseops.moe_experts(x, index, weights, gate_up, down)
    grad_x, grad_w = torch.autograd.grad(out, [x, weights], torch.ones_like(out))
    x, weights = x.detach(), weights.detach()
    full = fuseops.moe_experts_backward(torch.ones_like(out), x, index, weights, gate_up, down)
    frozen = fuseops.moe_experts_backward(
        torch.ones_like(out), x, index, weights, gate_up, down, expert_grads=False
    )
    assert frozen[2].shape == (0,) and frozen[3].shape == (0,)
    for a, b in zip((grad_x, grad_w), frozen[:2]):
        assert torch.equal(a, b)
    assert torch.equal(full[0], frozen[0]) and torch.equal(full[1], frozen[1])


def test_result_does_not_depend_on_the_number_of_threads():
    args = routed(301, 64, 48, 6, 2, torch.float32, grad=False)
    threads = torch.get_num_threads()
    try:
        results = []
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            results.append(fuseops.moe_experts(*args))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(results[0], r) for r in results[1:])


def test_special_values_stay_in_their_tokens(device):
    """A NaN in one token's input reaches that token's result and the
    gradients of the experts it went to, not the other tokens' results."""
    x, index, weights, gate_up, down = routed(10, 8, 6, 4, 2, torch.float32, device, grad=False)
    x[3, 2] = float("nan")
    out = fuseops.moe_experts(x, index, weights, gate_up, down)
    assert out[3].isnan().all()
    assert out[torch.arange(10, device=device) != 3].isfinite().all()


def test_bad_inputs_name_the_op_and_argument():
    x, index, weights, gate_up, down = routed(6, 8, 5, 3, 2, torch.float32, grad=False)
    op = "fuseops::moe_experts"
    expect_error_mentions(
        lambda: fuseops.moe_experts(x, index.clone().fill_(3), weights, gate_up, down),
        [op, "'top_k_index'", "[0, 3)", "got 3"],
    )
    expect_error_mentions(
        lambda: fuseops.moe_experts(x, index.clone().fill_(-2), weights, gate_up, down),
        [op, "'top_k_index'", "got -2"],
    )
    expect_error_mentions(
        lambda: fuseops.moe_experts(x, index.float(), weights, gate_up, down),
        [op, "'top_k_index'", "int64 or int32"],
    )
    expect_error_mentions(
        lambda: fuseops.moe_experts(x[:, :7], index, weights, gate_up, down),
        [op, "'gate_up_proj'"],
    )
    expect_error_mentions(
        lambda: fuseops.moe_experts(x, index, weights, gate_up, down[:, :, :4]),
        [op, "'down_proj'", "[3, 8, 5]"],
    )
    expect_error_mentions(
        lambda: fuseops.moe_experts(x, index, weights[:, :1], gate_up, down),
        [op, "'top_k_weights'"],
    )
    expect_error_mentions(
        lambda: fuseops.moe_experts(x, index, weights, gate_up.double(), down),
        [op, "'gate_up_proj'"],
    )
    expect_error_mentions(
        lambda: fuseops.moe_experts(x, index, weights, gate_up, down, "relu"),
        [op, "'activation'", "relu"],
    )
    expect_error_mentions(
        lambda: fuseops.moe_experts(x.unsqueeze(0), index, weights, gate_up, down),
        [op, "'hidden'", "2-D"],
    )


# --- transformers' experts ---

transformers = pytest.importorskip("transformers", reason="transformers is not installed")


def mixtral_experts(hidden_act="silu", dtype=torch.float32):
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralExperts

    config = MixtralConfig(
        hidden_size=32, intermediate_size=48, num_local_experts=4, hidden_act=hidden_act
    )
    config._experts_implementation = "eager"
    torch.manual_seed(0)
    experts = MixtralExperts(config).to(dtype)
    with torch.no_grad():
        experts.gate_up_proj.normal_(0, 32**-0.5)
        experts.down_proj.normal_(0, 48**-0.5)
    return experts


@pytest.mark.parametrize("hidden_act", ["silu", "gelu", "gelu_pytorch_tanh"])
def test_matches_transformers_eager_experts(hidden_act):
    """fuseops.transformers.apply's experts patch against transformers' own
    eager loop on one MixtralExperts: output and every gradient."""
    import fuseops.transformers as ft

    experts = mixtral_experts(hidden_act)
    patched = mixtral_experts(hidden_act)
    ft._patch(patched, ft._fused_experts_forward, "experts")
    patched._fuseops_moe_activation = ft._moe_activation(patched)
    assert patched._fuseops_moe_activation is not None
    x = torch.randn(40, 32, requires_grad=True)
    logits = torch.randn(40, 4)
    weights, index = logits.softmax(-1).topk(2, -1)
    weights.requires_grad_()
    outs, grads = [], []
    for module in (experts, patched):
        out = module(x, index, weights)
        outs.append(out)
        grads.append(torch.autograd.grad(out.square().sum(), [x, weights, *module.parameters()]))
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-5)
    for a, b in zip(grads[1], grads[0]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * max(1.0, b.abs().max().item()))


def test_registered_experts_implementation_is_chosen_by_name():
    """``set_experts_implementation("fuseops")`` after
    register_experts_implementation() runs moe_experts, without apply."""
    import fuseops.transformers as ft
    from transformers import MixtralConfig, MixtralForCausalLM

    ft.register_experts_implementation()
    config = MixtralConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
    )
    torch.manual_seed(0)
    model = MixtralForCausalLM(config).eval()
    ids = torch.randint(0, 64, (2, 7))
    model.set_experts_implementation("eager")
    want = model(ids).logits
    model.set_experts_implementation("fuseops")
    with torch.profiler.profile() as prof:
        got = model(ids).logits
    assert any(e.name == "fuseops::moe_experts" for e in prof.events())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_apply_patches_every_moe_familys_experts():
    """Every mixture-of-experts family apply supports gets its experts
    patched (listed as fuseops.moe_experts)."""
    import fuseops.transformers as ft
    from test_transformers import make_model

    for family in ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "glm4_moe", "dots1"):
        replaced = ft.apply(make_model(family))
        assert any(r.new == "fuseops.moe_experts('silu')" for r in replaced), family
        assert not any(
            r.new.startswith("fuseops.moe_experts")
            for r in ft.apply(make_model(family), experts=False)
        ), family


def test_patched_mixtral_trains_under_torch_compile_fullgraph():
    """The experts patch is one opaque op: a patched Mixtral's training step
    compiles as one graph (the per-expert row counts, which depend on the
    routing, stay inside the op) and gives the eager patched model's loss
    and gradients."""
    import copy

    import fuseops.transformers as ft
    from test_transformers import make_model

    model = make_model("mixtral", num_hidden_layers=1, output_router_logits=False)
    ft.apply(model)
    compiled_model = copy.deepcopy(model)
    compiled = torch.compile(compiled_model, fullgraph=True)
    ids = torch.randint(0, model.config.vocab_size, (2, 9))
    losses, grads = [], []
    for m, call in ((model, model), (compiled_model, compiled)):
        loss = call(input_ids=ids, labels=ids).loss
        loss.backward()
        losses.append(loss.detach())
        grads.append([p.grad for p in m.parameters()])
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-5)
    for a, b in zip(grads[1], grads[0]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
