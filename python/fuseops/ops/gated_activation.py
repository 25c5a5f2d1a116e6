"""The gated activations swiglu (``silu(gate) * up``) and geglu
(``gelu(gate) * up``), on separate gate and up tensors or on one packed
``[..., 2*H]`` tensor, with their backward ops."""

from __future__ import annotations

from typing import Optional

import torch

from ._sample import DTYPES, Sample, tensor


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
    if up is None:
        if out is not None:
            torch.ops.fuseops.swiglu.packed_out(gate, out=out)
            return out
        return torch.ops.fuseops.swiglu.packed(gate)
    if out is not None:
        torch.ops.fuseops.swiglu.out(gate, up, out=out)
        return out
    return torch.ops.fuseops.swiglu(gate, up)


def _backward_outs(op: str, up, grad_gate, grad_up) -> bool:
    """Whether preallocated gradients were given (both or neither, and only
    for the separate form)."""
    if grad_gate is None and grad_up is None:
        return False
    if grad_gate is None or grad_up is None or up is None:
        raise TypeError(
            f"fuseops.{op}: grad_gate= and grad_up= go together, with separate gate and up tensors"
        )
    return True


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
    if _backward_outs("swiglu_backward", up, grad_gate, grad_up):
        torch.ops.fuseops.swiglu_backward.out(
            grad_output, gate, up, grad_gate=grad_gate, grad_up=grad_up
        )
        return grad_gate, grad_up
    if up is None:
        return torch.ops.fuseops.swiglu_backward.packed(grad_output, gate)
    return torch.ops.fuseops.swiglu_backward(grad_output, gate, up)


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
    if up is None:
        if out is not None:
            torch.ops.fuseops.geglu.packed_out(gate, approximate, out=out)
            return out
        return torch.ops.fuseops.geglu.packed(gate, approximate)
    if out is not None:
        torch.ops.fuseops.geglu.out(gate, up, approximate, out=out)
        return out
    return torch.ops.fuseops.geglu(gate, up, approximate)


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
    if _backward_outs("geglu_backward", up, grad_gate, grad_up):
        torch.ops.fuseops.geglu_backward.out(
            grad_output, gate, up, approximate, grad_gate=grad_gate, grad_up=grad_up
        )
        return grad_gate, grad_up
    if up is None:
        return torch.ops.fuseops.geglu_backward.packed(grad_output, gate, approximate)
    return torch.ops.fuseops.geglu_backward(grad_output, gate, up, approximate)


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


def bench_cases():
    from ._bench_case import Case, Traffic, gate_up, packed

    return [
        Case(
            "swiglu",
            "swiglu",
            "swiglu",
            gate_up,
            forward_traffic=Traffic(rows=3),  # gate, up in; out
            backward_traffic=Traffic(rows=5),  # dy, gate, up in; dgate, dup out
            differentiable=(0, 1),
            description="silu(gate) * up (the reference is the native composite)",
        ),
        Case(
            "swiglu_packed",
            "swiglu",
            "swiglu",
            packed,
            forward_traffic=Traffic(rows=3),  # both halves in; out
            backward_traffic=Traffic(rows=5),  # dy, both halves in; the packed gradient out
            description="silu(x[..., :H]) * x[..., H:] on one packed [..., 2H] tensor "
            "(hidden is H)",
            variant=True,
        ),
        Case(
            "geglu",
            "geglu",
            "geglu",
            gate_up,
            options={"approximate": "none"},
            forward_traffic=Traffic(rows=3),
            backward_traffic=Traffic(rows=5),
            differentiable=(0, 1),
            description="gelu(gate) * up (the reference is the native composite)",
        ),
    ]


def samples(device) -> list[Sample]:
    ops = torch.ops.fuseops

    def t(shape, dtype=torch.float32, layout="contiguous", grad=False):
        return tensor(shape, dtype, device, layout, grad, scale=3.0)

    def packed_geglu(op, tensors, approximate, kwargs=None, large=False):
        # geglu's wrappers take a packed input as (..., input, None, approximate).
        wrapper = geglu_backward if op._schema.name.endswith("_backward") else geglu
        return Sample(
            op,
            (*tensors, approximate),
            wrapper,
            kwargs or {},
            wrapper_args=(*tensors, None, approximate),
            large=large,
        )

    packed = t((5, 14))
    gate, up = t((5, 7)), t((5, 7))
    grad = t((5, 7))
    # Halves of one packed tensor, read in place.
    view_gate, view_up = (h.detach().requires_grad_() for h in t((6, 10)).chunk(2, -1))
    result = [
        Sample(ops.swiglu.default, (gate, up), swiglu),
        Sample(ops.swiglu.default, (view_gate, view_up), swiglu),
        Sample(
            ops.swiglu.default,
            (t((4, 6), torch.float64, "expanded", True), t((4, 6), torch.float64, grad=True)),
            swiglu,
        ),
        Sample(ops.swiglu.default, (t((0, 3), torch.float16), t((0, 3), torch.float16)), swiglu),
        Sample(ops.swiglu.out, (gate, up), swiglu, {"out": torch.empty(5, 7, device=device)}),
        Sample(ops.swiglu.packed, (t((5, 14), grad=True),), swiglu),
        Sample(ops.swiglu.packed, (t((5, 14), torch.bfloat16, "transposed"),), swiglu),
        Sample(ops.swiglu.packed_out, (packed,), swiglu, {"out": torch.empty(5, 7, device=device)}),
        Sample(ops.swiglu_backward.default, (grad, gate, up), swiglu_backward),
        Sample(
            ops.swiglu_backward.out,
            (grad, gate, up),
            swiglu_backward,
            {
                "grad_gate": torch.empty(5, 7, device=device),
                "grad_up": torch.empty(5, 7, device=device),
            },
        ),
        Sample(ops.swiglu_backward.packed, (grad, packed), swiglu_backward),
        Sample(ops.geglu.default, (t((5, 7), grad=True), up, "tanh"), geglu),
        Sample(
            ops.geglu.default,
            (t((2, 3, 4), torch.float16, "sliced"), t((2, 3, 4), torch.float16), "none"),
            geglu,
        ),
        Sample(ops.geglu.out, (gate, up, "none"), geglu, {"out": torch.empty(5, 7, device=device)}),
        packed_geglu(ops.geglu.packed, (t((5, 14), grad=True),), "tanh"),
        packed_geglu(
            ops.geglu.packed_out, (packed,), "none", {"out": torch.empty(5, 7, device=device)}
        ),
        Sample(ops.geglu_backward.default, (grad, gate, up, "tanh"), geglu_backward),
        Sample(
            ops.geglu_backward.out,
            (grad, gate, up, "tanh"),
            geglu_backward,
            {
                "grad_gate": torch.empty(5, 7, device=device),
                "grad_up": torch.empty(5, 7, device=device),
            },
        ),
        packed_geglu(ops.geglu_backward.packed, (grad, packed), "none"),
        packed_geglu(
            ops.geglu_backward.packed,
            (t((4, 3), torch.bfloat16), t((4, 6), torch.bfloat16)),
            "tanh",
        ),
    ]
    # 301 rows of a packed 2 x 67: several tasks per thread, a vector tail in
    # every half row.
    for dtype in DTYPES:
        result.append(
            Sample(ops.swiglu.packed, (t((301, 134), dtype, grad=True),), swiglu, large=True)
        )
        for approximate in ("none", "tanh"):
            result.append(
                packed_geglu(
                    ops.geglu.packed, (t((301, 134), dtype, grad=True),), approximate, large=True
                )
            )
    return result


def fuzz(d) -> Sample:
    """One random call for tests_py/test_fuzz.py (``d``: fuseops.ops._fuzz.Draw)."""
    ops, approximate, shape = torch.ops.fuseops, d.choice(("none", "tanh")), d.shape(min_dims=1)
    gate = d.tensor(shape, scale=3.0, grad=True)
    up = d.tensor(shape, gate.dtype, grad=True)
    packed = d.tensor(shape[:-1] + (2 * shape[-1],), gate.dtype, 3.0, grad=True)
    return [
        lambda: Sample(ops.swiglu.default, (gate, up), swiglu),
        lambda: Sample(ops.swiglu.packed, (packed,), swiglu),
        lambda: Sample(ops.geglu.default, (gate, up, approximate), geglu),
        lambda: Sample(
            ops.geglu.packed, (packed, approximate), geglu, wrapper_args=(packed, None, approximate)
        ),
    ][d.int(0, 3)]()


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


def export_cases() -> list:
    """The calls the export tests run (fuseops/ops/_export.py): each op in
    both forms, in every dtype, with each GELU form."""
    import itertools

    from ._export import EXPORT_DTYPES, ExportCase, gelu_limits
    from ._export import randn as t

    ops = torch.ops.fuseops
    cases = []
    for op, approximates in ((ops.swiglu, (None,)), (ops.geglu, ("none", "tanh"))):
        for dtype, a, shape in itertools.product(
            EXPORT_DTYPES, approximates, ((5, 24), (2, 3, 17))
        ):
            extra = () if a is None else (a,)
            limits = gelu_limits(dtype, a)
            cases += [
                ExportCase(
                    op.default,
                    f"{dtype} {a} {shape}",
                    (t(*shape, dtype=dtype, scale=3.0), t(*shape, dtype=dtype)),
                    lambda g, u, op=op, extra=extra: op(g, u, *extra),
                    not_run_by=limits,
                ),
                ExportCase(
                    op.packed,
                    f"{dtype} {a} packed {shape}",
                    (t(*shape[:-1], 2 * shape[-1], dtype=dtype, scale=3.0),),
                    lambda x, op=op, extra=extra: op.packed(x, *extra),
                    not_run_by=limits,
                ),
            ]
    return cases


def autocast_cases() -> list:
    """swiglu and geglu under CPU autocast against torch's compositions (tests_py/test_autocast.py)."""
    import torch.nn.functional as F

    from ._autocast import D, LOW, AutocastCase, rand

    return [
        AutocastCase(
            "swiglu",
            swiglu,
            lambda g, u: F.silu(g) * u,
            [
                (rand(4, D), rand(4, D)),
                (rand(4, D, dtype=LOW), rand(4, D)),
                (rand(4, D, dtype=LOW), rand(4, D, dtype=LOW)),
            ],
        ),
        AutocastCase(
            "geglu",
            geglu,
            lambda g, u: F.gelu(g) * u,
            [(rand(4, D), rand(4, D)), (rand(4, D, dtype=LOW), rand(4, D))],
        ),
    ]


__all__ = ["geglu", "geglu_backward", "swiglu", "swiglu_backward"]
