"""int8 linear layers: weight packing, the W8A16 linear
(``int8_weight_only_linear``) and the W8A8 dynamic one
(``int8_dynamic_linear``), plus ``quantize_``, which swaps a model's
``nn.Linear`` layers for ``fuseops.nn.Int8Linear``.

Weights are quantized per output channel (``quantize_per_channel_int8``),
then packed (``pack_int8_weight``) into the layout the kernels stream:
``packed[b, g, c, j] = wq[16*b + c, 4*g + j]`` (int8, shape
``[ceil(N/16), ceil(K/4), 16, 4]``, zeros past N and K), kept with the
float32 scales ``[N]`` and the int16 sums ``colsum [ceil(K/32), N]``,
``colsum[b, n] = sum of wq[n, k] over activation block b`` (K in blocks of
32; the W8A8 kernels' correction, block by block, for activations shifted to
unsigned). All three are
ordinary tensors: a module keeps them as buffers, ``state_dict`` round-trips
them, and ``torch.compile``/``torch.export`` see plain tensors.

These are inference ops: they have no derivative, and called on tensors that
require grad with grad mode on they raise (use ``torch.no_grad()`` or
``torch.inference_mode()``).
"""

from __future__ import annotations

from typing import Optional

import torch

from ._export import PREPARES_WEIGHTS


def pack_int8_weight(
    wq: torch.Tensor, scale: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(packed, scale, colsum)`` of an int8 weight ``wq [N, K]`` with
    per-channel float32 ``scale [N]`` (module docstring for the layout)."""
    return torch.ops.fuseops.pack_int8_weight(wq, scale)


def int8_weight_only_linear(
    x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, bias: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """``x @ (wq * scale[:, None]).T + bias`` with the packed int8 weight:
    ``x [..., K]`` float32, bfloat16, float16 or float64, result ``[..., N]``
    in x's dtype. Products are summed in float32 (float64 activations are
    rounded to float32) and each channel's scale is applied once to its sum:
    ``y[m, n] = scale[n] * sum_k x[m, k] * wq[n, k] + bias[n]``."""
    return torch.ops.fuseops.int8_weight_only_linear(x, packed, scale, bias)


def int8_dynamic_linear(
    x: torch.Tensor,
    packed: torch.Tensor,
    scale: torch.Tensor,
    colsum: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """W8A8 dynamic: ``x [..., K]`` (float32, bfloat16, float16 or float64)
    quantized on the fly per activation block of 32 along K, each block of a
    row as ``quantize_per_token_int8`` quantizes a row (``x_scale[m, b] =
    absmax / 127``, ``xq = round(x / x_scale)``; llama.cpp's Q8_0
    activations): one scale per row let an outlier channel set every other
    value's step, +2.5-5.8% perplexity on real models where per block costs
    +0.1-0.4%. Each block's int8 products are summed exactly in int32 and
    folded into a float32 accumulator, block after block: ``acc = fma(x_scale[m,
    b], sum_b, acc)``; then ``y[m, n] = acc * scale[n] + bias[n]`` in float32
    (float64 for float64 x), rounded to x's dtype. ``(packed, scale,
    colsum)`` as ``pack_int8_weight`` returns them. A row holding Inf or NaN
    gives a row of NaN."""
    return torch.ops.fuseops.int8_dynamic_linear(x, packed, scale, colsum, bias)


def unpack_int8_weight(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """The ``[n, k]`` weight a packed tensor holds (in packed's dtype)."""
    blocks, groups = packed.shape[:2]
    return packed.permute(0, 2, 1, 3).reshape(blocks * 16, groups * 4)[:n, :k]


# K values per activation scale of int8_dynamic_linear (and per colsum row).
ACTIVATION_BLOCK = 32


def block_colsum(wq: torch.Tensor) -> torch.Tensor:
    """``colsum`` (int16 ``[ceil(K/32), N]``) of an int8 weight ``wq [N,
    K]``: the sum of each channel's weights over each activation block
    (zeros past K; at most 32 * 128 in magnitude)."""
    n, k = wq.shape
    blocks = -(-k // ACTIVATION_BLOCK)
    padded = torch.nn.functional.pad(wq, (0, blocks * ACTIVATION_BLOCK - k))
    sums = padded.view(n, blocks, ACTIVATION_BLOCK).sum(-1, dtype=torch.int32)
    return sums.t().to(torch.int16).contiguous()


def colsum_of_packed(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """``block_colsum`` of the weight a packed tensor holds, without
    unpacking it (a model's head can be hundreds of MB)."""
    blocks, groups = packed.shape[:2]
    activation_blocks = -(-k // ACTIVATION_BLOCK)
    per_group = packed.sum(-1, dtype=torch.int32)  # [blocks, groups, 16]
    spare = activation_blocks * (ACTIVATION_BLOCK // 4) - groups
    per_group = torch.nn.functional.pad(per_group, (0, 0, 0, spare))
    sums = per_group.view(blocks, activation_blocks, ACTIVATION_BLOCK // 4, 16).sum(2)
    return (
        sums.permute(1, 0, 2)
        .reshape(activation_blocks, blocks * 16)[:, :n]
        .to(torch.int16)
        .contiguous()
    )


def pack_int8_weight_reference(wq: torch.Tensor, scale: torch.Tensor):
    n, k = wq.shape
    blocks, groups = -(-n // 16), -(-k // 4)
    padded = torch.nn.functional.pad(wq, (0, 4 * groups - k, 0, 16 * blocks - n))
    packed = padded.view(blocks, 16, groups, 4).permute(0, 2, 1, 3).contiguous()
    return packed, scale.clone(), block_colsum(wq)


def int8_weight_only_linear_reference(x, packed, scale, bias=None):
    # In x's dtype, which the conformance suite and the bench make float64
    # (float32 for reduced-precision rows): a weight dequantized exactly.
    w = unpack_int8_weight(packed, scale.shape[0], x.shape[-1]).to(x.dtype)
    y = (x @ w.T) * scale.to(x.dtype)
    return y if bias is None else y + bias.to(x.dtype)


def int8_dynamic_linear_reference(x, packed, scale, colsum, bias=None):
    # The quantized math in float64: each activation block of a row quantized
    # in float32 exactly as the op does (float64 inputs rounded to float32
    # first), the int8 products summed exactly (|sum| < 2^53), the scales
    # applied in float64.
    from .quantize import _quantize_blocks_int8_reference

    n, k = scale.shape[0], x.shape[-1]
    blocks = -(-k // ACTIVATION_BLOCK)
    xq, x_scale = _quantize_blocks_int8_reference(x, ACTIVATION_BLOCK, blocks)
    w = unpack_int8_weight(packed, n, k).to(torch.float64)
    w = torch.nn.functional.pad(w, (0, blocks * ACTIVATION_BLOCK - k))
    per_block = torch.einsum(
        "...bk,nbk->...bn", xq.to(torch.float64), w.reshape(n, blocks, ACTIVATION_BLOCK)
    )
    y = (per_block * x_scale.to(torch.float64).unsqueeze(-1)).sum(-2) * scale.to(torch.float64)
    y = y if bias is None else y + bias.to(torch.float64)
    return y.to(x.dtype)


# --- export: ONNX, ExecuTorch and their test calls (fuseops/ops/_export.py) ---

NOT_EXPORTED = {("pack_int8_weight",): PREPARES_WEIGHTS}


def onnx_translations() -> dict:
    """The int8 linears: the packed weight unpacked with ONNX operators
    (``Transpose``, ``Reshape``, ``Slice``); the weight-only one dequantizes
    it in float32 for ``MatMul``, the dynamic one quantizes the activations
    per block of 32 as the op does (``absmax / 127``, ``Round`` half to even)
    and sums each block's int8 products exactly in int32 with
    ``MatMulInteger`` (``DynamicQuantizeLinear`` does not apply: it quantizes
    a whole tensor asymmetrically to uint8)."""
    from ._onnx import FLOAT, add_bias, cast, dtype_of, ints, op, opmath, quantize_rows, static_dim

    def unpack(packed, n: int, k: int):
        """The ``[n, k]`` int8 weight of ``pack_int8_weight``'s layout
        ``[ceil(N/16), ceil(K/4), 16, 4]``."""
        blocks = static_dim(packed, 0, "packed.shape[0]")
        groups = static_dim(packed, 1, "packed.shape[1]")
        w = op.Reshape(op.Transpose(packed, perm=[0, 2, 1, 3]), ints(blocks * 16, groups * 4))
        return op.Slice(w, ints(0, 0), ints(n, k), ints(0, 1))

    def int8_weight_only_linear_onnx(input, packed, scale, bias=None):
        """``fuseops::int8_weight_only_linear``: ``x @ wq.T * scale + bias`` in
        float32, the int8 weight unpacked and cast to float32 (exact), the
        channel's scale applied to each sum as the op does."""
        n = static_dim(scale, 0, "the output features (scale.shape[0])")
        k = static_dim(input, -1, "the input features")
        w = op.Cast(unpack(packed, n, k), to=FLOAT)
        y = op.Mul(op.MatMul(cast(input, FLOAT), op.Transpose(w, perm=[1, 0])), cast(scale, FLOAT))
        return cast(add_bias(y, bias, FLOAT), dtype_of(input))

    def int8_dynamic_linear_onnx(input, packed, scale, colsum, bias=None):
        """``fuseops::int8_dynamic_linear``: each activation block of 32 of a
        row quantized as the op does, one ``MatMulInteger`` per block (exact
        int32 sums), each block's sums times its scale in float32, summed
        over the blocks, then ``* scale + bias`` in float32 (float64 for
        float64 input). ``colsum`` is the op's correction for its unsigned
        activations: unused here."""
        del colsum
        n = static_dim(scale, 0, "the output features (scale.shape[0])")
        k = static_dim(input, -1, "the input features")
        blocks = -(-k // ACTIVATION_BLOCK)
        padded = blocks * ACTIVATION_BLOCK
        dtype = dtype_of(input)
        ct = opmath(dtype)
        # Activations [rows, K] -> [rows, blocks, 32], zeros past K, each
        # block quantized as a row of its own, then [blocks, rows, 32].
        x2d = op.Reshape(input, ints(-1, k))
        w = unpack(packed, n, k)
        if padded != k:
            x2d = op.Pad(x2d, ints(0, 0, 0, padded - k))
            w = op.Pad(w, ints(0, 0, 0, padded - k))
        xq, x_scale, bad = quantize_rows(op.Reshape(x2d, ints(-1, blocks, ACTIVATION_BLOCK)))
        rows = op.Transpose(xq, perm=[1, 0, 2])
        x_scale = op.Transpose(x_scale, perm=[1, 0, 2])  # [blocks, rows, 1]
        bad = op.ReduceSum(bad, ints(1), keepdims=0)  # [rows, 1]
        # Weight [N, blocks * 32] -> [blocks, 32, N].
        w = op.Transpose(op.Reshape(w, ints(n, blocks, ACTIVATION_BLOCK)), perm=[1, 2, 0])
        acc = op.MatMulInteger(rows, w)  # [blocks, rows, N]
        sums = op.ReduceSum(op.Mul(op.Cast(acc, to=FLOAT), x_scale), ints(0), keepdims=0)
        y = op.Mul(cast(sums, ct), cast(scale, ct))
        y = op.Add(add_bias(y, bias, ct), cast(bad, ct))
        out_shape = op.Concat(op.Shape(input, end=-1), ints(n), axis=0)
        return cast(op.Reshape(y, out_shape), dtype)

    ops = torch.ops.fuseops
    return {
        ops.int8_weight_only_linear.default: int8_weight_only_linear_onnx,
        ops.int8_dynamic_linear.default: int8_dynamic_linear_onnx,
    }


def executorch_decompositions() -> dict:
    """The int8 linears: the packed weight unpacked (permute, reshape,
    slice); the weight-only one dequantizes it in float32 for the product,
    the dynamic one quantizes the activations per block of 32 as the op does
    (``absmax / 127``, round half to even, clamp to [-127, 127]) and sums
    each block's integer products exactly (in float64, exact for the int8
    ranges). The ``.pte`` keeps the packed int8 bytes."""
    from ._executorch import add_bias, opmath, quantize_rows, rows_times

    def unpack(packed, n: int, k: int):
        """The ``[n, k]`` int8 weight of ``pack_int8_weight``'s layout
        ``[ceil(N/16), ceil(K/4), 16, 4]``."""
        blocks, groups = packed.shape[0], packed.shape[1]
        return packed.permute(0, 2, 1, 3).reshape(blocks * 16, groups * 4)[:n, :k]

    def int8_weight_only_linear_decomposition(input, packed, scale, bias=None):
        """``fuseops::int8_weight_only_linear``: ``x @ wq.T * scale + bias`` in
        float32, the int8 weight unpacked and cast to float32 (exact), the
        channel's scale applied to each sum as the op does."""
        n, k = scale.shape[0], input.shape[-1]
        w = unpack(packed, n, k).to(torch.float32)
        x2d = input.to(torch.float32).reshape(-1, k)
        y = rows_times(x2d, w, input.shape[:-1] + (n,)) * scale.to(torch.float32)
        return add_bias(y, bias, torch.float32).to(input.dtype)

    def int8_dynamic_linear_decomposition(input, packed, scale, colsum, bias=None):
        """``fuseops::int8_dynamic_linear``: each activation block of 32 of a
        row quantized as the op does, each block's integer products summed
        exactly (float64) and times its scale in float32, summed over the
        blocks, then ``* scale + bias`` in float32 (float64 for float64
        input). ``colsum`` is the op's correction for its unsigned
        activations: unused here."""
        del colsum
        n, k = scale.shape[0], input.shape[-1]
        blocks = -(-k // ACTIVATION_BLOCK)
        padded = blocks * ACTIVATION_BLOCK
        dtype = input.dtype
        ct = opmath(dtype)
        x2d = input.reshape(-1, k)
        w = unpack(packed, n, k).to(torch.float64)
        if padded != k:
            x2d = torch.nn.functional.pad(x2d, (0, padded - k))
            w = torch.nn.functional.pad(w, (0, padded - k))
        xq, x_scale = quantize_rows(x2d.reshape(-1, blocks, ACTIVATION_BLOCK))
        rows = xq.to(torch.float64).permute(1, 0, 2)  # [blocks, rows, 32]
        w = w.reshape(n, blocks, ACTIVATION_BLOCK).permute(1, 2, 0)  # [blocks, 32, N]
        acc = torch.bmm(rows, w)  # [blocks, rows, N], exact integers
        sums = (acc.to(torch.float32) * x_scale.permute(1, 0, 2)).sum(dim=0)
        y = sums.reshape(input.shape[:-1] + (n,)).to(ct) * scale.to(ct)
        return add_bias(y, bias, ct).to(dtype)

    ops = torch.ops.fuseops
    return {
        ops.int8_weight_only_linear.default: int8_weight_only_linear_decomposition,
        ops.int8_dynamic_linear.default: int8_dynamic_linear_decomposition,
    }


__all__ = [
    "int8_dynamic_linear",
    "int8_weight_only_linear",
    "pack_int8_weight",
    "unpack_int8_weight",
]
