"""The activations gelu (erf or tanh form), silu and bias_gelu (bias add then
gelu), with their backward ops."""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

from ._sample import DTYPES, Sample, tensor

#: Inputs where the activations' special cases live: signed zeros, the
#: saturated tails, infinities and NaN.
SPECIAL_VALUES = (
    0.0,
    -0.0,
    1.0,
    -1.0,
    30.0,
    -30.0,
    100.0,
    -100.0,
    float("inf"),
    float("-inf"),
    float("nan"),
)


def gelu(
    x: torch.Tensor, approximate: str = "none", *, out: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """GELU as ``torch.nn.functional.gelu``: ``approximate="none"`` is
    ``x * Phi(x)`` (erf form), ``"tanh"`` the tanh approximation; any other
    string is an error. Differentiable (twice). bfloat16/float16 compute in
    float32. With ``out=`` the result goes into a preallocated tensor (resized
    if its shape differs); that form is not differentiable."""
    if out is not None:
        torch.ops.fuseops.gelu.out(x, approximate, out=out)
        return out
    return torch.ops.fuseops.gelu(x, approximate)


def gelu_backward(
    grad_output: torch.Tensor,
    x: torch.Tensor,
    approximate: str = "none",
    *,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``grad_output * gelu'(x)``. ``out=`` may be ``grad_output`` itself
    (computed in place), as gelu's autograd does with a gradient nothing else
    refers to."""
    if out is not None:
        torch.ops.fuseops.gelu_backward.out(grad_output, x, approximate, out=out)
        return out
    return torch.ops.fuseops.gelu_backward(grad_output, x, approximate)


def silu(x: torch.Tensor, *, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """SiLU (swish) ``x * sigmoid(x)`` as ``torch.nn.functional.silu``;
    differentiable (twice). ``out=`` as in :func:`gelu`."""
    if out is not None:
        torch.ops.fuseops.silu.out(x, out=out)
        return out
    return torch.ops.fuseops.silu(x)


def silu_backward(
    grad_output: torch.Tensor, x: torch.Tensor, *, out: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """``grad_output * silu'(x)``; ``out=`` as in :func:`gelu_backward`."""
    if out is not None:
        torch.ops.fuseops.silu_backward.out(grad_output, x, out=out)
        return out
    return torch.ops.fuseops.silu_backward(grad_output, x)


def bias_gelu(
    x: torch.Tensor,
    bias: torch.Tensor,
    approximate: str = "none",
    *,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``gelu(x + bias, approximate)`` in one pass (bias 1-D of size
    ``x.shape[-1]``, x's dtype), as Megatron's bias-GELU; differentiable with
    respect to ``x`` and ``bias``. ``out=`` as in :func:`gelu`."""
    if out is not None:
        torch.ops.fuseops.bias_gelu.out(x, bias, approximate, out=out)
        return out
    return torch.ops.fuseops.bias_gelu(x, bias, approximate)


def bias_gelu_backward(
    grad_output: torch.Tensor,
    x: torch.Tensor,
    bias: torch.Tensor,
    approximate: str = "none",
    *,
    grad_input: Optional[torch.Tensor] = None,
    grad_bias: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(grad_input, grad_bias)`` of bias_gelu: ``grad_output * gelu'(x + bias)``
    and its sum over all rows (float32 accumulation for bfloat16/float16).
    ``grad_input=``/``grad_bias=`` (together) take preallocated tensors;
    grad_input may be ``grad_output`` itself (computed in place), as
    bias_gelu's autograd does with a gradient nothing else refers to."""
    if grad_input is not None or grad_bias is not None:
        if grad_input is None or grad_bias is None:
            raise TypeError("fuseops.bias_gelu_backward: grad_input= and grad_bias= go together")
        torch.ops.fuseops.bias_gelu_backward.out(
            grad_output, x, bias, approximate, grad_input=grad_input, grad_bias=grad_bias
        )
        return grad_input, grad_bias
    return torch.ops.fuseops.bias_gelu_backward(grad_output, x, bias, approximate)


def gelu_reference(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    # The textbook formulas, as model code writes them (e.g. "gelu_new").
    if approximate == "tanh":
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))
        return 0.5 * x * (1.0 + torch.tanh(inner))
    if approximate != "none":
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def gelu_backward_reference(
    grad_output: torch.Tensor, x: torch.Tensor, approximate: str = "none"
) -> torch.Tensor:
    if approximate == "tanh":
        k = math.sqrt(2.0 / math.pi)
        t = torch.tanh(k * (x + 0.044715 * x * x * x))
        derivative = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x)
    else:
        cdf = 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))
        pdf = torch.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
        derivative = cdf + x * pdf
    return grad_output * derivative


def silu_reference(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(x)


def silu_backward_reference(grad_output: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    s = torch.sigmoid(x)
    return grad_output * s * (1 + x * (1 - s))


def bias_gelu_reference(
    x: torch.Tensor, bias: torch.Tensor, approximate: str = "none"
) -> torch.Tensor:
    return gelu_reference(x + bias, approximate)


def bias_gelu_backward_reference(
    grad_output: torch.Tensor, x: torch.Tensor, bias: torch.Tensor, approximate: str = "none"
) -> tuple[torch.Tensor, torch.Tensor]:
    grad_input = gelu_backward_reference(grad_output, x + bias, approximate)
    # The rows counted explicitly: reshape(-1, 0) is ambiguous for hidden size 0.
    return grad_input, grad_input.reshape(math.prod(x.shape[:-1]), x.shape[-1]).sum(0)


def _gelu_out(x, *, approximate, out):
    return torch.ops.aten.gelu.out(x, approximate=approximate, out=out)


def bench_cases():
    from ._bench_case import Case, Traffic, x, x_bias

    return [
        Case(
            "gelu",
            "gelu",
            "gelu",
            x,
            options={"approximate": "none"},
            forward_traffic=Traffic(rows=2),
            backward_traffic=Traffic(rows=3),  # dy, x in; dx out
            native=lambda x, *, approximate: F.gelu(x, approximate=approximate),
            native_label="F.gelu",
            native_out=_gelu_out,
            description="exact (erf) GELU",
        ),
        Case(
            "gelu_tanh",
            "gelu",
            "gelu",
            x,
            options={"approximate": "tanh"},
            forward_traffic=Traffic(rows=2),
            backward_traffic=Traffic(rows=3),
            native=lambda x, *, approximate: F.gelu(x, approximate=approximate),
            native_label="F.gelu(tanh)",
            native_out=_gelu_out,
            description="tanh-approximated GELU",
            variant=True,
        ),
        Case(
            "silu",
            "silu",
            "silu",
            x,
            forward_traffic=Traffic(rows=2),
            backward_traffic=Traffic(rows=3),
            native=F.silu,
            native_label="F.silu",
            native_out=lambda x, *, out: torch.ops.aten.silu.out(x, out=out),
            description="x * sigmoid(x)",
        ),
        Case(
            "bias_gelu",
            "bias_gelu",
            "bias_gelu",
            x_bias,
            options={"approximate": "none"},
            forward_traffic=Traffic(rows=2, vectors=1),  # x, bias in; y out
            backward_traffic=Traffic(rows=3, vectors=2),  # dy, x, bias in; dx, dbias out
            native=lambda x, b, *, approximate: F.gelu(x + b, approximate=approximate),
            native_label="F.gelu(x + bias)",
            differentiable=(0, 1),
            description="bias add then exact GELU",
        ),
    ]


def samples(device) -> list[Sample]:
    ops = torch.ops.fuseops

    def t(shape, dtype=torch.float32, layout="contiguous", grad=False):
        return tensor(shape, dtype, device, layout, grad, scale=3.0)

    x, b = t((5, 7)), t((7,))
    specials = torch.tensor(SPECIAL_VALUES, device=device)
    result = [
        Sample(ops.gelu.default, (x, "none"), gelu),
        Sample(ops.gelu.default, (t((4, 3), grad=True), "tanh"), gelu),
        Sample(ops.gelu.default, (t((5, 7), torch.bfloat16, "transposed"), "none"), gelu),
        Sample(ops.gelu.default, (t((2, 3, 4), torch.float64, "expanded", True), "none"), gelu),
        Sample(ops.gelu.default, (t((0, 3), torch.float16), "tanh"), gelu),
        Sample(ops.gelu.default, (t(()), "none"), gelu),
        Sample(ops.gelu.out, (x, "tanh"), gelu, {"out": torch.empty(5, 7, device=device)}),
        Sample(ops.gelu_backward.default, (t((5, 7)), x, "tanh"), gelu_backward),
        Sample(
            ops.gelu_backward.out,
            (t((5, 7)), x, "tanh"),
            gelu_backward,
            {"out": torch.empty(5, 7, device=device)},
        ),
        Sample(
            ops.gelu_backward.default,
            (t((5, 7), grad=True), t((5, 7), grad=True), "none"),
            gelu_backward,
        ),
        Sample(ops.silu.default, (t((4, 3), grad=True),), silu),
        Sample(ops.silu.default, (t((3, 8), torch.float16, "sliced", True),), silu),
        Sample(ops.silu.out, (x,), silu, {"out": torch.empty(5, 7, device=device)}),
        Sample(
            ops.silu_backward.default, (t((5, 7), grad=True), t((5, 7), grad=True)), silu_backward
        ),
        Sample(
            ops.silu_backward.out,
            (t((5, 7)), x),
            silu_backward,
            {"out": torch.empty(5, 7, device=device)},
        ),
        Sample(
            ops.bias_gelu.default, (t((5, 7), grad=True), t((7,), grad=True), "tanh"), bias_gelu
        ),
        Sample(
            ops.bias_gelu.default,
            (
                t((6, 7), torch.bfloat16, "transposed", True),
                t((7,), torch.bfloat16, "sliced", True),
                "none",
            ),
            bias_gelu,
        ),
        Sample(ops.bias_gelu.default, (t((0, 7)), b, "none"), bias_gelu),
        Sample(
            ops.bias_gelu.out, (x, b, "none"), bias_gelu, {"out": torch.empty(5, 7, device=device)}
        ),
        Sample(ops.bias_gelu_backward.default, (t((5, 7)), x, b, "none"), bias_gelu_backward),
        Sample(
            ops.bias_gelu_backward.default,
            (t((4, 5), torch.float16), t((4, 5), torch.float16), t((5,), torch.float16), "tanh"),
            bias_gelu_backward,
        ),
        Sample(
            ops.bias_gelu_backward.out,
            (t((5, 7)), x, b, "tanh"),
            bias_gelu_backward,
            {
                "grad_input": torch.empty(5, 7, device=device),
                "grad_bias": torch.empty(7, device=device),
            },
        ),
    ]
    # Every CPU build on the special values, and on 301 rows of 67 (several
    # tasks per thread, a vector tail in every row).
    result += [
        Sample(ops.gelu.default, (specials.clone().requires_grad_(), "none"), gelu, large=True),
        Sample(ops.gelu.default, (specials.clone().requires_grad_(), "tanh"), gelu, large=True),
        Sample(ops.silu.default, (specials.clone().requires_grad_(),), silu, large=True),
    ]
    for dtype in DTYPES:
        for approximate in ("none", "tanh"):
            result += [
                Sample(
                    ops.gelu.default,
                    (t((301, 67), dtype, grad=True), approximate),
                    gelu,
                    large=True,
                ),
                Sample(
                    ops.bias_gelu.default,
                    (t((301, 67), dtype, grad=True), t((67,), dtype, grad=True), approximate),
                    bias_gelu,
                    large=True,
                ),
            ]
        result.append(Sample(ops.silu.default, (t((301, 67), dtype, grad=True),), silu, large=True))
    return result


def fuzz(d) -> Sample:
    """One random call for tests_py/test_fuzz.py (``d``: fuseops.ops._fuzz.Draw)."""
    ops, approximate, kind = torch.ops.fuseops, d.choice(("none", "tanh")), d.int(0, 5)
    x = d.tensor(d.shape(min_dims=1 if kind >= 4 else 0), scale=3.0, grad=True)
    g, b = d.tensor(x.shape, x.dtype, grad=True), d.tensor(x.shape[-1:], x.dtype, 3.0, grad=True)
    return [
        lambda: Sample(ops.gelu.default, (x, approximate), gelu),
        lambda: Sample(ops.gelu_backward.default, (g, x, approximate), gelu_backward),
        lambda: Sample(ops.silu.default, (x,), silu),
        lambda: Sample(ops.silu_backward.default, (g, x), silu_backward),
        lambda: Sample(ops.bias_gelu.default, (x, b, approximate), bias_gelu),
        lambda: Sample(ops.bias_gelu_backward.default, (g, x, b, approximate), bias_gelu_backward),
    ][kind]()


# --- export: ONNX, ExecuTorch and their test calls (fuseops/ops/_export.py) ---


def onnx_translations() -> dict:
    """gelu (both forms) and bias_gelu as ONNX ``Gelu`` (opset 20), silu as
    ``x * Sigmoid(x)``, computed in float32 (float64 for float64)."""
    from ._onnx import cast, dtype_of, gelu_math, op, opmath, silu_math

    def gelu_onnx(input, approximate: str = "none"):
        """``fuseops::gelu``: ONNX ``Gelu`` (erf or tanh form) in float32."""
        dtype = dtype_of(input)
        return cast(gelu_math(cast(input, opmath(dtype)), approximate), dtype)

    def silu_onnx(input):
        """``fuseops::silu``: ``x * Sigmoid(x)`` in float32."""
        dtype = dtype_of(input)
        return cast(silu_math(cast(input, opmath(dtype))), dtype)

    def bias_gelu_onnx(input, bias, approximate: str = "none"):
        """``fuseops::bias_gelu``: ``Gelu(x + bias)``, the sum kept in float32
        as the op keeps it."""
        dtype = dtype_of(input)
        ct = opmath(dtype)
        return cast(gelu_math(op.Add(cast(input, ct), cast(bias, ct)), approximate), dtype)

    ops = torch.ops.fuseops
    return {
        ops.gelu.default: gelu_onnx,
        ops.silu.default: silu_onnx,
        ops.bias_gelu.default: bias_gelu_onnx,
    }


def executorch_decompositions() -> dict:
    """gelu and bias_gelu: ``aten.gelu`` (the erf form) or the tanh form
    written out; silu: ``x * sigmoid(x)``; in float32 (float64 for float64)."""
    from ._executorch import gelu_math, opmath, silu_math

    def gelu_decomposition(input, approximate: str = "none"):
        """``fuseops::gelu``: the erf or tanh form in float32."""
        return gelu_math(input.to(opmath(input.dtype)), approximate, "gelu").to(input.dtype)

    def silu_decomposition(input):
        """``fuseops::silu``: ``x * sigmoid(x)`` in float32."""
        return silu_math(input.to(opmath(input.dtype))).to(input.dtype)

    def bias_gelu_decomposition(input, bias, approximate: str = "none"):
        """``fuseops::bias_gelu``: ``gelu(x + bias)``, the sum kept in float32
        as the op keeps it."""
        ct = opmath(input.dtype)
        y = gelu_math(input.to(ct) + bias.to(ct), approximate, "bias_gelu")
        return y.to(input.dtype)

    ops = torch.ops.fuseops
    return {
        ops.gelu.default: gelu_decomposition,
        ops.silu.default: silu_decomposition,
        ops.bias_gelu.default: bias_gelu_decomposition,
    }


def export_cases() -> list:
    """The calls the export tests run (fuseops/ops/_export.py)."""
    from ._export import EXPORT_DTYPES, ExportCase, elementwise_cases, gelu_limits
    from ._export import randn as t

    ops = torch.ops.fuseops
    cases = []
    for approximate in ("none", "tanh"):
        cases += elementwise_cases(
            ops.gelu.default,
            lambda x, a=approximate: ops.gelu(x, a),
            SPECIAL_VALUES,
            approximate,
        )
    cases += elementwise_cases(ops.silu.default, None, SPECIAL_VALUES)
    cases += [
        ExportCase(
            ops.bias_gelu.default,
            f"{dtype} {approximate} {shape}",
            (t(*shape, dtype=dtype, scale=3.0), t(shape[-1], dtype=dtype)),
            lambda x, b, a=approximate: ops.bias_gelu(x, b, a),
            not_run_by=gelu_limits(dtype, approximate),
        )
        for approximate in ("none", "tanh")
        for dtype in EXPORT_DTYPES
        for shape in ((5, 24), (2, 3, 17))
    ]
    return cases


def autocast_cases() -> list:
    """gelu, silu and bias_gelu under CPU autocast against torch's (tests_py/test_autocast.py)."""
    import torch.nn.functional as F

    from ._autocast import D, LOW, AutocastCase, rand

    return [
        AutocastCase(
            "gelu",
            lambda x: gelu(x),
            lambda x: F.gelu(x),
            [(rand(4, D),), (rand(4, D, dtype=LOW),)],
        ),
        AutocastCase("silu", silu, F.silu, [(rand(4, D),), (rand(4, D, dtype=LOW),)]),
        AutocastCase(
            "bias_gelu",
            lambda x, b: bias_gelu(x, b, "tanh"),
            lambda x, b: F.gelu(x + b, approximate="tanh"),
            [
                (rand(4, D), rand(D)),
                (rand(4, D, dtype=LOW), rand(D)),
                (rand(4, D, dtype=LOW), rand(D, dtype=LOW)),
            ],
        ),
    ]


__all__ = ["bias_gelu", "bias_gelu_backward", "gelu", "gelu_backward", "silu", "silu_backward"]


def row_reduction_cases() -> list:
    """bias_gelu: the bias gradient sums over rows (tests_py/test_threads.py)."""
    from ._threads import RowReductionCase, leaves

    x, b = leaves((4096, 256), (256,))
    return [RowReductionCase("bias_gelu", lambda: bias_gelu(x, b), (x, b))]
