"""Hugging Face ``transformers`` models on fuseops ops, in one line.

``fuseops.transformers.apply(model)`` patches an instantiated model in place
(its modules' ``forward``, on the instances: other models of the same classes
in the process stay as they are) and returns what it patched:

- ``rms_norm``: the family's RMSNorm modules run ``fuseops.rms_norm``
  (Gemma's ``x_hat * (1 + weight)`` in float32 included);
- ``rope``: the attention modules apply the rotary embedding with
  ``fuseops.rope`` (the rest of HF's attention code unchanged; Cohere's and
  GLM's GPT-J pairs with ``interleaved=True``);
- ``mlp``: gated MLPs run ``fuseops.swiglu``/``fuseops.geglu`` on their
  gate and up projections (Phi-3's and GLM's packed ``gate_up_proj`` in
  place), GPT-2's, StarCoder2's, Falcon's and BERT's ``fuseops.bias_gelu`` on
  the projection without its bias;
- ``layer_norm``: ``torch.nn.LayerNorm`` modules run ``fuseops.layer_norm``,
  and so do Cohere's bias-free LayerNorms (computed in float32);
- ``cross_entropy``: the causal-LM head, on each family's causal-LM class
  only (``FAMILIES[model_type].causal_lm``; other heads keep HF's forward).
  With ``labels`` in training mode the loss is
  ``fuseops.linear_cross_entropy`` of the last hidden states and the head's
  weight, so the ``[tokens, vocab]`` logits are never formed (the output's
  ``logits`` is None, unless ``apply(model, logits="always")`` asked for
  them); otherwise the logits are computed as HF does and the loss, if
  labels are given, is ``fuseops.cross_entropy``. Both honour
  ``ignore_index``, ``shift_labels``, ``num_items_in_batch`` (sum divided by
  it, as HF's loss does), the config's ``final_logit_softcapping`` and the
  logits' scale factors (Granite's ``logits_scaling``, Cohere's
  ``logit_scale``).

With ``quantize="w8a16"``, ``"w8a8"`` (or ``"w4a16"`` where
``fuseops.quantization.QUANTIZE_MODES`` has it) the model is then
quantized for inference: every ``torch.nn.Linear``, the LM head included,
becomes a quantized layer through ``fuseops.quantize_``, after q/k/v and
gate/up are merged into one layer each (``fuse_projections``; the old names
hold :class:`ProjectionSlice` modules returning their part).

Patching is idempotent: patched modules carry a marker and a second
``apply`` (with the same ``logits``) changes nothing and returns an empty
list. Parameters, buffers and
``state_dict`` keys are untouched, so a model patched on the meta device
loads its weights afterwards and ``save_pretrained``/``from_pretrained``
round-trip as for the unpatched model.
"""

from __future__ import annotations

import functools
import inspect
import sys
import types
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F

from . import quantization
from .nn import Replacement
from .ops.activation import bias_gelu, gelu
from .ops.cross_entropy import cross_entropy as _cross_entropy
from .ops.cross_entropy import linear_cross_entropy
from .ops.decode_attention import decode_attention
from .ops.gated_activation import geglu, swiglu
from .ops.layer_norm import layer_norm
from .ops.linear import linear as _fuseops_linear
from .ops.moe_experts import moe_experts
from .ops.rms_norm import rms_norm
from .ops.rope import apply_rotary_pos_emb as _fuseops_apply_rotary_pos_emb
from .ops.rope import rope as _fuseops_rope
from .ops.rope_cache_attention import rope_cache_attention

#: Attribute set on every patched module (its value: what was patched).
MARKER = "_fuseops_patched"

KINDS = ("rms_norm", "rope", "mlp", "layer_norm", "cross_entropy", "attention", "experts")

#: The attention implementation :func:`apply` sets (``attention=True``),
#: registered with transformers' AttentionInterface and AttentionMaskInterface.
ATTENTION = "fuseops"

#: Calls with at most this many new tokens run fuseops.decode_attention
#: (decoding, speculative steps, short prompts); longer ones SDPA.
DECODE_ATTENTION_MAX_QUERY = 16

# Set on a model whose head is patched: the `logits` mode it was patched with.
_LOGITS_ATTRIBUTE = "_fuseops_logits"

#: The ``quantize`` modes of :func:`apply`, where ``fuseops.quantization``
#: has them (:func:`quantize_modes`): int8 or int4 weights, for inference.
QUANTIZE = ("w8a16", "w8a8", "w4a16", "w4a8")

# Set on a model that apply quantized: the mode it was quantized with.
_QUANTIZE_ATTRIBUTE = "_fuseops_quantize"


@dataclass(frozen=True)
class _Family:
    prefix: str  # class-name prefix of the family's modules: "Llama" -> LlamaRMSNorm
    # "gated" (gate_proj/up_proj/down_proj), "packed" (gate_up_proj), and the
    # bias + GELU kinds of _BIAS_GELU_MLPS: "conv1d" (GPT-2), "linear"
    # (StarCoder2), "dense" (BERT), "falcon" (FalconLinear dense_h_to_4h)
    mlp: str
    rms_offset: bool = False  # RMSNorm multiplies by (1 + weight) in float32 (Gemma)
    mlp_class: Optional[str] = None  # class name of the MLP module when not <prefix>MLP
    # The model classes whose forward _causal_lm_forward reproduces: the base
    # model, then lm_head and HF's causal-LM loss, nothing else. Other heads
    # with an lm_head (GPT2DoubleHeadsModel's multiple-choice head) keep HF's.
    causal_lm: tuple[str, ...] = ()
    # Mixture-of-experts: the causal LM adds the routers' load-balancing loss
    # (its modeling module's load_balancing_loss_func) when asked for the
    # router logits, and returns MoeCausalLMOutputWithPast.
    moe: bool = False
    # A decoder (causal self-attention with a cache): apply's attention patch.
    decoder: bool = True
    # How the family's apply_rotary_pos_emb pairs the head dimensions, one of
    # _ROTARY: "half" (rotate_half: j with j + rd/2), "interleaved" (GPT-J
    # pairs 2j, 2j+1, cos/sin rows already in that layout: Cohere),
    # "interleaved_half" (GPT-J pairs, cos/sin rows in the rotate_half
    # layout, whose first half the function repeats pairwise: GLM).
    rotary: str = "half"
    # Class name of a bias-free LayerNorm computed in float32 (Cohere's:
    # weight * (x - mean) * rsqrt(var + eps), rounded once to x's dtype).
    layer_norm_class: Optional[str] = None
    # The causal LM multiplies its logits by its logit_scale (Cohere).
    logit_scale: bool = False


# model_type -> family. Every family's attention calls its module's
# apply_rotary_pos_emb(q, k, cos, sin) on [batch, heads, seq, head_dim].
FAMILIES: dict[str, _Family] = {
    "llama": _Family("Llama", "gated", causal_lm=("LlamaForCausalLM",)),
    "mistral": _Family("Mistral", "gated", causal_lm=("MistralForCausalLM",)),
    "qwen2": _Family("Qwen2", "gated", causal_lm=("Qwen2ForCausalLM",)),
    "qwen3": _Family("Qwen3", "gated", causal_lm=("Qwen3ForCausalLM",)),
    "gemma": _Family("Gemma", "gated", rms_offset=True, causal_lm=("GemmaForCausalLM",)),
    "gemma2": _Family("Gemma2", "gated", rms_offset=True, causal_lm=("Gemma2ForCausalLM",)),
    "gemma3_text": _Family("Gemma3", "gated", rms_offset=True, causal_lm=("Gemma3ForCausalLM",)),
    # Gemma 3's multimodal models (Gemma3ForConditionalGeneration): the text
    # tower as gemma3_text's, the SigLIP vision tower's nn.LayerNorm; the head
    # stays HF's (its forward passes the labels to the base model and returns
    # the image hidden states).
    "gemma3": _Family("Gemma3", "gated", rms_offset=True),
    # Qwen2-VL and Qwen2.5-VL: the text tower (its MLP class is Qwen2MLP) and
    # the vision tower's norms (its MLP and attention stay HF's). HF's rotary
    # embedding module selects the multimodal (mrope) sections of cos and
    # sin; the attention then calls the plain apply_rotary_pos_emb. The
    # ForConditionalGeneration head is the base model, lm_head and the
    # causal-LM loss, as the head patch computes.
    "qwen2_vl": _Family(
        "Qwen2VL", "gated", mlp_class="Qwen2MLP", causal_lm=("Qwen2VLForConditionalGeneration",)
    ),
    "qwen2_5_vl": _Family(
        "Qwen2_5_VL",
        "gated",
        mlp_class="Qwen2MLP",
        causal_lm=("Qwen2_5_VLForConditionalGeneration",),
    ),
    "phi3": _Family("Phi3", "packed", causal_lm=("Phi3ForCausalLM",)),
    "olmo2": _Family("Olmo2", "gated", causal_lm=("Olmo2ForCausalLM",)),
    "olmo3": _Family("Olmo3", "gated", causal_lm=("Olmo3ForCausalLM",)),
    "smollm3": _Family("SmolLM3", "gated", causal_lm=("SmolLM3ForCausalLM",)),
    "seed_oss": _Family("SeedOss", "gated", causal_lm=("SeedOssForCausalLM",)),
    "ministral": _Family("Ministral", "gated", causal_lm=("MinistralForCausalLM",)),
    "exaone4": _Family("Exaone4", "gated", causal_lm=("Exaone4ForCausalLM",)),
    "hunyuan_v1_dense": _Family(
        "HunYuanDenseV1", "gated", causal_lm=("HunYuanDenseV1ForCausalLM",)
    ),
    # Logits divided by config.logits_scaling (the head patch does so too).
    "granite": _Family("Granite", "gated", causal_lm=("GraniteForCausalLM",)),
    # Experts and routers stay HF's; Qwen2-MoE's shared expert is a gated MLP.
    "mixtral": _Family("Mixtral", "gated", causal_lm=("MixtralForCausalLM",), moe=True),
    "qwen2_moe": _Family("Qwen2Moe", "gated", causal_lm=("Qwen2MoeForCausalLM",), moe=True),
    "qwen3_moe": _Family("Qwen3Moe", "gated", causal_lm=("Qwen3MoeForCausalLM",), moe=True),
    "olmoe": _Family("Olmoe", "gated", causal_lm=("OlmoeForCausalLM",), moe=True),
    # MoE without an auxiliary loss in its causal LM's forward.
    "hunyuan_v1_moe": _Family("HunYuanMoEV1", "gated", causal_lm=("HunYuanMoEV1ForCausalLM",)),
    "dots1": _Family("Dots1", "gated", causal_lm=("Dots1ForCausalLM",)),
    "glm4_moe": _Family("Glm4Moe", "gated", causal_lm=("Glm4MoeForCausalLM",)),
    "ministral3": _Family("Ministral3", "gated", causal_lm=("Ministral3ForCausalLM",)),
    "vaultgemma": _Family(
        "VaultGemma", "gated", rms_offset=True, causal_lm=("VaultGemmaForCausalLM",)
    ),
    # nn.LayerNorm, partial rotary.
    "stablelm": _Family("StableLm", "gated", causal_lm=("StableLmForCausalLM",)),
    # No rotary embedding (learned positions), nn.LayerNorm, bias + GELU MLPs.
    "gpt2": _Family("GPT2", "conv1d", causal_lm=("GPT2LMHeadModel",)),
    # nn.LayerNorm, bias + GELU MLPs (nn.Linear c_fc and c_proj).
    "starcoder2": _Family("Starcoder2", "linear", causal_lm=("Starcoder2ForCausalLM",)),
    # CohereLayerNorm (the per-head q/k norms, of a [heads, head_dim] weight,
    # stay HF's), GPT-J rotary pairs, logits multiplied by logit_scale;
    # Cohere 2 applies the rotary embedding on its sliding-window layers only.
    "cohere": _Family(
        "Cohere",
        "gated",
        causal_lm=("CohereForCausalLM",),
        rotary="interleaved",
        layer_norm_class="CohereLayerNorm",
        logit_scale=True,
    ),
    "cohere2": _Family(
        "Cohere2",
        "gated",
        causal_lm=("Cohere2ForCausalLM",),
        rotary="interleaved",
        layer_norm_class="Cohere2LayerNorm",
        logit_scale=True,
    ),
    # Packed gate_up_proj, partial rotary on GPT-J pairs; GLM-4's extra
    # post-attention and post-MLP norms are RMSNorms as the others.
    "glm": _Family("Glm", "packed", causal_lm=("GlmForCausalLM",), rotary="interleaved_half"),
    "glm4": _Family("Glm4", "packed", causal_lm=("Glm4ForCausalLM",), rotary="interleaved_half"),
    # nn.LayerNorm, rotary (none with alibi), bias + GELU MLPs (FalconLinear
    # dense_h_to_4h; without a bias the MLP stays HF's). Its attention calls
    # SDPA or eager math itself, not through transformers' AttentionInterface:
    # transformers refuses to change its implementation, so it keeps HF's.
    "falcon": _Family("Falcon", "falcon", causal_lm=("FalconForCausalLM",)),
    # No lm_head: BERT's language-model heads are a transform then a decoder.
    "bert": _Family("Bert", "dense", mlp_class="BertIntermediate", decoder=False),
}

LOGITS = ("auto", "always")


def supported_model_types() -> list[str]:
    """The ``config.model_type`` values :func:`apply` accepts."""
    return sorted(FAMILIES)


def quantize_modes() -> list[str]:
    """The ``quantize`` values :func:`apply` accepts in this installation:
    those of :data:`QUANTIZE` that ``fuseops.quantization.QUANTIZE_MODES``
    has."""
    return [mode for mode in QUANTIZE if mode in quantization.QUANTIZE_MODES]


# ---------------------------------------------------------------------------
# Patched forwards (bound to one module instance each)


def _linear_forward(self, input: torch.Tensor) -> torch.Tensor:
    # nn.Linear's parameters as they are: only the product changes.
    return _fuseops_linear(input, self.weight, self.bias)


def _rms_norm_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    # Llama's RMSNorm returns weight * x_hat.to(dtype): the weight's dtype
    # wins when it is wider (float32 weights, bfloat16 activations).
    weight = self.weight
    out = rms_norm(hidden_states, weight, _eps(self))
    promoted = torch.promote_types(hidden_states.dtype, weight.dtype)
    return out if promoted == out.dtype else out.to(promoted)


def _rms_norm_offset_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    # Gemma's RMSNorm: (x_hat * (1 + weight)) in float32, rounded once to x's
    # dtype; the float32 (1 + weight) is a differentiable [hidden] vector.
    return rms_norm(hidden_states, 1.0 + self.weight.float(), _eps(self))


def _eps(module) -> float:
    eps = getattr(module, "variance_epsilon", None)
    return module.eps if eps is None else eps


# Where each family's MLP keeps its activation module.
_ACTIVATION_ATTRIBUTES = ("act_fn", "activation_fn", "act", "intermediate_act_fn")


def _activation_kind(act) -> Optional[str]:
    """'silu', 'none' (erf GELU), 'tanh' (tanh GELU) or None for an
    activation module fuseops has no fused form of."""
    name = type(act).__name__
    if name in ("SiLUActivation", "SiLU"):
        return "silu"
    if name in ("GELUTanh", "PytorchGELUTanh", "NewGELUActivation"):
        return "tanh"
    if name == "GELUActivation" or (
        name == "GELU" and getattr(act, "approximate", "none") == "none"
    ):
        return "none"
    if name == "GELU" and act.approximate == "tanh":
        return "tanh"
    return None


def _gated(gate: torch.Tensor, up: Optional[torch.Tensor], kind: str) -> torch.Tensor:
    return swiglu(gate, up) if kind == "silu" else geglu(gate, up, kind)


def _gated_mlp_forward(self, x: torch.Tensor) -> torch.Tensor:
    return self.down_proj(_gated(self.gate_proj(x), self.up_proj(x), self._fuseops_act))


def _fused_gate_up_mlp_forward(self, x: torch.Tensor) -> torch.Tensor:
    # gate_proj and up_proj merged by apply(fuse_projections=...) into
    # gate_up_proj (gate rows, then up rows): one product, read in place as
    # the packed gated activation's input.
    return self.down_proj(_gated(self.gate_up_proj(x), None, self._fuseops_act))


def _packed_mlp_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    # Phi-3: gate_up_proj's output holds the gate, then up (chunk(2, -1)),
    # fuseops' packed layout; the halves are read in place.
    return self.down_proj(_gated(self.gate_up_proj(hidden_states), None, self._fuseops_act))


def _conv1d_mlp_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    # GPT-2: c_fc is a Conv1D (weight [in, out], y = x @ weight + bias); the
    # bias add and the GELU are fused after the bias-free product.
    fc = self.c_fc
    hidden = hidden_states.matmul(fc.weight)
    return self.dropout(self.c_proj(bias_gelu(hidden, fc.bias, self._fuseops_act)))


def _linear_bias_gelu(fc: torch.nn.Module, x: torch.Tensor, approximate: str) -> torch.Tensor:
    # GELU(fc(x)) for an nn.Linear fc: the bias add fused into the GELU after
    # the bias-free product. A layer apply(quantize=...) has replaced adds its
    # bias in its own kernel, so only the GELU is left.
    if isinstance(fc, torch.nn.Linear):
        return bias_gelu(F.linear(x, fc.weight), fc.bias, approximate)
    return gelu(fc(x), approximate)


def _linear_mlp_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    # StarCoder2: c_fc and c_proj are nn.Linear; the bias add and the GELU
    # are fused after c_fc's bias-free product, then c_proj and the residual
    # dropout as HF's.
    hidden = _linear_bias_gelu(self.c_fc, hidden_states, self._fuseops_act)
    return F.dropout(self.c_proj(hidden), p=self.residual_dropout, training=self.training)


def _dense_gelu_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    # BERT's intermediate layer: dense then GELU, the bias add fused.
    return _linear_bias_gelu(self.dense, hidden_states, self._fuseops_act)


def _falcon_mlp_forward(self, x: torch.Tensor) -> torch.Tensor:
    # Falcon: dense_h_to_4h is a FalconLinear (x @ weight.T, then the bias
    # added); the bias add and the GELU are fused after that product, then
    # dense_4h_to_h as HF's.
    fc = self.dense_h_to_4h
    return self.dense_4h_to_h(bias_gelu(x @ fc.weight.T, fc.bias, self._fuseops_act))


# The bias + GELU MLP kinds: the layer whose bias is fused, and the forward.
_BIAS_GELU_MLPS: dict[str, tuple[str, Callable[..., torch.Tensor]]] = {
    "conv1d": ("c_fc", _conv1d_mlp_forward),
    "linear": ("c_fc", _linear_mlp_forward),
    "dense": ("dense", _dense_gelu_forward),
    "falcon": ("dense_h_to_4h", _falcon_mlp_forward),
}


def _layer_norm_forward(self, input: torch.Tensor) -> torch.Tensor:
    params_match = all(p is None or p.dtype == input.dtype for p in (self.weight, self.bias))
    if len(self.normalized_shape) != 1 or not params_match:
        return torch.nn.LayerNorm.forward(self, input)
    return layer_norm(input, self.weight, self.bias, self.eps)


def _float32_layer_norm_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    # Cohere's LayerNorm: no bias, statistics and the weight product in
    # float32, the result in x's dtype (fuseops.layer_norm computes
    # bfloat16/float16 in float32 and rounds once; other dtype mixes run
    # on float32 copies, as HF's code does).
    weight, eps = self.weight, _eps(self)
    if weight.dtype == hidden_states.dtype:
        return layer_norm(hidden_states, weight, None, eps)
    return layer_norm(hidden_states.float(), weight.float(), None, eps).to(hidden_states.dtype)


def _hf_apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim: int = 1):
    # HF's signature (transformers 5): q, k [batch, heads, seq, head_dim] for
    # unsqueeze_dim=1; cos, sin [batch, seq, rotary_dim] (rotary_dim <=
    # head_dim: partial rotary, the rest passed through).
    return _fuseops_apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)


def _interleaved_rope(q, k, cos, sin, unsqueeze_dim: int):
    # GPT-J pairs (2j, 2j + 1); fuseops.rope takes [batch, seq, heads, head_dim].
    if unsqueeze_dim == 2:
        return _fuseops_rope(q, k, cos, sin, interleaved=True)
    if unsqueeze_dim != 1:
        raise ValueError(f"apply_rotary_pos_emb: unsqueeze_dim must be 1 or 2, got {unsqueeze_dim}")
    q_out, k_out = _fuseops_rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin, interleaved=True)
    return q_out.transpose(1, 2), k_out.transpose(1, 2)


def _hf_apply_rotary_pos_emb_interleaved(q, k, cos, sin, unsqueeze_dim: int = 1):
    # Cohere's: cos, sin rows [batch, seq, rotary_dim] with each frequency
    # twice in a row (repeat_interleave), q and k rotated in float32 and
    # rounded to their dtype.
    return _interleaved_rope(q, k, cos, sin, unsqueeze_dim)


def _hf_apply_rotary_pos_emb_interleaved_half(q, k, cos, sin, unsqueeze_dim: int = 1):
    # GLM's: cos, sin rows in the rotate_half layout (the frequencies, then
    # the same again); the function takes the first half, each frequency
    # twice in a row, and rotates GPT-J pairs of q's and k's first
    # rotary_dim dimensions (partial rotary: the rest passed through).
    half = cos.shape[-1] // 2
    cos = cos[..., :half].repeat_interleave(2, dim=-1)
    sin = sin[..., :half].repeat_interleave(2, dim=-1)
    return _interleaved_rope(q, k, cos, sin, unsqueeze_dim)


# _Family.rotary -> the apply_rotary_pos_emb the family's attention runs.
_ROTARY: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {
    "half": _hf_apply_rotary_pos_emb,
    "interleaved": _hf_apply_rotary_pos_emb_interleaved,
    "interleaved_half": _hf_apply_rotary_pos_emb_interleaved_half,
}


@functools.lru_cache(maxsize=None)
def _rope_forward_of(function: types.FunctionType, rotary: str = "half") -> types.FunctionType:
    """The attention class's own forward, compiled code and all, reading
    ``apply_rotary_pos_emb`` from a copy of its module's globals where that
    name is fuseops' (the form of _ROTARY[rotary]; one function per class,
    shared by its instances)."""
    scope = dict(function.__globals__)
    scope["apply_rotary_pos_emb"] = _ROTARY[rotary]
    patched = types.FunctionType(
        function.__code__, scope, function.__name__, function.__defaults__, function.__closure__
    )
    patched.__kwdefaults__ = function.__kwdefaults__
    patched.__qualname__ = function.__qualname__
    patched.__doc__ = function.__doc__
    return patched


# The attention forwards whose steps _cached_attention_forward reproduces:
# q/k/v projections viewed as [batch, tokens, heads, head_dim] (Qwen 3's
# per-head q_norm and k_norm there), transposed, apply_rotary_pos_emb, the
# cache's update, the attention interface, o_proj. A class is taken when its
# forward compiles to exactly the code of one of these (module, class) pairs
# in the installed transformers (Gemma, Granite, GLM, Qwen2-MoE and others
# share Llama's); any other keeps its own forward with fuseops' rotary.
# Mistral's and Qwen 2's pass sliding_window to the attention interface,
# which the mask already encodes for a full cache layer.
_CACHED_ATTENTION_TEMPLATES = (
    ("llama", "LlamaAttention", False),
    ("mistral", "MistralAttention", False),
    ("qwen2", "Qwen2Attention", False),
    ("qwen3", "Qwen3Attention", True),  # q_norm, k_norm per head
)


def _code_key(function) -> Optional[tuple]:
    code = getattr(function, "__code__", None)
    if code is None:
        return None
    return (code.co_code, code.co_names, code.co_consts, code.co_varnames, code.co_argcount)


@functools.lru_cache(maxsize=None)
def _template_keys() -> dict:
    """Code key -> whether that template has per-head q/k norms."""
    import importlib

    keys = {}
    for module_name, class_name, qk_norm in _CACHED_ATTENTION_TEMPLATES:
        try:
            module = importlib.import_module(
                f"transformers.models.{module_name}.modeling_{module_name}"
            )
        except ImportError:
            continue
        key = _code_key(getattr(getattr(module, class_name, None), "forward", None))
        if key is not None:
            keys[key] = qk_norm
    return keys


def _fused_step_layer(
    module, hidden_states, position_embeddings, attention_mask, past_key_values, kwargs
):
    """The static cache layer a fused decode step writes, or None where the
    step keeps the class's own forward: no cache, a dynamic layer, a
    sliding-window layer that would roll (its buffer full or filling up on
    this step), more new tokens than DECODE_ATTENTION_MAX_QUERY, another
    attention implementation, a gradient to record, dropout, or inputs the
    fused op does not take."""
    from transformers.cache_utils import StaticLayer, StaticSlidingWindowLayer

    layers = getattr(past_key_values, "layers", None)
    layer_idx = getattr(module, "layer_idx", None)
    if layers is None or layer_idx is None or layer_idx >= len(layers):
        return None
    layer = layers[layer_idx]
    if not getattr(layer, "is_initialized", False):
        return None
    if type(layer) not in (StaticLayer, StaticSlidingWindowLayer):
        return None
    if (
        position_embeddings is None
        or hidden_states.dim() != 3
        or hidden_states.shape[1] > DECODE_ATTENTION_MAX_QUERY
        or module.config._attn_implementation != ATTENTION
        or (module.training and module.attention_dropout > 0)
        or (attention_mask is not None and attention_mask.dim() != 4)
        or kwargs.get("position_bias") is not None
        or kwargs.get("s_aux") is not None
    ):
        return None
    if (
        type(layer) is StaticSlidingWindowLayer
        and layer.cumulative_length_int + hidden_states.shape[1] > layer.max_cache_len
    ):
        # Until its buffer fills, a sliding-window layer is a static one (its
        # update writes at cumulative_length; the mask holds the window); the
        # fused step advances its Python count of tokens too.
        return None
    if torch.is_grad_enabled() and (
        hidden_states.requires_grad or any(p.requires_grad for p in module.parameters())
    ):
        return None
    return layer


@functools.lru_cache(maxsize=None)
def _cached_attention_forward_of(
    function: types.FunctionType, rotary: str, qk_norm: bool
) -> Callable:
    """The forward of an attention class of a template
    (_CACHED_ATTENTION_TEMPLATES): a decode step against a static cache
    layer (_fused_step_layer) runs fuseops.rope_cache_attention (rotary,
    cache write and attention in one call); every other call the class's
    own forward with fuseops' rotary (_rope_forward_of)."""
    rope_forward = _rope_forward_of(function, rotary)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
        attention_mask: Optional[torch.Tensor] = None,
        past_key_values=None,
        **kwargs,
    ):
        layer = _fused_step_layer(
            self, hidden_states, position_embeddings, attention_mask, past_key_values, kwargs
        )
        if layer is None:
            return rope_forward(
                self, hidden_states, position_embeddings, attention_mask, past_key_values, **kwargs
            )
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        query = self.q_proj(hidden_states).view(hidden_shape)
        key = self.k_proj(hidden_states).view(hidden_shape)
        if qk_norm:
            query, key = self.q_norm(query), self.k_norm(key)
        value = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        cos, sin = position_embeddings  # type: ignore[misc]  # (checked by _fused_step_layer)
        if rotary == "interleaved_half":
            # GLM's cos/sin rows, as _hf_apply_rotary_pos_emb_interleaved_half reads them.
            half = cos.shape[-1] // 2
            cos = cos[..., :half].repeat_interleave(2, dim=-1)
            sin = sin[..., :half].repeat_interleave(2, dim=-1)
        out = rope_cache_attention(
            query.transpose(1, 2),
            key.transpose(1, 2),
            value,
            cos,
            sin,
            layer.keys,
            layer.values,
            layer.cumulative_length,
            attention_mask,
            scale=self.scaling,
            interleaved=rotary != "half",
        )
        if hasattr(layer, "cumulative_length_int"):
            # StaticSlidingWindowLayer's own count of the tokens written.
            layer.cumulative_length_int += input_shape[-1]
        out = out.transpose(1, 2).reshape(*input_shape, -1)
        return self.o_proj(out), None

    forward.__qualname__ = function.__qualname__
    forward.__doc__ = function.__doc__
    return forward


# ---------------------------------------------------------------------------
# The causal-LM head


def _repeat_kv(t: torch.Tensor, group: int) -> torch.Tensor:
    return t if group == 1 else t.repeat_interleave(group, dim=1)


def _softcapped_attention(module, query, key, value, attention_mask, dropout, scaling, softcap):
    # HF's eager attention with a softcap (Gemma 2), for what SDPA cannot
    # take: differentiable ATen ops, softmax in float32.
    group = query.shape[1] // key.shape[1]
    key, value = _repeat_kv(key, group), _repeat_kv(value, group)
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    scores = softcap * torch.tanh(scores / softcap)
    q_len, kv_len = query.shape[2], key.shape[2]
    if attention_mask is None and getattr(module, "is_causal", False) and q_len > 1:
        # The mask SDPA's is_causal stands for (masks are skipped then).
        attention_mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=query.device).tril(
            kv_len - q_len
        )[None, None]
    if attention_mask is not None:
        mask = attention_mask[:, :, :, : key.shape[-2]]
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        else:
            scores = scores + mask
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = F.dropout(weights, p=dropout, training=module.training)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), None


def _attention_forward(
    module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    dropout: float = 0.0,
    scaling: Optional[float] = None,
    is_causal: Optional[bool] = None,
    softcap: Optional[float] = None,
    **kwargs,
):
    """The ``"fuseops"`` attention implementation (transformers'
    AttentionInterface signature): query ``[B, Hq, L, D]``, key and value
    ``[B, Hkv, S, D]`` (the cache after its update); returns ``[B, L, Hq,
    Dv]`` and no weights."""
    q_len = query.shape[2]
    records_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    # Only a decoder's causal self-attention (vision towers and encoders,
    # with their own sequence packing, keep SDPA).
    decode = (
        getattr(module, "is_causal", False)
        and q_len <= DECODE_ATTENTION_MAX_QUERY
        and not records_grad
        and (dropout == 0.0 or not module.training)
        and kwargs.get("position_bias") is None
        and kwargs.get("s_aux") is None
        and kwargs.get("cache") is None
        and (attention_mask is None or attention_mask.dim() == 4)
    )
    if not decode:
        if softcap:
            scale = scaling if scaling is not None else query.shape[-1] ** -0.5
            return _softcapped_attention(
                module, query, key, value, attention_mask, dropout, scale, softcap
            )
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            **kwargs,
        )
    # HF's SDPA rule: causal only for several new tokens without a mask,
    # aligned at the cache's start (an empty static cache holds the prompt
    # in its first slots).
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(causal) and q_len > 1 and attention_mask is None
    if causal and key.shape[2] > q_len:
        key, value = key[:, :, :q_len], value[:, :, :q_len]
    if attention_mask is not None:
        attention_mask = attention_mask[:, :, :, : key.shape[2]]
    out = decode_attention(
        query,
        key,
        value,
        attention_mask,
        is_causal=causal,
        scale=scaling,
        softcap=float(softcap or 0.0),
    )
    return out.transpose(1, 2).contiguous(), None


def _register_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION, _attention_forward)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)


def _shifted_targets(
    labels: Optional[torch.Tensor], shift_labels: Optional[torch.Tensor], ignore_index: int, device
) -> torch.Tensor:
    # HF's ForCausalLMLoss: token t predicts label t + 1; the last position
    # has no label.
    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    return shift_labels.reshape(-1).to(device)


def _reduce(loss_sum_or_mean: torch.Tensor, num_items_in_batch) -> torch.Tensor:
    if num_items_in_batch is None:
        return loss_sum_or_mean
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(loss_sum_or_mean.device)
    return loss_sum_or_mean / num_items_in_batch


def _causal_lm_forward(
    original: Callable, logits_mode: str, moe: bool = False, logit_scale: bool = False
):
    """The ``forward`` of a patched ``*ForCausalLM``/``*LMHeadModel``: the
    base model as HF calls it, then the head and loss by fuseops. With
    `logits_mode` ``"always"`` the logits are also computed in training with
    labels, by one more product with the head's weight. With `logit_scale`
    the logits are multiplied by the model's ``logit_scale`` (Cohere)."""

    from transformers.modeling_outputs import (
        CausalLMOutputWithCrossAttentions,
        CausalLMOutputWithPast,
        MoeCausalLMOutputWithPast,
    )

    # The family's own, from the module that defines its causal LM.
    load_balancing_loss = sys.modules[original.__module__].load_balancing_loss_func if moe else None

    signature = inspect.signature(original)
    # Names that positional arguments bind to, in the original's order (it
    # differs between families); plain dict work, which torch.compile traces.
    positional = [
        p.name
        for p in list(signature.parameters.values())[1:]
        if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    ]

    def forward(self, *args, **kwargs):
        if len(args) > len(positional):
            raise TypeError(
                f"{type(self).__name__}.forward takes at most {len(positional)} "
                f"positional arguments, got {len(args)}"
            )
        arguments = dict(zip(positional, args))
        arguments.update(kwargs)
        return_dict = arguments.pop("return_dict", None)
        if return_dict is None:
            return_dict = getattr(self.config, "return_dict", True)
        labels = arguments.pop("labels", None)
        logits_to_keep = arguments.pop("logits_to_keep", 0)
        num_items_in_batch = arguments.pop("num_items_in_batch", None)
        ignore_index = arguments.pop("ignore_index", -100)
        shift_labels = arguments.pop("shift_labels", None)
        has_labels = labels is not None or shift_labels is not None
        if has_labels and self.training and torch.is_grad_enabled():
            _refuse_training_if_quantized(self)
        if moe:
            router_logits = arguments.get("output_router_logits")
            if router_logits is None:
                router_logits = self.config.output_router_logits
            arguments["output_router_logits"] = router_logits
        outputs = getattr(self, self.base_model_prefix)(**arguments)
        hidden_states = outputs[0]
        head = self.lm_head
        softcap = getattr(self.config, "final_logit_softcapping", None)
        # Granite's heads divide the logits by it.
        logits_scaling = getattr(self.config, "logits_scaling", None) or 1.0
        # Cohere's heads multiply them by it.
        multiplier = self.logit_scale if logit_scale else 1.0
        reduction = "mean" if num_items_in_batch is None else "sum"

        def compute_logits():
            if isinstance(logits_to_keep, int):
                kept = (
                    hidden_states[:, slice(-logits_to_keep, None), :]
                    if logits_to_keep
                    else hidden_states
                )
            else:
                kept = hidden_states[:, logits_to_keep, :]
            logits = head(kept)
            if logits_scaling != 1.0:
                logits = logits / logits_scaling
            if multiplier != 1.0:
                logits = logits * multiplier
            return logits if softcap is None else torch.tanh(logits / softcap) * softcap

        logits = loss = None
        # A quantized head has no float weight to fuse with: its logits
        # (under no_grad, in training mode) take the path below.
        if has_labels and self.training and isinstance(head, torch.nn.Linear):
            # The loss without the [tokens, vocab] logits.
            target = _shifted_targets(labels, shift_labels, ignore_index, hidden_states.device)
            hidden, bias = hidden_states.reshape(-1, hidden_states.shape[-1]), head.bias
            if logits_scaling != 1.0:
                # (h W^T + b) / s, as (h / s) W^T + b / s.
                hidden = hidden / logits_scaling
                bias = None if bias is None else bias / logits_scaling
            if multiplier != 1.0:
                # (h W^T + b) * m, as (h * m) W^T + b * m.
                hidden = hidden * multiplier
                bias = None if bias is None else bias * multiplier
            loss = _reduce(
                linear_cross_entropy(
                    hidden,
                    head.weight,
                    target,
                    bias,
                    reduction=reduction,
                    ignore_index=ignore_index,
                    softcap=softcap,
                ),
                num_items_in_batch,
            )
            if logits_mode == "always":
                logits = compute_logits()
        else:
            logits = compute_logits()
            if has_labels:
                target = _shifted_targets(labels, shift_labels, ignore_index, logits.device)
                loss = _reduce(
                    _cross_entropy(
                        logits.reshape(-1, logits.shape[-1]),
                        target,
                        reduction=reduction,
                        ignore_index=ignore_index,
                    ),
                    num_items_in_batch,
                )

        fields = dict(
            loss=loss,
            logits=logits,
            past_key_values=getattr(outputs, "past_key_values", None),
            hidden_states=getattr(outputs, "hidden_states", None),
            attentions=getattr(outputs, "attentions", None),
        )
        if moe:
            # Looked up above whenever moe is set.
            assert load_balancing_loss is not None
            aux_loss = None
            if router_logits:
                aux_loss = load_balancing_loss(
                    outputs.router_logits,
                    self.num_experts,
                    self.num_experts_per_tok,
                    arguments.get("attention_mask"),
                )
                if loss is not None:
                    fields["loss"] = loss + self.router_aux_loss_coef * aux_loss.to(loss.device)
            result = MoeCausalLMOutputWithPast(
                aux_loss=aux_loss, router_logits=outputs.router_logits, **fields
            )
        elif hasattr(outputs, "cross_attentions"):
            result = CausalLMOutputWithCrossAttentions(
                cross_attentions=outputs.cross_attentions, **fields
            )
        else:
            result = CausalLMOutputWithPast(**fields)
        return result if return_dict else result.to_tuple()

    # The original's signature, for the callers that read it (generate's
    # argument checks, Trainer's column selection and loss-kwargs detection).
    forward.__signature__ = signature  # type: ignore[attr-defined]
    forward.__doc__ = original.__doc__
    return forward


def _refuse_training_if_quantized(model: torch.nn.Module) -> None:
    mode = model.__dict__.get(_QUANTIZE_ATTRIBUTE)
    if mode is not None:
        raise RuntimeError(
            f"{type(model).__name__}: its linear layers were quantized by "
            f"fuseops.transformers.apply(quantize={mode!r}) and are inference-only (no "
            "gradients): a training step cannot run through them. Run the quantized model "
            "under torch.no_grad() or torch.inference_mode() (generate does), and train the "
            "model before quantizing it"
        )


# ---------------------------------------------------------------------------
# Fused projections: several linear layers of the same input as one


class ProjectionSlice(torch.nn.Module):
    """Stands in for one of the linear layers that :func:`apply` merged into
    one layer of their parent (``q_proj``, ``k_proj``, ``v_proj`` ->
    ``qkv_proj``; ``gate_proj``, ``up_proj`` -> ``gate_up_proj``), so that
    HF's forward, which calls each of them on the same hidden states, runs
    one product for all of them. The first slice called with an input
    computes the merged layer's output and keeps it until every other slice
    has taken its part of it for that same tensor (the same object, not
    modified in place since: its version counter, which inference tensors
    and tensors traced by torch.compile do not have, is compared); a call
    with any other input computes afresh.
    ``y[..., offset:offset + out_features]`` of the merged output is what
    the original layer computed: the merged weight is the originals' rows
    one after the other, and a quantized merged layer quantizes each output
    channel on its own, as the separate layers did, so the results are the
    same bits. The slice holds no weight; ``parent.<merged>`` does."""

    def __init__(
        self,
        parent: torch.nn.Module,
        merged: str,
        index: int,
        splits: tuple[int, ...],
        in_features: int,
    ) -> None:
        super().__init__()
        # Not a submodule: the merged layer is the parent's, once.
        object.__setattr__(self, "_parent", parent)
        self.merged = merged
        self.index = index
        self.splits = splits
        self.in_features = in_features
        self.out_features = splits[index]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parent = self._parent
        key = "_fuseops_outputs_" + self.merged
        # torch.compile traces the same logic (the stored outputs are gone by
        # the end of the attention, so the graph carries no state); a traced
        # tensor has no version counter to read.
        version = -1 if torch.compiler.is_compiling() or x.is_inference() else x._version
        kept = parent.__dict__.get(key)
        if kept is not None and kept[0] is x and kept[1] == version and self.index in kept[3]:
            kept[3].discard(self.index)
            if not kept[3]:
                del parent.__dict__[key]
            return kept[2][self.index]
        outputs = getattr(parent, self.merged)(x).split(self.splits, dim=-1)
        waiting = set(range(len(self.splits))) - {self.index}
        parent.__dict__[key] = (x, version, outputs, waiting)
        return outputs[self.index]

    def extra_repr(self) -> str:
        offset = sum(self.splits[: self.index])
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"{self.merged}[..., {offset}:{offset + self.out_features}]"
        )


# Layers merged by apply(fuse_projections=...): (their names, the merged
# layer's name), in each module that has all of them as nn.Linear of the same
# input size (the gated families' attention and MLP), the first set that
# applies; q/k without v where the quantization recipe gives v_proj more
# bits than the rest (one merged layer has one format).
_MERGED_PROJECTIONS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("q_proj", "k_proj", "v_proj"), "qkv_proj"),
    (("q_proj", "k_proj"), "qk_proj"),
    (("gate_proj", "up_proj"), "gate_up_proj"),
)


def _merge_projections(
    model: torch.nn.Module, kept_apart: tuple[str, ...] = ()
) -> list[tuple[str, tuple[str, ...], str]]:
    """Merges, in every module of `model`, each set of _MERGED_PROJECTIONS
    that names none of `kept_apart` into one ``nn.Linear`` (weights and
    biases concatenated, a missing bias as zeros) and puts a
    :class:`ProjectionSlice` in place of each original. Returns (module
    name, originals, merged name) for each merge."""
    merges: list[tuple[str, tuple[str, ...], str]] = []
    for name, module in list(model.named_modules()):
        for originals, merged in _MERGED_PROJECTIONS:
            if any(original in kept_apart for original in originals):
                continue
            linears = [module._modules.get(original) for original in originals]
            if merged in module._modules or not all(
                type(linear) is torch.nn.Linear for linear in linears
            ):
                continue
            if len({(linear.in_features, linear.weight.dtype) for linear in linears}) != 1:
                continue
            fused = _concatenated(linears)
            splits = tuple(linear.out_features for linear in linears)
            for index, original in enumerate(originals):
                slice_ = ProjectionSlice(module, merged, index, splits, fused.in_features)
                setattr(module, original, slice_)
            module.add_module(merged, fused)
            if getattr(module.forward, "__func__", None) is _gated_mlp_forward:
                # fuseops' MLP forward: the merged output read in place.
                module.forward = types.MethodType(_fused_gate_up_mlp_forward, module)
            merges.append((name, originals, merged))
    return merges


def _concatenated(linears: list) -> torch.nn.Linear:
    """One ``nn.Linear`` whose output is the outputs of `linears` (same
    input size and dtype) one after the other."""
    first = linears[0]
    weight = first.weight
    fused = torch.nn.Linear(
        first.in_features,
        sum(linear.out_features for linear in linears),
        bias=any(linear.bias is not None for linear in linears),
        device=weight.device,
        dtype=weight.dtype,
    )
    with torch.no_grad():
        torch.cat([linear.weight for linear in linears], out=fused.weight)
        if fused.bias is not None:
            biases = [
                linear.bias if linear.bias is not None else weight.new_zeros(linear.out_features)
                for linear in linears
            ]
            torch.cat(biases, out=fused.bias)
    return fused.train(first.training)


# ---------------------------------------------------------------------------
# apply


def _family_of(model: torch.nn.Module) -> _Family:
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in FAMILIES:
        what = (
            f"model type {model_type!r}"
            if model_type is not None
            else "a model without config.model_type"
        )
        raise ValueError(
            f"fuseops.transformers.apply: {what} ({type(model).__name__}) is not supported; "
            f"supported model types: {', '.join(supported_model_types())}"
        )
    return FAMILIES[model_type]


def _patch(module: torch.nn.Module, forward: Callable, kind: str) -> None:
    module.forward = types.MethodType(forward, module)
    setattr(module, MARKER, kind)


def _reproduced_head(model: torch.nn.Module, family: _Family) -> bool:
    """Whether `model` runs the forward of one of `family`'s causal-LM
    classes (that class, or a subclass that does not override forward) on an
    ``nn.Linear`` lm_head over its base model."""
    forward = type(model).forward
    prefix = getattr(model, "base_model_prefix", "")
    return (
        any(
            cls.__name__ in family.causal_lm and vars(cls).get("forward") is forward
            for cls in type(model).__mro__
        )
        and isinstance(getattr(model, "lm_head", None), torch.nn.Linear)
        and bool(prefix)
        and hasattr(model, prefix)
    )


def apply(
    model: torch.nn.Module,
    rms_norm: bool = True,
    rope: bool = True,
    mlp: bool = True,
    cross_entropy: bool = True,
    layer_norm: bool = True,
    logits: str = "auto",
    quantize: Optional[str] = None,
    group_size: int = 32,
    recipe: str = "mixed",
    fuse_projections: Optional[bool] = None,
    attention: bool = True,
    linear: bool = True,
    experts: bool = True,
) -> list[Replacement]:
    """Patches `model` (a ``transformers`` ``PreTrainedModel`` of a supported
    family, see :func:`supported_model_types`) in place to run on fuseops
    ops and returns what was patched, one :class:`fuseops.nn.Replacement` per
    module (``name``: qualified module name, ``old``: its class, ``new``: the
    fuseops op now computing it, or for a quantized layer the fuseops layer
    that replaced it). Each flag turns one kind of patch on or off.
    A module already patched is left alone, so a second call returns ``[]``.
    An unsupported model type raises ``ValueError`` naming the supported ones.

    The head (``cross_entropy``, the entry named ``"<model>"``) is patched
    only on the classes whose forward the patch reproduces, each family's
    causal LM (``FAMILIES[model_type].causal_lm``: ``LlamaForCausalLM``,
    ``GPT2LMHeadModel``, ...) and subclasses of it that keep its forward.
    Every other class (``GPT2DoubleHeadsModel``, ``*ForSequenceClassification``,
    ``*ForTokenClassification``, ``*ForQuestionAnswering``, the base models,
    a subclass with its own forward) gets the other patches and keeps HF's
    forward, head and loss; the returned list then has no ``"<model>"`` entry.

    `logits` says what the patched head returns as ``logits`` in training
    with labels: ``"auto"`` (the default) None, since the fused loss never
    forms the ``[tokens, vocab]`` logits; ``"always"`` the logits as HF
    computes them (``logits_to_keep`` and softcapping included,
    differentiable), for code that reads them in training (accuracy logging,
    a second loss). ``fuseops.linear_cross_entropy`` does not return the
    logits, so ``"always"`` costs one more ``[tokens, hidden] x [hidden,
    vocab]`` product and holds the logits for as long as the output is; the
    loss and its gradients stay fused. Outside training with labels, both
    return HF's logits. The mode is fixed when the head is patched: calling
    ``apply`` again with another `logits` raises ``ValueError``.

    `quantize` (default None: the weights stay as they are) makes the
    patched model an inference model with quantized weights: after the
    patches, ``fuseops.quantize_(model, quantize)`` replaces every
    ``torch.nn.Linear`` (exact type; attention and MLP projections and the
    LM head; not the mixture-of-experts routers that are ``nn.Linear``
    layers named ``gate``, ``wg``, ``router`` or ``shared_expert_gate``,
    which stay in the model's dtype) by a quantized layer, each listed in
    the returned list as
    ``Replacement(name, "Linear", "fuseops.quantization.Int8Linear('w8a16')")``.
    ``"w8a16"``: int8 weights, one scale per output channel, activations
    in the model's dtype; ``"w8a8"``: the same weights, activations
    quantized on the fly, a scale per block of 32; ``"w4a16"``, where
    ``fuseops.quantization.QUANTIZE_MODES`` has it, int4 weights with a
    scale and a minimum per `group_size` input features (`group_size` is
    used by the int4 modes only; ``fuseops.nn.Int4Linear``'s default
    ``"scale_min"`` scheme), in ``quantize_``'s `recipe` (default
    ``"mixed"``: the LM head and the attention value projections at 8 bits;
    ``"pure"``: only the head; ``"uniform"``: none), each layer's
    ``Replacement`` naming the mode it got; ``"w4a8"``: the same int4
    weights, activations quantized per weight group on the fly (the fastest
    decode on CPUs with AVX512_VNNI). :func:`quantize_modes` lists the modes this installation
    has; another value raises ``ValueError`` naming them. The patched model
    then runs under ``torch.no_grad()`` or ``torch.inference_mode()``
    (``generate`` does): quantized layers have no gradients, and a training
    step with labels raises ``RuntimeError``. The embedding stays in the
    model's dtype (a tied LM head gets its own quantized copy), and so do
    GPT-2's ``Conv1D`` projections, which are not ``nn.Linear``.
    transformers' mixture-of-experts experts, whose weights are one 3-D
    tensor for all experts (``gate_up_proj``, ``down_proj``), are quantized
    expert by expert in the int8 and int4 modes (listed as
    ``Replacement("....experts.gate_up_proj", "Parameter", "8 x
    fuseops.quantization.Int8Linear('w8a16')")``) and run by HF's experts
    loop with the quantized products (under ``torch.compile``, where a graph
    cannot loop over the experts a step routes to, every expert runs on
    every token and only the routed results are added: the same bits, more
    weight bytes per step). Layers
    already quantized are left alone, so a second call with the same
    `quantize` returns ``[]``; with another mode it raises ``ValueError``.

    `fuse_projections` (default: on with `quantize`) merges, before
    quantizing, the projections of the same input into one layer per
    module: ``q_proj``/``k_proj``/``v_proj`` into ``qkv_proj`` (under the
    int4 modes, whose recipe gives ``v_proj`` 8 bits, ``q_proj``/``k_proj``
    into ``qk_proj``) and ``gate_proj``/``up_proj`` into ``gate_up_proj``,
    so a decode step reads each layer's weights in four (five) products
    instead of seven. The results are
    the same bits as the separate quantized layers' (each output channel is
    quantized and summed on its own). The originals' places hold
    :class:`ProjectionSlice` modules that return their part of the merged
    output (HF's attention forward runs unchanged); the state_dict holds the
    merged layer's buffers (``...self_attn.qkv_proj.packed``), so save and
    load such a model after ``apply`` with the same arguments. Float models
    keep HF's separate layers: ``fuse_projections=True`` without `quantize`
    raises ``ValueError`` (merged float weights would change the parameter
    names that state_dicts, optimizers and PEFT adapters use).

    `experts` (mixture-of-experts families) runs transformers' experts
    modules (every expert's weights in one 3-D ``gate_up_proj`` and
    ``down_proj``, transformers' default gate) through
    :func:`fuseops.moe_experts`, forward and backward, in place of the
    experts implementation the config names (``"grouped_mm"`` by default,
    or the eager loop); listed as ``Replacement("....mlp.experts",
    "MixtralExperts", "fuseops.moe_experts('silu')")``. The routers stay
    HF's. With `quantize`, the quantized experts' loop replaces it.

    `linear` (decoder families, float models: without `quantize`) runs
    every ``torch.nn.Linear`` (exact type: the projections and the LM head)
    through :func:`fuseops.linear`, whose CPU kernel reads the weight once
    for the few rows of a decode step; larger products and the gradients
    are ATen's, as before. The layers and their parameters stay as they are.
    """
    if not isinstance(logits, str) or logits not in LOGITS:
        raise ValueError(
            f"fuseops.transformers.apply: logits must be one of "
            f"{', '.join(map(repr, LOGITS))}, got {logits!r}"
        )
    if quantize is not None and quantize not in quantize_modes():
        raise ValueError(
            f"fuseops.transformers.apply: unknown quantize mode {quantize!r}; supported: None, "
            + ", ".join(map(repr, quantize_modes()))
        )
    if recipe not in quantization.RECIPES:
        raise ValueError(
            f"fuseops.transformers.apply: unknown recipe {recipe!r}; supported: "
            + ", ".join(map(repr, quantization.RECIPES))
        )
    quantized_with = model.__dict__.get(_QUANTIZE_ATTRIBUTE)
    if quantize is not None and quantized_with is not None and quantized_with != quantize:
        raise ValueError(
            f"fuseops.transformers.apply: quantize={quantize!r}, but this "
            f"{type(model).__name__} was quantized with quantize={quantized_with!r}; its "
            f"float weights are gone (quantize an unquantized model to change the mode)"
        )
    if fuse_projections is None:
        fuse_projections = quantize is not None
    elif fuse_projections and quantize is None:
        raise ValueError(
            "fuseops.transformers.apply: fuse_projections=True needs quantize=...: float models "
            "keep HF's separate q/k/v and gate/up layers (their parameter names are what "
            "state_dicts, optimizers and PEFT adapters use)"
        )
    family = _family_of(model)
    patched_with = model.__dict__.get(_LOGITS_ATTRIBUTE)
    if cross_entropy and patched_with is not None and patched_with != logits:
        raise ValueError(
            f"fuseops.transformers.apply: logits={logits!r}, but the head of this "
            f"{type(model).__name__} was patched with logits={patched_with!r}; the mode is "
            f"fixed when the head is patched (patch an unpatched model to change it)"
        )
    wanted = {
        "rms_norm": rms_norm,
        "rope": rope,
        "mlp": mlp,
        "layer_norm": layer_norm,
        "cross_entropy": cross_entropy,
        # Quantized models replace their linear layers.
        "linear": linear and family.decoder and quantize is None,
        "experts": experts,
    }
    replaced: list[Replacement] = []

    def record(name: str, module: torch.nn.Module, forward: Callable, kind: str, new: str) -> None:
        _patch(module, forward, kind)
        replaced.append(Replacement(name or "<model>", type(module).__name__, new))

    mlp_class = family.mlp_class or f"{family.prefix}MLP"
    for name, module in model.named_modules():
        if MARKER in module.__dict__:
            continue
        cls_name = type(module).__name__
        if (
            wanted["layer_norm"]
            and cls_name == family.layer_norm_class
            and module.weight.dim() == 1
        ):
            record(
                name,
                module,
                _float32_layer_norm_forward,
                "layer_norm",
                "fuseops.layer_norm (float32, no bias)",
            )
        elif wanted["rms_norm"] and cls_name == f"{family.prefix}RMSNorm":
            if family.rms_offset:
                record(
                    name,
                    module,
                    _rms_norm_offset_forward,
                    "rms_norm",
                    "fuseops.rms_norm(1 + weight)",
                )
            else:
                record(name, module, _rms_norm_forward, "rms_norm", "fuseops.rms_norm")
        elif (
            wanted["rope"] and cls_name.startswith(family.prefix) and cls_name.endswith("Attention")
        ):
            # Only an attention whose own forward calls apply_rotary_pos_emb
            # (not one wrapped by a decorator, nor one without rotary).
            function = type(module).forward
            code = getattr(function, "__code__", None)
            if code is not None and "apply_rotary_pos_emb" in code.co_names:
                new = "fuseops.rope" + ("" if family.rotary == "half" else " (interleaved)")
                qk_norm = _template_keys().get(_code_key(function))
                if qk_norm is None:
                    record(name, module, _rope_forward_of(function, family.rotary), "rope", new)
                else:
                    new += (
                        f"; fuseops.rope_cache_attention (static cache, <= "
                        f"{DECODE_ATTENTION_MAX_QUERY} new tokens, no gradient)"
                    )
                    record(
                        name,
                        module,
                        _cached_attention_forward_of(function, family.rotary, qk_norm),
                        "rope",
                        new,
                    )
        elif (
            wanted["experts"]
            and _stacked_experts(module)
            and (activation := _moe_activation(module)) is not None
        ):
            module._fuseops_moe_activation = activation
            record(
                name,
                module,
                _fused_experts_forward,
                "experts",
                f"fuseops.moe_experts({activation!r})",
            )
        elif wanted["mlp"] and cls_name == mlp_class:
            act = next(
                (getattr(module, a) for a in _ACTIVATION_ATTRIBUTES if hasattr(module, a)), None
            )
            kind = _activation_kind(act) if act is not None else None
            forward: Callable[..., object]
            if family.mlp in ("gated", "packed"):
                projections = (
                    ("gate_proj", "up_proj") if family.mlp == "gated" else ("gate_up_proj",)
                )
                if kind is None or not all(hasattr(module, p) for p in projections):
                    continue  # an activation without a fused gated form, or no gate: HF's
                new = "fuseops.swiglu" if kind == "silu" else f"fuseops.geglu({kind!r})"
                if family.mlp == "gated":
                    forward = _gated_mlp_forward
                else:
                    forward, new = _packed_mlp_forward, new + " (packed gate_up_proj)"
            else:
                layer, forward = _BIAS_GELU_MLPS[family.mlp]
                if kind not in ("none", "tanh") or getattr(module, layer).bias is None:
                    continue  # bias_gelu needs a GELU and a bias
                new = f"fuseops.bias_gelu({kind!r})"
            module._fuseops_act = kind
            record(name, module, forward, "mlp", new)
        elif wanted["layer_norm"] and type(module) is torch.nn.LayerNorm:
            record(name, module, _layer_norm_forward, "layer_norm", "fuseops.layer_norm")
        elif wanted["linear"] and type(module) is torch.nn.Linear:
            record(name, module, _linear_forward, "linear", "fuseops.linear")

    if wanted["cross_entropy"] and MARKER not in model.__dict__ and _reproduced_head(model, family):
        setattr(model, _LOGITS_ATTRIBUTE, logits)
        record(
            "",
            model,
            _causal_lm_forward(type(model).forward, logits, family.moe, family.logit_scale),
            "cross_entropy",
            "fuseops.linear_cross_entropy (training with labels), fuseops.cross_entropy",
        )
    if attention:
        config = getattr(model, "config", None)
        current = getattr(config, "_attn_implementation", None)
        can_set = getattr(model, "_can_set_attn_implementation", lambda: False)
        if family.decoder and current in ("sdpa", "eager") and can_set():
            _register_attention()
            model.set_attn_implementation(ATTENTION)
            replaced.append(
                Replacement(
                    "<attention>",
                    current,
                    f"fuseops.decode_attention (<= {DECODE_ATTENTION_MAX_QUERY} new tokens, "
                    "no gradient; SDPA otherwise)",
                )
            )
    if quantize is not None:
        if fuse_projections:
            # The mixed recipe gives the int4 modes' value projections 8
            # bits: they stay a layer of their own.
            mixed = quantize in ("w4a16", "w4a8") and recipe == "mixed"
            kept_apart = ("v_proj",) if mixed else ()
            for name, originals, merged in _merge_projections(model, kept_apart):
                prefix = f"{name}." if name else ""
                for original in originals:
                    replaced.append(
                        Replacement(
                            prefix + original,
                            "Linear",
                            f"fuseops.transformers.ProjectionSlice({prefix + merged})",
                        )
                    )
        replaced += _quantize(model, quantize, group_size, recipe)
    return replaced


#: The names of mixture-of-experts routers that are plain ``nn.Linear``
#: layers (HunYuan's ``wg``, Qwen2-MoE's ``shared_expert_gate``, older
#: families' ``gate``/``router``): apply(quantize=...) keeps them in the
#: model's dtype, as llama.cpp keeps its ``ffn_gate_inp``. They are a few
#: KiB, their rounding would change which experts a token goes to, and
#: families' code reads their ``weight`` (HunYuan checks its dtype).
_ROUTER_NAMES = frozenset({"gate", "wg", "router", "shared_expert_gate"})


def _is_router(name: str, module: torch.nn.Module) -> bool:
    return name.rsplit(".", 1)[-1] in _ROUTER_NAMES


def _stacked_experts(module: torch.nn.Module) -> bool:
    """Whether `module` holds transformers' experts in the layout of its
    ``use_experts_implementation`` classes that fuseops quantizes: every
    expert's gate and up rows in one 3-D ``gate_up_proj`` [experts, 2 x
    intermediate, hidden] (gate rows first), ``down_proj`` [experts, hidden,
    intermediate], no biases, no norm after the experts."""
    gate_up = getattr(module, "gate_up_proj", None)
    down = getattr(module, "down_proj", None)
    return (
        isinstance(gate_up, torch.nn.Parameter)
        and isinstance(down, torch.nn.Parameter)
        and gate_up.dim() == 3
        and down.dim() == 3
        and getattr(module, "has_gate", False) is True
        and getattr(module, "has_bias", True) is False
        and getattr(module, "is_concatenated", False) is True
        and getattr(module, "is_transposed", True) is False
        and getattr(module, "has_post_expert_norm", True) is False
        and callable(getattr(module, "_apply_gate", None))
    )


#: moe_experts' activation for each :func:`_activation_kind`.
_MOE_ACTIVATIONS = {"silu": "silu", "none": "gelu", "tanh": "gelu_tanh"}


def _moe_activation(module: torch.nn.Module) -> Optional[str]:
    """moe_experts' ``activation`` for a :func:`_stacked_experts` module
    whose gate is transformers' default one (``act_fn(gate) * up``), else
    None (a family's own gate, an activation without a fused form)."""
    from transformers.integrations import moe

    if getattr(type(module), "_apply_gate", None) is not moe._default_apply_gate:
        return None
    act = getattr(module, "act_fn", None)
    kind = _activation_kind(act) if act is not None else None
    return _MOE_ACTIVATIONS.get(kind) if kind is not None else None


def _fused_experts_forward(
    self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    # Expert parallelism marks the slots of other ranks' experts with an
    # index past this rank's experts (and a zero weight): HF's own
    # implementation skips them.
    if self._is_expert_parallel:
        return type(self).forward(self, hidden_states, top_k_index, top_k_weights)
    return moe_experts(
        hidden_states,
        top_k_index,
        top_k_weights,
        self.gate_up_proj,
        self.down_proj,
        self._fuseops_moe_activation,
    )


def _registered_experts_forward(
    self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """transformers' experts implementation ``"fuseops"``
    (``experts_implementation="fuseops"``): :func:`fuseops.moe_experts` where
    the experts' layout and gate are transformers' default ones, transformers'
    eager loop otherwise."""
    activation = _moe_activation(self) if _stacked_experts(self) else None
    if activation is None or self._is_expert_parallel:
        return type(self).forward.__wrapped__(self, hidden_states, top_k_index, top_k_weights)
    return moe_experts(
        hidden_states, top_k_index, top_k_weights, self.gate_up_proj, self.down_proj, activation
    )


def register_experts_implementation() -> None:
    """Registers :func:`fuseops.moe_experts` as transformers' experts
    implementation ``"fuseops"``, so that
    ``from_pretrained(..., experts_implementation="fuseops")`` or
    ``model.set_experts_implementation("fuseops")`` choose it without
    :func:`apply` (which patches the experts modules themselves)."""
    from transformers.integrations.moe import ExpertsInterface

    ExpertsInterface.register("fuseops", _registered_experts_forward)


def _quantized_experts_forward(
    self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    # transformers' eager experts loop with each expert's two products
    # quantized: the experts hit in increasing order, each on its tokens,
    # weighted and added into the output in the same order as HF's.
    out = torch.zeros_like(hidden_states)
    if torch.compiler.is_compiling():
        # A graph cannot loop over the set of experts a step routes to (it
        # depends on the data): every expert runs on every token, and only
        # the routed tokens' results are added, in the same order and with
        # the same bits (a row's result does not depend on the other rows).
        for expert in range(len(self.gate_up_proj)):
            routed = top_k_index == expert
            weight = torch.where(routed, top_k_weights, 0).sum(-1, keepdim=True)
            hidden = self._apply_gate(self.gate_up_proj[expert](hidden_states))
            result = (self.down_proj[expert](hidden) * weight).to(out.dtype)
            out = out + torch.where(routed.any(-1, keepdim=True), result, 0)
        return out
    for expert in torch.unique(top_k_index).tolist():
        if expert >= len(self.gate_up_proj):  # a masked slot (expert parallelism)
            continue
        token, slot = torch.where(top_k_index == expert)
        hidden = self._apply_gate(self.gate_up_proj[expert](hidden_states[token]))
        routed = self.down_proj[expert](hidden) * top_k_weights[token, slot, None]
        out.index_add_(0, token, routed.to(out.dtype))
    return out


def _quantize_experts(model: torch.nn.Module, mode: str, group_size: int) -> list[Replacement]:
    """Quantizes, expert by expert, the 3-D weights of every
    :func:`_stacked_experts` module (int8 and int4 modes): ``gate_up_proj``
    and ``down_proj`` become ``nn.ModuleList``s of quantized layers, one per
    expert, and the module's forward runs them."""
    if mode not in ("w8a16", "w8a8", "w4a16", "w4a8"):
        return []
    replaced = []
    for name, module in list(model.named_modules()):
        if not _stacked_experts(module):
            continue
        for weight_name in ("gate_up_proj", "down_proj"):
            weights = getattr(module, weight_name).detach()
            delattr(module, weight_name)
            layers = [quantization._quantized_layer(w, mode, group_size) for w in weights]
            setattr(module, weight_name, torch.nn.ModuleList(layers))
            layer = type(layers[0])
            replaced.append(
                Replacement(
                    f"{name}.{weight_name}",
                    "Parameter",
                    f"{len(layers)} x {layer.__module__}.{layer.__qualname__}({mode!r})",
                )
            )
        module.forward = types.MethodType(_quantized_experts_forward, module)
    return replaced


def _quantize(model: torch.nn.Module, mode: str, group_size: int, recipe: str) -> list[Replacement]:
    # Only the int4 modes group their scales; the int8 modes take one per channel.
    options: dict[str, Any] = {"group_size": group_size} if mode.startswith("w4") else {}
    options["recipe"] = recipe
    replaced = _quantize_experts(model, mode, group_size)
    quantized = quantization.quantize_(model, mode, skip=_is_router, **options)
    setattr(model, _QUANTIZE_ATTRIBUTE, mode)
    for q in quantized:
        layer = type(model.get_submodule(q.name))
        replaced.append(
            Replacement(q.name, "Linear", f"{layer.__module__}.{layer.__qualname__}({q.mode!r})")
        )
    return replaced


def _call_module(self, *args, **kwargs):
    # The template of _own_compiled_frame's per-model functions.
    return type(self).__call__(self, *args, **kwargs)


def _own_compiled_frame(model: torch.nn.Module) -> None:
    """Gives `model` a ``__call__`` attribute (what transformers compiles:
    ``torch.compile(self.__call__)``) whose code object is the model's own.
    torch.compile keeps its graphs per code object and tells two models of
    one class apart only by the guards on their modules, which
    compile_decoding skips: without a code object of its own, a second model
    compiled in the same process would run the first one's graph. Calling
    the model (``model(...)``) is unchanged: Python looks ``__call__`` up on
    the class."""
    code = _call_module.__code__.replace(co_name=f"_call_module_{id(model):x}")
    function = types.FunctionType(code, _call_module.__globals__, code.co_name)
    model.__dict__["__call__"] = types.MethodType(function, model)


def compile_decoding(
    model: torch.nn.Module, *, cpp_wrapper: bool = True, module_guards: bool = False
) -> None:
    """Makes ``model.generate`` decode with a ``torch.compile``'d step on a
    static KV cache, on any device, CPUs included. This is transformers'
    own mechanism, configured: the model's generation config gets
    ``cache_implementation="static"`` and a ``compile_config`` (full graph,
    static shapes, ``_compile_all_devices``), so ``generate`` runs the
    prefill eagerly and each decode step through one compiled graph. Call
    it after :func:`apply` (patched, quantized or not; an unpatched model
    works too); nothing is compiled until the first ``generate``.

    A decode step of a small model on a CPU is bound by the Python of its
    ~100 module calls and ~300 op calls as much as by its weights; the
    compiled step replaces them with one graph. Two options trim what is
    left of the per-step cost (``python -m fuseops bench --decode`` measures
    both; PERFORMANCE.md has the figures):

    - `cpp_wrapper` (default True): inductor's C++ wrapper calls the graph's
      kernels and ops from C++ instead of one Python call each (a longer
      first compile).
    - `module_guards` (default False): False skips the guards on the
      model's modules (``torch.compiler.skip_guard_on_all_nn_modules_unsafe``):
      hundreds of checks per step on a model's attributes that decoding
      never changes. The graph then assumes the modules it traced: after
      changing the model's structure (another :func:`apply`, a replaced
      layer, training mode) call ``torch._dynamo.reset()``. Weights changed
      in place are seen either way. Each model compiled so gets a frame of
      its own (a ``__call__`` attribute with its own code object), so two
      models in one process never share a graph.

    Each shape a step can have (batch size; the cache's length, which is
    the prompt's plus ``max_new_tokens``) compiles its own graph once, and
    torch.compile's recompile limit (8 by default) applies.
    """
    from transformers import CompileConfig

    options: dict[str, Any] = {}
    if cpp_wrapper:
        options["cpp_wrapper"] = True
    if not module_guards:
        options["guard_filter_fn"] = torch.compiler.skip_guard_on_all_nn_modules_unsafe
    # torch.compile takes a mode or options, not both; "default" is inductor's
    # defaults ("reduce-overhead", transformers' default, is CUDA graphs).
    config = CompileConfig(
        fullgraph=True, dynamic=False, mode=None if options else "default", options=options or None
    )
    config._compile_all_devices = True
    if not module_guards:
        _own_compiled_frame(model)
    generation = model.generation_config
    generation.cache_implementation = "static"
    generation.compile_config = config


def is_patched(module: torch.nn.Module) -> bool:
    """Whether :func:`apply` patched `module` itself."""
    return MARKER in module.__dict__


__all__ = [
    "FAMILIES",
    "KINDS",
    "LOGITS",
    "MARKER",
    "ProjectionSlice",
    "QUANTIZE",
    "apply",
    "compile_decoding",
    "is_patched",
    "quantize_modes",
    "register_experts_implementation",
    "supported_model_types",
]
