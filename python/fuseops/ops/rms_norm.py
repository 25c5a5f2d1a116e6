"""rms_norm and fused_add_rms_norm (residual add, then RMSNorm), with the
forward ops that also return what backward needs and the backward ops."""

from __future__ import annotations

import math

from typing import Optional

import torch
import torch.nn.functional as F

from ._sample import DTYPES, Sample, tensor


def rms_norm(
    x: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    eps: Optional[float] = None,
    *,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """RMSNorm over the last dimension, as
    ``F.rms_norm(x, (x.shape[-1],), weight, eps)``: ``x / sqrt(mean(x^2) + eps)
    * weight``, differentiable with respect to ``x`` and ``weight``. ``weight``
    (optional, shape ``(x.shape[-1],)``) may have another floating dtype than
    ``x``; the result has x's dtype. bfloat16/float16 compute in float32.
    ``eps=None`` is PyTorch's default, the machine epsilon of float32 (of
    float64 for float64 input).

    With ``out=`` the result is written into a preallocated tensor (resized if
    its shape differs; ``x`` itself is allowed); that form is not differentiable.
    """
    if out is not None:
        torch.ops.fuseops.rms_norm.out(x, weight, eps, out=out)
        return out
    return torch.ops.fuseops.rms_norm(x, weight, eps)


def rms_norm_forward(
    x: torch.Tensor, weight: Optional[torch.Tensor] = None, eps: Optional[float] = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(x, weight, eps), rstd)``, where ``rstd = 1 / sqrt(mean(x^2) + eps)``
    per row (shape ``x.shape[:-1]``, float32, or float64 for float64 input) is
    what :func:`rms_norm_backward` needs."""
    return torch.ops.fuseops.rms_norm_forward(x, weight, eps)


def rms_norm_backward(
    grad_output: torch.Tensor,
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    rstd: torch.Tensor,
    *,
    grad_input: Optional[torch.Tensor] = None,
    grad_weight: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(grad_input, grad_weight)`` of rms_norm in one pass over the rows;
    grad_weight (weight's dtype, accumulated in float32) is an empty tensor
    when ``weight`` is None. ``grad_input=``/``grad_weight=`` (together) take
    preallocated tensors; grad_input may be ``grad_output`` itself (computed
    in place), as rms_norm's autograd does with a gradient nothing else
    refers to."""
    if grad_input is not None or grad_weight is not None:
        if grad_input is None or grad_weight is None:
            raise TypeError("fuseops.rms_norm_backward: grad_input= and grad_weight= go together")
        torch.ops.fuseops.rms_norm_backward.out(
            grad_output, x, weight, rstd, grad_input=grad_input, grad_weight=grad_weight
        )
        return grad_input, grad_weight
    return torch.ops.fuseops.rms_norm_backward(grad_output, x, weight, rstd)


def fused_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    eps: Optional[float] = None,
    *,
    out: Optional[torch.Tensor] = None,
    residual_out: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual add and RMSNorm in one pass: returns ``(out, new_residual)``
    with ``new_residual = x + residual`` (rounded to the dtype, as ``x +
    residual`` is) and ``out = rms_norm(new_residual, weight, eps)``.
    Differentiable with respect to ``x``, ``residual`` and ``weight``.

    With ``out=`` and ``residual_out=`` (both or neither) the results are
    written into preallocated tensors, which may be ``x`` and ``residual``
    themselves (in place, as inference engines update the residual stream);
    that form is not differentiable.
    """
    if (out is None) != (residual_out is None):
        raise TypeError("fuseops.fused_add_rms_norm: pass both out= and residual_out=, or neither")
    if out is not None:
        torch.ops.fuseops.fused_add_rms_norm.out(
            x, residual, weight, eps, out=out, residual_out=residual_out
        )
        return out, residual_out
    return torch.ops.fuseops.fused_add_rms_norm(x, residual, weight, eps)


def fused_add_rms_norm_forward(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    eps: Optional[float] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(out, new_residual, rstd)``: fused_add_rms_norm plus what
    :func:`fused_add_rms_norm_backward` needs."""
    return torch.ops.fuseops.fused_add_rms_norm_forward(x, residual, weight, eps)


def fused_add_rms_norm_backward(
    grad_output: torch.Tensor,
    grad_new_residual: Optional[torch.Tensor],
    new_residual: torch.Tensor,
    weight: Optional[torch.Tensor],
    rstd: torch.Tensor,
    *,
    grad_input: Optional[torch.Tensor] = None,
    grad_weight: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(grad_input, grad_weight)`` of fused_add_rms_norm. grad_input, the
    gradient of new_residual through the norm plus ``grad_new_residual``, is
    the gradient of both ``x`` and ``residual``. ``grad_input=``/
    ``grad_weight=`` (together) take preallocated tensors as in
    :func:`rms_norm_backward`; grad_input may be ``grad_output`` or
    ``grad_new_residual`` itself (computed in place), as fused_add_rms_norm's
    autograd does with an output gradient nothing else refers to."""
    if grad_input is not None or grad_weight is not None:
        if grad_input is None or grad_weight is None:
            raise TypeError(
                "fuseops.fused_add_rms_norm_backward: grad_input= and grad_weight= go together"
            )
        torch.ops.fuseops.fused_add_rms_norm_backward.out(
            grad_output,
            grad_new_residual,
            new_residual,
            weight,
            rstd,
            grad_input=grad_input,
            grad_weight=grad_weight,
        )
        return grad_input, grad_weight
    return torch.ops.fuseops.fused_add_rms_norm_backward(
        grad_output, grad_new_residual, new_residual, weight, rstd
    )


def _rms_norm_eps(x: torch.Tensor, eps: Optional[float]) -> float:
    # F.rms_norm's default: the machine epsilon of the computation dtype.
    if eps is not None:
        return eps
    return torch.finfo(torch.float64 if x.dtype == torch.float64 else torch.float32).eps


def rms_norm_reference(
    x: torch.Tensor, weight: Optional[torch.Tensor] = None, eps: Optional[float] = None
) -> torch.Tensor:
    # As Llama-style model code writes it: bfloat16/float16 are upcast to
    # float32 for the mean of squares (in half precision it loses the row).
    xf = x.float() if x.dtype in (torch.bfloat16, torch.float16) else x
    y = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + _rms_norm_eps(x, eps))
    if weight is not None:
        y = y * weight
    return y.to(x.dtype)


def rms_norm_backward_reference(
    grad_output: torch.Tensor,
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    rstd: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_input, grad_weight); grad_weight is empty when weight is None."""
    compute = rstd.dtype
    g = grad_output.to(compute)
    x_hat = x.to(compute) * rstd.unsqueeze(-1)
    g_hat = g * weight.to(compute) if weight is not None else g
    grad_input = rstd.unsqueeze(-1) * (g_hat - x_hat * (g_hat * x_hat).mean(dim=-1, keepdim=True))
    if weight is None:
        grad_weight = x.new_empty(0)
    else:
        # The rows counted explicitly: reshape(-1, 0) is ambiguous for hidden size 0.
        rows = math.prod(x.shape[:-1])
        grad_weight = (g * x_hat).reshape(rows, x.shape[-1]).sum(0).to(weight.dtype)
    return grad_input.to(x.dtype), grad_weight


def fused_add_rms_norm_reference(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    eps: Optional[float] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual)."""
    new_residual = x + residual
    return rms_norm_reference(new_residual, weight, eps), new_residual


def fused_add_rms_norm_backward_reference(
    grad_output: torch.Tensor,
    grad_new_residual: Optional[torch.Tensor],
    new_residual: torch.Tensor,
    weight: Optional[torch.Tensor],
    rstd: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_input, grad_weight): rms_norm's backward of new_residual plus
    grad_new_residual, added before rounding to the dtype."""
    compute = rstd.dtype
    grad_input, grad_weight = rms_norm_backward_reference(
        grad_output, new_residual.to(compute), weight, rstd
    )
    if grad_new_residual is not None:
        grad_input = grad_input + grad_new_residual.to(compute)
    if weight is None:
        grad_weight = new_residual.new_empty(0)
    return grad_input.to(new_residual.dtype), grad_weight


def _native_fused_add_rms_norm(x, residual, weight, *, eps):
    new_residual = x + residual
    return F.rms_norm(new_residual, (x.shape[-1],), weight, eps), new_residual


def _fused_add_rms_norm_out(fn, args, options, outs):
    fn(*args, **options, out=outs[0], residual_out=outs[1])


def bench_cases():
    from ._bench_case import EPS, Case, Traffic, x_residual_weight, x_weight

    return [
        Case(
            "rms_norm",
            "rms_norm",
            "rms_norm",
            x_weight,
            options={"eps": EPS},
            forward_traffic=Traffic(rows=2, vectors=1),  # x, w in; y out
            backward_traffic=Traffic(rows=3, vectors=2),  # dy, x, w in; dx, dw out
            native=lambda x, w, *, eps: F.rms_norm(x, (x.shape[-1],), w, eps),
            native_label="F.rms_norm",
            differentiable=(0, 1),
            description="RMSNorm over the last dimension, with weight",
        ),
        Case(
            "fused_add_rms_norm",
            "fused_add_rms_norm",
            "fused_add_rms_norm",
            x_residual_weight,
            options={"eps": EPS},
            # x, residual, w in; out, new_residual out
            forward_traffic=Traffic(rows=4, vectors=1),
            # d_out, d_new_residual, new_residual, w in; one gradient for x and
            # residual (they are equal), dw out
            backward_traffic=Traffic(rows=4, vectors=2),
            native=_native_fused_add_rms_norm,
            native_label="x + residual, F.rms_norm",
            differentiable=(0, 1, 2),
            call_out=_fused_add_rms_norm_out,
            description="residual add then RMSNorm; returns (out, new residual)",
        ),
    ]


def samples(device) -> list[Sample]:
    ops = torch.ops.fuseops

    def t(shape, dtype=torch.float32, layout="contiguous", grad=False):
        return tensor(shape, dtype, device, layout, grad)

    x, r, w = t((5, 24)), t((5, 24)), t((24,))
    _, rstd = rms_norm_forward(x, w)
    _, new_residual, rstd2 = fused_add_rms_norm_forward(x, r, w)
    result = [
        Sample(ops.rms_norm.default, (x, w, 1e-6), rms_norm),
        Sample(ops.rms_norm.default, (x, None, None), rms_norm),
        Sample(
            ops.rms_norm.default, (t((6, 24), torch.bfloat16, "transposed"), None, 1e-5), rms_norm
        ),
        Sample(
            ops.rms_norm.default, (t((3, 4, 24), grad=True), t((24,), grad=True), 1e-6), rms_norm
        ),
        Sample(
            ops.rms_norm.default,
            (t((4, 16), torch.float64, "expanded", True), None, None),
            rms_norm,
        ),
        Sample(
            ops.rms_norm.default,
            (t((3, 16), torch.float16, "sliced"), t((16,), torch.float16, "sliced"), 1e-6),
            rms_norm,
        ),
        # A weight of another floating dtype than the input.
        Sample(ops.rms_norm.default, (t((4, 8), torch.bfloat16), t((8,)), 1e-6), rms_norm),
        Sample(ops.rms_norm.default, (t((0, 16), grad=True), t((16,), grad=True), 1e-6), rms_norm),
        Sample(
            ops.rms_norm.out, (x, w, 1e-6), rms_norm, {"out": torch.empty(5, 24, device=device)}
        ),
        Sample(ops.rms_norm_forward.default, (x, w, None), rms_norm_forward),
        Sample(
            ops.rms_norm_forward.default,
            (t((4, 5), torch.float16), t((5,), torch.float16), None),
            rms_norm_forward,
        ),
        Sample(
            ops.rms_norm_forward.default,
            (t((5, 24), grad=True), t((24,), grad=True), 1e-6),
            rms_norm_forward,
        ),
        Sample(ops.rms_norm_backward.default, (t((5, 24)), x, w, rstd), rms_norm_backward),
        Sample(ops.rms_norm_backward.default, (t((5, 24)), x, None, rstd), rms_norm_backward),
        Sample(
            ops.rms_norm_backward.out,
            (t((5, 24)), x, w, rstd),
            rms_norm_backward,
            {
                "grad_input": torch.empty(5, 24, device=device),
                "grad_weight": torch.empty(24, device=device),
            },
        ),
        Sample(
            ops.rms_norm_backward.out,
            (t((5, 24)), x, None, rstd),
            rms_norm_backward,
            {
                "grad_input": torch.empty(5, 24, device=device),
                "grad_weight": torch.empty(0, device=device),
            },
        ),
        Sample(ops.fused_add_rms_norm.default, (x, r, w, 1e-6), fused_add_rms_norm),
        Sample(
            ops.fused_add_rms_norm.default,
            (
                t((5, 24), grad=True),
                t((5, 24), layout="transposed", grad=True),
                t((24,), grad=True),
                None,
            ),
            fused_add_rms_norm,
        ),
        Sample(
            ops.fused_add_rms_norm.out,
            (x, r, w, 1e-6),
            fused_add_rms_norm,
            {
                "out": torch.empty(5, 24, device=device),
                "residual_out": torch.empty(5, 24, device=device),
            },
        ),
        Sample(
            ops.fused_add_rms_norm_forward.default, (x, r, None, 1e-6), fused_add_rms_norm_forward
        ),
        Sample(
            ops.fused_add_rms_norm_forward.default,
            (t((5, 24), grad=True), t((5, 24), grad=True), t((24,), grad=True), 1e-6),
            fused_add_rms_norm_forward,
        ),
        Sample(
            ops.fused_add_rms_norm_backward.default,
            (t((5, 24)), t((5, 24)), new_residual, w, rstd2),
            fused_add_rms_norm_backward,
        ),
        Sample(
            ops.fused_add_rms_norm_backward.default,
            (t((5, 24)), None, new_residual, w, rstd2),
            fused_add_rms_norm_backward,
        ),
        Sample(
            ops.fused_add_rms_norm_backward.out,
            (t((5, 24)), t((5, 24)), new_residual, w, rstd2),
            fused_add_rms_norm_backward,
            {
                "grad_input": torch.empty(5, 24, device=device),
                "grad_weight": torch.empty(24, device=device),
            },
        ),
        Sample(
            ops.fused_add_rms_norm_backward.out,
            (t((5, 24)), None, new_residual, None, rstd2),
            fused_add_rms_norm_backward,
            {
                "grad_input": torch.empty(5, 24, device=device),
                "grad_weight": torch.empty(0, device=device),
            },
        ),
    ]
    # 300 rows of 1027: several tasks per thread, a tail in every row.
    for dtype in DTYPES:
        result += [
            Sample(
                ops.rms_norm.default,
                (t((300, 1027), dtype, grad=True), t((1027,), dtype, grad=True), 1e-6),
                rms_norm,
                large=True,
            ),
            Sample(
                ops.fused_add_rms_norm.default,
                (
                    t((300, 1027), dtype, grad=True),
                    t((300, 1027), dtype, grad=True),
                    t((1027,), dtype, grad=True),
                    1e-6,
                ),
                fused_add_rms_norm,
                large=True,
            ),
            Sample(ops.rms_norm.default, (t((1027,), dtype), None, 1e-6), rms_norm, large=True),
        ]
    return result


def fuzz(d) -> Sample:
    """One random call for tests_py/test_fuzz.py (``d``: fuseops.ops._fuzz.Draw)."""
    ops, x = torch.ops.fuseops, d.tensor(d.shape(min_dims=1), grad=True)
    # eps=None is the dtype's epsilon: float64's for the float64 reference.
    eps = d.choice((None, 1e-6, 1e-5, 0.5) if x.dtype == torch.float64 else (1e-6, 1e-5, 0.5))
    # A weight of another floating dtype than the input is allowed.
    w = d.maybe(lambda: d.tensor(x.shape[-1:], d.choice((x.dtype, d.dtype())), grad=True))
    kind = d.int(0, 3)
    if kind == 0:
        return Sample(ops.rms_norm.default, (x, w, eps), rms_norm)
    if kind == 1:
        residual = d.tensor(x.shape, x.dtype, grad=True)
        return Sample(ops.fused_add_rms_norm.default, (x, residual, w, eps), fused_add_rms_norm)
    rstd = rms_norm_forward(x.detach(), None if w is None else w.detach(), eps)[1]
    if kind == 2:
        return Sample(
            ops.rms_norm_backward.default,
            (d.tensor(x.shape, x.dtype), x, w, rstd),
            rms_norm_backward,
        )
    # x as new_residual; the gradient of new_residual may be absent.
    grad_new_residual = d.maybe(lambda: d.tensor(x.shape, x.dtype))
    return Sample(
        ops.fused_add_rms_norm_backward.default,
        (d.tensor(x.shape, x.dtype), grad_new_residual, x, w, rstd),
        fused_add_rms_norm_backward,
    )


# --- export: ONNX, ExecuTorch and their test calls (fuseops/ops/_export.py) ---


def onnx_translations() -> dict:
    """rms_norm and fused_add_rms_norm as ONNX ``RMSNormalization`` (the
    residual add in the input's dtype, as the op rounds it); float64 inputs
    decomposed, since the operator keeps its statistics in float32."""
    from ._onnx import DOUBLE, FLOAT, cast, dtype_of, ints, ones_like_last, op, opmath, scalar

    def normalized(x, weight, eps: Optional[float], dtype):
        ct = opmath(dtype)
        if eps is None:  # F.rms_norm's default, as the op's
            eps = torch.finfo(torch.float64 if ct == DOUBLE else torch.float32).eps
        xc = cast(x, ct)
        if ct == FLOAT:
            scale = ones_like_last(xc) if weight is None else cast(weight, FLOAT)
            y = op.RMSNormalization(xc, scale, axis=-1, epsilon=eps, stash_type=1)
        else:
            # RMSNormalization keeps its statistics in float32: float64 by hand.
            mean_square = op.ReduceMean(op.Mul(xc, xc), ints(-1), keepdims=1)
            y = op.Mul(xc, op.Reciprocal(op.Sqrt(op.Add(mean_square, scalar(eps, ct)))))
            if weight is not None:
                y = op.Mul(y, cast(weight, ct))
        return cast(y, dtype)

    def rms_norm_onnx(input, weight=None, eps: Optional[float] = None):
        """``fuseops::rms_norm``: ``RMSNormalization`` over the last dimension."""
        return normalized(input, weight, eps, dtype_of(input))

    def fused_add_rms_norm_onnx(input, residual, weight=None, eps: Optional[float] = None):
        """``fuseops::fused_add_rms_norm``: ``(rms_norm(x + residual), x +
        residual)`` with the sum rounded to the input's dtype (a float32 sum
        of two bfloat16/float16 values rounds to the same value as their sum
        does)."""
        dtype = dtype_of(input)
        ct = opmath(dtype)
        new_residual = cast(op.Add(cast(input, ct), cast(residual, ct)), dtype)
        return normalized(new_residual, weight, eps, dtype), new_residual

    ops = torch.ops.fuseops
    return {
        ops.rms_norm.default: rms_norm_onnx,
        ops.fused_add_rms_norm.default: fused_add_rms_norm_onnx,
    }


def executorch_decompositions() -> dict:
    """rms_norm and fused_add_rms_norm: the mean of squares over the last
    dimension, ``rsqrt``, the weight; the residual add rounded to the input's
    dtype, as the op rounds it."""
    from ._executorch import opmath

    def normalized(x, weight, eps: Optional[float], dtype):
        ct = opmath(dtype)
        if eps is None:  # F.rms_norm's default, as the op's
            eps = torch.finfo(ct).eps
        xc = x.to(ct)
        y = xc * torch.rsqrt((xc * xc).mean(dim=-1, keepdim=True) + eps)
        if weight is not None:
            y = y * weight.to(ct)
        return y.to(dtype)

    def rms_norm_decomposition(input, weight=None, eps: Optional[float] = None):
        """``fuseops::rms_norm``: ``x * rsqrt(mean(x^2) + eps) * weight``."""
        return normalized(input, weight, eps, input.dtype)

    def fused_add_rms_norm_decomposition(input, residual, weight=None, eps=None):
        """``fuseops::fused_add_rms_norm``: ``(rms_norm(x + residual), x +
        residual)`` with the sum rounded to the input's dtype."""
        dtype = input.dtype
        ct = opmath(dtype)
        new_residual = (input.to(ct) + residual.to(ct)).to(dtype)
        return normalized(new_residual, weight, eps, dtype), new_residual

    ops = torch.ops.fuseops
    return {
        ops.rms_norm.default: rms_norm_decomposition,
        ops.fused_add_rms_norm.default: fused_add_rms_norm_decomposition,
    }


def export_cases() -> list:
    """The calls the export tests run (fuseops/ops/_export.py)."""
    from ._export import EXPORT_DTYPES, ExportCase
    from ._export import randn as t

    ops = torch.ops.fuseops
    cases = []
    for dtype in EXPORT_DTYPES:
        cases += [
            ExportCase(
                ops.rms_norm.default, f"{dtype} weight", (t(5, 24, dtype=dtype), t(24, dtype=dtype))
            ),
            # eps=None: the machine epsilon of float32 (of float64 for float64).
            ExportCase(
                ops.rms_norm.default,
                f"{dtype} 3-d, no weight, eps=None",
                (t(2, 3, 40, dtype=dtype, scale=1e-4),),
                lambda x: ops.rms_norm(x, None, None),
            ),
            # A float32 weight on any x; eps large enough to matter.
            ExportCase(
                ops.rms_norm.default,
                f"{dtype} float32 weight, eps=0.5",
                (t(3, 7, dtype=dtype, scale=0.3), t(7)),
                lambda x, w: ops.rms_norm(x, w, 0.5),
            ),
        ]
    cases += [
        ExportCase(
            ops.fused_add_rms_norm.default,
            f"{dtype} {shape}",
            (t(*shape, dtype=dtype), t(*shape, dtype=dtype), t(shape[-1], dtype=dtype)),
            lambda x, r, w: ops.fused_add_rms_norm(x, r, w, 1e-6),
        )
        for dtype in EXPORT_DTYPES
        for shape in ((5, 24), (2, 3, 33))
    ]
    cases.append(
        ExportCase(
            ops.fused_add_rms_norm.default,
            "no weight, eps=None",
            (t(4, 16), t(4, 16)),
            lambda x, r: ops.fused_add_rms_norm(x, r, None, None),
        )
    )
    return cases


def autocast_cases() -> list:
    """rms_norm and fused_add_rms_norm under CPU autocast against torch's (tests_py/test_autocast.py)."""
    import torch.nn.functional as F

    from ._autocast import D, LOW, AutocastCase, rand, weight

    def fused_add_rms_norm_torch(x, residual, w):
        new_residual = x + residual
        return F.rms_norm(new_residual, (D,), w, 1e-6), new_residual

    return [
        AutocastCase(
            "rms_norm",
            lambda x, w: rms_norm(x, w, 1e-6),
            lambda x, w: F.rms_norm(x, (D,), w, 1e-6),
            [(rand(4, D), weight()), (rand(4, D, dtype=LOW), weight())],
        ),
        AutocastCase(
            "fused_add_rms_norm",
            lambda x, r, w: fused_add_rms_norm(x, r, w, 1e-6),
            fused_add_rms_norm_torch,
            [
                (rand(4, D), rand(4, D), weight()),
                (rand(4, D, dtype=LOW), rand(4, D), weight()),
                (rand(4, D, dtype=LOW), rand(4, D, dtype=LOW), weight()),
            ],
        ),
    ]


__all__ = [
    "fused_add_rms_norm",
    "fused_add_rms_norm_backward",
    "fused_add_rms_norm_forward",
    "rms_norm",
    "rms_norm_backward",
    "rms_norm_forward",
]


def row_reduction_cases() -> list:
    """rms_norm: the weight gradient sums over rows (tests_py/test_threads.py)."""
    from ._threads import RowReductionCase, leaves

    x, w = leaves((4096, 1024), (1024,))
    return [RowReductionCase("rms_norm", lambda: rms_norm(x, w, 1e-6), (x, w))]
