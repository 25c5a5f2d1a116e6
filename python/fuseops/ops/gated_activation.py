"""The gated activations swiglu (``silu(gate) * up``) and geglu
(``gelu(gate) * up``), on separate gate and up tensors or on one packed
``[..., 2*H]`` tensor, with their backward ops."""

from __future__ import annotations

from typing import Optional

import torch

from ._out import call


def swiglu(
    gate: torch.Tensor,
    up: Optional[torch.Tensor] = None,
    *,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``silu(gate) * up`` in one pass, differentiable in both.

    With ``up`` omitted, ``gate`` is a packed ``[..., 2*H]`` tensor: its first
    half along the last dimension is the gate, the second half ``up``
    (``gate, up = input.chunk(2, -1)``); the result is ``[..., H]`` and the
    gradient flows back packed the same way. Halves that are views of one
    packed tensor are read in place, without copies. ``out=`` as in
    :func:`gelu`."""
    return _gated(torch.ops.fuseops.swiglu, gate, up, (), out)


def _gated(op, gate, up, options: tuple, out):
    # Without `up`, `gate` is the packed input: the op's `packed` overloads.
    if up is None:
        return call(op, gate, *options, out=out, overload="packed")
    return call(op, gate, up, *options, out=out)


def _gated_backward(name: str, grad_output, gate, up, options: tuple, grad_gate, grad_up):
    # Preallocated gradients come both or neither, and only for the separate
    # form; without `up`, the op's `packed` overload.
    op = getattr(torch.ops.fuseops, name)
    if grad_gate is None and grad_up is None:
        if up is None:
            return op.packed(grad_output, gate, *options)
        return op(grad_output, gate, up, *options)
    if grad_gate is None or grad_up is None or up is None:
        raise TypeError(
            f"fuseops.{name}: grad_gate= and grad_up= go together, with separate gate and up tensors"
        )
    op.out(grad_output, gate, up, *options, grad_gate=grad_gate, grad_up=grad_up)
    return grad_gate, grad_up


def swiglu_backward(
    grad_output: torch.Tensor,
    gate: torch.Tensor,
    up: Optional[torch.Tensor] = None,
    *,
    grad_gate: Optional[torch.Tensor] = None,
    grad_up: Optional[torch.Tensor] = None,
):
    """``(grad_gate, grad_up)`` of swiglu in one pass; with ``up`` omitted,
    ``gate`` is the packed input and the packed ``[..., 2*H]`` gradient is
    returned. ``grad_gate=``/``grad_up=`` take preallocated gradients, which
    may be ``grad_output``, ``gate`` or ``up`` themselves (computed in place),
    as swiglu's autograd does with a gradient nothing else refers to."""
    return _gated_backward("swiglu_backward", grad_output, gate, up, (), grad_gate, grad_up)


def geglu(
    gate: torch.Tensor,
    up: Optional[torch.Tensor] = None,
    approximate: str = "none",
    *,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``gelu(gate, approximate) * up`` in one pass, differentiable in both;
    ``up=None`` means a packed ``[..., 2*H]`` input (gate first), as in
    :func:`swiglu`."""
    return _gated(torch.ops.fuseops.geglu, gate, up, (approximate,), out)


def geglu_backward(
    grad_output: torch.Tensor,
    gate: torch.Tensor,
    up: Optional[torch.Tensor] = None,
    approximate: str = "none",
    *,
    grad_gate: Optional[torch.Tensor] = None,
    grad_up: Optional[torch.Tensor] = None,
):
    """``(grad_gate, grad_up)`` of geglu; packed gradient when ``up`` is
    omitted, and preallocated gradients, as in :func:`swiglu_backward`."""
    return _gated_backward(
        "geglu_backward", grad_output, gate, up, (approximate,), grad_gate, grad_up
    )


def _split_packed(gate: torch.Tensor, up: Optional[torch.Tensor]):
    # A packed [..., 2*H] input holds the gate first, then up.
    return gate.chunk(2, dim=-1) if up is None else (gate, up)


def swiglu_reference(gate: torch.Tensor, up: Optional[torch.Tensor] = None) -> torch.Tensor:
    # As Llama's MLP writes it: F.silu(gate_proj(x)) * up_proj(x).
    gate, up = _split_packed(gate, up)
    return torch.nn.functional.silu(gate) * up


def geglu_reference(
    gate: torch.Tensor, up: Optional[torch.Tensor] = None, approximate: str = "none"
) -> torch.Tensor:
    gate, up = _split_packed(gate, up)
    return torch.nn.functional.gelu(gate, approximate=approximate) * up


# --- export: ONNX, ExecuTorch and their test calls (fuseops/ops/_export.py) ---


def onnx_translations() -> dict:
    """swiglu (``silu(gate) * up``) and geglu (``gelu(gate) * up``, ONNX
    ``Gelu``) in float32, the packed forms splitting the input in two halves."""
    from ._onnx import cast, dtype_of, gelu_math, op, opmath, silu_math

    def gated(gate, up, activation, dtype):
        ct = opmath(dtype)
        return cast(op.Mul(activation(cast(gate, ct)), cast(up, ct)), dtype)

    def halves(input):
        """``(gate, up)``: the two halves of a packed input's last dimension."""
        gate, up = op.Split(input, num_outputs=2, axis=-1)
        return gate, up

    def swiglu_onnx(gate, up):
        """``fuseops::swiglu``: ``silu(gate) * up`` in float32."""
        return gated(gate, up, silu_math, dtype_of(gate))

    def swiglu_packed_onnx(input):
        """``fuseops::swiglu.packed``: the gate is the first half of the last
        dimension, up the second."""
        gate, up = halves(input)
        return gated(gate, up, silu_math, dtype_of(input))

    def geglu_onnx(gate, up, approximate: str = "none"):
        """``fuseops::geglu``: ``gelu(gate) * up`` in float32."""
        return gated(gate, up, lambda x: gelu_math(x, approximate), dtype_of(gate))

    def geglu_packed_onnx(input, approximate: str = "none"):
        """``fuseops::geglu.packed``."""
        gate, up = halves(input)
        return gated(gate, up, lambda x: gelu_math(x, approximate), dtype_of(input))

    ops = torch.ops.fuseops
    return {
        ops.swiglu.default: swiglu_onnx,
        ops.swiglu.packed: swiglu_packed_onnx,
        ops.geglu.default: geglu_onnx,
        ops.geglu.packed: geglu_packed_onnx,
    }


def executorch_decompositions() -> dict:
    """swiglu (``silu(gate) * up``) and geglu (``gelu(gate) * up``) in
    float32, the packed forms splitting the input in two halves."""
    from ._executorch import gelu_math, opmath, silu_math

    def gated(gate, up, activation, dtype):
        ct = opmath(dtype)
        return (activation(gate.to(ct)) * up.to(ct)).to(dtype)

    def halves(input):
        """``(gate, up)``: the two halves of a packed input's last dimension."""
        half = input.shape[-1] // 2
        return input[..., :half], input[..., half:]

    def swiglu_decomposition(gate, up):
        """``fuseops::swiglu``: ``silu(gate) * up`` in float32."""
        return gated(gate, up, silu_math, gate.dtype)

    def swiglu_packed_decomposition(input):
        """``fuseops::swiglu.packed``: the gate is the first half of the last
        dimension, up the second."""
        gate, up = halves(input)
        return gated(gate, up, silu_math, input.dtype)

    def geglu_decomposition(gate, up, approximate: str = "none"):
        """``fuseops::geglu``: ``gelu(gate) * up`` in float32."""
        return gated(gate, up, lambda x: gelu_math(x, approximate, "geglu"), gate.dtype)

    def geglu_packed_decomposition(input, approximate: str = "none"):
        """``fuseops::geglu.packed``."""
        gate, up = halves(input)
        return gated(gate, up, lambda x: gelu_math(x, approximate, "geglu"), input.dtype)

    ops = torch.ops.fuseops
    return {
        ops.swiglu.default: swiglu_decomposition,
        ops.swiglu.packed: swiglu_packed_decomposition,
        ops.geglu.default: geglu_decomposition,
        ops.geglu.packed: geglu_packed_decomposition,
    }


__all__ = ["geglu", "geglu_backward", "swiglu", "swiglu_backward"]
