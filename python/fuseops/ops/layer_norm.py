"""layer_norm over the last dimension, its forward op that also returns the
statistics backward needs, and its backward op."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ._sample import DTYPES, Sample, tensor


def layer_norm(
    x: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    eps: float = 1e-5,
    *,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Layer normalization over the last dimension, as
    ``F.layer_norm(x, (x.shape[-1],), weight, bias, eps)``; differentiable with
    respect to ``x``, ``weight`` and ``bias`` (each optional, of shape
    ``(x.shape[-1],)`` and x's dtype). bfloat16/float16 compute in float32.

    With ``out=`` the result is written into a preallocated tensor (resized if
    its shape differs; ``x`` itself is allowed); that form is not differentiable.
    """
    if out is not None:
        torch.ops.fuseops.layer_norm.out(x, weight, bias, eps, out=out)
        return out
    return torch.ops.fuseops.layer_norm(x, weight, bias, eps)


def layer_norm_forward(
    x: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    eps: float = 1e-5,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(layer_norm(x, weight, bias, eps), mean, rstd)``: the per-row mean and
    ``rstd = 1 / sqrt(var + eps)`` (shape ``x.shape[:-1]``, float32; float64
    for float64 ``x``) are what :func:`layer_norm_backward` needs. The output
    is differentiable, the statistics are not."""
    return torch.ops.fuseops.layer_norm_forward(x, weight, bias, eps)


def layer_norm_backward(
    grad_output: torch.Tensor,
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    mean: torch.Tensor,
    rstd: torch.Tensor,
    *,
    grad_input: Optional[torch.Tensor] = None,
    grad_weight: Optional[torch.Tensor] = None,
    grad_bias: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of layer_norm: ``(grad_input, grad_weight, grad_bias)`` from
    the per-row ``mean`` and ``rstd = 1 / sqrt(var + eps)`` of ``x``, as
    :func:`layer_norm_forward` returns them (shape ``x.shape[:-1]``) or as
    ``torch.native_layer_norm`` does (shape ``x.shape[:-1] + (1,)``, on CPU
    in x's dtype); used in float32 (float64 for float64 ``x``). grad_weight
    and grad_bias are the row sums of ``grad_output * x_hat`` and
    ``grad_output``, returned whether or not the forward had a weight or bias.
    ``grad_input=``, ``grad_weight=``, ``grad_bias=`` (all three) take
    preallocated tensors; grad_input may be ``grad_output`` itself (computed
    in place), as layer_norm's autograd does with a gradient nothing else
    refers to."""
    outs = (grad_input, grad_weight, grad_bias)
    if any(o is not None for o in outs):
        if any(o is None for o in outs):
            raise TypeError(
                "fuseops.layer_norm_backward: grad_input=, grad_weight= and grad_bias= go together"
            )
        torch.ops.fuseops.layer_norm_backward.out(
            grad_output,
            x,
            weight,
            mean,
            rstd,
            grad_input=grad_input,
            grad_weight=grad_weight,
            grad_bias=grad_bias,
        )
        return outs
    return torch.ops.fuseops.layer_norm_backward(grad_output, x, weight, mean, rstd)


def layer_norm_reference(
    x: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    mean = x.mean(dim=-1, keepdim=True)
    var = (x - mean).pow(2).mean(dim=-1, keepdim=True)
    y = (x - mean) / torch.sqrt(var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


def layer_norm_backward_reference(
    grad_output: torch.Tensor,
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    mean: torch.Tensor,
    rstd: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # With x_hat = (x - mean) * rstd and g = grad_output * weight:
    # grad_input = rstd * (g - mean(g) - x_hat * mean(g * x_hat)).
    # Statistics of shape x.shape[:-1], or with native_layer_norm's trailing 1.
    mean, rstd = mean.reshape(x.shape[:-1]), rstd.reshape(x.shape[:-1])
    x_hat = (x - mean.unsqueeze(-1)) * rstd.unsqueeze(-1)
    g = grad_output * weight if weight is not None else grad_output
    grad_input = rstd.unsqueeze(-1) * (
        g - g.mean(dim=-1, keepdim=True) - x_hat * (g * x_hat).mean(dim=-1, keepdim=True)
    )
    rows = tuple(range(x.dim() - 1))
    grad_weight = (grad_output * x_hat).sum(dim=rows) if rows else grad_output * x_hat
    grad_bias = grad_output.sum(dim=rows) if rows else grad_output.clone()
    return grad_input.to(x.dtype), grad_weight.to(x.dtype), grad_bias.to(x.dtype)


def bench_cases():
    from ._bench_case import Case, Traffic, x_weight_bias

    return [
        Case(
            "layer_norm",
            "layer_norm",
            "layer_norm",
            x_weight_bias,
            options={"eps": 1e-5},
            forward_traffic=Traffic(rows=2, vectors=2),  # x, w, b in; y out
            backward_traffic=Traffic(rows=3, vectors=3),  # dy, x, w in; dx, dw, db out
            native=lambda x, w, b, *, eps: F.layer_norm(x, (x.shape[-1],), w, b, eps),
            native_label="F.layer_norm",
            differentiable=(0, 1, 2),
            description="LayerNorm over the last dimension, with weight and bias",
        ),
    ]


def samples(device) -> list[Sample]:
    ops = torch.ops.fuseops

    def t(shape, dtype=torch.float32, layout="contiguous", grad=False):
        return tensor(shape, dtype, device, layout, grad)

    x, w, b = t((5, 24)), t((24,)), t((24,))
    _, mean, rstd = layer_norm_forward(x, w, b, 1e-5)
    result = [
        Sample(ops.layer_norm.default, (x, w, b, 1e-5), layer_norm),
        Sample(ops.layer_norm.default, (x, None, None, 1e-6), layer_norm),
        Sample(
            ops.layer_norm.default,
            (t((6, 20), torch.bfloat16, "transposed"), None, t((20,), torch.bfloat16), 1e-5),
            layer_norm,
        ),
        Sample(
            ops.layer_norm.default,
            (t((3, 4, 24), grad=True), t((24,), grad=True), t((24,), grad=True), 1e-5),
            layer_norm,
        ),
        Sample(ops.layer_norm.default, (t((3, 24), grad=True), None, None, 1e-5), layer_norm),
        Sample(
            ops.layer_norm.default,
            (
                t((4, 16), torch.float64, "expanded", True),
                t((16,), torch.float64, "sliced", True),
                None,
                1e-5,
            ),
            layer_norm,
        ),
        Sample(
            ops.layer_norm.default,
            (t((2, 3, 16), torch.float16, "sliced"), None, None, 1e-5),
            layer_norm,
        ),
        Sample(
            ops.layer_norm.default,
            (t((0, 16), grad=True), t((16,), grad=True), t((16,), grad=True), 1e-5),
            layer_norm,
        ),
        Sample(
            ops.layer_norm.out,
            (x, w, b, 1e-5),
            layer_norm,
            {"out": torch.empty(5, 24, device=device)},
        ),
        Sample(ops.layer_norm_forward.default, (x, w, None, 1e-5), layer_norm_forward),
        Sample(
            ops.layer_norm_forward.default,
            (t((4, 5, 16), torch.float16), t((16,), torch.float16), None, 1e-5),
            layer_norm_forward,
        ),
        Sample(
            ops.layer_norm_forward.default,
            (t((3, 24), grad=True), t((24,), grad=True), b, 1e-5),
            layer_norm_forward,
        ),
        # Statistics as torch.native_layer_norm keeps them (a trailing 1).
        Sample(
            ops.layer_norm_backward.default,
            (t((5, 24)), x, w, mean[:, None], rstd[:, None]),
            layer_norm_backward,
        ),
        Sample(
            ops.layer_norm_backward.default, (t((5, 24)), x, w, mean, rstd), layer_norm_backward
        ),
        Sample(
            ops.layer_norm_backward.default, (t((5, 24)), x, None, mean, rstd), layer_norm_backward
        ),
        Sample(
            ops.layer_norm_backward.out,
            (t((5, 24)), x, w, mean, rstd),
            layer_norm_backward,
            {
                "grad_input": torch.empty(5, 24, device=device),
                "grad_weight": torch.empty(24, device=device),
                "grad_bias": torch.empty(24, device=device),
            },
        ),
    ]
    for dtype in DTYPES:
        for shape in [(3, 7), (37, 1000), (5, 4099)]:
            result.append(
                Sample(
                    ops.layer_norm.default,
                    (
                        t(shape, dtype, grad=True),
                        t(shape[-1:], dtype, grad=True),
                        t(shape[-1:], dtype, grad=True),
                        1e-5,
                    ),
                    layer_norm,
                    large=True,
                )
            )
    return result


def fuzz(d) -> Sample:
    """One random call for tests_py/test_fuzz.py (``d``: fuseops.ops._fuzz.Draw)."""
    ops, eps = torch.ops.fuseops, d.choice((1e-6, 1e-5, 0.5))
    x = d.tensor(d.shape(min_dims=1), grad=True)
    w, b = (d.maybe(lambda: d.tensor(x.shape[-1:], x.dtype, grad=True)) for _ in "wb")
    if d.flag():
        return Sample(ops.layer_norm.default, (x, w, b, eps), layer_norm)
    _, mean, rstd = layer_norm_forward(x.detach(), None if w is None else w.detach(), None, eps)
    return Sample(
        ops.layer_norm_backward.default,
        (d.tensor(x.shape, x.dtype), x, w, mean, rstd),
        layer_norm_backward,
    )


# --- export: ONNX, ExecuTorch and their test calls (fuseops/ops/_export.py) ---


def onnx_translations() -> dict:
    """layer_norm as ONNX ``LayerNormalization``; float64 inputs decomposed,
    since the operator keeps its statistics in float32."""
    from ._onnx import FLOAT, cast, dtype_of, ints, ones_like_last, op, opmath, scalar

    def layer_norm_onnx(input, weight=None, bias=None, eps: float = 1e-5):
        """``fuseops::layer_norm``: ``LayerNormalization`` over the last dimension."""
        dtype = dtype_of(input)
        ct = opmath(dtype)
        xc = cast(input, ct)
        if ct == FLOAT:
            scale = ones_like_last(xc) if weight is None else cast(weight, FLOAT)
            b = None if bias is None else cast(bias, FLOAT)
            y = op.LayerNormalization(xc, scale, b, axis=-1, epsilon=eps, stash_type=1)
            if isinstance(y, (tuple, list)):
                y = y[0]
        else:
            # LayerNormalization keeps its statistics in float32: float64 by hand.
            centered = op.Sub(xc, op.ReduceMean(xc, ints(-1), keepdims=1))
            var = op.ReduceMean(op.Mul(centered, centered), ints(-1), keepdims=1)
            y = op.Div(centered, op.Sqrt(op.Add(var, scalar(eps, ct))))
            if weight is not None:
                y = op.Mul(y, cast(weight, ct))
            if bias is not None:
                y = op.Add(y, cast(bias, ct))
        return cast(y, dtype)

    return {torch.ops.fuseops.layer_norm.default: layer_norm_onnx}


def executorch_decompositions() -> dict:
    """layer_norm: the mean and (biased) variance over the last dimension,
    ``rsqrt``, the weight and bias."""
    from ._executorch import opmath

    def layer_norm_decomposition(input, weight=None, bias=None, eps: float = 1e-5):
        """``fuseops::layer_norm`` in float32 (float64 for float64)."""
        dtype = input.dtype
        ct = opmath(dtype)
        xc = input.to(ct)
        centered = xc - xc.mean(dim=-1, keepdim=True)
        var = (centered * centered).mean(dim=-1, keepdim=True)
        y = centered * torch.rsqrt(var + eps)
        if weight is not None:
            y = y * weight.to(ct)
        if bias is not None:
            y = y + bias.to(ct)
        return y.to(dtype)

    return {torch.ops.fuseops.layer_norm.default: layer_norm_decomposition}


def export_cases() -> list:
    """The calls the export tests run (fuseops/ops/_export.py)."""
    from ._export import EXPORT_DTYPES, ExportCase
    from ._export import randn as t

    layer_norm = torch.ops.fuseops.layer_norm
    cases = []
    for dtype in EXPORT_DTYPES:
        cases += [
            ExportCase(
                layer_norm.default,
                f"{dtype} weight and bias",
                (t(5, 24, dtype=dtype, scale=3.0), t(24, dtype=dtype), t(24, dtype=dtype)),
                lambda x, w, b: layer_norm(x, w, b, 1e-5),
            ),
            ExportCase(
                layer_norm.default,
                f"{dtype} 3-d, neither, eps=0.5",
                (t(2, 3, 40, dtype=dtype),),
                lambda x: layer_norm(x, None, None, 0.5),
            ),
            ExportCase(
                layer_norm.default,
                f"{dtype} bias only",
                (t(3, 9, dtype=dtype) + 5, t(9, dtype=dtype)),
                lambda x, b: layer_norm(x, None, b, 1e-6),
            ),
        ]
    return cases


def autocast_cases() -> list:
    """layer_norm under CPU autocast against torch's (tests_py/test_autocast.py)."""
    import torch.nn.functional as F

    from ._autocast import D, LOW, AutocastCase, rand, weight

    return [
        AutocastCase(
            "layer_norm",
            lambda x, w, b: layer_norm(x, w, b, 1e-5),
            lambda x, w, b: F.layer_norm(x, (D,), w, b, 1e-5),
            [(rand(4, D), weight(), rand(D)), (rand(4, D, dtype=LOW), weight(), rand(D))],
        )
    ]


__all__ = ["layer_norm", "layer_norm_backward", "layer_norm_forward"]


def row_reduction_cases() -> list:
    """layer_norm: the weight and bias gradients sum over rows
    (tests_py/test_threads.py)."""
    from ._threads import RowReductionCase, leaves

    x, w, b = leaves((4096, 1024), (1024,), (1024,))
    return [RowReductionCase("layer_norm", lambda: layer_norm(x, w, b, 1e-5), (x, w, b))]
