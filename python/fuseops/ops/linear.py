"""linear: ``torch.nn.functional.linear`` with a CPU kernel for the few-row
products of decoding, which read each weight once at memory bandwidth."""

from __future__ import annotations

from typing import Optional

import torch


def linear(
    input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """``input @ weight.T + bias``, as ``torch.nn.functional.linear``:
    ``input [..., K]``, ``weight [N, K]``, ``bias [N]`` or None, one floating
    dtype; returns ``[..., N]``, differentiable in all three.

    On CPU, 1 to 4 rows (the product of ``input``'s leading dimensions: the
    tokens of a decode step; up to 8 in bfloat16/float16 on CPUs where ATen
    emulates those types, which ``FUSEOPS_REDUCED_GEMMS=emulated|native``
    overrides) run fuseops' kernel, which reads the weight once, all threads on disjoint output
    channels, and sums each output in float32 on its own: its bits depend
    neither on the other rows nor on the thread count. Other calls run
    ATen's matrix product, as torch's linear does: more rows (a blocked
    GEMM wins once each weight serves more rows), float64, and other
    devices. Where ATen emulates bfloat16/float16, 32 rows or more run as
    float32 products of the operands widened block by block (2-4x ATen's
    emulated product from 64 rows), forward and backward. The gradients are
    ATen's matrix products (widened likewise, except in a backward that
    builds a graph).
    """
    return torch.ops.fuseops.linear(input, weight, bias)


#: Its gradients are ATen's matrix products, not a fuseops op.
BACKWARD_OPS: dict[str, Optional[str]] = {"linear": None}


def linear_reference(input, weight, bias=None):
    y = input.to(torch.float64) @ weight.to(torch.float64).T
    if bias is not None:
        y = y + bias.to(torch.float64)
    return y.to(input.dtype)


# --- export: ONNX, ExecuTorch and their test calls (fuseops/ops/_export.py) ---


def onnx_translations() -> dict:
    """linear as ``MatMul`` with the weight transposed, plus the bias, in
    float32 for bfloat16/float16 inputs (as the op sums), rounded once."""
    from ._onnx import add_bias, cast, dtype_of, op, opmath

    def linear_onnx(input, weight, bias=None):
        """``fuseops::linear``: ``input @ weight.T + bias`` in float32
        (float64 for float64), rounded once to the input's dtype."""
        dtype = dtype_of(input)
        ct = opmath(dtype)
        y = op.MatMul(cast(input, ct), op.Transpose(cast(weight, ct), perm=[1, 0]))
        return cast(add_bias(y, bias, ct), dtype)

    return {torch.ops.fuseops.linear.default: linear_onnx}


def executorch_decompositions() -> dict:
    """linear as ATen's ``linear`` in float32 for bfloat16/float16 inputs
    (as the op sums), rounded once."""
    from ._executorch import opmath

    def linear_decomposition(input, weight, bias=None):
        """``fuseops::linear``: ``torch.nn.functional.linear`` in float32
        (float64 for float64), rounded once to the input's dtype."""
        ct = opmath(input.dtype)
        b = None if bias is None else bias.to(ct)
        return torch.nn.functional.linear(input.to(ct), weight.to(ct), b).to(input.dtype)

    return {torch.ops.fuseops.linear.default: linear_decomposition}


#: Results that depend on the thread count (python/README.md, "Threads and
#: determinism"): what linear leaves to ATen's matrix products (more than 4
#: rows, float64, the gradients), whose bits are MKL's or oneDNN's; on AMD
#: CPUs MKL's products of these samples' shapes differ between 2 and 3
#: threads. The streamed rows' bits do not (test_linear.py).
THREAD_COUNT_DEPENDENT = ("linear",)

__all__ = ["linear"]
