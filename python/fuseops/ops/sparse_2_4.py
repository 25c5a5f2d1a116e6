"""2:4 semi-structured sparse linear layers: ``prune_2_4`` (keep the 2
largest magnitudes of every group of 4 input features), ``pack_2_4`` (kept
values + bitmask) and ``sparse_2_4_linear``, for float weights (float32,
float64, bfloat16, float16) and int8 weights with per-channel scales
(W8A16: float activations, int8 weights dequantized on the fly), and
``sparse_2_4_dynamic_linear`` for int8 weights with int8 activations
quantized per token on the fly (W8A8; one activation scale per row, where
``int8_dynamic_linear`` has one per block of 32).

A packed weight is three plain tensors (a module keeps them as buffers,
``state_dict`` round-trips them, ``torch.compile``/``torch.export`` see
ordinary tensors):

- ``values`` ``[N, K/2]``, the weight's dtype: the 2 kept values of each
  group of 4 along K, in K order;
- ``meta`` uint8 ``[N, ceil(K/8)]``: bit ``4*(g%2) + j`` of ``meta[n,
  g//2]`` is set when ``weight[n, 4g + j]`` is kept (bit ``k % 8`` of byte
  ``k // 8`` for input feature k); 16 consecutive features' mask is a
  little-endian 16-bit word, the AVX-512 kernels' expand mask;
- ``scale`` float32 ``[N]``: the int8 weight's per-channel scales, or ones
  for a float weight (unless one is given).

The values are half the dense weight's bytes; the mask adds 1/8 byte per
weight. K must be a multiple of 4.

These are inference ops: they have no derivative, and called on tensors that
require grad with grad mode on they raise (use ``torch.no_grad()`` or
``torch.inference_mode()``).
"""

from __future__ import annotations

from typing import Optional

import torch

from ._export import PREPARES_WEIGHTS


def prune_2_4(weight: torch.Tensor) -> torch.Tensor:
    """The weight ``[N, K]`` (float, K a multiple of 4) with the 2 values of
    largest magnitude of each group of 4 along K kept and the others set to
    0; NaN counts as the largest, and among equal magnitudes the lower index
    is kept."""
    return torch.ops.fuseops.prune_2_4(weight)


def pack_2_4(
    weight: torch.Tensor, scale: Optional[torch.Tensor] = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(values, meta, scale)`` of a 2:4 weight ``[N, K]`` (module docstring
    for the layout): a float weight (``scale`` optional, ones by default) or
    an int8 one with its float32 per-channel ``scale`` (required). A group
    with more than 2 nonzeros is refused (``prune_2_4`` first)."""
    return torch.ops.fuseops.pack_2_4(weight, scale)


def sparse_2_4_linear(
    x: torch.Tensor,
    values: torch.Tensor,
    meta: torch.Tensor,
    scale: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``x @ (W * scale[:, None]).T + bias`` with the packed 2:4 weight W:
    ``x [..., K]`` float32, float64, bfloat16 or float16, result ``[...,
    N]`` in x's dtype. Float values must have x's dtype; int8 values take
    any of them. Products are summed in float32 (in float64 for float64 x,
    whatever the values) and each channel's scale is applied once: ``y[m, n] = scale[n] * sum_k x[m, k] *
    W[n, k] + bias[n]``."""
    return torch.ops.fuseops.sparse_2_4_linear(x, values, meta, scale, bias)


def sparse_2_4_dynamic_linear(
    x: torch.Tensor,
    values: torch.Tensor,
    meta: torch.Tensor,
    scale: torch.Tensor,
    colsum: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """W8A8 dynamic with the packed 2:4 int8 weight, activations per row
    (``int8_dynamic_linear`` quantizes them per block of 32): ``x [..., K]`` (float32, bfloat16, float16 or
    float64) quantized per row on the fly exactly as
    ``quantize_per_token_int8`` does (``x_scale = absmax / 127``, ``xq =
    round(x / x_scale)``), the int8 products of the kept weights summed
    exactly in int32, then ``y[m, n] = (acc[m, n] * x_scale[m]) * scale[n] +
    bias[n]`` in float32 (float64 for float64 x), rounded to x's dtype.
    ``(values, meta, scale)`` as ``pack_2_4`` returns them for an int8
    weight, and ``colsum = values.sum(1, dtype=torch.int32)`` (the kernels'
    correction for activations shifted to unsigned; ``colsum_2_4``). K at
    most 132104 (int32 sums). A row holding Inf or NaN gives a row of NaN."""
    return torch.ops.fuseops.sparse_2_4_dynamic_linear(x, values, meta, scale, colsum, bias)


def colsum_2_4(values: torch.Tensor) -> torch.Tensor:
    """The int32 per-channel sums of packed int8 values that
    ``sparse_2_4_dynamic_linear`` takes."""
    return values.sum(1, dtype=torch.int32)


def unpack_2_4(values: torch.Tensor, meta: torch.Tensor, k: int) -> torch.Tensor:
    """The dense ``[N, k]`` weight (in values' dtype) a packed one holds."""
    n = values.shape[0]
    shifts = torch.arange(8, device=meta.device)
    kept = (
        ((meta.to(torch.int64).unsqueeze(-1) >> shifts) & 1)
        .bool()
        .reshape(n, 8 * meta.shape[1])[:, :k]
    )
    dense = torch.zeros(n, k, dtype=values.dtype, device=values.device)
    dense[kept] = values.reshape(-1)
    return dense


def prune_2_4_reference(weight):
    n, k = weight.shape
    a = weight.abs().nan_to_num(nan=float("inf")).reshape(n, k // 4, 4)
    index = torch.arange(4, device=weight.device)
    # rank i: the group's values larger than i, or equal at a lower index.
    beats = (a.unsqueeze(-1) > a.unsqueeze(-2)) | (
        (a.unsqueeze(-1) == a.unsqueeze(-2)) & (index[:, None] < index[None, :])
    )
    rank = beats.sum(-2)
    return torch.where(rank.reshape(n, k) < 2, weight, torch.zeros_like(weight))


def pack_2_4_reference(weight, scale=None):
    n, k = weight.shape
    nonzero = (weight != 0).reshape(n, k // 4, 4)
    zero_rank = (~nonzero).cumsum(-1)
    keep = nonzero | (~nonzero & (zero_rank <= (2 - nonzero.sum(-1, keepdim=True))))
    values = weight[keep.reshape(n, k)].reshape(n, k // 2)
    # Sizes spelled out: -1 is ambiguous when there are no rows.
    bits = torch.nn.functional.pad(keep.reshape(n, k), (0, 8 * (-(-k // 8)) - k)).reshape(
        n, -(-k // 8), 8
    )
    meta = (bits.to(torch.int64) << torch.arange(8, device=weight.device)).sum(-1).to(torch.uint8)
    scale = torch.ones(n, device=weight.device) if scale is None else scale.float().clone()
    return values, meta, scale


def sparse_2_4_linear_reference(x, values, meta, scale, bias=None):
    # In x's dtype, which the conformance suite and the bench make float64
    # (float32 for reduced-precision rows): the dense weight, exactly.
    w = unpack_2_4(values, meta, x.shape[-1]).to(x.dtype)
    y = (x @ w.T) * scale.to(x.dtype)
    return y if bias is None else y + bias.to(x.dtype)


def sparse_2_4_dynamic_linear_reference(x, values, meta, scale, colsum, bias=None):
    # The quantized math in float64: the rows quantized in float32 exactly as
    # the op does (float64 inputs rounded to float32 first), the int8
    # products summed exactly (|sum| < 2^53), the scales applied in float64.
    from .quantize import quantize_per_token_int8_reference

    xq, x_scale = quantize_per_token_int8_reference(x)
    w = unpack_2_4(values, meta, x.shape[-1]).to(torch.float64)
    y = (
        (xq.to(torch.float64) @ w.T)
        * x_scale.to(torch.float64).unsqueeze(-1)
        * scale.to(torch.float64)
    )
    y = y if bias is None else y + bias.to(torch.float64)
    return y.to(x.dtype)


# --- export (fuseops/ops/_export.py) ---

NOT_EXPORTED = {
    ("prune_2_4", "pack_2_4"): PREPARES_WEIGHTS,
}


def onnx_translations() -> dict:
    """The 2:4 linears: the dense weight rebuilt from ``meta``'s bits
    (``BitShift``, ``BitwiseAnd``, ``CumSum`` of the kept positions in each
    group of 4, ``GatherElements`` of the values, ``Where``), then the math of
    ``int8_weight_only_linear``/``int8_dynamic_linear``'s translations: float
    sums for the weight-only op, ``MatMulInteger`` for the dynamic one."""
    from onnxscript import ir

    from ._onnx import (
        FLOAT,
        INT8,
        INT32,
        INT64,
        UINT8,
        add_bias,
        cast,
        dtype_of,
        dynamic_int8_linear,
        ints,
        op,
        opmath,
        scalar,
        static_dim,
    )

    def dense(values, meta, k: int, to: ir.DataType):
        """The ``[N, k]`` weight the packed one holds, in ``to`` (exact:
        ONNX Runtime has no int8 ``Where``)."""
        n = static_dim(values, 0, "the output features (values.shape[0])")
        kb = static_dim(meta, 1, "meta.shape[1]")
        shifts = op.Constant(value=ir.tensor(list(range(8)), dtype=UINT8))
        one = op.Constant(value=ir.tensor(1, dtype=UINT8))
        bits = op.BitwiseAnd(
            op.BitShift(op.Unsqueeze(meta, ints(-1)), shifts, direction="RIGHT"), one
        )
        bits = op.Slice(op.Reshape(bits, ints(n, kb * 8)), ints(0), ints(k), ints(1))
        kept = op.Cast(bits, to=INT64)
        # The kept positions' rank in their group of 4 (0 or 1), and where
        # that value sits in the group's pair of values.
        rank = op.Sub(op.CumSum(op.Reshape(kept, ints(n, k // 4, 4)), ints(-1)), ints(1))
        base = op.Constant(value=ir.tensor([[[2 * g] for g in range(k // 4)]], dtype=INT64))
        index = op.Reshape(op.Add(op.Max(rank, ints(0)), base), ints(n, k))
        gathered = cast(op.GatherElements(values, index, axis=1), to)
        return op.Where(op.Equal(kept, ints(1)), gathered, cast(scalar(0.0, FLOAT), to))

    def sparse_2_4_linear_onnx(input, values, meta, scale, bias=None):
        """``fuseops::sparse_2_4_linear``: ``(x @ W.T) * scale + bias`` in
        float32 (float64 for float64 x), W the dense weight cast exactly."""
        dtype = dtype_of(input)
        ct = opmath(dtype)
        k = static_dim(input, -1, "the input features")
        w = dense(values, meta, k, ct)
        y = op.Mul(op.MatMul(cast(input, ct), op.Transpose(w, perm=[1, 0])), cast(scale, ct))
        return cast(add_bias(y, bias, ct), dtype)

    def sparse_2_4_dynamic_linear_onnx(input, values, meta, scale, colsum, bias=None):
        """``fuseops::sparse_2_4_dynamic_linear``: the rows quantized as the op
        does, ``MatMulInteger`` with the dense int8 weight (exact int32 sums),
        then ``(acc * x_scale) * scale + bias`` in float32 (float64 for float64
        x). ``colsum`` is the op's correction for unsigned activations: unused."""
        del colsum
        k = static_dim(input, -1, "the input features")
        w = op.Cast(dense(values, meta, k, INT32), to=INT8)
        return dynamic_int8_linear(input, w, scale, bias)

    ops = torch.ops.fuseops
    return {
        ops.sparse_2_4_linear.default: sparse_2_4_linear_onnx,
        ops.sparse_2_4_dynamic_linear.default: sparse_2_4_dynamic_linear_onnx,
    }


def executorch_decompositions() -> dict:
    """The 2:4 linears: the dense weight rebuilt from ``meta``'s bits
    (floor divisions by powers of 2, a ``cumsum`` of the kept positions in
    each group of 4, a ``gather`` of the values, ``where``), then the math of
    the int8 linears' decompositions: float sums for the weight-only op,
    exact integer sums (float64) for the dynamic one. The ``.pte`` keeps the
    packed values and bits."""
    from ._executorch import add_bias, dynamic_int8_linear, opmath, rows_times

    def dense(values, meta, k: int):
        """The ``[N, k]`` weight (values' dtype) the packed one holds."""
        n = values.shape[0]
        m = meta.to(torch.int32)
        shifted = [torch.div(m, 1 << j, rounding_mode="floor") for j in range(8)]
        bits = torch.stack([b - torch.div(b, 2, rounding_mode="floor") * 2 for b in shifted], -1)
        bits = bits.reshape(n, -1)[:, :k]
        rank = bits.reshape(n, k // 4, 4).cumsum(-1) - 1
        base = (torch.arange(k // 4, dtype=torch.int64) * 2).reshape(1, -1, 1)
        index = (rank.clamp(min=0).to(torch.int64) + base).reshape(n, k)
        gathered = torch.gather(values, 1, index)
        return torch.where(bits == 1, gathered, torch.zeros_like(gathered))

    def sparse_2_4_linear_decomposition(input, values, meta, scale, bias=None):
        """``fuseops::sparse_2_4_linear``: ``(x @ W.T) * scale + bias`` in
        float32 (float64 for float64 x), W the dense weight cast exactly."""
        dtype = input.dtype
        ct = opmath(dtype)
        n, k = values.shape[0], input.shape[-1]
        w = dense(values, meta, k).to(ct)
        y = rows_times(input.to(ct).reshape(-1, k), w, input.shape[:-1] + (n,)) * scale.to(ct)
        return add_bias(y, bias, ct).to(dtype)

    def sparse_2_4_dynamic_linear_decomposition(input, values, meta, scale, colsum, bias=None):
        """``fuseops::sparse_2_4_dynamic_linear``: the rows quantized as the op
        does, the int8 products summed exactly (float64), then ``(acc *
        x_scale) * scale + bias`` in float32 (float64 for float64 x)."""
        del colsum
        return dynamic_int8_linear(input, dense(values, meta, input.shape[-1]), scale, bias)

    ops = torch.ops.fuseops
    return {
        ops.sparse_2_4_linear.default: sparse_2_4_linear_decomposition,
        ops.sparse_2_4_dynamic_linear.default: sparse_2_4_dynamic_linear_decomposition,
    }


__all__ = [
    "colsum_2_4",
    "pack_2_4",
    "prune_2_4",
    "sparse_2_4_dynamic_linear",
    "sparse_2_4_linear",
    "unpack_2_4",
]
