"""Quantization of models: ``quantize_(model, mode)`` and the layers it puts
in place of ``torch.nn.Linear``, ``Int8Linear`` (W8A16 / W8A8),
``Int4Linear`` (W4A16, groups along K) and ``Sparse24Linear`` (2:4 sparse,
float or int8), with their shared base.

The model-level layer over the quantized ops of ``fuseops.ops``
(``int8_linear``, ``int4_linear``, ``sparse_2_4``, ``quantize``), which
import nothing from here; ``fuseops.nn`` re-exports the layers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Optional

import torch

from .ops.int4_linear import (
    int4_dynamic_linear,
    int4_weight_only_linear,
    pack_int4_weight,
    quantize_per_group_int4,
)
from .ops.int8_linear import int8_dynamic_linear, int8_weight_only_linear, pack_int8_weight
from .ops.quantize import quantize_per_channel_int8
from .ops.sparse_2_4 import (
    colsum_2_4,
    pack_2_4,
    prune_2_4,
    sparse_2_4_dynamic_linear,
    sparse_2_4_linear,
)

#: The modes of ``quantize_`` (and of the layers' ``mode``).
QUANTIZE_MODES = ("w8a16", "w8a8", "w4a16", "w4a8", "2:4", "2:4+w8a16", "2:4+w8a8")


class _QuantizedLinear(torch.nn.Module):
    """What the quantized linear layers share: building one from a
    ``torch.nn.Linear`` (its weight packed by the subclass's ``_pack``, its
    bias kept), the float32 scales kept through ``module.to(dtype)``, the
    bias in the activations' dtype, and the repr."""

    MODES: tuple[str, ...] = ()
    #: Buffers that keep their dtype (what the kernels take) whatever the
    #: module's dtype.
    FIXED_DTYPE_BUFFERS: tuple[str, ...] = ("scale",)

    def _check_mode(self, mode: str) -> None:
        if mode not in self.MODES:
            raise ValueError(
                f"{type(self).__name__}: unknown mode {mode!r}; supported: "
                + ", ".join(map(repr, self.MODES))
            )

    @classmethod
    def _from_float(cls, linear: torch.nn.Module, mode: str, **options):
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
            **options,
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
        # module.to(dtype) casts floating buffers; the scales keep their dtype
        # (what the kernels take) and only follow device moves.
        kept = {name: self._buffers[name] for name in self.FIXED_DTYPE_BUFFERS}
        super()._apply(fn, recurse)
        for name, buffer in kept.items():
            self._buffers[name] = buffer.to(device=self._buffers[name].device)
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


class Int4Linear(_QuantizedLinear):
    """A linear layer with int4 weights for inference: ``y = x @ w.T + bias``
    with ``w[n, k] = (q[n, k] - zero[n, g]) * scale[n, g]``, one scale and
    zero point per group of ``group_size`` input features of an output
    channel (``fuseops.quantize_per_group_int4``: symmetric, llama.cpp's Q4_0
    rule, by default; ``symmetric=False`` for a zero point per group);
    activations float32, bfloat16, float16 or float64 (the result has x's
    dtype). ``mode`` picks the kernel: ``"w4a16"`` (default) runs
    ``fuseops.int4_weight_only_linear`` (float activations), ``"w4a8"`` runs
    ``fuseops.int4_dynamic_linear`` (activations quantized to int8 per token
    on the fly; the faster decode on CPUs with AVX512_VNNI). The mode is an
    attribute, not state: both use the same buffers. Build it from a trained
    layer with ``Int4Linear.from_float(linear, group_size=128)`` or let
    ``fuseops.quantize_(model, "w4a16", group_size=128)`` swap a model's
    ``nn.Linear`` layers.

    The weight lives in buffers, the form ``fuseops.pack_int4_weight``
    returns: ``packed`` (uint8 ``[ceil(N/16), groups * group_size / 2, 16]``,
    two values per byte) and ``scale_zero`` (``[groups, 2, N]``) in
    ``scale_dtype``: bfloat16 by default, half the bytes of float32, which a
    decode step streams with the weights (at groups of 128, 4.25 bits per
    weight instead of 4.5). The scales are then rounded to bfloat16 after
    quantization (a relative error of at most 2^-8 on each group's weights,
    next to int4's rounding of up to 1/16 of the group's largest value);
    the zero points stay exact. ``scale_dtype=torch.float32`` keeps them as
    ``quantize_per_group_int4`` computes them. ``bias`` is the layer's, in
    its dtype, or None. ``state_dict()`` saves and ``load_state_dict()``
    restores them like any buffers; the group size and the scales' dtype
    are read back from them, so a state_dict saved with another group size
    or scale dtype than the module was built with loads as saved and sets
    them. No gradients: run it under ``torch.no_grad()`` or
    ``torch.inference_mode()``.
    """

    MODES = ("w4a16", "w4a8")
    FIXED_DTYPE_BUFFERS = ("scale_zero",)
    SCALE_DTYPES = (torch.bfloat16, torch.float32)

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device=None,
        dtype: torch.dtype = torch.float32,
        mode: str = "w4a16",
        group_size: int = 128,
        symmetric: bool = True,
        scale_dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        super().__init__()
        self._check_mode(mode)
        if group_size <= 0 or group_size % 2:
            raise ValueError(
                f"Int4Linear: group_size must be a positive even number, got {group_size}"
            )
        if scale_dtype not in self.SCALE_DTYPES:
            raise ValueError(
                f"Int4Linear: scale_dtype must be torch.bfloat16 or torch.float32, got {scale_dtype}"
            )
        self.mode = mode
        self.in_features = in_features
        self.out_features = out_features
        self.group_size = group_size
        self.symmetric = symmetric
        blocks, groups = -(-out_features // 16), -(-in_features // group_size)
        self.register_buffer(
            "packed",
            torch.zeros(blocks, groups * group_size // 2, 16, dtype=torch.uint8, device=device),
        )
        self.register_buffer(
            "scale_zero", torch.zeros(groups, 2, out_features, dtype=scale_dtype, device=device)
        )
        self.register_buffer(
            "bias", torch.zeros(out_features, dtype=dtype, device=device) if bias else None
        )

    @classmethod
    def from_float(
        cls,
        linear: torch.nn.Linear,
        group_size: int = 128,
        symmetric: bool = True,
        mode: str = "w4a16",
        scale_dtype: torch.dtype = torch.bfloat16,
    ) -> "Int4Linear":
        """The layer's weight quantized in groups of `group_size` along K
        (``fuseops.quantize_per_group_int4``) and packed, the scales and
        zero points in `scale_dtype`; its bias kept."""
        return cls._from_float(
            linear, mode, group_size=group_size, symmetric=symmetric, scale_dtype=scale_dtype
        )

    @property
    def scale_dtype(self) -> torch.dtype:
        return self.scale_zero.dtype

    def _pack(self, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        quantized = quantize_per_group_int4(weight, self.group_size, self.symmetric)
        packed, scale_zero = pack_int4_weight(*quantized, self.group_size)
        return {"packed": packed, "scale_zero": scale_zero.to(self.scale_dtype)}

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # The group size is in the buffers' shapes (groups = scale_zero's
        # first dimension, groups * group_size / 2 = packed's second), the
        # scales' dtype in scale_zero's: a state_dict saved with another
        # group size or scale dtype than this module was built with loads as
        # saved, and the module takes them on.
        packed = state_dict.get(prefix + "packed")
        scale_zero = state_dict.get(prefix + "scale_zero")
        mine = self._buffers["scale_zero"]
        if (
            isinstance(scale_zero, torch.Tensor)
            and mine is not None
            and scale_zero.dtype in self.SCALE_DTYPES
            and scale_zero.dtype != mine.dtype
        ):
            self._buffers["scale_zero"] = mine.to(scale_zero.dtype)
        if packed is not None and scale_zero is not None and scale_zero.dim() == 3:
            groups = scale_zero.shape[0]
            if groups and packed.dim() == 3 and (2 * packed.shape[1]) % groups == 0:
                group_size = 2 * packed.shape[1] // groups
                if group_size != self.group_size and -(-self.in_features // group_size) == groups:
                    self.group_size = group_size
                    for name, incoming in (("packed", packed), ("scale_zero", scale_zero)):
                        mine = self._buffers[name]
                        assert mine is not None
                        self._buffers[name] = mine.new_empty(incoming.shape)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        linear = int4_dynamic_linear if self.mode == "w4a8" else int4_weight_only_linear
        return linear(x, self.packed, self.scale_zero, self.group_size, self._bias(x))

    def extra_repr(self) -> str:
        return (
            super().extra_repr()
            + f", group_size={self.group_size}, symmetric={self.symmetric}"
            + f", scale_dtype={self.scale_dtype}"
        )


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


def _quantized_layer(weight: torch.Tensor, mode: str, group_size: int = 128) -> torch.nn.Module:
    """The quantized layer (no bias) of a 2-D `weight` [out, in] in `mode`
    (an int8 or int4 mode of :func:`quantize_`), as ``quantize_`` would make
    it from an ``nn.Linear`` holding that weight: for weights that are not
    a Linear's own (a slice of transformers' 3-D experts' weights)."""
    linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
    linear.weight = torch.nn.Parameter(weight.detach(), requires_grad=False)
    if mode in ("w4a16", "w4a8"):
        return Int4Linear.from_float(linear, group_size=group_size, mode=mode)
    return Int8Linear.from_float(linear, mode=mode)


@dataclass(frozen=True)
class Quantized:
    name: str  # qualified module name in the model
    in_features: int
    out_features: int
    mode: str


def quantize_(
    model: torch.nn.Module,
    mode: str = "w8a16",
    skip: Optional[Iterable[str] | Callable[[str, torch.nn.Module], bool]] = None,
    group_size: int = 128,
    scale_dtype: torch.dtype = torch.bfloat16,
) -> list[Quantized]:
    """Replaces, in place, the ``torch.nn.Linear`` layers of `model` (exact
    type) by ``fuseops.nn.Int8Linear`` in `mode`, and returns what it
    replaced. ``skip`` leaves layers alone: qualified names (a name also
    skips everything under it), or a predicate ``skip(name, module)``.
    `model` itself is replaced only through its parent, so pass the model
    that holds the layers. Modes: ``"w8a16"`` (int8 weights per channel,
    float activations) and ``"w8a8"`` (the same weights, activations
    quantized per token on the fly: ``int8_dynamic_linear``) give
    ``fuseops.nn.Int8Linear``; ``"w4a16"`` (int4 weights, one scale per
    group of `group_size` input features, symmetric; float activations)
    and ``"w4a8"`` (the same weights, activations quantized per token on the
    fly: ``int4_dynamic_linear``) give ``fuseops.nn.Int4Linear``, its scales
    and zero points stored in `scale_dtype` (bfloat16 or float32, see
    ``Int4Linear``); ``"2:4"`` (weights pruned to 2:4 sparsity,
    kept values in the layer's dtype), ``"2:4+w8a16"`` (pruned, then int8
    per channel) and ``"2:4+w8a8"`` (the same int8 weights, activations
    quantized per token on the fly: ``sparse_2_4_dynamic_linear``) give
    ``fuseops.nn.Sparse24Linear``, and leave layers whose ``in_features``
    is not a multiple of 4 alone. Any other name raises ValueError."""
    if mode not in QUANTIZE_MODES:
        raise ValueError(
            f"fuseops.quantize_: unknown mode {mode!r}; supported: "
            + ", ".join(repr(m) for m in QUANTIZE_MODES)
        )
    if skip is None:
        skipped = lambda name, module: False  # noqa: E731
    elif callable(skip):
        skipped = skip
    else:
        names = set(skip)
        skipped = lambda name, module: any(name == s or name.startswith(s + ".") for s in names)  # noqa: E731
    replaced: list[Quantized] = []
    for parent_name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            if type(child) is not torch.nn.Linear:
                continue
            name = f"{parent_name}.{child_name}" if parent_name else child_name
            if skipped(name, child):
                continue
            if mode.startswith("2:4"):
                if child.in_features % 4:
                    continue
                setattr(parent, child_name, Sparse24Linear.from_float(child, mode=mode))
            elif mode in ("w4a16", "w4a8"):
                setattr(
                    parent,
                    child_name,
                    Int4Linear.from_float(
                        child, group_size=group_size, mode=mode, scale_dtype=scale_dtype
                    ),
                )
            else:
                setattr(parent, child_name, Int8Linear.from_float(child, mode=mode))
            replaced.append(Quantized(name, child.in_features, child.out_features, mode))
    return replaced


__all__ = ["Int4Linear", "Int8Linear", "QUANTIZE_MODES", "Quantized", "Sparse24Linear", "quantize_"]
