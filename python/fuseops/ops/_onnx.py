"""What the op modules' ONNX functions share (their ``onnx_translations()``,
collected by :mod:`fuseops.onnx`): the opset-23 operators ``op``, onnxscript's
``ir``, and the helpers that cast to and from the op's precision, make
constants, read static sizes and quantize rows as the fuseops kernels do.

Importing this module imports onnxscript, so only ``onnx_translations()``
(inside its body) and :mod:`fuseops.onnx` import it: ``import fuseops``
does not.
"""

from __future__ import annotations

from onnxscript import ir
from onnxscript import opset23 as op

#: The opset the functions write (RMSNormalization is opset 23).
OPSET = 23

FLOAT = ir.DataType.FLOAT
DOUBLE = ir.DataType.DOUBLE
INT8 = ir.DataType.INT8
INT32 = ir.DataType.INT32
INT64 = ir.DataType.INT64
UINT8 = ir.DataType.UINT8


def opmath(dtype: ir.DataType) -> ir.DataType:
    """The dtype fuseops computes in: float64 for float64, else float32."""
    return DOUBLE if dtype == DOUBLE else FLOAT


def dtype_of(x) -> ir.DataType:
    # The graph's inputs carry their dtype; the values the functions compute
    # need not (the tracer does not infer them), so each function takes the
    # dtype of its op's inputs and hands it on.
    if x.dtype is None:
        raise ValueError(f"fuseops.onnx: the dtype of {x.name!r} is unknown")
    return x.dtype


def cast(x, dtype: ir.DataType):
    return x if x.dtype == dtype else op.Cast(x, to=dtype)


def scalar(value: float, dtype: ir.DataType):
    return op.Constant(value=ir.tensor(value, dtype=dtype))


def ints(*values: int):
    return op.Constant(value=ir.tensor(list(values), dtype=INT64))


def static_dim(value, axis: int, what: str) -> int:
    dim = value.shape[axis] if value.shape is not None else None
    if not isinstance(dim, int):
        raise ValueError(f"fuseops.onnx: {what} must be static in the exported graph (got {dim!r})")
    return dim


def last_slice(x, start: int, end: int, step: int = 1):
    return op.Slice(x, ints(start), ints(end), ints(-1), ints(step))


def ones_like_last(x):
    """A float32 vector of ones as long as ``x``'s last dimension (the scale
    of a normalization without weight)."""
    return op.ConstantOfShape(op.Shape(x, start=-1), value=ir.tensor([1.0], dtype=FLOAT))


def gelu_math(x, approximate: str):
    """ONNX ``Gelu`` (opset 20), the erf or tanh form."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"fuseops.onnx: approximate must be 'none' or 'tanh', got {approximate!r}")
    return op.Gelu(x, approximate=approximate)


def silu_math(x):
    """``x * Sigmoid(x)`` (ONNX's ``Swish`` is opset 24)."""
    return op.Mul(x, op.Sigmoid(x))


def quantize_rows(x):
    """``quantize_per_token_int8`` in float32: ``(xq int8, x_scale [..., 1],
    bad [..., 1])`` where ``bad`` is 0 for a finite row and NaN for a row
    holding Inf or NaN (added to the result, it makes that row NaN, as the
    op's)."""
    xf = cast(x, FLOAT)
    x_scale = op.Div(op.ReduceMax(op.Abs(xf), ints(-1), keepdims=1), scalar(127.0, FLOAT))
    x_scale = op.Where(op.Equal(x_scale, scalar(0.0, FLOAT)), scalar(1.0, FLOAT), x_scale)
    q = op.Clip(op.Round(op.Div(xf, x_scale)), scalar(-127.0, FLOAT), scalar(127.0, FLOAT))
    # NaN would be undefined in the Cast to int8: zeros there, the row is NaN anyway.
    q = op.Where(op.IsNaN(q), scalar(0.0, FLOAT), q)
    bad = op.ReduceSum(op.Mul(xf, scalar(0.0, FLOAT)), ints(-1), keepdims=1)
    return op.Cast(q, to=INT8), x_scale, bad


def add_bias(y, bias, ct: ir.DataType):
    return y if bias is None else op.Add(y, cast(bias, ct))


def dynamic_int8_linear(input, weight, scale, bias):
    """The per-row W8A8 linear's math (2:4) on its ``[N, K]`` int8
    ``weight``: the rows quantized as the ops do, ``MatMulInteger`` (exact
    int32 sums), then ``(acc * x_scale) * scale + bias`` in float32 (float64
    for float64 input); a row the op gives NaN (a non-finite input) stays NaN."""
    dtype = dtype_of(input)
    ct = opmath(dtype)
    xq, x_scale, bad = quantize_rows(input)
    acc = op.MatMulInteger(xq, op.Transpose(weight, perm=[1, 0]))
    y = op.Mul(op.Mul(op.Cast(acc, to=ct), cast(x_scale, ct)), cast(scale, ct))
    y = op.Add(add_bias(y, bias, ct), cast(bad, ct))
    return cast(y, dtype)
