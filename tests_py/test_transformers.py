"""fuseops.transformers.apply on Hugging Face models built from tiny configs
(random weights, nothing downloaded): the patched model against an unpatched
copy with the same weights, in training, evaluation and generation, and the
model-handling paths (patching twice, meta device, save/load, torch.compile).

float32 comparisons are tight (1e-5 relative to the largest value: the
models differ only in the order of float32 sums inside the fused ops).
bfloat16 ones allow what the rounding order of a bfloat16 model explains:
fuseops computes each fused op in float32 and rounds once, where HF's code
rounds after every step (bfloat16's epsilon is 7.8e-3, and a few roundings
apart compound through the layers), so logits and loss are compared to
3e-2 of the largest value and each parameter's gradient to 6e-2 of its
largest value; and the patched bfloat16 logits must be as close to a float32
run of the same weights as HF's bfloat16 logits are (within a factor 2).
"""

from __future__ import annotations

import copy
import importlib
import os
import tempfile

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (pip install 'fuseops[transformers]')"
)

import fuseops  # noqa: E402
import fuseops.transformers as fot  # noqa: E402
from support import tiny_llama  # noqa: E402

COMMON = dict(tiny_llama.CONFIG, max_position_embeddings=64)
VOCAB = COMMON["vocab_size"]

GATED = {"rms_norm", "rope", "swiglu", "linear_cross_entropy"}
GEMMA = {"rms_norm", "rope", "geglu", "linear_cross_entropy"}
NO_DROPOUT = dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
# Special tokens inside the tiny vocabulary (some families' defaults are not).
TOKENS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
# The routers' load-balancing loss on, with a weight that shows in the loss.
MOE = dict(output_router_logits=True, router_aux_loss_coef=0.5)
SHARED_EXPERTS = dict(
    n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1
)

# Tiny vision towers for the multimodal families (built by every test, run
# by test_multimodal_with_images_matches).
QWEN2_VL_VISION = dict(depth=1, embed_dim=32, hidden_size=64, num_heads=2)
SIGLIP_VISION = dict(
    model_type="siglip_vision_model",
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    image_size=28,
    patch_size=14,
)
# Qwen2-VL's multimodal rotary sections (temporal, height, width) over the
# 8 rotary frequencies of head_dim 16. Text alone has the same position in
# all three; the text after an image (test_multimodal_with_images_matches)
# has distinct ones.
MROPE = dict(rope_type="default", rope_theta=10000.0, mrope_section=[2, 3, 3])

# family -> (config class, model class, config overrides, fuseops ops the
# patched training step must run). A config class with a text_config (the
# multimodal families) takes the overrides in its text_config, but those of
# OUTER.
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}, GATED),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 8}, GATED),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}, GATED),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 32}, GATED),
    # (1 + weight) RMSNorm, tanh-GELU GeGLU; Gemma 2 and 3 with the final
    # logits' softcapping (Gemma 2 also with its attention softcapping).
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {"head_dim": 16}, GEMMA),
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        {"head_dim": 16, "sliding_window": 8, "final_logit_softcapping": 3.0},
        GEMMA,
    ),
    "gemma3_text": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        {"head_dim": 16, "sliding_window": 8, "final_logit_softcapping": 3.0},
        GEMMA,
    ),
    # Multimodal: the text towers (Qwen2-VL's multimodal rotary sections),
    # with Qwen2-VL's causal-LM head patched and Gemma 3's left to HF.
    "qwen2_vl": (
        "Qwen2VLConfig",
        "Qwen2VLForConditionalGeneration",
        dict(TOKENS, rope_parameters=MROPE, vision_config=QWEN2_VL_VISION),
        GATED,
    ),
    "qwen2_5_vl": (
        "Qwen2_5_VLConfig",
        "Qwen2_5_VLForConditionalGeneration",
        dict(
            TOKENS,
            rope_parameters=MROPE,
            vision_config=dict(QWEN2_VL_VISION, intermediate_size=64, out_hidden_size=64),
        ),
        GATED,
    ),
    "gemma3": (
        "Gemma3Config",
        "Gemma3ForConditionalGeneration",
        dict(
            TOKENS,
            head_dim=16,
            sliding_window=8,
            vision_config=SIGLIP_VISION,
            mm_tokens_per_image=4,
        ),
        {"rms_norm", "rope", "geglu"},
    ),
    # Packed gate_up_proj, partial rotary embedding.
    "phi3": (
        "Phi3Config",
        "Phi3ForCausalLM",
        {"partial_rotary_factor": 0.5, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2},
        GATED,
    ),
    # q/k RMSNorm over the whole projection (Olmo 2 and 3, EXAONE 4), layers
    # without rotary (SmolLM3), sliding windows (Ministral, Olmo 3, EXAONE 4).
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", TOKENS, GATED),
    "olmo3": ("Olmo3Config", "Olmo3ForCausalLM", dict(TOKENS, sliding_window=8), GATED),
    "smollm3": (
        "SmolLM3Config",
        "SmolLM3ForCausalLM",
        dict(TOKENS, no_rope_layer_interval=2),
        GATED,
    ),
    "seed_oss": (
        "SeedOssConfig",
        "SeedOssForCausalLM",
        dict(TOKENS, head_dim=16, attention_dropout=0.0, residual_dropout=0.0),
        GATED,
    ),
    "ministral": (
        "MinistralConfig",
        "MinistralForCausalLM",
        dict(TOKENS, head_dim=16, sliding_window=8),
        GATED,
    ),
    "exaone4": ("Exaone4Config", "Exaone4ForCausalLM", dict(TOKENS, sliding_window=8), GATED),
    "hunyuan_v1_dense": (
        "HunYuanDenseV1Config",
        "HunYuanDenseV1ForCausalLM",
        dict(TOKENS, head_dim=16),
        GATED,
    ),
    # Multipliers on the embedding, residuals and attention, and logits
    # divided by logits_scaling (not 1, so that a head ignoring it fails).
    "granite": (
        "GraniteConfig",
        "GraniteForCausalLM",
        dict(
            TOKENS,
            logits_scaling=2.5,
            embedding_multiplier=3.0,
            residual_multiplier=0.5,
            attention_multiplier=0.25,
        ),
        GATED,
    ),
    # Mixture of experts (the experts and routers stay HF's), with the
    # routers' load-balancing loss added to the loss.
    "mixtral": (
        "MixtralConfig",
        "MixtralForCausalLM",
        dict(TOKENS, num_local_experts=4, num_experts_per_tok=2, **MOE),
        {"rms_norm", "rope", "linear_cross_entropy"},
    ),
    "qwen2_moe": (
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        dict(
            TOKENS,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=64,
            **MOE,
        ),
        GATED,  # the shared expert's SwiGLU
    ),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        dict(TOKENS, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, **MOE),
        {"rms_norm", "rope", "linear_cross_entropy"},
    ),
    "olmoe": (
        "OlmoeConfig",
        "OlmoeForCausalLM",
        dict(TOKENS, num_experts=4, num_experts_per_tok=2, **MOE),
        {"rms_norm", "rope", "linear_cross_entropy"},
    ),
    # MoE with shared experts (gated MLPs) and a first dense layer.
    "hunyuan_v1_moe": (
        "HunYuanMoEV1Config",
        "HunYuanMoEV1ForCausalLM",
        dict(TOKENS, num_experts=4, moe_topk=2, head_dim=16),
        GATED,
    ),
    "dots1": (
        "Dots1Config",
        "Dots1ForCausalLM",
        dict(TOKENS, head_dim=16, first_k_dense_replace=1, **SHARED_EXPERTS),
        GATED,
    ),
    "glm4_moe": (
        "Glm4MoeConfig",
        "Glm4MoeForCausalLM",
        dict(TOKENS, head_dim=16, first_k_dense_replace=1, **SHARED_EXPERTS),
        GATED,
    ),
    "ministral3": (
        "Ministral3Config",
        "Ministral3ForCausalLM",
        dict(TOKENS, head_dim=16, sliding_window=8),
        GATED,
    ),
    "vaultgemma": (
        "VaultGemmaConfig",
        "VaultGemmaForCausalLM",
        dict(TOKENS, head_dim=16, final_logit_softcapping=3.0),
        GEMMA,
    ),
    # nn.LayerNorm, partial rotary, a gated MLP.
    "stablelm": (
        "StableLmConfig",
        "StableLmForCausalLM",
        dict(TOKENS, partial_rotary_factor=0.5),
        {"layer_norm", "rope", "swiglu", "linear_cross_entropy"},
    ),
    # LayerNorm and bias + tanh GELU (Conv1D projections), learned positions.
    "gpt2": (
        "GPT2Config",
        "GPT2LMHeadModel",
        dict(
            NO_DROPOUT,
            n_inner=96,
            num_key_value_heads=None,
            intermediate_size=None,
            bos_token_id=1,
            eos_token_id=2,
        ),
        {"layer_norm", "bias_gelu", "linear_cross_entropy"},
    ),
    # LayerNorm, rotary, bias + tanh GELU (nn.Linear projections).
    "starcoder2": (
        "Starcoder2Config",
        "Starcoder2ForCausalLM",
        TOKENS,
        {"layer_norm", "rope", "bias_gelu", "linear_cross_entropy"},
    ),
    # Cohere's bias-free float32 LayerNorm (its per-head q/k norms stay HF's),
    # GPT-J rotary pairs and logits multiplied by logit_scale (not 1, so that
    # a head ignoring it fails); Cohere 2 with rotary on its sliding-window
    # layers only (every second layer is a full-attention one).
    "cohere": (
        "CohereConfig",
        "CohereForCausalLM",
        dict(TOKENS, use_qk_norm=True, logit_scale=0.25),
        {"layer_norm", "rope", "swiglu", "linear_cross_entropy"},
    ),
    "cohere2": (
        "Cohere2Config",
        "Cohere2ForCausalLM",
        dict(TOKENS, sliding_window=8, sliding_window_pattern=2, logit_scale=0.25),
        {"layer_norm", "rope", "swiglu", "linear_cross_entropy"},
    ),
    # Packed gate_up_proj, partial rotary (half of head_dim) on GPT-J pairs;
    # GLM-4 with its post-attention and post-MLP norms.
    "glm": ("GlmConfig", "GlmForCausalLM", dict(TOKENS, head_dim=16), GATED),
    "glm4": ("Glm4Config", "Glm4ForCausalLM", dict(TOKENS, head_dim=16), GATED),
    # LayerNorm, rotary, bias + erf GELU after FalconLinear's product,
    # multi-query attention (one key/value head) parallel to the MLP.
    "falcon": (
        "FalconConfig",
        "FalconForCausalLM",
        dict(
            TOKENS, bias=True, ffn_hidden_size=96, num_key_value_heads=None, intermediate_size=None
        ),
        {"layer_norm", "rope", "bias_gelu", "linear_cross_entropy"},
    ),
}
# Families whose attention computes SDPA (or eager math) itself instead of
# going through transformers' AttentionInterface: transformers refuses to
# change their attention implementation, so apply leaves it as it is.
OWN_ATTENTION = {"falcon"}
# The settings of a multimodal config that are its own, not its text_config's.
OUTER = {
    "vision_config",
    "mm_tokens_per_image",
    "tie_word_embeddings",
    "image_token_id",
    "image_token_index",
    "vision_start_token_id",
    "vision_end_token_id",
}
# The families whose causal-LM head is patched (the fused loss).
HEADS = sorted(f for f, row in FAMILIES.items() if "linear_cross_entropy" in row[3])


def build_config(config_cls: str, settings: dict):
    cls = getattr(transformers, config_cls)
    settings = {k: v for k, v in settings.items() if v is not None}
    if "text_config" in getattr(cls, "sub_configs", {}):
        outer = {k: settings.pop(k) for k in OUTER if k in settings}
        return cls(text_config=settings, **outer)
    return cls(**settings)


def make_model(family: str, dtype=torch.float32, seed: int = 0, **overrides):
    config_cls, model_cls, extra, _ = FAMILIES[family]
    config = build_config(config_cls, {**COMMON, **extra, **overrides})
    torch.manual_seed(seed)
    return getattr(transformers, model_cls)(config).to(dtype)


def pair(family: str, dtype=torch.float32, **overrides):
    """(unpatched, patched) models with the same weights."""
    ref = make_model(family, dtype, **overrides)
    patched = copy.deepcopy(ref)
    assert fot.apply(patched)
    return ref, patched


def batch(seed: int = 1, batch_size: int = 2, seq: int = 16):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (batch_size, seq), generator=gen)
    labels = ids.clone()
    labels[0, :3] = -100  # ignored positions, as padding or a prompt would be
    return ids, labels


def fuseops_ops_run(fn) -> set[str]:
    """Names of the fuseops ops (``fuseops::<name>``) that `fn()` ran."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return {e.name.split("::", 1)[1] for e in prof.events() if e.name.startswith("fuseops::")}


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def assert_gradients_match(ref, patched, tolerance: float, floor: float = 1e-3) -> None:
    """Every parameter's gradient within `tolerance` of its largest value; a
    gradient that is zero in exact math (a key bias: softmax ignores a shift
    shared by all keys) holds only rounding noise, so each is measured
    against at least `floor` of the largest gradient of the model."""
    floor *= max(p.grad.abs().max().item() for p in ref.parameters() if p.grad is not None)
    for (name, p_ref), (_, p) in zip(ref.named_parameters(), patched.named_parameters()):
        if p_ref.grad is None:  # outside the loss (a pooler under a token-level head)
            assert p.grad is None, name
            continue
        assert p.grad is not None, name
        scale = max(p_ref.grad.abs().max().item(), floor)
        err = (p.grad.double() - p_ref.grad.double()).abs().max().item() / scale
        assert err <= tolerance, f"{name}: gradient error {err:.2e} of its largest value"


def train_step(model, input_ids, labels, **kwargs):
    model.train()
    model.zero_grad(set_to_none=True)
    out = model(input_ids, labels=labels, **kwargs)
    out.loss.backward()
    return out


TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (3e-2, 6e-2)}  # (values, gradients)


# bfloat16 on one family per code path: Llama's RMSNorm and SwiGLU, Gemma's
# (1 + weight) RMSNorm, GeGLU and softcapping, Phi-3's packed MLP, GPT-2's
# LayerNorm and bias_gelu, StarCoder2's bias_gelu after nn.Linear, Cohere's
# float32 LayerNorm, GPT-J rotary and logit_scale, GLM's GPT-J rotary from
# rotate_half rows, Falcon's bias_gelu after FalconLinear.
BFLOAT16 = ("llama", "gemma2", "phi3", "gpt2", "starcoder2", "cohere", "glm", "falcon")
CASES = [(family, torch.float32) for family in sorted(FAMILIES)] + [
    (family, torch.bfloat16) for family in BFLOAT16
]


@pytest.mark.parametrize("family,dtype", CASES, ids=[f"{f}-{str(d)[6:]}" for f, d in CASES])
def test_training_and_eval_match(family, dtype):
    ref, patched = pair(family, dtype)
    ids, labels = batch()
    value_tol, grad_tol = TOLERANCE[dtype]

    # Training with labels: loss and every parameter's gradient.
    expected = train_step(ref, ids, labels)
    ran = fuseops_ops_run(lambda: train_step(patched, ids, labels))
    got = train_step(patched, ids, labels)
    assert FAMILIES[family][3] <= ran, f"fuseops ops run: {sorted(ran)}"
    if family in HEADS:
        assert got.logits is None  # no [tokens, vocab] logits in training with labels
    else:  # HF's head
        assert relative_error(got.logits, expected.logits) <= value_tol
    assert abs(got.loss.item() - expected.loss.item()) <= value_tol * abs(expected.loss.item())
    assert_gradients_match(ref, patched, grad_tol)
    # The unpatched copy of the same classes runs none of fuseops' ops.
    assert not fuseops_ops_run(lambda: train_step(ref, ids, labels))

    # Evaluation: logits, and the loss from them.
    ref.eval(), patched.eval()
    with torch.no_grad():
        expected = ref(ids, labels=labels)
        got = patched(ids, labels=labels)
    assert relative_error(got.logits, expected.logits) <= value_tol
    assert abs(got.loss.item() - expected.loss.item()) <= value_tol * abs(expected.loss.item())
    if dtype == torch.bfloat16:
        # As accurate as HF's own bfloat16 run, against float32 math on the
        # same (bfloat16) weights.
        exact = copy.deepcopy(ref).float().eval()
        with torch.no_grad():
            truth = exact(ids).logits
        assert (
            relative_error(got.logits, truth) <= 2 * relative_error(expected.logits, truth) + 1e-3
        )


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_generate_greedy_with_cache(family):
    ref, patched = pair(family)
    ids, _ = batch(seq=6, batch_size=1)
    kwargs = dict(max_new_tokens=6, do_sample=False, use_cache=True, pad_token_id=0)
    expected = ref.eval().generate(ids, **kwargs)
    ran = fuseops_ops_run(lambda: patched.eval().generate(ids, **kwargs))
    assert FAMILIES[family][3] - {"linear_cross_entropy"} <= ran
    if family in OWN_ATTENTION:
        assert patched.config._attn_implementation != fot.ATTENTION
        assert "decode_attention" not in ran
    else:
        # Every other decoder here attends through the "fuseops" implementation.
        assert patched.config._attn_implementation == fot.ATTENTION
        assert "decode_attention" in ran
    torch.testing.assert_close(patched.generate(ids, **kwargs), expected, rtol=0, atol=0)


# The families whose attention forward is one of the templates of
# fuseops.transformers._CACHED_ATTENTION_TEMPLATES (Llama's, Mistral's, Qwen
# 2's, Qwen 3's) in this transformers and whose test configs make full
# static-cache layers: their decode steps run fuseops.rope_cache_attention.
# Mistral and Ministral share a template; their configs here have a sliding
# window of 8 tokens, so with a prompt of 6 their first two steps run the op
# on a sliding-window layer that has not filled yet and the next ones HF's
# rolling update over the slots the op wrote (the tokens must match across
# that hand-over). Qwen2-MoE shares one too, but transformers' own
# Qwen2-MoE fails to generate with a static cache.
FUSED_STEP = {"dots1", "gemma", "glm", "glm4", "granite", "llama", "ministral", "mistral"}
FUSED_STEP |= {"mixtral", "qwen2", "qwen3", "qwen3_moe"}


@pytest.mark.parametrize("family", sorted(set(FAMILIES) - {"bert", "qwen2_moe"}))
def test_generate_greedy_with_static_cache(family):
    ref, patched = pair(family)
    ids, _ = batch(seq=6, batch_size=1)
    kwargs = dict(
        max_new_tokens=6,
        do_sample=False,
        use_cache=True,
        pad_token_id=0,
        cache_implementation="static",
    )
    expected = ref.eval().generate(ids, **kwargs)
    got = []
    ran = fuseops_ops_run(lambda: got.append(patched.eval().generate(ids, **kwargs)))
    assert ("rope_cache_attention" in ran) == (family in FUSED_STEP), ran
    torch.testing.assert_close(got[0], expected, rtol=0, atol=0)


def _is_router(name: str) -> bool:
    return name.rsplit(".", 1)[-1] in {"gate", "wg", "router", "shared_expert_gate"}


def _dequantized_int8(weight: torch.Tensor) -> torch.Tensor:
    q, scale = fuseops.quantize_per_channel_int8(weight)
    return q.float() * scale[:, None]


def _stacked_experts(module: torch.nn.Module) -> bool:
    # transformers' experts: every expert's weights in one 3-D parameter.
    weight = getattr(module, "gate_up_proj", None)
    return isinstance(weight, torch.nn.Parameter) and weight.dim() == 3


def int8_dequantized(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model` whose nn.Linear weights (routers aside) and
    experts' weights (expert by expert) are their int8 per-channel
    quantization, dequantized (q * scale) in float32; each a parameter of
    its own, so a tied head leaves the embedding as it is."""
    model = copy.deepcopy(model)
    with torch.no_grad():
        for name, module in model.named_modules():
            if type(module) is torch.nn.Linear and not _is_router(name):
                module.weight = torch.nn.Parameter(_dequantized_int8(module.weight))
            if _stacked_experts(module):
                for weight in (module.gate_up_proj, module.down_proj):
                    weight.copy_(torch.stack([_dequantized_int8(w) for w in weight]))
    return model


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_quantized_model_of_every_family(family):
    """apply(quantize=...) in every family: every nn.Linear but the
    mixture-of-experts routers quantized, and the experts' 3-D weights
    expert by expert; in w8a16 the logits those of the
    float model of the dequantized weights, to float32 accumulation (the
    same bound as tests_py/test_decode.py's for Llama); greedy generate runs
    in w8a16 and in w4a8 (int4 weights, int8 activations)."""
    ref = make_model(family).eval()
    ids, _ = batch(batch_size=1, seq=8)
    kwargs = dict(max_new_tokens=3, do_sample=False, use_cache=True, pad_token_id=0)
    for mode in ("w8a16", "w4a8"):
        model = copy.deepcopy(ref)
        fot.apply(model, quantize=mode)
        left = [n for n, m in model.named_modules() if type(m) is torch.nn.Linear]
        assert all(_is_router(n) for n in left), left
        assert not any(_stacked_experts(m) for m in model.modules())
        assert model.generate(ids, **kwargs).shape == (1, ids.shape[1] + 3)
        if mode == "w8a16":
            reference = int8_dequantized(ref)
            fot.apply(reference)  # the same fused ops around the linear layers
            with torch.no_grad():
                want = reference(ids).logits
                got = model(ids).logits
            torch.testing.assert_close(got, want, rtol=0, atol=1e-5 * want.abs().max().item())


def test_compile_decoding_of_quantized_experts():
    """A quantized mixture-of-experts model under compile_decoding: the
    compiled step (every expert on every token, the routed results added)
    makes the eager model's tokens, and its scores agree to float32
    rounding (1e-4 of the largest, the bound of test_decode.py's compiled
    steps; the quantized products give the same bits on every row)."""
    # No router logits: generate would compute their load-balancing loss
    # against the static cache's attention mask (another length).
    eager = make_model("mixtral", output_router_logits=False).eval()
    fot.apply(eager, quantize="w8a16")
    compiled = copy.deepcopy(eager)
    fot.compile_decoding(compiled)
    ids, _ = batch(batch_size=2, seq=6)
    kwargs = dict(max_new_tokens=4, do_sample=False, pad_token_id=0)
    kwargs.update(output_scores=True, return_dict_in_generate=True)
    torch._dynamo.reset()
    got = compiled.generate(ids, **kwargs)
    want = eager.generate(ids, cache_implementation="static", **kwargs)
    torch._dynamo.reset()
    torch.testing.assert_close(got.sequences, want.sequences, rtol=0, atol=0)
    for got_scores, want_scores in zip(got.scores, want.scores):
        scale = want_scores.abs().max().item()
        assert (got_scores - want_scores).abs().max().item() <= 1e-4 * scale


# Special tokens of the multimodal families inside the tiny vocabulary.
IMAGE_TOKEN, IMAGE_START, IMAGE_END = 3, 4, 5
IMAGE_TOKENS = {
    "qwen2_vl": dict(
        image_token_id=IMAGE_TOKEN,
        vision_start_token_id=IMAGE_START,
        vision_end_token_id=IMAGE_END,
    ),
    "gemma3": dict(image_token_index=IMAGE_TOKEN),
}
IMAGE_TOKENS["qwen2_5_vl"] = IMAGE_TOKENS["qwen2_vl"]


def image_inputs(family: str, config) -> dict:
    """A batch of two sequences with one image each (4 image tokens after a
    start token), the image's pixels and, for Qwen2-VL, its patch grid."""
    gen = torch.Generator().manual_seed(4)
    ids = torch.randint(IMAGE_END + 1, VOCAB, (2, 16), generator=gen)
    ids[:, 2], ids[:, 3:7], ids[:, 7] = IMAGE_START, IMAGE_TOKEN, IMAGE_END
    labels = ids.clone()
    labels[:, :8] = -100  # the loss on the text after the image
    vision = config.vision_config
    if family == "gemma3":  # 2 x 2 patches, pooled to mm_tokens_per_image = 4 tokens
        pixels = torch.randn(2, 3, vision.image_size, vision.image_size, generator=gen)
        return dict(input_ids=ids, labels=labels, pixel_values=pixels)
    # A 4 x 4 patch grid per image, merged 2 x 2 into 4 tokens; the text
    # after it takes 3-D (temporal, height, width) rotary positions.
    grid = torch.tensor([[1, 4, 4]] * 2)
    patch = vision.in_channels * vision.temporal_patch_size * vision.patch_size**2
    return dict(
        input_ids=ids,
        labels=labels,
        pixel_values=torch.randn(2 * 16, patch, generator=gen),
        image_grid_thw=grid,
        mm_token_type_ids=(ids == IMAGE_TOKEN).int(),
    )


VISION_TOWERS = ("model.visual.", "model.vision_tower.")


@pytest.mark.parametrize("family", sorted(IMAGE_TOKENS))
def test_multimodal_with_images_matches(family):
    # The vision tower's patched modules (LayerNorm, Qwen2.5-VL's RMSNorm)
    # and the text tower on image tokens, in training and evaluation.
    ref = make_model(family, **IMAGE_TOKENS[family])
    # Parameters initialized to zeros (Gemma 3's image projection, which
    # would cut the image off the loss; norm offsets, biases) take random
    # values, as trained ones have.
    gen = torch.Generator().manual_seed(6)
    with torch.no_grad():
        for p in ref.parameters():
            if not p.any():
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    patched = copy.deepcopy(ref)
    assert fot.apply(patched)
    inputs = image_inputs(family, ref.config)
    expected = train_step(ref, **inputs)
    ran = fuseops_ops_run(lambda: train_step(patched, **inputs))
    assert FAMILIES[family][3] <= ran, f"fuseops ops run: {sorted(ran)}"
    if family != "qwen2_5_vl":  # its vision tower has RMSNorm, no LayerNorm
        assert "layer_norm" in ran
    got = train_step(patched, **inputs)
    assert abs(got.loss.item() - expected.loss.item()) <= 1e-5 * abs(expected.loss.item())
    # The image reached the loss: the vision tower's patch embedding (its
    # first parameter) has a gradient.
    vision = next(p for n, p in ref.named_parameters() if n.startswith(VISION_TOWERS))
    assert vision.grad is not None and vision.grad.abs().max() > 0
    assert_gradients_match(ref, patched, 1e-5)
    ref.eval(), patched.eval()
    with torch.no_grad():
        expected, got = ref(**inputs), patched(**inputs)
    assert relative_error(got.logits, expected.logits) <= 1e-5
    assert abs(got.loss.item() - expected.loss.item()) <= 1e-5 * abs(expected.loss.item())


def test_bert_masked_lm_matches():
    # An encoder: LayerNorm and BERT's dense + erf GELU; its masked-LM head
    # (a transform, then the decoder) stays HF's, with HF's loss.
    config = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=96,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    torch.manual_seed(0)
    ref = transformers.BertForMaskedLM(config)
    patched = copy.deepcopy(ref)
    replaced = fot.apply(patched)
    assert "<model>" not in {r.name for r in replaced}
    assert {r.new for r in replaced} == {"fuseops.layer_norm", "fuseops.bias_gelu('none')"}
    ids, labels = batch()
    expected = train_step(ref, ids, labels)
    assert {"layer_norm", "bias_gelu"} <= fuseops_ops_run(lambda: train_step(patched, ids, labels))
    got = train_step(patched, ids, labels)
    torch.testing.assert_close(got.logits, expected.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.loss, expected.loss, rtol=1e-5, atol=0)
    assert_gradients_match(ref, patched, 1e-5)


# Every model class transformers exports for a supported family, each built
# from a one-layer config, against an unpatched copy in training and
# evaluation: the fused head only on the causal LMs (HF's own forward, head
# and loss on every other class), the other patches everywhere.

# The classes whose forward the fused head reproduces.
LM_HEADS = {
    "LlamaForCausalLM",
    "Olmo2ForCausalLM",
    "Olmo3ForCausalLM",
    "SmolLM3ForCausalLM",
    "SeedOssForCausalLM",
    "MinistralForCausalLM",
    "Exaone4ForCausalLM",
    "HunYuanDenseV1ForCausalLM",
    "GraniteForCausalLM",
    "MixtralForCausalLM",
    "Qwen2MoeForCausalLM",
    "Qwen3MoeForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "GemmaForCausalLM",
    "Gemma2ForCausalLM",
    "Gemma3ForCausalLM",
    "Phi3ForCausalLM",
    "GPT2LMHeadModel",
    "OlmoeForCausalLM",
    "HunYuanMoEV1ForCausalLM",
    "Dots1ForCausalLM",
    "Glm4MoeForCausalLM",
    "Ministral3ForCausalLM",
    "VaultGemmaForCausalLM",
    "StableLmForCausalLM",
    "Starcoder2ForCausalLM",
    "Qwen2VLForConditionalGeneration",
    "Qwen2_5_VLForConditionalGeneration",
    "CohereForCausalLM",
    "Cohere2ForCausalLM",
    "GlmForCausalLM",
    "Glm4ForCausalLM",
    "FalconForCausalLM",
}
CHOICES = 2


def tiny_config(model_type: str):
    if model_type == "bert":
        return transformers.BertConfig(
            vocab_size=VOCAB,
            hidden_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            intermediate_size=96,
            max_position_embeddings=64,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            pad_token_id=0,
        )
    config_cls, _, extra, _ = FAMILIES[model_type]
    # A pad token: the sequence classifiers find each row's last token by it.
    settings = {**COMMON, **extra, "num_hidden_layers": 1, "pad_token_id": 0}
    if model_type == "gpt2":
        settings["summary_first_dropout"] = 0.0  # GPT2DoubleHeadsModel's summary
    return build_config(config_cls, settings)


def family_classes(model_type: str) -> list[type]:
    """The model classes of `model_type`'s modeling module (its __all__), but
    the abstract *PreTrainedModel and those of another config (Gemma 3's
    multimodal classes are model type "gemma3", its text-only ones
    "gemma3_text"; Qwen2-VL's text model is "qwen2_vl_text")."""
    module = importlib.import_module(
        type(tiny_config(model_type)).__module__.replace(".configuration_", ".modeling_")
    )
    classes = [getattr(module, name) for name in module.__all__]
    return [
        cls
        for cls in classes
        if isinstance(cls, type)
        and issubclass(cls, transformers.PreTrainedModel)
        and not cls.__name__.endswith("PreTrainedModel")
        and cls.config_class.model_type == model_type
    ]


def class_inputs(name: str, num_labels: int) -> dict:
    """Inputs and labels for the head of class `name`; a class this test
    does not know fails it, so a new head gets inputs here first."""
    gen = torch.Generator().manual_seed(3)
    seq = 8

    def ints(low, high, *shape):
        return torch.randint(low, high, shape, generator=gen)

    def tokens(*shape):  # no pad token (0): every position is real
        ids = ints(1, VOCAB, *shape)
        labels = ids.clone()
        labels[..., 0, :3] = -100
        return ids, labels

    ids, labels = tokens(2, seq)
    if name.endswith(("ForCausalLM", "LMHeadModel", "ForMaskedLM", "ForConditionalGeneration")):
        return dict(input_ids=ids, labels=labels)
    if name.endswith("DoubleHeadsModel"):
        ids, labels = tokens(2, CHOICES, seq)
        return dict(
            input_ids=ids,
            labels=labels,
            mc_token_ids=ints(0, seq, 2, CHOICES),
            mc_labels=ints(0, CHOICES, 2),
        )
    if name.endswith("ForMultipleChoice"):
        return dict(input_ids=tokens(2, CHOICES, seq)[0], labels=ints(0, CHOICES, 2))
    if name.endswith("ForSequenceClassification"):
        return dict(input_ids=ids, labels=ints(0, num_labels, 2))
    if name.endswith("ForTokenClassification"):
        return dict(input_ids=ids, labels=ints(0, num_labels, 2, seq))
    if name.endswith("ForQuestionAnswering"):
        return dict(input_ids=ids, start_positions=ints(0, seq, 2), end_positions=ints(0, seq, 2))
    if name.endswith("ForNextSentencePrediction"):
        return dict(input_ids=ids, labels=ints(0, 2, 2))
    if name.endswith("ForPreTraining"):
        return dict(input_ids=ids, labels=labels, next_sentence_label=ints(0, 2, 2))
    if name.endswith("Model") and "For" not in name:  # a base model
        return dict(input_ids=ids)
    raise AssertionError(f"no inputs for {name}")


def output_tensors(out, name: str = "") -> dict[str, torch.Tensor]:
    """Every tensor of a model output by its path (a ModelOutput holds only
    the fields that are set, so a missing field is a missing key)."""
    from transformers.cache_utils import Cache

    if torch.is_tensor(out):
        return {name: out}
    if isinstance(out, Cache):
        items = [
            (f"{i}.{kind}", getattr(layer, kind))
            for i, layer in enumerate(out.layers)
            for kind in ("keys", "values")
        ]
    elif isinstance(out, dict):
        items = out.items()
    elif isinstance(out, (tuple, list)):
        items = enumerate(out)
    else:
        raise AssertionError(f"{name}: an output of type {type(out).__name__}")
    result = {}
    for key, value in items:
        if value is not None:
            result.update(output_tensors(value, f"{name}.{key}" if name else str(key)))
    return result


def project(hidden: torch.Tensor) -> torch.Tensor:
    """A base model's scalar to train: a fixed random projection of its
    output (not its mean square, which a final norm makes nearly constant,
    leaving gradients that are mostly rounding noise)."""
    weight = torch.randn(hidden.shape[-1], generator=torch.Generator().manual_seed(5))
    return (hidden * weight).mean()


@pytest.mark.parametrize("model_type", fot.supported_model_types())
def test_every_model_class_matches(model_type):
    classes = family_classes(model_type)
    # The enumeration found the family: its base model and causal LM at least.
    assert len(classes) >= 2, [cls.__name__ for cls in classes]
    for cls in classes:
        where = cls.__name__
        torch.manual_seed(0)
        ref = cls(tiny_config(model_type))
        for module in ref.modules():  # dropout off (the classifiers' own included)
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
        patched = copy.deepcopy(ref)
        replaced = {r.name for r in fot.apply(patched)}
        assert replaced - {"<model>"}, where  # norms, MLPs, rotary everywhere
        assert ("<model>" in replaced) == (where in LM_HEADS), where
        inputs = class_inputs(where, ref.config.num_labels)

        for training in (True, False):
            outputs = []
            for model in (ref, patched):
                model.train(training)
                model.zero_grad(set_to_none=True)
                torch.manual_seed(0)  # any dropout left draws the same mask in both
                with torch.set_grad_enabled(training):
                    out = output_tensors(model(**inputs, output_hidden_states=True))
                if training:
                    losses = [v for k, v in out.items() if k.endswith("loss")]
                    (sum(losses) if losses else project(out["last_hidden_state"])).backward()
                outputs.append(out)
            expected, got = outputs
            if training and where in LM_HEADS:
                # The fused loss forms no logits (logits="auto").
                assert "logits" not in got, where
                expected.pop("logits")
            assert got.keys() == expected.keys(), f"{where}: {sorted(got)} != {sorted(expected)}"
            for key, value in expected.items():
                err = relative_error(got[key], value)
                assert err <= 1e-5, f"{where} (training={training}) {key}: error {err:.2e}"
            if training:
                # The question-answering and multiple-choice output biases
                # shift every position's (choice's) logit alike, which the
                # softmax ignores: zero gradients in exact math, whose float32
                # noise reaches 5e-8 of the model's largest gradient, so each
                # is measured against at least 1e-2 of it.
                assert_gradients_match(ref, patched, 1e-5, floor=1e-2)


@pytest.mark.parametrize("family", HEADS)
def test_logits_always_in_training(family):
    ref = make_model(family, num_hidden_layers=1)
    patched = copy.deepcopy(ref)
    assert "<model>" in {r.name for r in fot.apply(patched, logits="always")}
    ids, labels = batch()
    expected = train_step(ref, ids, labels)
    ran = fuseops_ops_run(lambda: train_step(patched, ids, labels))
    assert "linear_cross_entropy" in ran and "cross_entropy" not in ran  # the loss stays fused
    got = train_step(patched, ids, labels)
    assert relative_error(got.logits, expected.logits) <= 1e-5
    assert abs(got.loss.item() - expected.loss.item()) <= 1e-5 * abs(expected.loss.item())
    assert_gradients_match(ref, patched, 1e-5)
    # The logits are differentiable, as HF's: a second loss on them trains
    # the same gradients.
    for model in (ref, patched):
        model.zero_grad(set_to_none=True)
        out = model(ids, labels=labels)
        (out.loss + out.logits.float().square().mean()).backward()
    assert_gradients_match(ref, patched, 1e-5)
    # Evaluation is as with logits="auto".
    ref.eval(), patched.eval()
    with torch.no_grad():
        assert relative_error(patched(ids).logits, ref(ids).logits) <= 1e-5


def test_logits_argument_is_checked():
    model = make_model("llama", num_hidden_layers=1)
    for bad in ("never", True, None):
        with pytest.raises(
            ValueError,
            match=r"^fuseops\.transformers\.apply: logits must be one of "
            r"'auto', 'always', got",
        ):
            fot.apply(model, logits=bad)
    assert not any(fot.is_patched(m) for m in model.modules())  # a rejected call patches nothing
    assert fot.apply(model)
    assert fot.apply(model, logits="auto") == []
    # The mode is the patch's: asking for another one is an error, not a no-op.
    with pytest.raises(
        ValueError,
        match=r"^fuseops\.transformers\.apply: logits='always', but the head "
        r"of this LlamaForCausalLM was patched with logits='auto'",
    ):
        fot.apply(model, logits="always")
    ids, labels = batch()
    assert model.train()(ids, labels=labels).logits is None


def test_head_patched_only_where_its_forward_is_reproduced():
    config = make_model("llama", num_hidden_layers=1).config

    class KeepsForward(transformers.LlamaForCausalLM):
        pass

    class OwnForward(transformers.LlamaForCausalLM):
        def forward(self, input_ids=None, scale=1.0, **kwargs):
            out = super().forward(input_ids, **kwargs)
            out.logits = out.logits * scale
            return out

    assert "<model>" in {r.name for r in fot.apply(KeepsForward(config))}
    torch.manual_seed(0)
    ref = OwnForward(config)
    patched = copy.deepcopy(ref)
    replaced = {r.name for r in fot.apply(patched)}
    assert "<model>" not in replaced and "model.norm" in replaced
    ids, labels = batch()
    ref.train(), patched.train()
    expected, got = ref(ids, scale=2.0, labels=labels), patched(ids, scale=2.0, labels=labels)
    assert (
        relative_error(got.logits, expected.logits) <= 1e-5
    )  # its own forward ran, logits and all
    assert abs(got.loss.item() - expected.loss.item()) <= 1e-5 * abs(expected.loss.item())


def test_num_items_in_batch_and_shift_labels():
    ref, patched = pair("llama")
    ids, labels = batch()
    n = torch.tensor(37)  # tokens of all micro-batches of an accumulation step
    expected = train_step(ref, ids, labels, num_items_in_batch=n)
    got = train_step(patched, ids, labels, num_items_in_batch=n)
    torch.testing.assert_close(got.loss, expected.loss, rtol=1e-5, atol=0)
    torch.testing.assert_close(
        patched.lm_head.weight.grad, ref.lm_head.weight.grad, rtol=1e-5, atol=1e-7
    )
    # Pre-shifted labels (HF's shift_labels) give the same loss as labels.
    shifted = torch.nn.functional.pad(labels, (0, 1), value=-100)[:, 1:]
    patched.train()
    torch.testing.assert_close(
        patched(ids, shift_labels=shifted, num_items_in_batch=n).loss, got.loss, rtol=1e-6, atol=0
    )


def test_activation_checkpointing():
    # The decoder layers' forwards run again in the backward: the patched
    # modules' too.
    ref, patched = pair("llama")
    ids, labels = batch()
    expected = train_step(ref, ids, labels)
    patched.activation_checkpointing_enable()
    got = train_step(patched, ids, labels)
    torch.testing.assert_close(got.loss, expected.loss, rtol=1e-5, atol=0)
    assert_gradients_match(ref, patched, 1e-5)


def test_optimizer_steps_match():
    ref, patched = pair("llama")
    losses = {}
    for name, model in (("ref", ref), ("patched", patched)):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        losses[name] = []
        for _ in range(4):
            ids, labels = batch(seed=10)  # one batch, learnt by heart
            out = train_step(model, ids, labels)
            opt.step()
            losses[name].append(out.loss.item())
    assert losses["patched"][-1] < losses["patched"][0]  # it learns
    torch.testing.assert_close(
        torch.tensor(losses["patched"]), torch.tensor(losses["ref"]), rtol=1e-4, atol=0
    )


def test_patching_twice_is_a_no_op_and_flags_select():
    model = make_model("llama")
    first = fot.apply(model, rope=False, cross_entropy=False, attention=False, linear=False)
    assert {r.new for r in first} == {"fuseops.rms_norm", "fuseops.swiglu"}
    assert model.config._attn_implementation == "sdpa"
    assert not fot.is_patched(model) and not fot.is_patched(model.model.layers[0].self_attn)
    forwards = {name: m.__dict__.get("forward") for name, m in model.named_modules()}
    assert fot.apply(model, rope=False, cross_entropy=False, attention=False, linear=False) == []
    assert {name: m.__dict__.get("forward") for name, m in model.named_modules()} == forwards
    # The rest later; then nothing is left.
    rest = fot.apply(model)
    linears = {name for name, m in model.named_modules() if type(m) is torch.nn.Linear}
    assert "lm_head" in linears and "model.layers.0.mlp.down_proj" in linears
    assert {r.name for r in rest} == {"<model>", "<attention>"} | linears | {
        f"model.layers.{i}.self_attn" for i in range(COMMON["num_hidden_layers"])
    }
    assert {r.new for r in rest if r.name in linears} == {"fuseops.linear"}
    assert fot.apply(model) == []


def test_unsupported_model_type_names_supported_ones():
    config = transformers.GPTNeoXConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
    )
    model = transformers.GPTNeoXForCausalLM(config)
    with pytest.raises(ValueError, match=r"'gpt_neox'.*supported model types: .*llama.*qwen3"):
        fot.apply(model)
    with pytest.raises(ValueError, match="supported model types"):
        fot.apply(torch.nn.Linear(2, 2))


def test_meta_device_patch_then_load_weights():
    ref = make_model("qwen3")
    with torch.device("meta"):
        model = type(ref)(ref.config)
    assert fot.apply(model)
    model.load_state_dict(ref.state_dict(), assign=True)
    # Non-persistent buffers (the rotary inverse frequencies) are not in a
    # state_dict: rebuilt as for any model materialized from meta.
    for name, buffer in ref.named_buffers():
        module_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(module_name), attr, buffer.clone())
    ids, labels = batch()
    expected = train_step(ref, ids, labels)
    got = train_step(model, ids, labels)
    torch.testing.assert_close(got.loss, expected.loss, rtol=1e-5, atol=0)


def test_save_pretrained_round_trip():
    ref, patched = pair("llama")
    ids, labels = batch()
    with tempfile.TemporaryDirectory() as folder:
        patched.save_pretrained(folder)
        assert os.path.exists(os.path.join(folder, "config.json"))
        loaded = type(ref).from_pretrained(folder)
    assert loaded.config.architectures == ["LlamaForCausalLM"]
    for (name, a), (_, b) in zip(
        sorted(ref.state_dict().items()), sorted(loaded.state_dict().items())
    ):
        torch.testing.assert_close(b, a, rtol=0, atol=0, msg=name)
    assert not fot.is_patched(loaded)
    assert fot.apply(loaded)
    torch.testing.assert_close(
        train_step(loaded, ids, labels).loss, train_step(ref, ids, labels).loss, rtol=1e-5, atol=0
    )


def test_torch_compile_forward():
    # One layer: Inductor's compilation dominates this file's time.
    ref, patched = pair("llama", num_hidden_layers=1)
    ids, _ = batch()
    ref.eval(), patched.eval()
    # fullgraph: the patched forwards and fuseops' ops trace without breaks.
    compiled = torch.compile(patched, fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(ids).logits, ref(ids).logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("preset", ["smoke", "moe-smoke"])
def test_bench_command(tmp_path, preset):
    from fuseops.__main__ import main

    assert (
        main(
            [
                "bench",
                "--transformers",
                preset,
                "--no-compile",
                "--dtype",
                "float32",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    import json

    report = json.loads((tmp_path / "transformers.json").read_text())
    [result] = report["results"]
    assert result["loss_ok"] and result["patched_modules"] > 0
    assert [row["variant"] for row in result["rows"]] == ["transformers", "fuseops"]
    for row in result["rows"]:
        assert row["step_s"] > 0 and row["prefill_s"] > 0 and row["peak_bytes"] > 0
    # transformers.Trainer steps, unpatched and patched (accelerate, which
    # Trainer needs, is in the test setup).
    assert [row["variant"] for row in result["trainer_rows"]] == ["Trainer", "Trainer + fuseops"]
    assert all(row["step_s"] > 0 for row in result["trainer_rows"])
    text = (tmp_path / "transformers.txt").read_text()
    assert "| float32 | fuseops |" in text
    assert ("MixtralForCausalLM" in text) == (preset == "moe-smoke")
