"""Drop-in replacements for ``torch.nn`` modules, backed by fuseops ops.

Each module subclasses its ``torch.nn`` counterpart and only overrides
``forward``: constructor arguments, parameters and ``state_dict`` keys are the
same, so an existing checkpoint loads unchanged. ``replace_modules(model)``
swaps them into an existing model in place. For gated MLPs, which torch.nn
lacks, ``SwiGLUMLP`` is the plain-torch counterpart that ``SwiGLU`` replaces.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from .ops.activation import gelu, silu
from .ops.causal_conv1d import causal_conv1d
from .ops.cross_entropy import cross_entropy, cross_entropy_reference, linear_cross_entropy
from .ops.gated_activation import geglu, swiglu
from .ops.int8_linear import int8_dynamic_linear, int8_weight_only_linear, pack_int8_weight
from .ops.layer_norm import layer_norm
from .ops.quantize import quantize_per_channel_int8
from .ops.rms_norm import rms_norm
from .ops.rope import rope, rope_cache, rope_reference
from .ops.sparse_2_4 import (
    colsum_2_4,
    pack_2_4,
    prune_2_4,
    sparse_2_4_dynamic_linear,
    sparse_2_4_linear,
)

# Replaced class (torch.nn's, or SwiGLUMLP) -> (fuseops class, predicate
# saying whether an instance's configuration is supported; None means always).
_REPLACEMENTS: dict[type, tuple[type, Optional[Callable[[torch.nn.Module], bool]]]] = {}


def _replaces(torch_cls: type, supported: Optional[Callable[[torch.nn.Module], bool]] = None):
    """Class decorator: the decorated fuseops module replaces `torch_cls`."""

    def register(cls: type) -> type:
        _REPLACEMENTS[torch_cls] = (cls, supported)
        return cls

    return register


@dataclass(frozen=True)
class Replacement:
    name: str  # qualified module name in the model
    old: str  # torch.nn class name
    new: str  # fuseops.nn class name


def _converted(module: torch.nn.Module, cls: type) -> torch.nn.Module:
    # A new instance sharing the old one's state (parameters, buffers, hooks,
    # training flag): optimizers holding those parameters keep working.
    new = object.__new__(cls)
    new.__dict__ = module.__dict__.copy()
    return new


def replace_modules(model: torch.nn.Module) -> list[Replacement]:
    """Replaces, in place, every torch.nn module (and SwiGLUMLP) of `model`
    that fuseops has a drop-in for (exact type match, supported configuration), and returns what
    was replaced. `model` itself is never replaced, only its submodules."""
    replaced: list[Replacement] = []
    for parent_name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            entry = _REPLACEMENTS.get(type(child))
            if entry is None:
                continue
            cls, supported = entry
            if supported is not None and not supported(child):
                continue
            setattr(parent, child_name, _converted(child, cls))
            qualified = f"{parent_name}.{child_name}" if parent_name else child_name
            replaced.append(Replacement(qualified, type(child).__name__, cls.__name__))
    return replaced


@_replaces(torch.nn.LayerNorm, supported=lambda m: len(m.normalized_shape) == 1)
class LayerNorm(torch.nn.LayerNorm):
    """torch.nn.LayerNorm computed by fuseops.layer_norm (forward and backward).

    Normalization over more than the last dimension, or an input whose dtype
    differs from the parameters' (which fuseops.layer_norm rejects), takes
    torch's own path, so the module accepts everything torch.nn.LayerNorm does.
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        params_match = all(p is None or p.dtype == input.dtype for p in (self.weight, self.bias))
        if len(self.normalized_shape) != 1 or not params_match:
            return super().forward(input)
        return layer_norm(input, self.weight, self.bias, self.eps)


@_replaces(torch.nn.RMSNorm, supported=lambda m: len(m.normalized_shape) == 1)
class RMSNorm(torch.nn.RMSNorm):
    """torch.nn.RMSNorm computed by fuseops.rms_norm (forward and backward).

    Normalization over more than the last dimension takes torch's own path,
    so the module accepts everything torch.nn.RMSNorm does.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if len(self.normalized_shape) != 1:
            return super().forward(x)
        return rms_norm(x, self.weight, self.eps)


@_replaces(torch.nn.GELU)
class GELU(torch.nn.GELU):
    """torch.nn.GELU computed by fuseops.gelu (forward and backward)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return gelu(input, self.approximate)


@_replaces(torch.nn.SiLU, supported=lambda m: not m.inplace)
class SiLU(torch.nn.SiLU):
    """torch.nn.SiLU computed by fuseops.silu (forward and backward).

    ``inplace=True`` is not fused (replace_modules leaves such modules alone;
    constructed directly, it takes torch's in-place path)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if self.inplace:
            return super().forward(input)
        return silu(input)


class CausalConv1d(torch.nn.Conv1d):
    """Mamba's depthwise causal convolution, computed by fuseops.causal_conv1d
    (forward and backward): ``CausalConv1d(dim, width, bias=True,
    activation=None | "silu")``, ``forward(x, initial_states=None)`` with x
    of shape ``(batch, dim, seqlen)`` (contiguous or channel-last) returns
    ``(batch, dim, seqlen)``.

    Its parameters are those of the ``torch.nn.Conv1d(dim, dim, width,
    groups=dim, padding=width - 1, bias=bias)`` that Mamba builds (weight
    ``(dim, 1, width)``, same initialisation and ``state_dict`` keys), so a
    Mamba block's ``conv1d`` weights load unchanged. Unlike that module,
    whose output has ``seqlen + width - 1`` steps that Mamba slices to
    ``seqlen``, the result is already causal and ``seqlen`` long, so
    ``replace_modules`` does not swap plain ``Conv1d`` modules for it.
    """

    def __init__(
        self,
        dim: int,
        width: int = 4,
        bias: bool = True,
        activation: Optional[str] = None,
        device=None,
        dtype=None,
    ) -> None:
        if activation not in (None, "silu", "swish"):
            raise ValueError(
                f"fuseops.nn.CausalConv1d: activation must be None, 'silu' or 'swish', got {activation!r}"
            )
        super().__init__(
            dim, dim, width, groups=dim, padding=width - 1, bias=bias, device=device, dtype=dtype
        )
        self.activation = activation

    def forward(
        self, x: torch.Tensor, initial_states: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        return causal_conv1d(
            x, self.weight.squeeze(1), self.bias, initial_states, activation=self.activation
        )

    def extra_repr(self) -> str:
        return super().extra_repr() + f", activation={self.activation!r}"


@_replaces(torch.nn.CrossEntropyLoss)
class CrossEntropyLoss(torch.nn.CrossEntropyLoss):
    """torch.nn.CrossEntropyLoss computed by fuseops.cross_entropy (forward and
    backward), plus ``z_loss``, ``softcap`` and ``inplace_backward`` (see
    fuseops.cross_entropy; ``inplace_backward=True`` overwrites the input
    logits with their gradient). Class indices in the class dimension
    (dimension 1, as in torch; moved last for inputs of more than 2
    dimensions) are fused; probability targets take torch's own path (without
    z_loss or softcap, which they do not support)."""

    def __init__(
        self,
        weight: Optional[torch.Tensor] = None,
        size_average=None,
        ignore_index: int = -100,
        reduce=None,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
        z_loss: float = 0.0,
        softcap: Optional[float] = None,
        inplace_backward: bool = False,
    ) -> None:
        super().__init__(weight, size_average, ignore_index, reduce, reduction, label_smoothing)
        self.z_loss = z_loss
        self.softcap = softcap
        self.inplace_backward = inplace_backward

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        # Instances converted by replace_modules lack the extensions' attributes.
        z_loss = getattr(self, "z_loss", 0.0)
        softcap = getattr(self, "softcap", None)
        if target.is_floating_point():
            if z_loss or softcap is not None:
                raise ValueError(
                    "fuseops.nn.CrossEntropyLoss: z_loss and softcap need class-index targets"
                )
            return super().forward(input, target)
        logits = input.movedim(1, -1) if input.dim() > 2 else input
        return cross_entropy(
            logits,
            target,
            self.weight,
            self.reduction,
            self.ignore_index,
            self.label_smoothing,
            z_loss,
            softcap,
            inplace_backward=getattr(self, "inplace_backward", False),
        )

    def extra_repr(self) -> str:
        return f"z_loss={self.z_loss}, softcap={self.softcap}, inplace_backward={self.inplace_backward}"


class TorchLinearCrossEntropyLoss(torch.nn.Module):
    """An LM head's projection and cross-entropy in plain torch:
    ``forward(input, linear_weight, target, linear_bias=None,
    normalizer=None)`` with ``input`` ``[..., H]``, the output projection's
    ``linear_weight`` ``[V, H]`` (and bias) and ``target`` ``[...]`` forms the
    logits ``F.linear(input, linear_weight, linear_bias)``, upcasts them to
    float32 (as Hugging Face's causal-LM loss does) and takes their
    cross-entropy (``fuseops.reference.cross_entropy``: torch's options plus
    ``z_loss`` and ``softcap``). ``reduction`` is "mean" or "sum";
    ``normalizer`` (with "sum") divides the loss. This is the module a model
    builds to be plain torch and still be found by ``replace_modules``, which
    swaps it for ``LinearCrossEntropyLoss``."""

    def __init__(
        self,
        weight: Optional[torch.Tensor] = None,
        ignore_index: int = -100,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
        z_loss: float = 0.0,
        softcap: Optional[float] = None,
    ) -> None:
        super().__init__()
        self.register_buffer("weight", weight)
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.label_smoothing = label_smoothing
        self.z_loss = z_loss
        self.softcap = softcap

    def forward(
        self,
        input: torch.Tensor,
        linear_weight: torch.Tensor,
        target: torch.Tensor,
        linear_bias: Optional[torch.Tensor] = None,
        normalizer: Optional[float] = None,
    ) -> torch.Tensor:
        logits = torch.nn.functional.linear(input, linear_weight, linear_bias).float()
        weight = None if self.weight is None else self.weight.float()
        loss = cross_entropy_reference(
            logits.reshape(-1, logits.shape[-1]),
            target.reshape(-1),
            weight,
            self.reduction,
            self.ignore_index,
            self.label_smoothing,
            self.z_loss,
            self.softcap,
        )
        return loss / normalizer if normalizer is not None else loss

    def extra_repr(self) -> str:
        return (
            f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, "
            f"label_smoothing={self.label_smoothing}, z_loss={self.z_loss}, "
            f"softcap={self.softcap}"
        )


@_replaces(TorchLinearCrossEntropyLoss)
class LinearCrossEntropyLoss(TorchLinearCrossEntropyLoss):
    """An LM head's projection and cross-entropy in one op,
    ``fuseops.linear_cross_entropy``: ``TorchLinearCrossEntropyLoss`` (same
    constructor and forward) without forming the ``[tokens, V]`` logits; the
    logits' statistics and gradients are computed in float32 whatever the
    input dtype."""

    def forward(
        self,
        input: torch.Tensor,
        linear_weight: torch.Tensor,
        target: torch.Tensor,
        linear_bias: Optional[torch.Tensor] = None,
        normalizer: Optional[float] = None,
    ) -> torch.Tensor:
        return linear_cross_entropy(
            input.reshape(-1, input.shape[-1]),
            linear_weight,
            target.reshape(-1),
            linear_bias,
            self.weight,
            self.reduction,
            self.ignore_index,
            self.label_smoothing,
            self.z_loss,
            self.softcap,
            normalizer,
        )


class _GatedMLP(torch.nn.Module):
    """Llama-style gated MLP: ``down_proj(act(gate_proj(x)) * up_proj(x))``."""

    def __init__(
        self,
        in_features: int,
        hidden_features: int,
        out_features: Optional[int] = None,
        bias: bool = False,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        out_features = in_features if out_features is None else out_features
        self.gate_proj = torch.nn.Linear(in_features, hidden_features, bias=bias, **factory)
        self.up_proj = torch.nn.Linear(in_features, hidden_features, bias=bias, **factory)
        self.down_proj = torch.nn.Linear(hidden_features, out_features, bias=bias, **factory)


class SwiGLUMLP(_GatedMLP):
    """SwiGLU MLP block in plain torch:
    ``down_proj(F.silu(gate_proj(x)) * up_proj(x))``. torch.nn has no gated
    MLP module, so this is the one a model builds to be plain torch and still
    be found by ``replace_modules``, which swaps it for ``SwiGLU``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


@_replaces(SwiGLUMLP)
class SwiGLU(SwiGLUMLP):
    """SwiGLU MLP block: ``down_proj(silu(gate_proj(x)) * up_proj(x))``, with
    the activation-times-up step fused (parameter names as Llama's
    ``LlamaMLP``, so its checkpoints load)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))


class GeGLU(_GatedMLP):
    """GeGLU MLP block: ``down_proj(gelu(gate_proj(x), approximate) * up_proj(x))``."""

    def __init__(
        self,
        in_features: int,
        hidden_features: int,
        out_features: Optional[int] = None,
        bias: bool = False,
        approximate: str = "none",
        device=None,
        dtype=None,
    ) -> None:
        super().__init__(in_features, hidden_features, out_features, bias, device, dtype)
        if approximate not in ("none", "tanh"):
            raise ValueError(
                f"fuseops.nn.GeGLU: approximate must be 'none' or 'tanh', got {approximate!r}"
            )
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(geglu(self.gate_proj(x), self.up_proj(x), self.approximate))

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class TorchRotaryEmbedding(torch.nn.Module):
    """Rotary position embedding in plain torch, as Hugging Face writes it
    (``q * cos + rotate_half(q) * sin``, ``fuseops.reference.rope``), with
    its cos/sin cache: ``forward(query, key, positions)`` returns the rotated
    ``(query, key)`` (the query alone when key is None). This is the module a
    model builds to be plain torch and still be found by ``replace_modules``,
    which swaps it for ``RotaryEmbedding``.

    The cache (``fuseops.rope_cache``, float32 ``[max_pos, rotary_dim]``) is
    held as non-persistent buffers ``cos_cached`` and ``sin_cached``: it
    follows ``.to(device)`` and stays out of ``state_dict``. A position at or
    beyond the cache grows it to at least twice its length (``grow=True``,
    reading ``positions.max()``, a device sync on CUDA) or, with
    ``grow=False``, is an error."""

    cos_cached: torch.Tensor
    sin_cached: torch.Tensor

    def __init__(
        self,
        rotary_dim: int,
        max_position_embeddings: int = 2048,
        base: float = 10000.0,
        scaling: Optional[str] = None,
        factor: float = 1.0,
        interleaved: bool = False,
        grow: bool = True,
        device=None,
    ) -> None:
        super().__init__()
        self.rotary_dim = rotary_dim
        self.base = base
        self.scaling = scaling
        self.factor = factor
        self.interleaved = interleaved
        self.grow = grow
        cos, sin = self._cache(max_position_embeddings, device)
        self.register_buffer("cos_cached", cos, persistent=False)
        self.register_buffer("sin_cached", sin, persistent=False)

    def _cache(self, max_pos: int, device):
        return rope_cache(
            self.rotary_dim,
            max_pos,
            self.base,
            self.scaling,
            self.factor,
            interleaved=self.interleaved,
            device=device,
        )

    def _grow_for(self, positions: torch.Tensor) -> None:
        if self.grow and positions.numel() > 0:
            needed = int(positions.max()) + 1
            if needed > self.cos_cached.shape[0]:
                self.cos_cached, self.sin_cached = self._cache(
                    max(needed, 2 * self.cos_cached.shape[0]), self.cos_cached.device
                )

    def forward(self, query: torch.Tensor, key: Optional[torch.Tensor], positions: torch.Tensor):
        self._grow_for(positions)
        return rope_reference(
            query, key, self.cos_cached, self.sin_cached, positions, self.interleaved
        )

    def extra_repr(self) -> str:
        return (
            f"rotary_dim={self.rotary_dim}, max_pos={self.cos_cached.shape[0]}, "
            f"base={self.base}, scaling={self.scaling!r}, factor={self.factor}, "
            f"interleaved={self.interleaved}"
        )


@_replaces(TorchRotaryEmbedding)
class RotaryEmbedding(TorchRotaryEmbedding):
    """Rotary position embedding by ``fuseops.rope``: ``TorchRotaryEmbedding``
    (same constructor, cache and forward) with the rotation of query and key
    fused into one op, forward and backward."""

    def forward(self, query: torch.Tensor, key: Optional[torch.Tensor], positions: torch.Tensor):
        self._grow_for(positions)
        return rope(query, key, self.cos_cached, self.sin_cached, positions, self.interleaved)


class _QuantizedLinear(torch.nn.Module):
    """What the quantized linear layers share: building one from a
    ``torch.nn.Linear`` (its weight packed by the subclass's ``_pack``, its
    bias kept), the float32 scales kept through ``module.to(dtype)``, the
    bias in the activations' dtype, and the repr."""

    MODES: tuple[str, ...] = ()

    def _check_mode(self, mode: str) -> None:
        if mode not in self.MODES:
            raise ValueError(
                f"{type(self).__name__}: unknown mode {mode!r}; supported: "
                + ", ".join(map(repr, self.MODES))
            )

    @classmethod
    def _from_float(cls, linear: torch.nn.Module, mode: str):
        if not isinstance(linear, torch.nn.Linear):
            raise TypeError(
                f"{cls.__name__}.from_float: expected a torch.nn.Linear, got {type(linear).__name__}"
            )
        weight = linear.weight.detach()
        module = cls(
            linear.in_features,
            linear.out_features,
            bias=linear.bias is not None,
            device=weight.device,
            dtype=weight.dtype,
            mode=mode,
        )
        with torch.no_grad():
            for name, tensor in module._pack(weight).items():
                getattr(module, name).copy_(tensor)
            if linear.bias is not None:
                module.bias.copy_(linear.bias.detach())
        return module

    def _pack(self, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        """The buffers (name -> tensor) holding `weight` in this mode."""
        raise NotImplementedError

    def _apply(self, fn, recurse=True):
        # module.to(dtype) casts floating buffers; the scales stay float32
        # (what the kernels take) and only follow device moves.
        scale = self.scale
        super()._apply(fn, recurse)
        self._buffers["scale"] = scale.to(device=self.scale.device)
        return self

    def _bias(self, x: torch.Tensor) -> Optional[torch.Tensor]:
        return None if self.bias is None else self.bias.to(x.dtype)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, mode={self.mode!r}"
        )


class Int8Linear(_QuantizedLinear):
    """A linear layer with int8 weights for inference: ``y = x @
    (wq * scale[:, None]).T + bias``, activations float32, bfloat16, float16
    or float64 (the result has x's dtype). ``mode`` picks the kernel:
    ``"w8a16"`` (default) runs ``fuseops.int8_weight_only_linear`` (float
    activations), ``"w8a8"`` runs ``fuseops.int8_dynamic_linear`` (activations
    quantized per token on the fly, int8 x int8 products). The mode is an
    attribute, not state: both use the same buffers, so a state_dict saved in
    one mode loads in the other, and ``module.mode`` may be switched. Build it from a trained layer with ``Int8Linear.from_float(linear)``
    or let ``fuseops.quantize_(model)`` swap a model's ``nn.Linear`` layers.

    The weight lives in buffers, the form ``fuseops.pack_int8_weight``
    returns: ``packed`` (int8 ``[ceil(N/16), ceil(K/4), 16, 4]``), ``scale``
    (float32 ``[N]``) and ``colsum`` (int32 ``[N]``), plus ``bias`` (the
    layer's, in its dtype, or None), so ``state_dict()`` saves and
    ``load_state_dict()`` restores them like any buffers. No gradients: run
    it under ``torch.no_grad()`` or ``torch.inference_mode()``.
    """

    MODES = ("w8a16", "w8a8")

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device=None,
        dtype: torch.dtype = torch.float32,
        mode: str = "w8a16",
    ) -> None:
        super().__init__()
        self._check_mode(mode)
        self.mode = mode
        self.in_features = in_features
        self.out_features = out_features
        blocks, groups = -(-out_features // 16), -(-in_features // 4)
        self.register_buffer(
            "packed", torch.zeros(blocks, groups, 16, 4, dtype=torch.int8, device=device)
        )
        self.register_buffer("scale", torch.ones(out_features, dtype=torch.float32, device=device))
        self.register_buffer("colsum", torch.zeros(out_features, dtype=torch.int32, device=device))
        self.register_buffer(
            "bias", torch.zeros(out_features, dtype=dtype, device=device) if bias else None
        )

    @classmethod
    def from_float(cls, linear: torch.nn.Linear, mode: str = "w8a16") -> "Int8Linear":
        """The layer's weight quantized per output channel
        (``fuseops.quantize_per_channel_int8``) and packed; its bias kept."""
        return cls._from_float(linear, mode)

    def _pack(self, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        packed = pack_int8_weight(*quantize_per_channel_int8(weight))
        return dict(zip(("packed", "scale", "colsum"), packed))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "w8a8":
            return int8_dynamic_linear(x, self.packed, self.scale, self.colsum, self._bias(x))
        return int8_weight_only_linear(x, self.packed, self.scale, self._bias(x))


class Sparse24Linear(_QuantizedLinear):
    """A linear layer with a 2:4 semi-structured sparse weight for inference:
    in every group of 4 input features of an output channel at most 2
    weights are nonzero, and only those are stored. ``y = x @ (W *
    scale[:, None]).T + bias``. Modes: ``"2:4"`` keeps the kept values in
    the layer's float dtype (``scale`` is ones) and runs
    ``fuseops.sparse_2_4_linear``; ``"2:4+w8a16"`` quantizes them to int8
    with one float32 scale per output channel (int8 weights, float
    activations: ``fuseops.sparse_2_4_linear``); ``"2:4+w8a8"`` has the same
    int8 weights and quantizes the activations per token on the fly
    (``fuseops.sparse_2_4_dynamic_linear``, the math of
    ``int8_dynamic_linear``). The two int8 modes use the same buffers: a
    state_dict saved in one loads in the other, and ``module.mode`` may be
    switched between them (not to or from ``"2:4"``, whose values are
    float). Build it from a trained layer with
    ``Sparse24Linear.from_float(linear, mode)`` (which prunes with
    ``fuseops.prune_2_4``: the 2 largest magnitudes of each group) or let
    ``fuseops.quantize_(model, mode="2:4")`` swap a model's ``nn.Linear``
    layers. ``in_features`` must be a multiple of 4.

    The weight lives in buffers, the form ``fuseops.pack_2_4`` returns:
    ``values`` (``[N, K/2]``, the float dtype or int8), ``meta`` (uint8
    ``[N, ceil(K/8)]``) and ``scale`` (float32 ``[N]``), plus ``bias``, so
    ``state_dict()`` saves and ``load_state_dict()`` restores them like any
    buffers. ``colsum`` (int32 ``[N]``, ``fuseops.colsum_2_4(values)``, the
    W8A8 kernels' column sums) is derived from the values when they are
    packed or loaded, and is not saved. Float values follow
    ``module.to(dtype)``; activations of another dtype are met by converting
    the values on each call, so cast the module to the activations' dtype.
    No gradients: run it under ``torch.no_grad()`` or
    ``torch.inference_mode()``.
    """

    MODES = ("2:4", "2:4+w8a16", "2:4+w8a8")

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device=None,
        dtype: torch.dtype = torch.float32,
        mode: str = "2:4",
    ) -> None:
        super().__init__()
        self._check_mode(mode)
        if in_features % 4:
            raise ValueError(
                f"Sparse24Linear: in_features must be a multiple of 4 (groups of 4), got {in_features}"
            )
        self.in_features = in_features
        self.out_features = out_features
        # The int8 modes' kernel; which of them applies is an attribute, not state.
        self._int8_mode = "2:4+w8a16" if mode == "2:4" else mode
        values_dtype = dtype if mode == "2:4" else torch.int8
        self.register_buffer(
            "values", torch.zeros(out_features, in_features // 2, dtype=values_dtype, device=device)
        )
        # Positions 0 and 1 of every group: a valid mask for the zero values.
        self.register_buffer(
            "meta",
            torch.full(
                (out_features, -(-in_features // 8)), 0x33, dtype=torch.uint8, device=device
            ),
        )
        self.register_buffer("scale", torch.ones(out_features, dtype=torch.float32, device=device))
        self.register_buffer(
            "bias", torch.zeros(out_features, dtype=dtype, device=device) if bias else None
        )
        self.register_buffer(
            "colsum", torch.zeros(out_features, dtype=torch.int32, device=device), persistent=False
        )

    @property
    def mode(self) -> str:
        return self._int8_mode if self.values.dtype == torch.int8 else "2:4"

    @mode.setter
    def mode(self, mode: str) -> None:
        self._check_mode(mode)
        if (mode == "2:4") != (self.values.dtype != torch.int8):
            raise ValueError(
                f"Sparse24Linear: cannot switch from mode {self.mode!r} to {mode!r}: the values are "
                f"{self.values.dtype}; build a new module with from_float"
            )
        if mode != "2:4":
            self._int8_mode = mode

    @classmethod
    def from_float(cls, linear: torch.nn.Linear, mode: str = "2:4") -> "Sparse24Linear":
        """The layer's weight pruned to 2:4 (``fuseops.prune_2_4``), quantized
        per output channel for the int8 modes, and packed; its bias kept."""
        return cls._from_float(linear, mode)

    def _pack(self, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        pruned = prune_2_4(weight)
        if self.values.dtype == torch.int8:
            values, meta, scale = pack_2_4(*quantize_per_channel_int8(pruned))
        else:
            values, meta, scale = pack_2_4(pruned)
        return {"values": values, "meta": meta, "scale": scale, "colsum": self._colsum(values)}

    def _colsum(self, values: torch.Tensor) -> torch.Tensor:
        # Float values have no W8A8 kernel: their colsum stays 0.
        return colsum_2_4(values) if values.dtype == torch.int8 else torch.zeros_like(self.colsum)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        with torch.no_grad():
            self.colsum.copy_(self._colsum(self.values))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "2:4+w8a8":
            return sparse_2_4_dynamic_linear(
                x, self.values, self.meta, self.scale, self.colsum, self._bias(x)
            )
        values = self.values if self.values.dtype == torch.int8 else self.values.to(x.dtype)
        return sparse_2_4_linear(x, values, self.meta, self.scale, self._bias(x))


__all__ = [
    "CausalConv1d",
    "CrossEntropyLoss",
    "GELU",
    "GeGLU",
    "Int8Linear",
    "LayerNorm",
    "LinearCrossEntropyLoss",
    "RMSNorm",
    "Replacement",
    "RotaryEmbedding",
    "SiLU",
    "Sparse24Linear",
    "SwiGLU",
    "SwiGLUMLP",
    "TorchLinearCrossEntropyLoss",
    "TorchRotaryEmbedding",
    "replace_modules",
]
