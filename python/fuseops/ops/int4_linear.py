"""int4 linear layers: group-wise int4 quantization
(``quantize_per_group_int4``), weight packing (``pack_int4_weight``), the
W4A16 linear (``int4_weight_only_linear``) and the W4A8 linear
(``int4_dynamic_linear``: the same packed weight, activations quantized to
int8 per row and weight group).

A weight ``[N, K]`` is cut along K into groups of ``group_size`` values per
output channel; each group has a float32 scale and an integer zero point and
``w[n, k] ~= (wq[n, k] - zero[n, g]) * scale[n, g]`` with ``wq`` in [0, 15].
Symmetric quantization (the default) is llama.cpp's Q4_0 rule: zero point 8,
``scale = m / -8`` for the group's value ``m`` of largest magnitude (which so
comes back exactly); asymmetric spreads ``[min(w, 0), max(w, 0)]`` over 15
steps. ``pack_int4_weight`` then packs two values per byte in the layout the
kernels stream, ``packed[b, p, c] = wq[16b + c, 2p] | wq[16b + c, 2p + 1] << 4``
(uint8 ``[ceil(N/16), groups * group_size / 2, 16]``, zeros past N and K),
with the scales and zero points as float32 ``scale_zero [groups, 2, N]``. The
linear ops also take ``scale_zero`` in bfloat16 (``scale_zero.to(torch.bfloat16)``:
half its bytes, which a decode step streams with the weights; the scales
rounded to 8 bits, the zero points 0-15 exact), and compute with the float32
values it widens to, exactly. Both are ordinary tensors: a module keeps them as buffers, ``state_dict``
round-trips them, and ``torch.compile``/``torch.export`` see plain tensors.

These are inference ops: they have no derivative, and called on tensors that
require grad with grad mode on they raise (use ``torch.no_grad()`` or
``torch.inference_mode()``).
"""

from __future__ import annotations

from typing import Optional

import torch

from ._export import PREPARES_WEIGHTS


def quantize_per_group_int4(
    weight: torch.Tensor, group_size: int = 128, symmetric: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(wq, scale, zero)`` of a weight ``[N, K]``: ``wq`` uint8 ``[N, K]``
    in [0, 15], float32 ``scale`` and uint8 ``zero`` ``[N, ceil(K /
    group_size)]`` (module docstring for the rule). Computed in float32; a
    weight holding Inf or NaN raises."""
    return torch.ops.fuseops.quantize_per_group_int4(weight, group_size, symmetric)


def pack_int4_weight(
    wq: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(packed, scale_zero)`` of ``quantize_per_group_int4``'s result
    (module docstring for the layout)."""
    return torch.ops.fuseops.pack_int4_weight(wq, scale, zero, group_size)


def int4_weight_only_linear(
    x: torch.Tensor,
    packed: torch.Tensor,
    scale_zero: torch.Tensor,
    group_size: int,
    bias: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """W4A16: ``x @ w.T + bias`` with ``w[n, k] = (q[n, k] - zero[n, g]) *
    scale[n, g]`` from the packed weight: ``x [..., K]`` float32, bfloat16,
    float16 or float64, result ``[..., N]`` in x's dtype. In float32
    (float64 activations are rounded to float32), group by group: the
    products ``x * q`` summed, ``zero`` times the row's sum of activations
    over the group taken off, the group's scale applied to the difference;
    every CPU build returns the same bits."""
    return torch.ops.fuseops.int4_weight_only_linear(x, packed, scale_zero, group_size, bias)


def int4_dynamic_linear(
    x: torch.Tensor,
    packed: torch.Tensor,
    scale_zero: torch.Tensor,
    group_size: int,
    bias: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """W4A8: :func:`int4_weight_only_linear`'s packed weight times ``x``
    quantized to int8 per weight group: each ``group_size`` values of a row
    along K get their own scale (``quantize_per_token_int8``'s math within
    the group: ``absmax / 127``, round half to even; a row holding Inf or
    NaN gives NaN), as llama.cpp quantizes activations per block (Q8_1) for
    its Q4_1 dot products. Per group the products ``xq * q`` are summed
    exactly in int32, the zero point's share ``zero * sum(xq)`` taken off,
    and the product of the weight's and the activations' group scales
    applied in float32. On CPUs with AVX512_VNNI the products cost a quarter
    of W4A16's instructions, which is what a decode step needs to run at
    memory speed; the result carries the activations' int8 rounding (about
    0.4% of each group's largest value, where one scale per row let an
    outlier channel set the step for all). Every CPU build returns the same
    bits."""
    return torch.ops.fuseops.int4_dynamic_linear(x, packed, scale_zero, group_size, bias)


def unpack_int4_weight(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """The ``[n, k]`` values (uint8, in [0, 15]) a packed tensor holds."""
    blocks, pairs, _ = packed.shape
    # Also for the bytes held in another dtype (the reference checks hand
    # every tensor over in float64).
    packed = packed.to(torch.uint8)
    low, high = packed & 0xF, packed >> 4
    pairs_first = torch.stack((low, high), dim=-1).permute(0, 2, 1, 3)
    return pairs_first.reshape(blocks * 16, pairs * 2)[:n, :k]


def dequantize_int4_weight(
    packed: torch.Tensor, scale_zero: torch.Tensor, group_size: int, k: int, dtype=torch.float64
) -> torch.Tensor:
    """The weight ``[N, k]`` the packed form stands for, ``(q - zero) *
    scale``, computed in `dtype` (exact in float64)."""
    n = scale_zero.shape[-1]
    q = unpack_int4_weight(packed, n, k).to(dtype)
    group = torch.arange(k, device=packed.device) // group_size
    scale = scale_zero[:, 0, :].t().to(dtype)[:, group]
    zero = scale_zero[:, 1, :].t().to(dtype)[:, group]
    return (q - zero) * scale


def quantize_per_group_int4_reference(weight, group_size=128, symmetric=True):
    # The rule in float32, group by group, written out without the op's
    # padding: the op must give these very values.
    w = weight.to(torch.float32)
    n, k = w.shape
    groups = -(-k // group_size)
    wq = torch.empty(n, k, dtype=torch.uint8, device=w.device)
    scale = torch.empty(n, groups, dtype=torch.float32, device=w.device)
    zero = torch.empty(n, groups, dtype=torch.uint8, device=w.device)
    for g in range(groups):
        part = w[:, g * group_size : (g + 1) * group_size]
        if symmetric:
            extreme = part.gather(1, part.abs().argmax(1, keepdim=True)).squeeze(1)
            s = extreme / -8.0
            z = torch.full_like(s, 8.0)
        else:
            lo = part.amin(1).clamp(max=0)
            hi = part.amax(1).clamp(min=0)
            s = hi / 15.0 - lo / 15.0
            z = torch.round(-lo / torch.where(s == 0, 1.0, s)).clamp(0, 15)
        s = torch.where(s == 0, 1.0, s)
        wq[:, g * group_size : (g + 1) * group_size] = (
            (torch.round(part / s[:, None]) + z[:, None]).clamp(0, 15).to(torch.uint8)
        )
        scale[:, g] = s
        zero[:, g] = z.to(torch.uint8)
    return wq, scale, zero


def pack_int4_weight_reference(wq, scale, zero, group_size):
    wq, zero = wq.to(torch.uint8), zero.to(torch.uint8)
    n, k = wq.shape
    groups = scale.shape[1]
    blocks, k_padded = -(-n // 16), groups * group_size
    padded = torch.nn.functional.pad(wq, (0, k_padded - k, 0, 16 * blocks - n))
    pairs = padded.view(blocks, 16, k_padded // 2, 2)
    packed = (pairs[..., 0] | (pairs[..., 1] << 4)).permute(0, 2, 1).contiguous()
    scale_zero = torch.stack((scale.t(), zero.t().to(scale.dtype)), dim=1)
    return packed, scale_zero


def int4_weight_only_linear_reference(x, packed, scale_zero, group_size, bias=None):
    # In x's dtype, which the conformance suite and the bench make float64
    # (float32 for reduced-precision rows): the weight dequantized exactly.
    w = dequantize_int4_weight(packed, scale_zero, group_size, x.shape[-1], x.dtype)
    y = x @ w.T
    return y if bias is None else y + bias.to(x.dtype)


def int4_dynamic_linear_reference(x, packed, scale_zero, group_size, bias=None):
    # The quantized math in float64: each group of a row quantized in float32
    # exactly as the op does (float64 inputs rounded to float32 first), the
    # products and the zero points' shares exact, the scales applied in
    # float64.
    from .quantize import _quantize_blocks_int8_reference

    groups, k = scale_zero.shape[0], x.shape[-1]
    xq, x_scale = _quantize_blocks_int8_reference(x, group_size, groups)
    w = dequantize_int4_weight(packed, scale_zero, group_size, k, torch.float64)
    w = torch.nn.functional.pad(w, (0, groups * group_size - k))
    w = w.reshape(w.shape[0], groups, group_size)
    per_group = torch.einsum("...gk,ngk->...gn", xq.to(torch.float64), w)
    y = (per_group * x_scale.to(torch.float64).unsqueeze(-1)).sum(-2)
    y = y if bias is None else y + bias.to(torch.float64)
    return y.to(x.dtype)


# --- export: ONNX, ExecuTorch and their test calls (fuseops/ops/_export.py) ---

NOT_EXPORTED = {("quantize_per_group_int4", "pack_int4_weight"): PREPARES_WEIGHTS}


def onnx_translations() -> dict:
    """The int4 linears: the packed weight unpacked with ONNX operators
    (``BitwiseAnd``, ``BitShift``, ``Transpose``, ``Reshape``, ``Slice``); the
    weight-only one dequantizes it in float32 for ``MatMul`` (the group
    scales applied to the weight instead of to each group's sum), the dynamic
    one quantizes the activations per row and weight group as the op does and
    sums the int8 products per group exactly with ``MatMulInteger``, the zero
    points' share (fractional zeros included) taken off each group's sum."""
    from ._onnx import (
        FLOAT,
        INT8,
        INT32,
        INT64,
        UINT8,
        add_bias,
        cast,
        dtype_of,
        ints,
        ir,
        last_slice,
        op,
        opmath,
        quantize_rows,
        static_dim,
    )

    def unpack(packed, n: int):
        """The ``[n, groups * group_size]`` uint8 values (0..15) of
        ``pack_int4_weight``'s layout ``[ceil(N/16), groups * group_size / 2,
        16]`` (zeros past K)."""
        blocks = static_dim(packed, 0, "packed.shape[0]")
        pairs = static_dim(packed, 1, "packed.shape[1]")
        low = op.BitwiseAnd(packed, op.Constant(value=ir.tensor(15, dtype=UINT8)))
        high = op.BitShift(packed, op.Constant(value=ir.tensor(4, dtype=UINT8)), direction="RIGHT")
        both = op.Concat(op.Unsqueeze(low, ints(-1)), op.Unsqueeze(high, ints(-1)), axis=-1)
        q = op.Reshape(op.Transpose(both, perm=[0, 2, 1, 3]), ints(blocks * 16, pairs * 2))
        return op.Slice(q, ints(0), ints(n), ints(0))

    def scale_and_zero(scale_zero):
        """``(scale, zero)``, each float32 ``[groups, N]``."""
        sz = cast(scale_zero, FLOAT)
        scale = op.Gather(sz, op.Constant(value=ir.tensor(0, dtype=INT64)), axis=1)
        zero = op.Gather(sz, op.Constant(value=ir.tensor(1, dtype=INT64)), axis=1)
        return scale, zero

    def int4_weight_only_linear_onnx(input, packed, scale_zero, group_size: int, bias=None):
        """``fuseops::int4_weight_only_linear``: the weight ``(q - zero) *
        scale`` dequantized in float32 with ONNX operators, then ``MatMul`` in
        float32 (the op applies each group's scale to the group's sum
        instead)."""
        n = static_dim(scale_zero, -1, "the output features (scale_zero.shape[-1])")
        k = static_dim(input, -1, "the input features")
        q = last_slice(op.Cast(unpack(packed, n), to=FLOAT), 0, k)
        scale, zero = scale_and_zero(scale_zero)
        group_of = ints(*[j // group_size for j in range(k)])
        # [groups, N] -> [N, k]: each input feature's group.
        scale_k = op.Gather(op.Transpose(scale, perm=[1, 0]), group_of, axis=1)
        zero_k = op.Gather(op.Transpose(zero, perm=[1, 0]), group_of, axis=1)
        w = op.Mul(op.Sub(q, zero_k), scale_k)
        y = op.MatMul(cast(input, FLOAT), op.Transpose(w, perm=[1, 0]))
        return cast(add_bias(y, bias, FLOAT), dtype_of(input))

    def int4_dynamic_linear_onnx(input, packed, scale_zero, group_size: int, bias=None):
        """``fuseops::int4_dynamic_linear``: each group of a row quantized to
        int8 as the op does; per weight group one ``MatMulInteger`` of the
        int8 activations and ``q`` (exact int32 sums), less the zero point
        times the group's sum of the activations, times the product of the
        weight's and the activations' group scales in float32, summed over
        the groups, plus bias."""
        n = static_dim(scale_zero, -1, "the output features (scale_zero.shape[-1])")
        groups = static_dim(scale_zero, 0, "the weight groups (scale_zero.shape[0])")
        k = static_dim(input, -1, "the input features")
        padded = groups * group_size
        dtype = dtype_of(input)
        ct = opmath(dtype)
        # Activations [rows, K] -> [rows, groups, group_size], zeros past K,
        # each group quantized as a row of its own, then [groups, rows,
        # group_size].
        x2d = op.Reshape(input, ints(-1, k))
        if padded != k:
            x2d = op.Pad(x2d, ints(0, 0, 0, padded - k))
        xq, x_scale, bad = quantize_rows(op.Reshape(x2d, ints(-1, groups, group_size)))
        rows = op.Transpose(xq, perm=[1, 0, 2])
        # [rows, groups, 1] -> [groups, rows, 1]
        x_scale = op.Transpose(x_scale, perm=[1, 0, 2])
        bad = op.ReduceSum(bad, ints(1), keepdims=0)  # [rows, 1]
        # Weight [N, groups * group_size] -> q, int8 [groups, group_size, N].
        scale, zero = scale_and_zero(scale_zero)
        q = op.Reshape(op.Cast(unpack(packed, n), to=INT8), ints(n, groups, group_size))
        acc = op.MatMulInteger(rows, op.Transpose(q, perm=[1, 2, 0]))  # [groups, rows, N]
        # The zero point's share, zero * (the group's sum of xq): the zero
        # may be fractional (the scale_min scheme), so it is taken off in
        # float32 (the group's sum is exact there, |sum| < 2^24).
        row_sums = op.ReduceSum(op.Cast(rows, to=INT32), ints(-1), keepdims=1)
        group_sums = op.Sub(
            op.Cast(acc, to=FLOAT),
            op.Mul(op.Cast(row_sums, to=FLOAT), op.Unsqueeze(zero, ints(1))),
        )
        group_scales = op.Mul(op.Unsqueeze(scale, ints(1)), x_scale)  # [groups, rows, N]
        sums = op.ReduceSum(op.Mul(group_sums, group_scales), ints(0), keepdims=0)
        out_shape = op.Concat(op.Shape(input, end=-1), ints(n), axis=0)
        y = op.Add(add_bias(cast(sums, ct), bias, ct), cast(bad, ct))
        y = op.Reshape(y, out_shape)
        return cast(y, dtype)

    ops = torch.ops.fuseops
    return {
        ops.int4_weight_only_linear.default: int4_weight_only_linear_onnx,
        ops.int4_dynamic_linear.default: int4_dynamic_linear_onnx,
    }


def executorch_decompositions() -> dict:
    """The int4 linears: the packed weight unpacked (the two nibbles of each
    byte by integer division, permute, reshape, slice); the weight-only one
    dequantizes it in float32 for the product (the group scales applied to
    the weight instead of to each group's sum), the dynamic one quantizes the
    activations per row and weight group as the op does and sums the integer
    products per group exactly (float64). The ``.pte`` keeps the packed int4
    bytes."""
    from ._executorch import add_bias, opmath, quantize_rows, rows_times

    def unpack(packed, n: int):
        """The ``[n, groups * group_size]`` values (0..15, int32) of
        ``pack_int4_weight``'s layout ``[ceil(N/16), groups * group_size / 2,
        16]`` (zeros past K)."""
        blocks, pairs = packed.shape[0], packed.shape[1]
        p = packed.to(torch.int32)
        high = torch.div(p, 16, rounding_mode="floor")
        low = p - high * 16
        both = torch.stack((low, high), dim=-1)  # [blocks, pairs, 16, 2]
        return both.permute(0, 2, 1, 3).reshape(blocks * 16, pairs * 2)[:n]

    def scale_and_zero(scale_zero):
        """``(scale, zero)``, each float32 ``[groups, N]``."""
        sz = scale_zero.to(torch.float32)
        return sz[:, 0, :], sz[:, 1, :]

    def int4_weight_only_linear_decomposition(
        input, packed, scale_zero, group_size: int, bias=None
    ):
        """``fuseops::int4_weight_only_linear``: the weight ``(q - zero) *
        scale`` dequantized in float32, then the product in float32 (the op
        applies each group's scale to the group's sum instead)."""
        groups, n = scale_zero.shape[0], scale_zero.shape[-1]
        k = input.shape[-1]
        q = unpack(packed, n).to(torch.float32).reshape(n, groups, group_size)
        scale, zero = scale_and_zero(scale_zero)
        w = (q - zero.t().unsqueeze(-1)) * scale.t().unsqueeze(-1)
        x2d = input.to(torch.float32).reshape(-1, k)
        y = rows_times(x2d, w.reshape(n, groups * group_size)[:, :k], input.shape[:-1] + (n,))
        return add_bias(y, bias, torch.float32).to(input.dtype)

    def int4_dynamic_linear_decomposition(input, packed, scale_zero, group_size: int, bias=None):
        """``fuseops::int4_dynamic_linear``: each group of a row quantized to
        int8 as the op does; per weight group the products of the int8
        activations and ``q - zero`` summed exactly (float64), each group's
        sum times the product of the weight's and the activations' group
        scales in float32, summed over the groups, plus bias."""
        groups, n = scale_zero.shape[0], scale_zero.shape[-1]
        k = input.shape[-1]
        padded = groups * group_size
        dtype = input.dtype
        ct = opmath(dtype)
        # Activations [rows, K] -> [rows, groups, group_size], zeros past K,
        # each group quantized as a row of its own, then [groups, rows,
        # group_size].
        x2d = input.reshape(-1, k)
        if padded != k:
            x2d = torch.nn.functional.pad(x2d, (0, padded - k))
        xq, x_scale = quantize_rows(x2d.reshape(-1, groups, group_size))
        rows = xq.to(torch.float64).permute(1, 0, 2)
        x_scale = x_scale.permute(1, 0, 2)  # [groups, rows, 1]
        # Weight q - zero as [groups, group_size, N].
        scale, zero = scale_and_zero(scale_zero)
        q = unpack(packed, n).to(torch.float64).reshape(n, groups, group_size)
        w = (q - zero.t().to(torch.float64).unsqueeze(-1)).permute(1, 2, 0)
        acc = torch.bmm(rows, w)  # [groups, rows, N], exact integers
        sums = (acc.to(torch.float32) * (scale.unsqueeze(1) * x_scale)).sum(dim=0)
        y = sums.reshape(input.shape[:-1] + (n,)).to(ct)
        return add_bias(y, bias, ct).to(dtype)

    ops = torch.ops.fuseops
    return {
        ops.int4_weight_only_linear.default: int4_weight_only_linear_decomposition,
        ops.int4_dynamic_linear.default: int4_dynamic_linear_decomposition,
    }


__all__ = [
    "dequantize_int4_weight",
    "int4_dynamic_linear",
    "int4_weight_only_linear",
    "pack_int4_weight",
    "quantize_per_group_int4",
    "unpack_int4_weight",
]
