"""ONNX export of models that call fuseops ops: ONNX functions for the
inference ops, for ``torch.onnx.export(..., dynamo=True)``.

``torch.onnx.export`` does not know the ``torch.ops.fuseops.*`` ops: a
model calling them fails to export unless it is given an ONNX function for
each one. :func:`custom_translation_table` returns them (keys: the ops'
overloads, values: functions writing standard ONNX opset-23 operators),
and :func:`export` calls ``torch.onnx.export`` with that table, opset 23,
after checking that every fuseops op in the model has a translation::

    onnx_program = fuseops.onnx.export(model, (x,), "model.onnx")

Each function computes what the op computes, in the op's precision:
bfloat16 and float16 inputs are cast to float32, computed there and rounded
once to their dtype, as the fuseops kernels do (float64 stays float64). The
ONNX graph may order float sums differently (matrix products, row
reductions), as any two implementations of the op do. What each op becomes:

- ``rms_norm``, ``fused_add_rms_norm``: ONNX ``RMSNormalization`` (the
  residual add in the input's dtype, as the op rounds it); ``layer_norm``:
  ``LayerNormalization``; float64 inputs are decomposed (those operators
  keep their statistics in float32).
- ``gelu`` (both approximations), ``bias_gelu``, ``geglu``: ONNX ``Gelu``
  (opset 20); ``silu``, ``swiglu``: ``x * Sigmoid(x)``; ``relu``: ``Relu``.
  The packed forms of the gated activations split the input in two halves.
- ``rope`` (and ``rope.single``): a decomposition (Gather of the cache rows
  by position, Slice, Neg, Concat, Mul, Add), since the op takes any
  ``cos``/``sin`` rows where ONNX ``RotaryEmbedding`` takes half-width
  caches; partial rotary and GPT-J's interleaved pairs included.
- ``int8_weight_only_linear``, ``int4_weight_only_linear``: the packed
  weight unpacked with ONNX operators (Transpose, Reshape, Slice; for int4
  BitwiseAnd and BitShift), dequantized in float32 and multiplied with
  ``MatMul``: the op's float32 math, its per-channel (int8) or per-group
  (int4) scaling applied to the weight instead of to each group's sum.
- ``int8_dynamic_linear``, ``int4_dynamic_linear``: the activations
  quantized per row as the op does (``absmax / 127``, ``Round`` half to
  even), the int8 products summed exactly in int32 by ``MatMulInteger``
  (for int4 one product per weight group, with the zero points taken off
  the weight), then the scales in float32. ``DynamicQuantizeLinear`` does
  not apply: it quantizes the whole tensor asymmetrically to uint8.
- ``decode_attention``: a decomposition (key/value heads expanded to their
  query heads, ``MatMul``, ``Tanh`` for the softcap, ``Where`` for the mask
  and causal limit, ``Softmax``); ONNX's ``Attention`` (opset 23) returns
  NaN, not zeros, for a row that sees no key.

Not translated (:data:`NOT_TRANSLATED` says why for each): the backward
ops (training), the ``out=`` overloads (an exported graph is functional),
the losses (``cross_entropy``, the fused LM head), the quantization and
packing ops (they prepare weights once, before export), and, still to come,
``causal_conv1d`` and the 2:4 sparse linears.

Limits: shapes are static (the fuseops ops' shape functions specialize
symbolic sizes, so ``torch.export`` with ``dynamic_shapes`` fails on them).
rope's positions are gathered with ONNX ``Gather``, which takes a negative
position ``p >= -max_pos`` as ``max_pos + p`` where the op raises.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

try:
    from onnxscript import ir
    from onnxscript import opset23 as op
except ImportError as error:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "fuseops.onnx needs onnxscript, onnx and (to run the models) onnxruntime: "
        "pip install 'fuseops[onnx]'"
    ) from error

#: The opset the functions write (RMSNormalization is opset 23).
OPSET = 23

_FLOAT = ir.DataType.FLOAT
_DOUBLE = ir.DataType.DOUBLE
_INT8 = ir.DataType.INT8
_INT32 = ir.DataType.INT32
_INT64 = ir.DataType.INT64
_UINT8 = ir.DataType.UINT8


# --- helpers -----------------------------------------------------------------


def _opmath(dtype: ir.DataType) -> ir.DataType:
    """The dtype fuseops computes in: float64 for float64, else float32."""
    return _DOUBLE if dtype == _DOUBLE else _FLOAT


def _dtype(x) -> ir.DataType:
    # The graph's inputs carry their dtype; the values the functions compute
    # need not (the tracer does not infer them), so each function takes the
    # dtype of its op's inputs and hands it on.
    if x.dtype is None:
        raise ValueError(f"fuseops.onnx: the dtype of {x.name!r} is unknown")
    return x.dtype


def _cast(x, dtype: ir.DataType):
    return x if x.dtype == dtype else op.Cast(x, to=dtype)


def _scalar(value: float, dtype: ir.DataType):
    return op.Constant(value=ir.tensor(value, dtype=dtype))


def _ints(*values: int):
    return op.Constant(value=ir.tensor(list(values), dtype=_INT64))


def _static_dim(value, axis: int, what: str) -> int:
    dim = value.shape[axis] if value.shape is not None else None
    if not isinstance(dim, int):
        raise ValueError(f"fuseops.onnx: {what} must be static in the exported graph (got {dim!r})")
    return dim


def _last_slice(x, start: int, end: int, step: int = 1):
    return op.Slice(x, _ints(start), _ints(end), _ints(-1), _ints(step))


def _check_approximate(approximate: str) -> str:
    if approximate not in ("none", "tanh"):
        raise ValueError(f"fuseops.onnx: approximate must be 'none' or 'tanh', got {approximate!r}")
    return approximate


# --- normalization -----------------------------------------------------------


def _rms_norm(x, weight, eps: Optional[float], dtype: ir.DataType):
    ct = _opmath(dtype)
    if eps is None:  # F.rms_norm's default, as the op's
        eps = torch.finfo(torch.float64 if ct == _DOUBLE else torch.float32).eps
    xc = _cast(x, ct)
    if ct == _FLOAT:
        if weight is None:
            hidden = op.Shape(xc, start=-1)
            scale = op.ConstantOfShape(hidden, value=ir.tensor([1.0], dtype=_FLOAT))
        else:
            scale = _cast(weight, _FLOAT)
        y = op.RMSNormalization(xc, scale, axis=-1, epsilon=eps, stash_type=1)
    else:
        # RMSNormalization keeps its statistics in float32: float64 by hand.
        mean_square = op.ReduceMean(op.Mul(xc, xc), _ints(-1), keepdims=1)
        y = op.Mul(xc, op.Reciprocal(op.Sqrt(op.Add(mean_square, _scalar(eps, ct)))))
        if weight is not None:
            y = op.Mul(y, _cast(weight, ct))
    return _cast(y, dtype)


def rms_norm(input, weight=None, eps: Optional[float] = None):
    """``fuseops::rms_norm``: ``RMSNormalization`` over the last dimension."""
    return _rms_norm(input, weight, eps, _dtype(input))


def fused_add_rms_norm(input, residual, weight=None, eps: Optional[float] = None):
    """``fuseops::fused_add_rms_norm``: ``(rms_norm(x + residual), x + residual)``
    with the sum rounded to the input's dtype (a float32 sum of two
    bfloat16/float16 values rounds to the same value as their sum does)."""
    dtype = _dtype(input)
    ct = _opmath(dtype)
    new_residual = _cast(op.Add(_cast(input, ct), _cast(residual, ct)), dtype)
    return _rms_norm(new_residual, weight, eps, dtype), new_residual


def layer_norm(input, weight=None, bias=None, eps: float = 1e-5):
    """``fuseops::layer_norm``: ``LayerNormalization`` over the last dimension."""
    dtype = _dtype(input)
    ct = _opmath(dtype)
    xc = _cast(input, ct)
    if ct == _FLOAT:
        if weight is None:
            hidden = op.Shape(xc, start=-1)
            scale = op.ConstantOfShape(hidden, value=ir.tensor([1.0], dtype=_FLOAT))
        else:
            scale = _cast(weight, _FLOAT)
        b = None if bias is None else _cast(bias, _FLOAT)
        y = op.LayerNormalization(xc, scale, b, axis=-1, epsilon=eps, stash_type=1)
        if isinstance(y, (tuple, list)):
            y = y[0]
    else:
        # LayerNormalization keeps its statistics in float32: float64 by hand.
        centered = op.Sub(xc, op.ReduceMean(xc, _ints(-1), keepdims=1))
        var = op.ReduceMean(op.Mul(centered, centered), _ints(-1), keepdims=1)
        y = op.Div(centered, op.Sqrt(op.Add(var, _scalar(eps, ct))))
        if weight is not None:
            y = op.Mul(y, _cast(weight, ct))
        if bias is not None:
            y = op.Add(y, _cast(bias, ct))
    return _cast(y, dtype)


# --- activations -------------------------------------------------------------


def _gelu_math(x, approximate: str):
    return op.Gelu(x, approximate=_check_approximate(approximate))


def _silu_math(x):
    return op.Mul(x, op.Sigmoid(x))


def gelu(input, approximate: str = "none"):
    """``fuseops::gelu``: ONNX ``Gelu`` (erf or tanh form) in float32."""
    dtype = _dtype(input)
    return _cast(_gelu_math(_cast(input, _opmath(dtype)), approximate), dtype)


def silu(input):
    """``fuseops::silu``: ``x * Sigmoid(x)`` in float32."""
    dtype = _dtype(input)
    return _cast(_silu_math(_cast(input, _opmath(dtype))), dtype)


def relu(input):
    """``fuseops::relu``: ``Relu`` (exact in every dtype; computed in float32
    for bfloat16/float16, which ONNX Runtime's Relu does not take)."""
    dtype = _dtype(input)
    return _cast(op.Relu(_cast(input, _opmath(dtype))), dtype)


def bias_gelu(input, bias, approximate: str = "none"):
    """``fuseops::bias_gelu``: ``Gelu(x + bias)``, the sum kept in float32 as
    the op keeps it."""
    dtype = _dtype(input)
    ct = _opmath(dtype)
    return _cast(_gelu_math(op.Add(_cast(input, ct), _cast(bias, ct)), approximate), dtype)


def _halves(input):
    """``(gate, up)``: the two halves of a packed input's last dimension."""
    gate, up = op.Split(input, num_outputs=2, axis=-1)
    return gate, up


def _gated(gate, up, activation, dtype: ir.DataType):
    ct = _opmath(dtype)
    return _cast(op.Mul(activation(_cast(gate, ct)), _cast(up, ct)), dtype)


def swiglu(gate, up):
    """``fuseops::swiglu``: ``silu(gate) * up`` in float32."""
    return _gated(gate, up, _silu_math, _dtype(gate))


def swiglu_packed(input):
    """``fuseops::swiglu.packed``: the gate is the first half of the last
    dimension, up the second."""
    gate, up = _halves(input)
    return _gated(gate, up, _silu_math, _dtype(input))


def geglu(gate, up, approximate: str = "none"):
    """``fuseops::geglu``: ``gelu(gate) * up`` in float32."""
    return _gated(gate, up, lambda x: _gelu_math(x, approximate), _dtype(gate))


def geglu_packed(input, approximate: str = "none"):
    """``fuseops::geglu.packed``."""
    gate, up = _halves(input)
    return _gated(gate, up, lambda x: _gelu_math(x, approximate), _dtype(input))


# --- rope --------------------------------------------------------------------


def _rotate(x, rotary_dim: int, interleaved: bool):
    """``rotate_half`` (pairs (j, j + rd/2)) or GPT-J's (pairs (2j, 2j+1))."""
    if interleaved:
        even = op.Unsqueeze(_last_slice(x, 0, rotary_dim, 2), _ints(-1))
        odd = op.Unsqueeze(_last_slice(x, 1, rotary_dim, 2), _ints(-1))
        return op.Reshape(op.Concat(op.Neg(odd), even, axis=-1), op.Shape(x))
    half = rotary_dim // 2
    return op.Concat(op.Neg(_last_slice(x, half, rotary_dim)), _last_slice(x, 0, half), axis=-1)


def _rope_one(x, cos, sin, positions, interleaved: bool):
    # As the kernel: the cache rows (gathered by position) in float32
    # whatever the cache's dtype, x[..., :rd] * cos + rotate(x[..., :rd]) *
    # sin in float32, the rest of head_dim unchanged, rounded once.
    rotary_dim = _static_dim(cos, -1, "the rotary dim (cos.shape[-1])")
    head_dim = _static_dim(x, -1, "head_dim")
    dtype = _dtype(x)
    ct = _opmath(dtype)
    c, s = cos, sin
    if positions is not None:
        c, s = op.Gather(cos, positions, axis=0), op.Gather(sin, positions, axis=0)
    c = op.Unsqueeze(_cast(c, ct), _ints(-2))  # one row for all heads
    s = op.Unsqueeze(_cast(s, ct), _ints(-2))
    xc = _cast(x, ct)
    rot = xc if rotary_dim == head_dim else _last_slice(xc, 0, rotary_dim)
    rotated = op.Add(op.Mul(rot, c), op.Mul(_rotate(rot, rotary_dim, interleaved), s))
    if rotary_dim != head_dim:
        rotated = op.Concat(rotated, _last_slice(xc, rotary_dim, head_dim), axis=-1)
    return _cast(rotated, dtype)


def rope(query, key, cos, sin, positions=None, interleaved: bool = False):
    """``fuseops::rope``: query and key rotated (a decomposition: the op
    takes full-width ``cos``/``sin`` rows of any values, which ONNX
    ``RotaryEmbedding``'s half-width caches cannot express)."""
    return (
        _rope_one(query, cos, sin, positions, interleaved),
        _rope_one(key, cos, sin, positions, interleaved),
    )


def rope_single(input, cos, sin, positions=None, interleaved: bool = False):
    """``fuseops::rope.single``: rope without a key."""
    return _rope_one(input, cos, sin, positions, interleaved)


# --- quantized linear layers -------------------------------------------------


def _quantize_rows(x):
    """``quantize_per_token_int8`` in float32: ``(xq int8, x_scale [..., 1],
    bad [..., 1])`` where ``bad`` is 0 for a finite row and NaN for a row
    holding Inf or NaN (added to the result, it makes that row NaN, as the
    op's)."""
    xf = _cast(x, _FLOAT)
    x_scale = op.Div(op.ReduceMax(op.Abs(xf), _ints(-1), keepdims=1), _scalar(127.0, _FLOAT))
    x_scale = op.Where(op.Equal(x_scale, _scalar(0.0, _FLOAT)), _scalar(1.0, _FLOAT), x_scale)
    q = op.Clip(op.Round(op.Div(xf, x_scale)), _scalar(-127.0, _FLOAT), _scalar(127.0, _FLOAT))
    # NaN would be undefined in the Cast to int8: zeros there, the row is NaN anyway.
    q = op.Where(op.IsNaN(q), _scalar(0.0, _FLOAT), q)
    bad = op.ReduceSum(op.Mul(xf, _scalar(0.0, _FLOAT)), _ints(-1), keepdims=1)
    return op.Cast(q, to=_INT8), x_scale, bad


def _unpack_int8(packed, n: int, k: int):
    """The ``[n, k]`` int8 weight of ``pack_int8_weight``'s layout
    ``[ceil(N/16), ceil(K/4), 16, 4]``."""
    blocks = _static_dim(packed, 0, "packed.shape[0]")
    groups = _static_dim(packed, 1, "packed.shape[1]")
    w = op.Reshape(op.Transpose(packed, perm=[0, 2, 1, 3]), _ints(blocks * 16, groups * 4))
    return op.Slice(w, _ints(0, 0), _ints(n, k), _ints(0, 1))


def _add_bias(y, bias, ct):
    return y if bias is None else op.Add(y, _cast(bias, ct))


def int8_weight_only_linear(input, packed, scale, bias=None):
    """``fuseops::int8_weight_only_linear``: ``x @ wq.T * scale + bias`` in
    float32, the int8 weight unpacked and cast to float32 (exact), the
    channel's scale applied to each sum as the op does."""
    n = _static_dim(scale, 0, "the output features (scale.shape[0])")
    k = _static_dim(input, -1, "the input features")
    w = op.Cast(_unpack_int8(packed, n, k), to=_FLOAT)
    y = op.Mul(op.MatMul(_cast(input, _FLOAT), op.Transpose(w, perm=[1, 0])), _cast(scale, _FLOAT))
    return _cast(_add_bias(y, bias, _FLOAT), _dtype(input))


def int8_dynamic_linear(input, packed, scale, colsum, bias=None):
    """``fuseops::int8_dynamic_linear``: the rows quantized as the op does,
    ``MatMulInteger`` (exact int32 sums), then ``(acc * x_scale) * scale +
    bias`` in float32 (float64 for float64 input). ``colsum`` is the op's
    correction for its unsigned activations: unused here."""
    del colsum
    n = _static_dim(scale, 0, "the output features (scale.shape[0])")
    k = _static_dim(input, -1, "the input features")
    dtype = _dtype(input)
    ct = _opmath(dtype)
    xq, x_scale, bad = _quantize_rows(input)
    wt = op.Transpose(_unpack_int8(packed, n, k), perm=[1, 0])
    acc = op.MatMulInteger(xq, wt)
    y = op.Mul(op.Mul(op.Cast(acc, to=ct), _cast(x_scale, ct)), _cast(scale, ct))
    y = op.Add(_add_bias(y, bias, ct), _cast(bad, ct))
    return _cast(y, dtype)


def _unpack_int4(packed, n: int):
    """The ``[n, groups * group_size]`` uint8 values (0..15) of
    ``pack_int4_weight``'s layout ``[ceil(N/16), groups * group_size / 2,
    16]`` (zeros past K)."""
    blocks = _static_dim(packed, 0, "packed.shape[0]")
    pairs = _static_dim(packed, 1, "packed.shape[1]")
    low = op.BitwiseAnd(packed, op.Constant(value=ir.tensor(15, dtype=_UINT8)))
    high = op.BitShift(packed, op.Constant(value=ir.tensor(4, dtype=_UINT8)), direction="RIGHT")
    both = op.Concat(op.Unsqueeze(low, _ints(-1)), op.Unsqueeze(high, _ints(-1)), axis=-1)
    q = op.Reshape(op.Transpose(both, perm=[0, 2, 1, 3]), _ints(blocks * 16, pairs * 2))
    return op.Slice(q, _ints(0), _ints(n), _ints(0))


def _scale_zero(scale_zero):
    """``(scale, zero)``, each float32 ``[groups, N]``."""
    sz = _cast(scale_zero, _FLOAT)
    scale = op.Gather(sz, op.Constant(value=ir.tensor(0, dtype=_INT64)), axis=1)
    zero = op.Gather(sz, op.Constant(value=ir.tensor(1, dtype=_INT64)), axis=1)
    return scale, zero


def int4_weight_only_linear(input, packed, scale_zero, group_size: int, bias=None):
    """``fuseops::int4_weight_only_linear``: the weight ``(q - zero) * scale``
    dequantized in float32 with ONNX operators, then ``MatMul`` in float32
    (the op applies each group's scale to the group's sum instead)."""
    n = _static_dim(scale_zero, -1, "the output features (scale_zero.shape[-1])")
    k = _static_dim(input, -1, "the input features")
    q = _last_slice(op.Cast(_unpack_int4(packed, n), to=_FLOAT), 0, k)
    scale, zero = _scale_zero(scale_zero)
    group_of = _ints(*[j // group_size for j in range(k)])
    # [groups, N] -> [N, k]: each input feature's group.
    scale_k = op.Gather(op.Transpose(scale, perm=[1, 0]), group_of, axis=1)
    zero_k = op.Gather(op.Transpose(zero, perm=[1, 0]), group_of, axis=1)
    w = op.Mul(op.Sub(q, zero_k), scale_k)
    y = op.MatMul(_cast(input, _FLOAT), op.Transpose(w, perm=[1, 0]))
    return _cast(_add_bias(y, bias, _FLOAT), _dtype(input))


def int4_dynamic_linear(input, packed, scale_zero, group_size: int, bias=None):
    """``fuseops::int4_dynamic_linear``: the rows quantized to int8 as the op
    does; per weight group one ``MatMulInteger`` of the int8 activations and
    ``q - zero`` (exact int32 sums, the zero point's share included), each
    times its group's scale in float32, summed over the groups, then times
    the row's scale, plus bias."""
    n = _static_dim(scale_zero, -1, "the output features (scale_zero.shape[-1])")
    groups = _static_dim(scale_zero, 0, "the weight groups (scale_zero.shape[0])")
    k = _static_dim(input, -1, "the input features")
    padded = groups * group_size
    dtype = _dtype(input)
    ct = _opmath(dtype)
    xq, x_scale, bad = _quantize_rows(input)
    # Activations [rows, K] -> [groups, rows, group_size], zeros past K.
    rows = op.Reshape(xq, _ints(-1, k))
    if padded != k:
        rows = op.Pad(rows, _ints(0, 0, 0, padded - k))
    rows = op.Transpose(op.Reshape(rows, _ints(-1, groups, group_size)), perm=[1, 0, 2])
    # Weight [N, groups * group_size] -> q - zero, int8 [groups, group_size, N].
    scale, zero = _scale_zero(scale_zero)
    q = op.Reshape(op.Cast(_unpack_int4(packed, n), to=_INT32), _ints(n, groups, group_size))
    zero_ng = op.Unsqueeze(op.Cast(op.Transpose(zero, perm=[1, 0]), to=_INT32), _ints(-1))
    w = op.Transpose(op.Cast(op.Sub(q, zero_ng), to=_INT8), perm=[1, 2, 0])
    acc = op.MatMulInteger(rows, w)  # [groups, rows, N]
    sums = op.ReduceSum(
        op.Mul(op.Cast(acc, to=_FLOAT), op.Unsqueeze(scale, _ints(1))), _ints(0), keepdims=0
    )
    out_shape = op.Concat(op.Shape(input, end=-1), _ints(n), axis=0)
    y = op.Mul(_cast(op.Reshape(sums, out_shape), ct), _cast(x_scale, ct))
    y = op.Add(_add_bias(y, bias, ct), _cast(bad, ct))
    return _cast(y, dtype)


# --- attention -------------------------------------------------------------------


def decode_attention(
    query, key, value, attn_mask=None, is_causal: bool = False, scale=None, softcap: float = 0.0
):
    """``fuseops::decode_attention``: a decomposition in float32 (float64
    for float64): each key/value head expanded to its query heads, ``MatMul``,
    the softcap (``Tanh``), the mask and causal limit (``Where``),
    ``Softmax``, rows that see no key set to zero, ``MatMul`` with the
    values. Unlike the op, the graph multiplies the hidden keys' values by
    zero rather than skipping them (a NaN or Inf there would spread)."""
    dtype = _dtype(query)
    ct = _opmath(dtype)
    batch = _static_dim(query, 0, "the batch")
    q_heads = _static_dim(query, 1, "the query heads")
    q_len = _static_dim(query, 2, "the query length")
    dim = _static_dim(query, 3, "the head size")
    kv_heads = _static_dim(key, 1, "the key/value heads")
    keys = _static_dim(key, 2, "the key length")
    v_dim = _static_dim(value, 3, "the value head size")
    group = q_heads // kv_heads

    def per_query_head(t, last: int):
        t = _cast(t, ct)
        if group == 1:
            return t
        t = op.Expand(op.Unsqueeze(t, _ints(2)), _ints(batch, kv_heads, group, keys, last))
        return op.Reshape(t, _ints(batch, q_heads, keys, last))

    k = per_query_head(key, dim)
    v = per_query_head(value, v_dim)
    if scale is None:
        scale = dim**-0.5 if dim > 0 else 1.0
    scores = op.MatMul(
        op.Mul(_cast(query, ct), _scalar(scale, ct)), op.Transpose(k, perm=[0, 1, 3, 2])
    )
    if softcap > 0:
        cap = _scalar(softcap, ct)
        scores = op.Mul(op.Tanh(op.Div(scores, cap)), cap)
    visible = None
    if is_causal:
        rows = torch.arange(q_len).unsqueeze(1) + (keys - q_len)
        allowed = (torch.arange(keys).unsqueeze(0) <= rows).tolist()
        visible = op.Constant(value=ir.tensor(allowed, dtype=ir.DataType.BOOL))
    if attn_mask is not None:
        if attn_mask.dtype == ir.DataType.BOOL:
            seen = attn_mask
        else:
            bias = _cast(attn_mask, ct)
            seen = op.Not(op.Equal(bias, _scalar(float("-inf"), ct)))
            scores = op.Add(scores, bias)
        visible = seen if visible is None else op.And(visible, seen)
    if visible is not None:
        scores = op.Where(visible, scores, _scalar(float("-inf"), ct))
    weights = op.Softmax(scores, axis=-1)
    if visible is not None:
        weights = op.Where(visible, weights, _scalar(0.0, ct))
    return _cast(op.MatMul(weights, v), dtype)


# --- the table -----------------------------------------------------------------


def _translations() -> dict[Any, Callable]:
    ops = torch.ops.fuseops
    return {
        ops.rms_norm.default: rms_norm,
        ops.fused_add_rms_norm.default: fused_add_rms_norm,
        ops.layer_norm.default: layer_norm,
        ops.rope.default: rope,
        ops.rope.single: rope_single,
        ops.swiglu.default: swiglu,
        ops.swiglu.packed: swiglu_packed,
        ops.geglu.default: geglu,
        ops.geglu.packed: geglu_packed,
        ops.gelu.default: gelu,
        ops.silu.default: silu,
        ops.relu.default: relu,
        ops.bias_gelu.default: bias_gelu,
        ops.int8_weight_only_linear.default: int8_weight_only_linear,
        ops.int8_dynamic_linear.default: int8_dynamic_linear,
        ops.int4_weight_only_linear.default: int4_weight_only_linear,
        ops.int4_dynamic_linear.default: int4_dynamic_linear,
        ops.decode_attention.default: decode_attention,
    }


def custom_translation_table() -> dict[Any, Callable]:
    """``{torch.ops.fuseops.<op>.<overload>: ONNX function}`` for
    ``torch.onnx.export(..., dynamo=True, custom_translation_table=...)``
    (a new dict each call: add your own translations to it)."""
    return _translations()


def export(model, args=(), path=None, **kwargs):
    """``torch.onnx.export(model, args, path, dynamo=True, opset_version=23,
    custom_translation_table=custom_translation_table(), **kwargs)``: an
    ``onnx_program`` (``torch.onnx.ONNXProgram``), also saved to ``path``
    when given. ``kwargs`` go to ``torch.onnx.export`` (``dynamic_shapes``,
    ``kwargs``, ``input_names``, ...); a ``custom_translation_table`` there
    adds to fuseops' (and wins for the ops it names).

    The model is first captured with ``torch.export.export`` (or ``model``
    is already an ``ExportedProgram``); a fuseops op without a translation
    raises ``NotImplementedError`` naming it."""
    if kwargs.get("dynamo", True) is not True:
        raise ValueError("fuseops.onnx.export: fuseops ops export with dynamo=True only")
    table = custom_translation_table()
    table.update(kwargs.pop("custom_translation_table", None) or {})
    kwargs.setdefault("opset_version", OPSET)
    kwargs.pop("dynamo", None)
    if isinstance(model, torch.export.ExportedProgram):
        program = model
    else:
        program = torch.export.export(
            model,
            tuple(args) if isinstance(args, (tuple, list)) else (args,),
            kwargs=kwargs.pop("kwargs", None),
            dynamic_shapes=kwargs.pop("dynamic_shapes", None),
            strict=False,
        )
    missing = untranslated_ops(program, table)
    if missing:
        raise NotImplementedError(
            "fuseops.onnx: no ONNX translation for "
            + ", ".join(missing)
            + " (the fuseops ops with one: fuseops.onnx.custom_translation_table(); "
            "see fuseops.onnx.NOT_TRANSLATED for why the others have none)"
        )
    return torch.onnx.export(
        program, (), path, dynamo=True, custom_translation_table=table, **kwargs
    )


def untranslated_ops(program, table=None) -> list[str]:
    """The fuseops ops (``torch.ops.fuseops.<op>.<overload>``) that the graph
    of ``program`` (a ``torch.export.ExportedProgram``) calls and ``table``
    (default :func:`custom_translation_table`) has no function for."""
    table = custom_translation_table() if table is None else table
    found = set()
    for module in program.graph_module.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for node in module.graph.nodes:
            target = node.target
            if (
                node.op == "call_function"
                and isinstance(target, torch._ops.OpOverload)
                and target.namespace == "fuseops"
                and target not in table
            ):
                found.add(f"torch.ops.{target}")
    return sorted(found)


#: The fuseops ops without a translation, and why.
NOT_TRANSLATED = {
    "backward ops (*_backward) and the forward ops returning statistics for them "
    "(*_forward)": "training ops; ONNX export is for inference",
    "out= overloads (*.out, *_out) and rope_": "they write into preallocated tensors; "
    "an inference model to export calls the functional forms (no out=)",
    "cross_entropy, linear_cross_entropy and their variants": "losses (training); an "
    "inference graph returns logits",
    "causal_conv1d, causal_conv1d_update": "still to come (a grouped Conv with left "
    "padding, and the decode step's state update)",
    "sparse_2_4_linear, sparse_2_4_dynamic_linear": "still to come (the 2:4 metadata "
    "unpacked with ONNX operators)",
    "quantize_per_channel_int8, quantize_per_token_int8, dequantize_int8, "
    "quantize_per_group_int4, pack_int8_weight, pack_int4_weight, prune_2_4, pack_2_4": (
        "they prepare the weights once, before export"
    ),
}
