"""``fuseops.transformers.apply(model, quantize=..., fuse_projections=...)``:
q/k/v and gate/up merged into one quantized layer each.

Every output channel of a quantized layer is quantized (int8 per channel,
int4 per group of its own row) and summed on its own, in the same order
whatever the channels around it, so the merged layer's outputs are the same
bits as the separate layers': the checks here are exact (``torch.equal``),
and a merge that put a row, a scale or a bias in the wrong place, or a slice
that returned another projection's part, changes them.
"""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (pip install 'fuseops[transformers]')"
)

import fuseops.transformers as fot  # noqa: E402
from fuseops.quantization import Int4Linear, Int8Linear  # noqa: E402
from support.tiny_llama import CONFIG, VOCAB  # noqa: E402

MODES = fot.quantize_modes()
LAYER_TYPES = {"w8a16": Int8Linear, "w8a8": Int8Linear, "w4a16": Int4Linear, "w4a8": Int4Linear}


def tiny(family: str = "llama", seed: int = 0):
    torch.manual_seed(seed)
    if family == "qwen2":  # q/k/v with biases, no bias on o_proj and the MLP
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**CONFIG)).eval()
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).eval()


def ids(batch: int = 2, length: int = 12):
    return torch.randint(1, VOCAB, (batch, length), generator=torch.Generator().manual_seed(7))


def logits(model, tokens):
    with torch.no_grad():
        return model(input_ids=tokens).logits


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("mode", MODES)
def test_merged_layers_give_the_separate_layers_bits(family, mode):
    separate = tiny(family)
    merged = copy.deepcopy(separate)
    fot.apply(separate, quantize=mode, fuse_projections=False, group_size=32)
    fot.apply(merged, quantize=mode, group_size=32)
    tokens = ids()
    want, got = logits(separate, tokens), logits(merged, tokens)
    assert torch.equal(got, want)
    # And the merge did take place: every layer's q/k/v and gate/up are slices.
    for layer in merged.model.layers:
        assert isinstance(layer.self_attn.q_proj, fot.ProjectionSlice)
        assert isinstance(layer.mlp.up_proj, fot.ProjectionSlice)


@pytest.mark.parametrize("mode", MODES)
def test_structure_and_what_apply_returns(mode):
    model = tiny()
    replaced = fot.apply(model, quantize=mode)
    attention, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    layer_type = LAYER_TYPES[mode]
    head_dim = CONFIG["hidden_size"] // CONFIG["num_attention_heads"]
    q, kv = CONFIG["num_attention_heads"] * head_dim, CONFIG["num_key_value_heads"] * head_dim
    by_name = {r.name: r for r in replaced}
    # The int4 modes' recipe gives v_proj (and the head) 8 bits: q and k
    # merge without it.
    four_bit = mode in ("w4a16", "w4a8")
    merged_qk = attention.qk_proj if four_bit else attention.qkv_proj
    assert type(merged_qk) is layer_type and type(mlp.gate_up_proj) is layer_type
    assert merged_qk.out_features == q + (kv if four_bit else 2 * kv)
    assert mlp.gate_up_proj.out_features == 2 * CONFIG["intermediate_size"]
    assert (attention.k_proj.out_features, attention.k_proj.in_features) == (
        kv,
        CONFIG["hidden_size"],
    )
    if four_bit:
        assert type(attention.v_proj) is Int8Linear
        assert by_name["model.layers.0.self_attn.k_proj"].new == (
            "fuseops.transformers.ProjectionSlice(model.layers.0.self_attn.qk_proj)"
        )
    else:
        assert by_name["model.layers.0.self_attn.v_proj"].new == (
            "fuseops.transformers.ProjectionSlice(model.layers.0.self_attn.qkv_proj)"
        )
    assert by_name["model.layers.1.mlp.gate_up_proj"].old == "Linear"
    # No float linear layer is left, none is quantized twice.
    assert not [m for m in model.modules() if type(m) is torch.nn.Linear]
    quantized = [n for n, m in model.named_modules() if isinstance(m, layer_type)]
    # Per layer qk(v), o, gate_up, down; the head; under int4 v_proj and the
    # head are Int8Linear.
    assert len(quantized) == (4 * CONFIG["num_hidden_layers"] + (0 if four_bit else 1))
    assert not any(".q_proj" in key or ".gate_proj" in key for key in model.state_dict())
    assert fot.apply(model, quantize=mode) == []


def test_one_product_per_merged_layer():
    model = tiny()
    fot.apply(model, quantize="w8a16")
    calls: dict[str, int] = {}
    for name, module in model.named_modules():
        if isinstance(module, Int8Linear):
            module.register_forward_hook(
                lambda *_, name=name: calls.__setitem__(name, calls.get(name, 0) + 1)
            )
    logits(model, ids())
    assert len(calls) == 4 * CONFIG["num_hidden_layers"] + 1
    assert set(calls.values()) == {1}, calls
    # The merged outputs are not kept once every slice has taken its part.
    for layer in model.model.layers:
        assert not [k for k in vars(layer.self_attn) if k.startswith("_fuseops_outputs_")]
        assert not [k for k in vars(layer.mlp) if k.startswith("_fuseops_outputs_")]


def test_slices_compute_afresh_for_another_input_or_one_modified_in_place():
    separate, merged = tiny(), tiny()
    fot.apply(separate, quantize="w8a16", fuse_projections=False)
    fot.apply(merged, quantize="w8a16")
    want = separate.model.layers[0].self_attn
    got = merged.model.layers[0].self_attn
    x1, x2 = torch.randn(2, 3, CONFIG["hidden_size"]), torch.randn(2, 3, CONFIG["hidden_size"])
    with torch.no_grad():
        assert torch.equal(got.q_proj(x1), want.q_proj(x1))
        assert torch.equal(got.k_proj(x2), want.k_proj(x2))  # not x1's
        x3 = x1.clone()
        assert torch.equal(got.q_proj(x3), want.q_proj(x3))
        x3.mul_(2)  # the kept outputs are x3's before this
        assert torch.equal(got.v_proj(x3), want.v_proj(x3))
        assert torch.equal(got.q_proj(x3), want.q_proj(x3))  # asked twice: computed again
    with torch.inference_mode():
        x4 = torch.randn(1, 2, CONFIG["hidden_size"])
        assert torch.equal(got.k_proj(x4), want.k_proj(x4))
        assert torch.equal(got.v_proj(x4), want.v_proj(x4))


@pytest.mark.parametrize("mode", ["w8a16", "w4a16", "w4a8"])
def test_greedy_generate_is_unchanged_by_the_merge(mode):
    if mode not in MODES:
        pytest.skip(f"{mode} is not in this installation's quantize modes")
    separate = tiny()
    merged = copy.deepcopy(separate)
    fot.apply(separate, quantize=mode, fuse_projections=False)
    fot.apply(merged, quantize=mode)
    tokens = ids(batch=1)
    kwargs = dict(max_new_tokens=16, min_new_tokens=16, do_sample=False, pad_token_id=0)
    want = separate.generate(input_ids=tokens, **kwargs)
    got = merged.generate(input_ids=tokens, **kwargs)
    assert torch.equal(got, want)
    assert len(set(want[0, tokens.shape[1] :].tolist())) > 2


def test_state_dict_round_trip_and_deepcopy():
    model = tiny()
    fot.apply(model, quantize="w4a16" if "w4a16" in MODES else "w8a16")
    state = model.state_dict()
    assert "model.layers.0.self_attn.qk_proj.packed" in state or "w4a16" not in MODES
    assert "model.layers.0.self_attn.v_proj.packed" in state or "w4a16" not in MODES
    other = tiny(seed=1)
    fot.apply(other, quantize=model._fuseops_quantize)
    other.load_state_dict(state)
    tokens = ids()
    want = logits(model, tokens)
    assert torch.equal(logits(other, tokens), want)
    copied = copy.deepcopy(model)
    assert copied.model.layers[0].self_attn.q_proj._parent is copied.model.layers[0].self_attn
    assert torch.equal(logits(copied, tokens), want)


def test_fuse_projections_without_quantize_is_refused():
    model = tiny()
    with pytest.raises(ValueError, match="fuse_projections=True needs quantize"):
        fot.apply(model, fuse_projections=True)
    # Plain patching never merges.
    fot.apply(model)
    assert type(model.model.layers[0].self_attn.q_proj) is torch.nn.Linear


def test_compiled_model_runs_each_merged_product_once_and_matches_eager():
    model = tiny()
    fot.apply(model, quantize="w8a16")
    tokens = ids()
    want = logits(model, tokens)
    counts = {"products": 0}

    def count(gm, example_inputs):
        counts["products"] += sum(
            "int8_weight_only_linear" in str(node.target) for node in gm.graph.nodes
        )
        return gm.forward

    compiled = torch.compile(model, backend=count, fullgraph=True)
    with torch.no_grad():
        got = compiled(input_ids=tokens).logits
    assert torch.equal(got, want)
    # qkv, o, gate_up and down per layer, and the head: no product twice.
    assert counts["products"] == 4 * CONFIG["num_hidden_layers"] + 1
    for layer in model.model.layers:
        assert not [k for k in vars(layer.self_attn) if k.startswith("_fuseops_outputs_")]
    # Inductor compiles the ops around fuseops' own (attention, residual adds)
    # into code that sums float32 in another order: float32 rounding apart.
    with torch.no_grad():
        got = torch.compile(model, fullgraph=True)(input_ids=tokens).logits
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5 * want.abs().max().item())
