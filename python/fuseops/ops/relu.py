"""relu: ``max(x, 0)`` and its backward."""

from __future__ import annotations

from typing import Optional

import torch

from ._sample import DTYPES, Sample, tensor


def relu(x: torch.Tensor, *, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``max(x, 0)`` elementwise (NaN propagates), differentiable.

    With ``out=`` the result is written into a preallocated tensor (resized if
    its shape differs); like every out= op, that form is not differentiable.
    """
    if out is not None:
        torch.ops.fuseops.relu.out(x, out=out)
        return out
    return torch.ops.fuseops.relu(x)


def relu_backward(
    grad_output: torch.Tensor, result: torch.Tensor, *, out: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """Gradient of relu given its output: ``grad_output`` where ``result > 0``.

    ``out=`` may be ``grad_output`` itself (computed in place), as relu's
    autograd does with a gradient nothing else refers to.
    """
    if out is not None:
        torch.ops.fuseops.relu_backward.out(grad_output, result, out=out)
        return out
    return torch.ops.fuseops.relu_backward(grad_output, result)


def relu_reference(x: torch.Tensor) -> torch.Tensor:
    # clamp_min keeps NaN, as torch.relu does.
    return x.clamp_min(0)


def relu_backward_reference(grad_output: torch.Tensor, result: torch.Tensor) -> torch.Tensor:
    # `result <= 0` is False for NaN, so a NaN result passes the gradient on.
    return torch.where(result <= 0, torch.zeros_like(grad_output), grad_output)


def bench_cases():
    from ._bench_case import Case, Traffic, x

    return [
        Case(
            "relu",
            "relu",
            "relu",
            x,
            forward_traffic=Traffic(rows=2),  # x in, y out
            backward_traffic=Traffic(rows=3),  # dy, y in; dx out
            native=torch.relu,
            native_label="torch.relu",
            native_out=lambda x, *, out: torch.clamp_min(x, 0, out=out),
            description="max(x, 0)",
        ),
    ]


def samples(device) -> list[Sample]:
    ops = torch.ops.fuseops
    x = tensor((5, 7), device=device)
    specials = torch.tensor(
        [0.0, -0.0, float("nan"), float("inf"), float("-inf"), 1.5, -2.0], device=device
    )
    result = []
    for layout, dtype, shape, grad in [
        ("contiguous", torch.float32, (5, 7), False),
        ("contiguous", torch.float32, (4, 3), True),
        ("transposed", torch.bfloat16, (3, 4), True),
        ("sliced", torch.float16, (2, 3, 5), False),
        ("expanded", torch.float64, (4, 6), True),
        ("contiguous", torch.float32, (0, 3), True),
        ("contiguous", torch.float32, (), False),
    ]:
        result.append(Sample(ops.relu.default, (tensor(shape, dtype, device, layout, grad),), relu))
    result += [
        Sample(ops.relu.out, (x,), relu, {"out": torch.empty(5, 7, device=device)}),
        Sample(ops.relu_backward.default, (tensor((5, 7), device=device), relu(x)), relu_backward),
        Sample(
            ops.relu_backward.out,
            (tensor((5, 7), device=device), relu(x)),
            relu_backward,
            {"out": torch.empty(5, 7, device=device)},
        ),
        Sample(
            ops.relu_backward.default,
            (tensor((7, 5), device=device, layout="transposed", grad=True), relu(x.t())),
            relu_backward,
        ),
    ]
    # Every CPU build on the special values, and on 301 rows of 67 (several
    # tasks per thread, a vector tail in every row).
    result.append(Sample(ops.relu.default, (specials.requires_grad_(),), relu, large=True))
    result += [
        Sample(ops.relu.default, (tensor((301, 67), dtype, device, grad=True),), relu, large=True)
        for dtype in DTYPES
    ]
    return result


def fuzz(d) -> Sample:
    """One random call for tests_py/test_fuzz.py (``d``: fuseops.ops._fuzz.Draw)."""
    x = d.tensor(d.shape(), grad=True)
    if d.flag():
        return Sample(torch.ops.fuseops.relu.default, (x,), relu)
    return Sample(
        torch.ops.fuseops.relu_backward.default,
        (d.tensor(x.shape, x.dtype, grad=True), relu(x.detach())),
        relu_backward,
    )


# --- export: ONNX, ExecuTorch and their test calls (fuseops/ops/_export.py) ---


def onnx_translations() -> dict:
    """relu as ONNX ``Relu``."""
    from ._onnx import cast, dtype_of, op, opmath

    def relu_onnx(input):
        """``fuseops::relu``: ``Relu`` (exact in every dtype; computed in
        float32 for bfloat16/float16, which ONNX Runtime's Relu does not
        take)."""
        dtype = dtype_of(input)
        return cast(op.Relu(cast(input, opmath(dtype))), dtype)

    return {torch.ops.fuseops.relu.default: relu_onnx}


def executorch_decompositions() -> dict:
    """relu as ``where(x < 0, 0, x)``."""

    def relu_decomposition(input):
        """``fuseops::relu``: ``where(x < 0, 0, x)`` (exact in every dtype;
        NaN stays NaN, as the op's, where XNNPACK's float16 clamp returns 0)."""
        return torch.where(input < 0, torch.zeros_like(input), input)

    return {torch.ops.fuseops.relu.default: relu_decomposition}


def export_cases() -> list:
    """The calls the export tests run (fuseops/ops/_export.py)."""
    from ._export import elementwise_cases
    from .activation import SPECIAL_VALUES

    return elementwise_cases(torch.ops.fuseops.relu.default, None, SPECIAL_VALUES)


def autocast_cases() -> list:
    """relu under CPU autocast against torch's (tests_py/test_autocast.py)."""
    import torch.nn.functional as F

    from ._autocast import D, LOW, AutocastCase, rand

    return [AutocastCase("relu", relu, F.relu, [(rand(4, D),), (rand(4, D, dtype=LOW),)])]


__all__ = ["relu", "relu_backward"]
