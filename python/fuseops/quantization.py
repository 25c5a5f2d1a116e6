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
from .ops.int8_linear import (
    colsum_of_packed,
    int8_dynamic_linear,
    int8_weight_only_linear,
    pack_int8_weight,
)
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


#: How ``Int4Linear`` and ``quantize_`` choose each int4 group's scale and
#: zero point (``quantize_int4_scale_min`` for the default).
INT4_SCHEMES = ("scale_min", "symmetric", "asymmetric")


def quantize_int4_scale_min(
    weight: torch.Tensor,
    group_size: int = 32,
    importance: Optional[torch.Tensor] = None,
    scale_dtype: torch.dtype = torch.bfloat16,
    rows_per_step: int = 256,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(wq, scale, zero)`` of a weight ``[N, K]`` for ``w ~= (wq - zero) *
    scale`` per group of `group_size` along K: ``wq`` uint8 ``[N, K]`` in
    [0, 15], float32 ``scale`` and ``zero`` ``[N, ceil(K / group_size)]``,
    both exactly representable in `scale_dtype` (what ``Int4Linear``
    stores) and ``zero`` fractional, so that ``-zero * scale`` is the
    group's minimum (the "scale and min" form of llama.cpp's Q4_1 and
    Q4_K).

    The scale and minimum minimize the group's weighted squared error, the
    search of llama.cpp's ``make_qkx2_quants``: 21 trial scales around
    ``(max - min) / 15`` each give an assignment of levels, for which the
    scale and minimum are then fitted by weighted least squares, and the
    best fit is kept; the minimum is at most 0. The weights are
    ``rms(group) + |w|`` (larger weights count more, as in Q4_K without an
    importance matrix), times ``importance[k]`` where given: per input
    feature, for instance the mean square of the layer's calibration
    activations (llama.cpp's imatrix). The scale and zero point are then
    rounded to `scale_dtype` and the levels re-assigned against the rounded
    values, so the packed weight is the one fitted. Computed in float32,
    `rows_per_step` rows at a time (bounded memory for large layers)."""
    if weight.dim() != 2:
        raise ValueError(
            f"quantize_int4_scale_min: weight must be 2-D [N, K], got {tuple(weight.shape)}"
        )
    if group_size <= 0 or group_size % 2:
        raise ValueError(
            f"quantize_int4_scale_min: group_size must be a positive even number, got {group_size}"
        )
    if scale_dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(
            f"quantize_int4_scale_min: scale_dtype must be torch.bfloat16 or torch.float32, got {scale_dtype}"
        )
    n, k = weight.shape
    if importance is not None and (importance.dim() != 1 or importance.numel() != k):
        raise ValueError(
            f"quantize_int4_scale_min: importance must be 1-D of the weight's in_features ({k}), "
            f"got {tuple(importance.shape)}"
        )
    if not torch.isfinite(weight).all():
        raise ValueError("quantize_int4_scale_min: the weight holds Inf or NaN")
    groups = -(-k // group_size)
    pad = groups * group_size - k
    wq = torch.empty(n, k, dtype=torch.uint8, device=weight.device)
    scale = torch.empty(n, groups, dtype=torch.float32, device=weight.device)
    zero = torch.empty(n, groups, dtype=torch.float32, device=weight.device)
    feature_weight = None
    if importance is not None:
        feature_weight = torch.nn.functional.pad(importance.float().clamp_min(0), (0, pad))
        feature_weight = feature_weight.to(weight.device).view(groups, group_size)
    for begin in range(0, n, rows_per_step):
        rows = weight[begin : begin + rows_per_step].float()
        x = torch.nn.functional.pad(rows, (0, pad)).view(rows.shape[0], groups, group_size)
        # Padding past K counts for nothing.
        valid = torch.ones(groups * group_size, device=weight.device)
        valid[k:] = 0
        valid = valid.view(groups, group_size)
        mean_square = (x * x * valid).sum(-1, keepdim=True) / valid.sum(-1, keepdim=True)
        w = (mean_square.sqrt() + x.abs()) * valid
        if feature_weight is not None:
            w = w * feature_weight
        s, z = _scale_min_search(x, w)
        s, z = s.to(scale_dtype).float(), z.to(scale_dtype).float()
        q = torch.round(x / s + z).clamp(0, 15)
        wq[begin : begin + rows_per_step] = q.view(rows.shape[0], -1)[:, :k].to(torch.uint8)
        scale[begin : begin + rows_per_step] = s.squeeze(-1)
        zero[begin : begin + rows_per_step] = z.squeeze(-1)
    return wq, scale, zero


def _scale_min_search(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, zero) per group (last dimension) of `x` minimizing
    sum w (scale (q - zero) - x)^2 over the trial scales of
    ``quantize_int4_scale_min``; groups of one value or all zeros get scale 1
    (or |x| / 15) so that they come back exactly or as closely as 4 bits
    allow."""
    lo = x.amin(-1, keepdim=True).clamp(max=0)
    hi = x.amax(-1, keepdim=True)
    spread = hi - lo
    flat = spread <= 0
    spread = torch.where(flat, torch.ones_like(spread), spread)
    sw = w.sum(-1, keepdim=True)
    sx = (w * x).sum(-1, keepdim=True)
    best_err = best_scale = best_min = None
    # Trial inverse scales (nmax + rmin + rdelta * i) / spread, i = 0..20,
    # with rmin = -1 and rdelta = 0.1 (make_qkx2_quants' Q4_K values), and
    # first the min-max scale 15 / spread itself.
    for steps in [15.0] + [14.0 + 0.1 * i for i in range(21)]:
        level = torch.round((x - lo) * (steps / spread)).clamp(0, 15)
        sl = (w * level).sum(-1, keepdim=True)
        sl2 = (w * level * level).sum(-1, keepdim=True)
        sxl = (w * level * x).sum(-1, keepdim=True)
        det = sw * sl2 - sl * sl
        ok = det > 0
        safe_det = torch.where(ok, det, torch.ones_like(det))
        this_scale = torch.where(ok, (sw * sxl - sx * sl) / safe_det, spread / steps)
        this_min = torch.where(ok, (sl2 * sx - sl * sxl) / safe_det, lo)
        # A positive minimum is not allowed (the range must hold 0): the
        # scale alone fitted, the minimum 0.
        positive = this_min > 0
        this_scale = torch.where(
            positive, sxl / torch.where(sl2 > 0, sl2, torch.ones_like(sl2)), this_scale
        )
        this_min = torch.where(positive, torch.zeros_like(this_min), this_min)
        bad = ~(this_scale > 0)
        this_scale = torch.where(bad, spread / steps, this_scale)
        this_min = torch.where(bad, lo, this_min)
        err = (w * (this_scale * level + this_min - x) ** 2).sum(-1, keepdim=True)
        if best_err is None:
            best_err, best_scale, best_min = err, this_scale, this_min
        else:
            better = err < best_err
            best_err = torch.where(better, err, best_err)
            best_scale = torch.where(better, this_scale, best_scale)
            best_min = torch.where(better, this_min, best_min)
    assert best_scale is not None and best_min is not None
    best_scale = torch.where(flat & (lo == 0), torch.ones_like(best_scale), best_scale)
    best_min = torch.where(flat & (lo == 0), torch.zeros_like(best_min), best_min)
    return best_scale, -best_min / best_scale


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
    def _from_float(cls, linear: torch.nn.Module, mode: str, pack_options=None, **options):
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
            for name, tensor in module._pack(weight, **(pack_options or {})).items():
                getattr(module, name).copy_(tensor)
            if linear.bias is not None:
                module.bias.copy_(linear.bias.detach())
        module._after_pack()
        return module

    def _pack(self, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        """The buffers (name -> tensor) holding `weight` in this mode."""
        raise NotImplementedError

    def _after_pack(self) -> None:
        """Called once the packed buffers hold a weight: what derives from
        them (the subclass's)."""

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
    quantized on the fly with a scale per block of 32 along K, int8 x int8
    products). The mode is an
    attribute, not state: both use the same buffers, so a state_dict saved in
    one mode loads in the other, and ``module.mode`` may be switched. Build it from a trained layer with ``Int8Linear.from_float(linear)``
    or let ``fuseops.quantize_(model)`` swap a model's ``nn.Linear`` layers.

    The weight lives in buffers, the form ``fuseops.pack_int8_weight``
    returns: ``packed`` (int8 ``[ceil(N/16), ceil(K/4), 16, 4]``) and
    ``scale`` (float32 ``[N]``), plus ``bias`` (the layer's, in its dtype,
    or None), so ``state_dict()`` saves and ``load_state_dict()`` restores
    them like any buffers. ``colsum`` (int16 ``[ceil(K/32), N]``, the W8A8
    kernels' correction) is derived from ``packed`` in mode ``"w8a8"`` (when
    the weight is packed or loaded, or the mode is set) and empty in
    ``"w8a16"``, and not saved: half a bit per weight that only W8A8 reads.
    A state_dict that holds one (older releases saved a per-channel
    ``colsum [N]``) loads, the entry ignored. No gradients: run it under
    ``torch.no_grad()`` or ``torch.inference_mode()``.
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
        self.in_features = in_features
        self.out_features = out_features
        blocks, groups = -(-out_features // 16), -(-in_features // 4)
        self.register_buffer(
            "packed", torch.zeros(blocks, groups, 16, 4, dtype=torch.int8, device=device)
        )
        self.register_buffer("scale", torch.ones(out_features, dtype=torch.float32, device=device))
        self.register_buffer("colsum", None, persistent=False)
        self.register_buffer(
            "bias", torch.zeros(out_features, dtype=dtype, device=device) if bias else None
        )
        self.mode = mode

    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, mode: str) -> None:
        self._check_mode(mode)
        self._mode = mode
        self._derive_colsum()

    def _derive_colsum(self) -> None:
        # The W8A8 kernels' colsum, from the packed weight; empty otherwise.
        packed = self._buffers["packed"]
        assert packed is not None
        self._buffers["colsum"] = (
            colsum_of_packed(packed, self.out_features, self.in_features)
            if self._mode == "w8a8"
            else packed.new_zeros((0, self.out_features), dtype=torch.int16)
        )

    def _after_pack(self) -> None:
        self._derive_colsum()

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # colsum is derived, not loaded (state_dicts of older releases hold
        # one per channel): the entry is dropped, then derived again.
        state_dict.pop(prefix + "colsum", None)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._derive_colsum()

    @classmethod
    def from_float(cls, linear: torch.nn.Linear, mode: str = "w8a16") -> "Int8Linear":
        """The layer's weight quantized per output channel
        (``fuseops.quantize_per_channel_int8``) and packed; its bias kept."""
        return cls._from_float(linear, mode)

    def _pack(self, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        packed, scale, _ = pack_int8_weight(*quantize_per_channel_int8(weight))
        return {"packed": packed, "scale": scale}

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
    ``fuseops.int4_dynamic_linear`` (activations quantized to int8 per weight
    group on the fly; the faster decode on CPUs with AVX512_VNNI). The mode is an
    attribute, not state: both use the same buffers. Build it from a trained
    layer with ``Int4Linear.from_float(linear)`` or let
    ``fuseops.quantize_(model, "w4a16")`` swap a model's ``nn.Linear``
    layers.

    ``scheme`` is how each group's scale and zero point are chosen:
    ``"scale_min"`` (the default) fits a scale and a minimum per group
    minimizing the weighted squared error (``quantize_int4_scale_min``,
    llama.cpp's Q4_1/Q4_K form and search; the zero point is fractional),
    optionally weighted by ``importance`` per input feature;
    ``"symmetric"`` is llama.cpp's Q4_0 rule and ``"asymmetric"`` spreads
    ``[min, max]`` over 15 steps with an integer zero point (both
    ``fuseops.quantize_per_group_int4``). On real pretrained models
    ``"scale_min"`` at groups of 32 is what holds quality (PERFORMANCE.md,
    "Quantization on real models"); ``symmetric=True/False`` still selects
    the two older schemes.

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
        group_size: int = 32,
        symmetric: Optional[bool] = None,
        scale_dtype: torch.dtype = torch.bfloat16,
        scheme: str = "scale_min",
    ) -> None:
        super().__init__()
        self._check_mode(mode)
        if symmetric is not None:
            scheme = "symmetric" if symmetric else "asymmetric"
        if scheme not in INT4_SCHEMES:
            raise ValueError(
                f"Int4Linear: unknown scheme {scheme!r}; supported: "
                + ", ".join(map(repr, INT4_SCHEMES))
            )
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
        self.scheme = scheme
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
        group_size: int = 32,
        symmetric: Optional[bool] = None,
        mode: str = "w4a16",
        scale_dtype: torch.dtype = torch.bfloat16,
        scheme: str = "scale_min",
        importance: Optional[torch.Tensor] = None,
    ) -> "Int4Linear":
        """The layer's weight quantized in groups of `group_size` along K
        by `scheme` (class docstring; `importance` only with
        ``"scale_min"``) and packed, the scales and zero points in
        `scale_dtype`; its bias kept."""
        return cls._from_float(
            linear,
            mode,
            pack_options={"importance": importance},
            group_size=group_size,
            symmetric=symmetric,
            scale_dtype=scale_dtype,
            scheme=scheme,
        )

    @property
    def scale_dtype(self) -> torch.dtype:
        return self.scale_zero.dtype

    @property
    def symmetric(self) -> bool:
        return self.scheme == "symmetric"

    def _pack(
        self, weight: torch.Tensor, importance: Optional[torch.Tensor] = None
    ) -> dict[str, torch.Tensor]:
        if self.scheme != "scale_min":
            if importance is not None:
                raise ValueError(
                    f"Int4Linear: importance applies to scheme 'scale_min', not {self.scheme!r}"
                )
            quantized = quantize_per_group_int4(weight, self.group_size, self.symmetric)
            packed, scale_zero = pack_int4_weight(*quantized, self.group_size)
            return {"packed": packed, "scale_zero": scale_zero.to(self.scale_dtype)}
        wq, scale, zero = quantize_int4_scale_min(
            weight, self.group_size, importance, self.scale_dtype
        )
        # The packing op takes integer zero points; the fractional ones (exact
        # in scale_dtype) replace them in scale_zero after.
        dummy_zero = torch.zeros(scale.shape, dtype=torch.uint8, device=wq.device)
        packed, scale_zero = pack_int4_weight(wq, scale, dummy_zero, self.group_size)
        scale_zero[:, 1, :] = zero.t()
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
            + f", group_size={self.group_size}, scheme={self.scheme!r}"
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
    (``fuseops.sparse_2_4_dynamic_linear``: one scale per row, where
    ``int8_dynamic_linear`` has one per block of 32). The two int8 modes use the same buffers: a
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


def _quantized_layer(weight: torch.Tensor, mode: str, group_size: int = 32) -> torch.nn.Module:
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
    mode: str  # the mode this layer got (a recipe gives some layers 8 bits)


#: ``quantize_``'s recipes for the int4 modes: which layers get 8 bits.
RECIPES = ("mixed", "pure", "uniform")

# The value projections, by the names transformers' model families give
# them; the recipe keeps them at 8 bits.
_VALUE_PROJECTIONS = ("v_proj", "value", "attn_v", "wv", "v")


def _output_head_names(model: torch.nn.Module) -> set[str]:
    """The qualified names of the model's output projection (the language
    model head), tied to the embedding or not: the module
    ``get_output_embeddings()`` returns where the model has it, else a
    top-level or near-top-level Linear named ``lm_head`` or ``output``."""
    heads: set[str] = set()
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    for name, module in model.named_modules():
        if head is not None and module is head:
            heads.add(name)
        elif head is None and name.split(".")[-1] in ("lm_head", "output") and name.count(".") <= 1:
            heads.add(name)
    return heads


def _recipe_mode(recipe: str, mode: str, name: str, heads: set[str]) -> str:
    """The mode layer `name` gets when the model is quantized to `mode`
    with `recipe` (quantize_'s docstring)."""
    if mode not in ("w4a16", "w4a8") or recipe == "uniform":
        return mode
    eight = "w8a16" if mode == "w4a16" else "w8a8"
    if name in heads:
        # The head at 8 bits with float activations in both modes: its
        # inputs are the final hidden states, whose int8 rounding costs the
        # most (the logits' error is what the loss sees).
        return "w8a16"
    if recipe == "mixed" and name.split(".")[-1] in _VALUE_PROJECTIONS:
        return eight
    return mode


def quantize_(
    model: torch.nn.Module,
    mode: str = "w8a16",
    skip: Optional[Iterable[str] | Callable[[str, torch.nn.Module], bool]] = None,
    group_size: int = 32,
    scale_dtype: torch.dtype = torch.bfloat16,
    recipe: str = "mixed",
    scheme: str = "scale_min",
    importance: Optional[dict[str, torch.Tensor]] = None,
) -> list[Quantized]:
    """Replaces, in place, the ``torch.nn.Linear`` layers of `model` (exact
    type) by quantized layers in `mode`, and returns what it replaced and
    the mode each layer got. ``skip`` leaves layers alone: qualified names
    (a name also skips everything under it), or a predicate
    ``skip(name, module)``. `model` itself is replaced only through its
    parent, so pass the model that holds the layers.

    Modes: ``"w8a16"`` (int8 weights per channel, float activations) and
    ``"w8a8"`` (the same weights, activations quantized per block of 32 on
    the fly: ``int8_dynamic_linear``) give ``fuseops.nn.Int8Linear``;
    ``"w4a16"`` (int4 weights in groups of `group_size` input features,
    float activations) and ``"w4a8"`` (the same weights, activations
    quantized per weight group on the fly: ``int4_dynamic_linear``) give
    ``fuseops.nn.Int4Linear`` with `scheme`, its scales and zero points in
    `scale_dtype` (see ``Int4Linear``); ``importance`` maps a layer's
    qualified name to its per-input-feature weights for the
    ``"scale_min"`` search (for instance mean squared calibration
    activations). ``"2:4"`` (weights pruned to 2:4 sparsity, kept values in
    the layer's dtype), ``"2:4+w8a16"`` (pruned, then int8 per channel) and
    ``"2:4+w8a8"`` (the same int8 weights, activations quantized per token
    on the fly: ``sparse_2_4_dynamic_linear``) give
    ``fuseops.nn.Sparse24Linear``, and leave layers whose ``in_features``
    is not a multiple of 4 alone.

    `recipe` applies to the int4 modes, as llama.cpp's quantizer mixes
    types: ``"mixed"`` (the default) keeps the output head (tied to the
    embedding or not) at 8 bits with float activations and the attention
    value projections at 8 bits (``"w8a16"`` under ``"w4a16"``, ``"w8a8"``
    under ``"w4a8"``), the rest at 4; ``"pure"`` keeps only the head at 8
    bits; ``"uniform"`` gives every layer `mode`. PERFORMANCE.md
    ("Quantization on real models") has what each costs on real models.
    Any other mode, recipe or scheme raises ValueError."""
    if mode not in QUANTIZE_MODES:
        raise ValueError(
            f"fuseops.quantize_: unknown mode {mode!r}; supported: "
            + ", ".join(repr(m) for m in QUANTIZE_MODES)
        )
    if recipe not in RECIPES:
        raise ValueError(
            f"fuseops.quantize_: unknown recipe {recipe!r}; supported: "
            + ", ".join(repr(r) for r in RECIPES)
        )
    if scheme not in INT4_SCHEMES:
        raise ValueError(
            f"fuseops.quantize_: unknown scheme {scheme!r}; supported: "
            + ", ".join(repr(r) for r in INT4_SCHEMES)
        )
    if skip is None:
        skipped = lambda name, module: False  # noqa: E731
    elif callable(skip):
        skipped = skip
    else:
        names = set(skip)
        skipped = lambda name, module: any(name == s or name.startswith(s + ".") for s in names)  # noqa: E731
    heads = _output_head_names(model)
    importance = importance or {}
    replaced: list[Quantized] = []
    for parent_name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            if type(child) is not torch.nn.Linear:
                continue
            name = f"{parent_name}.{child_name}" if parent_name else child_name
            if skipped(name, child):
                continue
            layer_mode = _recipe_mode(recipe, mode, name, heads)
            if layer_mode.startswith("2:4"):
                if child.in_features % 4:
                    continue
                setattr(parent, child_name, Sparse24Linear.from_float(child, mode=layer_mode))
            elif layer_mode in ("w4a16", "w4a8"):
                setattr(
                    parent,
                    child_name,
                    Int4Linear.from_float(
                        child,
                        group_size=group_size,
                        mode=layer_mode,
                        scale_dtype=scale_dtype,
                        scheme=scheme,
                        importance=importance.get(name),
                    ),
                )
            else:
                setattr(parent, child_name, Int8Linear.from_float(child, mode=layer_mode))
            replaced.append(Quantized(name, child.in_features, child.out_features, layer_mode))
    return replaced


__all__ = [
    "INT4_SCHEMES",
    "Int4Linear",
    "Int8Linear",
    "QUANTIZE_MODES",
    "Quantized",
    "RECIPES",
    "Sparse24Linear",
    "quantize_",
    "quantize_int4_scale_min",
]
