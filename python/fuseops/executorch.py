"""ExecuTorch export of models that call fuseops ops: decompositions of the
inference ops into core ATen operators, for a ``.pte`` program that
ExecuTorch's portable (and XNNPACK) kernels run.

ExecuTorch has no kernels for the ``torch.ops.fuseops.*`` ops: lowering a
model that calls them fails (``Missing out variants: {'fuseops::rms_norm',
...}``). :func:`decomposition_table` maps each inference op's overload to a
plain-PyTorch function computing the same thing with core ATen operators,
and :func:`export` captures the model with ``torch.export``, runs
``ExportedProgram.run_decompositions`` with that table (on top of
``torch.export.default_decompositions()``), checks that no fuseops op is
left, and lowers the result with ``executorch.exir.to_edge_transform_and_lower``
(with the XNNPACK partitioner when ExecuTorch has it) and
``.to_executorch()``::

    program = fuseops.executorch.export(model, (x,), "model.pte")

Each decomposition computes what the op computes, in the op's precision:
bfloat16 and float16 inputs are cast to float32, computed there and rounded
once to their dtype, as the fuseops kernels do (float64 stays float64). The
decomposed graph may order float sums differently (matrix products, row
reductions), as any two implementations of the op do. What each op becomes
(the same math as :mod:`fuseops.onnx`, written with ATen operators):

- ``rms_norm``, ``fused_add_rms_norm`` (the residual add rounded to the
  input's dtype, as the op rounds it), ``layer_norm``: the mean of squares
  (mean and variance) over the last dimension, ``rsqrt``, the weight and
  bias.
- ``gelu``, ``bias_gelu``, ``geglu``: ``aten.gelu`` (the erf form) or the
  tanh form written out (``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715
  * x^3)))``: XNNPACK's GELU ignores ``approximate``); ``silu``,
  ``swiglu``: ``x * sigmoid(x)``; ``relu``: ``where(x < 0, 0, x)`` (NaN
  kept). The packed forms of the gated activations split the input
  in two halves.
- ``rope`` (and ``rope.single``): the cache rows gathered by position
  (``index``), ``x * cos + rotate(x) * sin`` in float32 (the cache rows
  cast to float32 whatever their dtype), the rest of ``head_dim`` past the
  rotary dim unchanged; partial rotary and GPT-J's interleaved pairs
  included.
- ``int8_weight_only_linear``, ``int4_weight_only_linear``: the packed
  weight unpacked (permute, reshape, slice; for int4 the two nibbles of
  each byte by integer division), dequantized in float32 and multiplied in
  float32: the op's float32 math, its per-group (int4) scaling applied to
  the weight instead of to each group's sum. The ``.pte`` stores the packed
  int8/int4 bytes: the weights are dequantized as the program runs.
- ``int8_dynamic_linear``, ``int4_dynamic_linear``: the activations
  quantized per row as the op does (``absmax / 127``, round half to even,
  clamp to [-127, 127]), the integer products summed exactly (in float64,
  exact for the int8 ranges), then the scales in float32 (float64 for
  float64 input). A row holding Inf or NaN gives NaN, as the op's.
- ``decode_attention``: key/value heads expanded to their query heads,
  ``matmul``, ``tanh`` for the softcap, ``where`` for the mask and the
  causal limit, ``softmax``; a row that sees no key gives zeros (the op's
  result, where ``scaled_dot_product_attention`` gives NaN). Unlike the
  op, the graph multiplies the hidden keys' values by zero rather than
  skipping them (a NaN or Inf there would spread).

Not decomposed (:data:`NOT_DECOMPOSED` says why for each): the backward
ops (training), the ``out=`` overloads (an exported graph is functional),
the losses, the quantization and packing ops (they prepare weights once,
before export), and, still to come, ``causal_conv1d`` and the 2:4 sparse
linears. :func:`export` raises ``NotImplementedError`` naming any of them
a model calls.

Limits: shapes are static (the fuseops ops' shape functions specialize
symbolic sizes, so ``torch.export`` with ``dynamic_shapes`` fails on them).
The decompositions run on ExecuTorch's kernels, not fuseops', so they have
ExecuTorch's speed, not the fused kernels'. rope's positions index the
cache as ``aten.index`` does (a negative position ``p >= -max_pos`` is
taken as ``max_pos + p`` where the op raises).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

import torch

try:
    from executorch.exir import to_edge_transform_and_lower
except ImportError as error:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "fuseops.executorch needs ExecuTorch: pip install 'fuseops[executorch]'"
    ) from error


# --- helpers -----------------------------------------------------------------


def _opmath(dtype: torch.dtype) -> torch.dtype:
    """The dtype fuseops computes in: float64 for float64, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _check_approximate(op: str, approximate: str) -> str:
    if approximate not in ("none", "tanh"):
        raise ValueError(
            f"fuseops.executorch: {op}'s approximate must be 'none' or 'tanh', got {approximate!r}"
        )
    return approximate


# --- normalization -----------------------------------------------------------


def _rms_norm(x, weight, eps: Optional[float], dtype: torch.dtype):
    ct = _opmath(dtype)
    if eps is None:  # F.rms_norm's default, as the op's
        eps = torch.finfo(ct).eps
    xc = x.to(ct)
    y = xc * torch.rsqrt((xc * xc).mean(dim=-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.to(ct)
    return y.to(dtype)


def rms_norm(input, weight=None, eps: Optional[float] = None):
    """``fuseops::rms_norm``: ``x * rsqrt(mean(x^2) + eps) * weight`` over the
    last dimension."""
    return _rms_norm(input, weight, eps, input.dtype)


def fused_add_rms_norm(input, residual, weight=None, eps: Optional[float] = None):
    """``fuseops::fused_add_rms_norm``: ``(rms_norm(x + residual), x +
    residual)`` with the sum rounded to the input's dtype (a float32 sum of
    two bfloat16/float16 values rounds to the same value as their sum
    does)."""
    dtype = input.dtype
    ct = _opmath(dtype)
    new_residual = (input.to(ct) + residual.to(ct)).to(dtype)
    return _rms_norm(new_residual, weight, eps, dtype), new_residual


def layer_norm(input, weight=None, bias=None, eps: float = 1e-5):
    """``fuseops::layer_norm``: mean and (biased) variance over the last
    dimension, then the weight and bias."""
    dtype = input.dtype
    ct = _opmath(dtype)
    xc = input.to(ct)
    centered = xc - xc.mean(dim=-1, keepdim=True)
    var = (centered * centered).mean(dim=-1, keepdim=True)
    y = centered * torch.rsqrt(var + eps)
    if weight is not None:
        y = y * weight.to(ct)
    if bias is not None:
        y = y + bias.to(ct)
    return y.to(dtype)


# --- activations -------------------------------------------------------------


def _gelu_math(x, approximate: str, op: str):
    if _check_approximate(op, approximate) == "tanh":
        # Written out: XNNPACK's GELU computes the erf form whatever
        # aten.gelu's approximate says.
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * (x * x * x))
        return 0.5 * x * (1.0 + torch.tanh(inner))
    return torch.nn.functional.gelu(x)


def _silu_math(x):
    return x * torch.sigmoid(x)


def gelu(input, approximate: str = "none"):
    """``fuseops::gelu``: the erf or tanh form in float32."""
    return _gelu_math(input.to(_opmath(input.dtype)), approximate, "gelu").to(input.dtype)


def silu(input):
    """``fuseops::silu``: ``x * sigmoid(x)`` in float32."""
    return _silu_math(input.to(_opmath(input.dtype))).to(input.dtype)


def relu(input):
    """``fuseops::relu``: ``where(x < 0, 0, x)`` (exact in every dtype; NaN
    stays NaN, as the op's, where XNNPACK's float16 clamp returns 0)."""
    return torch.where(input < 0, torch.zeros_like(input), input)


def bias_gelu(input, bias, approximate: str = "none"):
    """``fuseops::bias_gelu``: ``gelu(x + bias)``, the sum kept in float32 as
    the op keeps it."""
    ct = _opmath(input.dtype)
    return _gelu_math(input.to(ct) + bias.to(ct), approximate, "bias_gelu").to(input.dtype)


def _halves(input):
    """``(gate, up)``: the two halves of a packed input's last dimension."""
    half = input.shape[-1] // 2
    return input[..., :half], input[..., half:]


def _gated(gate, up, activation, dtype: torch.dtype):
    ct = _opmath(dtype)
    return (activation(gate.to(ct)) * up.to(ct)).to(dtype)


def swiglu(gate, up):
    """``fuseops::swiglu``: ``silu(gate) * up`` in float32."""
    return _gated(gate, up, _silu_math, gate.dtype)


def swiglu_packed(input):
    """``fuseops::swiglu.packed``: the gate is the first half of the last
    dimension, up the second."""
    gate, up = _halves(input)
    return _gated(gate, up, _silu_math, input.dtype)


def geglu(gate, up, approximate: str = "none"):
    """``fuseops::geglu``: ``gelu(gate) * up`` in float32."""
    return _gated(gate, up, lambda x: _gelu_math(x, approximate, "geglu"), gate.dtype)


def geglu_packed(input, approximate: str = "none"):
    """``fuseops::geglu.packed``."""
    gate, up = _halves(input)
    return _gated(gate, up, lambda x: _gelu_math(x, approximate, "geglu"), input.dtype)


# --- rope --------------------------------------------------------------------


def _rotate(x, interleaved: bool):
    """``rotate_half`` (pairs (j, j + rd/2)) or GPT-J's (pairs (2j, 2j+1))."""
    if interleaved:
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack((-odd, even), dim=-1).reshape(x.shape)
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rope_one(x, cos, sin, positions, interleaved: bool):
    # As the kernel: the cache rows (gathered by position) in float32
    # whatever the cache's dtype, x[..., :rd] * cos + rotate(x[..., :rd]) *
    # sin in float32, the rest of head_dim unchanged, rounded once.
    rotary_dim = cos.shape[-1]
    head_dim = x.shape[-1]
    dtype = x.dtype
    ct = _opmath(dtype)
    c, s = cos, sin
    if positions is not None:
        index = positions.to(torch.int64)
        c, s = cos[index], sin[index]
    c = c.to(ct).unsqueeze(-2)  # one row for all heads
    s = s.to(ct).unsqueeze(-2)
    xc = x.to(ct)
    rot = xc if rotary_dim == head_dim else xc[..., :rotary_dim]
    rotated = rot * c + _rotate(rot, interleaved) * s
    if rotary_dim != head_dim:
        rotated = torch.cat((rotated, xc[..., rotary_dim:]), dim=-1)
    return rotated.to(dtype)


def rope(query, key, cos, sin, positions=None, interleaved: bool = False):
    """``fuseops::rope``: query and key rotated."""
    return (
        _rope_one(query, cos, sin, positions, interleaved),
        _rope_one(key, cos, sin, positions, interleaved),
    )


def rope_single(input, cos, sin, positions=None, interleaved: bool = False):
    """``fuseops::rope.single``: rope without a key."""
    return _rope_one(input, cos, sin, positions, interleaved)


# --- quantized linear layers -------------------------------------------------


def _quantize_rows(x):
    """``quantize_per_token_int8``'s math in float32: ``(xq, x_scale)`` with
    ``xq`` the int8 values held in float32 (a row holding Inf or NaN holds
    NaN, which the products carry into that row's results, as the op's) and
    ``x_scale [..., 1]``."""
    xf = x.to(torch.float32)
    x_scale = xf.abs().amax(dim=-1, keepdim=True) / 127.0
    x_scale = torch.where(x_scale == 0, torch.ones_like(x_scale), x_scale)
    xq = torch.round(xf / x_scale).clamp(-127.0, 127.0)
    return xq, x_scale


def _unpack_int8(packed, n: int, k: int):
    """The ``[n, k]`` int8 weight of ``pack_int8_weight``'s layout
    ``[ceil(N/16), ceil(K/4), 16, 4]``."""
    blocks, groups = packed.shape[0], packed.shape[1]
    return packed.permute(0, 2, 1, 3).reshape(blocks * 16, groups * 4)[:n, :k]


def _add_bias(y, bias, ct):
    return y if bias is None else y + bias.to(ct)


def _rows_times(x2d, w, out_shape):
    """``x2d [rows, K] @ w.T`` reshaped to ``out_shape``."""
    return (x2d @ w.t()).reshape(out_shape)


def int8_weight_only_linear(input, packed, scale, bias=None):
    """``fuseops::int8_weight_only_linear``: ``x @ wq.T * scale + bias`` in
    float32, the int8 weight unpacked and cast to float32 (exact), the
    channel's scale applied to each sum as the op does."""
    n, k = scale.shape[0], input.shape[-1]
    w = _unpack_int8(packed, n, k).to(torch.float32)
    x2d = input.to(torch.float32).reshape(-1, k)
    y = _rows_times(x2d, w, input.shape[:-1] + (n,)) * scale.to(torch.float32)
    return _add_bias(y, bias, torch.float32).to(input.dtype)


def int8_dynamic_linear(input, packed, scale, colsum, bias=None):
    """``fuseops::int8_dynamic_linear``: the rows quantized as the op does,
    the int8 products summed exactly (float64), then ``(acc * x_scale) *
    scale + bias`` in float32 (float64 for float64 input). ``colsum`` is
    the op's correction for its unsigned activations: unused here."""
    del colsum
    n, k = scale.shape[0], input.shape[-1]
    dtype = input.dtype
    ct = _opmath(dtype)
    xq, x_scale = _quantize_rows(input)
    w = _unpack_int8(packed, n, k).to(torch.float64)
    acc = _rows_times(xq.to(torch.float64).reshape(-1, k), w, input.shape[:-1] + (n,))
    y = (acc.to(ct) * x_scale.to(ct)) * scale.to(ct)
    return _add_bias(y, bias, ct).to(dtype)


def _unpack_int4(packed, n: int):
    """The ``[n, groups * group_size]`` values (0..15, int32) of
    ``pack_int4_weight``'s layout ``[ceil(N/16), groups * group_size / 2,
    16]`` (zeros past K)."""
    blocks, pairs = packed.shape[0], packed.shape[1]
    p = packed.to(torch.int32)
    high = torch.div(p, 16, rounding_mode="floor")
    low = p - high * 16
    both = torch.stack((low, high), dim=-1)  # [blocks, pairs, 16, 2]
    return both.permute(0, 2, 1, 3).reshape(blocks * 16, pairs * 2)[:n]


def _scale_zero(scale_zero):
    """``(scale, zero)``, each float32 ``[groups, N]``."""
    sz = scale_zero.to(torch.float32)
    return sz[:, 0, :], sz[:, 1, :]


def int4_weight_only_linear(input, packed, scale_zero, group_size: int, bias=None):
    """``fuseops::int4_weight_only_linear``: the weight ``(q - zero) * scale``
    dequantized in float32, then the product in float32 (the op applies each
    group's scale to the group's sum instead)."""
    groups, n = scale_zero.shape[0], scale_zero.shape[-1]
    k = input.shape[-1]
    q = _unpack_int4(packed, n).to(torch.float32).reshape(n, groups, group_size)
    scale, zero = _scale_zero(scale_zero)
    w = ((q - zero.t().unsqueeze(-1)) * scale.t().unsqueeze(-1)).reshape(n, groups * group_size)
    x2d = input.to(torch.float32).reshape(-1, k)
    y = _rows_times(x2d, w[:, :k], input.shape[:-1] + (n,))
    return _add_bias(y, bias, torch.float32).to(input.dtype)


def int4_dynamic_linear(input, packed, scale_zero, group_size: int, bias=None):
    """``fuseops::int4_dynamic_linear``: the rows quantized to int8 as the op
    does; per weight group the products of the int8 activations and ``q -
    zero`` summed exactly (float64), each group's sum times its scale in
    float32, summed over the groups, then times the row's scale, plus
    bias."""
    groups, n = scale_zero.shape[0], scale_zero.shape[-1]
    k = input.shape[-1]
    padded = groups * group_size
    dtype = input.dtype
    ct = _opmath(dtype)
    xq, x_scale = _quantize_rows(input)
    # Activations [rows, K] -> [groups, rows, group_size], zeros past K.
    rows = xq.to(torch.float64).reshape(-1, k)
    if padded != k:
        rows = torch.nn.functional.pad(rows, (0, padded - k))
    rows = rows.reshape(-1, groups, group_size).permute(1, 0, 2)
    # Weight q - zero as [groups, group_size, N].
    scale, zero = _scale_zero(scale_zero)
    q = _unpack_int4(packed, n).to(torch.float64).reshape(n, groups, group_size)
    w = (q - zero.t().to(torch.float64).unsqueeze(-1)).permute(1, 2, 0)
    acc = torch.bmm(rows, w)  # [groups, rows, N], exact integers
    sums = (acc.to(torch.float32) * scale.unsqueeze(1)).sum(dim=0)
    y = sums.reshape(input.shape[:-1] + (n,)).to(ct) * x_scale.to(ct)
    return _add_bias(y, bias, ct).to(dtype)


# --- attention -----------------------------------------------------------------


def decode_attention(
    query, key, value, attn_mask=None, is_causal: bool = False, scale=None, softcap: float = 0.0
):
    """``fuseops::decode_attention`` in float32 (float64 for float64): each
    key/value head expanded to its query heads, ``matmul``, the softcap
    (``tanh``), the mask and causal limit (``where``), ``softmax``, rows
    that see no key set to zero, ``matmul`` with the values."""
    dtype = query.dtype
    ct = _opmath(dtype)
    batch, q_heads, q_len, dim = query.shape
    kv_heads, keys = key.shape[1], key.shape[2]
    group = q_heads // kv_heads

    def per_query_head(t):
        t = t.to(ct)
        if group == 1:
            return t
        last = t.shape[-1]
        t = t.unsqueeze(2).expand(batch, kv_heads, group, keys, last)
        return t.reshape(batch, q_heads, keys, last)

    k = per_query_head(key)
    v = per_query_head(value)
    if scale is None:
        scale = 1.0 / math.sqrt(dim) if dim > 0 else 1.0
    scores = (query.to(ct) * scale) @ k.transpose(-1, -2)
    if softcap > 0:
        scores = torch.tanh(scores / softcap) * softcap
    visible = None
    if is_causal:
        rows = torch.arange(q_len, device=query.device).unsqueeze(1) + (keys - q_len)
        visible = torch.arange(keys, device=query.device).unsqueeze(0) <= rows
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            seen = attn_mask
        else:
            bias = attn_mask.to(ct)
            seen = bias != -math.inf
            scores = scores + bias
        visible = seen if visible is None else visible & seen
    if visible is not None:
        hidden = torch.full_like(scores, -math.inf)
        scores = torch.where(visible, scores, hidden)
    weights = torch.softmax(scores, dim=-1)
    if visible is not None:
        weights = torch.where(visible, weights, torch.zeros_like(weights))
    return (weights @ v).to(dtype)


# --- the table -----------------------------------------------------------------


def _decompositions() -> dict[Any, Callable]:
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


def decomposition_table() -> dict[Any, Callable]:
    """``{torch.ops.fuseops.<op>.<overload>: decomposition}`` for
    ``ExportedProgram.run_decompositions`` (a new dict each call: add your
    own decompositions to it, or merge it into
    ``torch.export.default_decompositions()``, as :func:`decompose` does)."""
    return _decompositions()


def undecomposed_ops(program, table=None) -> list[str]:
    """The fuseops ops (``torch.ops.fuseops.<op>.<overload>``) that the graph
    of ``program`` (a ``torch.export.ExportedProgram``) calls and ``table``
    (default :func:`decomposition_table`) has no decomposition for."""
    table = decomposition_table() if table is None else table
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


def decompose(program, table=None):
    """``program`` (a ``torch.export.ExportedProgram``) with every fuseops op
    replaced by its decomposition and the rest decomposed to core ATen
    (``torch.export.default_decompositions()`` updated with ``table``,
    default :func:`decomposition_table`). Raises ``NotImplementedError``
    naming the fuseops ops the table has no decomposition for."""
    table = decomposition_table() if table is None else table
    missing = undecomposed_ops(program, table)
    if missing:
        raise NotImplementedError(
            "fuseops.executorch: no decomposition for "
            + ", ".join(missing)
            + " (the fuseops ops with one: fuseops.executorch.decomposition_table(); "
            "see fuseops.executorch.NOT_DECOMPOSED for why the others have none)"
        )
    full = torch.export.default_decompositions()
    full.update(table)
    return program.run_decompositions(full)


def _default_partitioners() -> list:
    try:
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
            XnnpackPartitioner,
        )
    except ImportError:  # pragma: no cover - ExecuTorch built without XNNPACK
        return []
    return [XnnpackPartitioner()]


def export(model, args=(), path=None, **kwargs):
    """The ExecuTorch program (``executorch.exir.ExecutorchProgramManager``)
    of ``model`` called on ``args``, also saved to ``path`` (a ``.pte``
    file) when given.

    ``model`` is captured with ``torch.export.export(model, args,
    kwargs=kwargs.pop("kwargs"), strict=False)`` (or is already an
    ``ExportedProgram``), decomposed by :func:`decompose` with
    :func:`decomposition_table` (plus ``decomposition_table=`` entries,
    which win for the ops they name), then lowered with ``to_edge_transform_and_lower(program,
    partitioner=...)`` and ``.to_executorch()``. ``partitioner`` defaults to
    ExecuTorch's XNNPACK partitioner where ExecuTorch has it (``[]``: the
    portable kernels only); ``compile_config`` goes to
    ``to_edge_transform_and_lower``, ``backend_config`` to
    ``to_executorch``. A fuseops op without a decomposition raises
    ``NotImplementedError`` naming it."""
    table = decomposition_table()
    table.update(kwargs.pop("decomposition_table", None) or {})
    partitioner = kwargs.pop("partitioner", None)
    compile_config = kwargs.pop("compile_config", None)
    backend_config = kwargs.pop("backend_config", None)
    if isinstance(model, torch.export.ExportedProgram):
        if kwargs:
            raise TypeError(
                "fuseops.executorch.export: an ExportedProgram takes no export arguments, got "
                + ", ".join(sorted(kwargs))
            )
        program = model
    else:
        program = torch.export.export(
            model,
            tuple(args) if isinstance(args, (tuple, list)) else (args,),
            kwargs=kwargs.pop("kwargs", None),
            dynamic_shapes=kwargs.pop("dynamic_shapes", None),
            strict=kwargs.pop("strict", False),
        )
        if kwargs:
            raise TypeError(
                "fuseops.executorch.export: unexpected keyword arguments "
                + ", ".join(sorted(kwargs))
            )
    program = decompose(program, table)
    edge = to_edge_transform_and_lower(
        program,
        partitioner=_default_partitioners() if partitioner is None else list(partitioner),
        compile_config=compile_config,
    )
    executorch_program = edge.to_executorch(backend_config)
    if path is not None:
        with open(path, "wb") as file:
            executorch_program.write_to_file(file)
    return executorch_program


#: The fuseops ops without a decomposition, and why.
NOT_DECOMPOSED = {
    "backward ops (*_backward) and the forward ops returning statistics for them "
    "(*_forward)": "training ops; an ExecuTorch program is for inference",
    "out= overloads (*.out, *_out) and rope_": "they write into preallocated tensors; "
    "an inference model to export calls the functional forms (no out=)",
    "cross_entropy, linear_cross_entropy and their variants": "losses (training); an "
    "inference graph returns logits",
    "causal_conv1d, causal_conv1d_update": "still to come (a grouped convolution with "
    "left padding, and the decode step's state update)",
    "sparse_2_4_linear, sparse_2_4_dynamic_linear": "still to come (the 2:4 metadata "
    "unpacked with ATen operators)",
    "quantize_per_channel_int8, quantize_per_token_int8, dequantize_int8, "
    "quantize_per_group_int4, pack_int8_weight, pack_int4_weight, prune_2_4, pack_2_4": (
        "they prepare the weights once, before export"
    ),
}
