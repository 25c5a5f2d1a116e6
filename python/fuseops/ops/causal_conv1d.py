"""Depthwise causal 1-D convolution as Mamba uses it (the causal-conv1d
package's ``causal_conv1d_fn`` and ``causal_conv1d_update``), its forward op
that also returns the final states, its backward op and the decoding step."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    initial_states: Optional[torch.Tensor] = None,
    return_final_states: bool = False,
    activation: Optional[str] = None,
    *,
    out: Optional[torch.Tensor] = None,
):
    """``out[b, c, t] = act(bias[c] + sum_k weight[c, k] * x[b, c, t - (width-1) + k])``
    for ``x`` of shape ``(batch, dim, seqlen)`` and ``weight`` ``(dim, width)``,
    width 2..4; inputs before ``t = 0`` come from ``initial_states`` ``(batch,
    dim, width-1)`` or are zero; ``activation`` is None or ``"silu"``
    (``"swish"``). Same signature and semantics as the causal-conv1d
    package's ``causal_conv1d_fn``.

    ``x`` is read in place when contiguous or channel-last (``x.stride(1) ==
    1``: a transposed ``(batch, seqlen, dim)`` tensor, its rows possibly
    strided), and the result keeps that layout; other strides are copied
    first. ``weight``/``bias`` have x's dtype, or float32 for bfloat16/float16
    ``x``. Differentiable in x, weight, bias and initial_states.

    With ``return_final_states=True`` returns ``(out, final_states)``: the
    last width-1 inputs of ``initial_states ++ x``, shape ``(batch, dim,
    width-1)``, differentiable too. With ``out=`` the result is written into a
    preallocated tensor (not differentiable; not with final states).
    """
    if out is not None:
        if return_final_states:
            raise ValueError(
                "fuseops.causal_conv1d: out= is not supported with return_final_states=True"
            )
        torch.ops.fuseops.causal_conv1d.out(x, weight, bias, initial_states, activation, out=out)
        return out
    if return_final_states:
        return torch.ops.fuseops.causal_conv1d_forward(x, weight, bias, initial_states, activation)
    return torch.ops.fuseops.causal_conv1d(x, weight, bias, initial_states, activation)


def causal_conv1d_forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    initial_states: Optional[torch.Tensor] = None,
    activation: Optional[str] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``causal_conv1d(..., return_final_states=True)``: ``(out, final_states)``."""
    return torch.ops.fuseops.causal_conv1d_forward(x, weight, bias, initial_states, activation)


def causal_conv1d_backward(
    grad_output: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    initial_states: Optional[torch.Tensor],
    grad_final_states: Optional[torch.Tensor],
    activation: Optional[str],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of causal_conv1d: ``(grad_x, grad_weight, grad_bias,
    grad_initial_states)``, given the output's gradient and optionally the
    final states'. The pre-activation is recomputed from ``x``.
    grad_weight/grad_bias are summed in float32 (float64 for float64) in an
    order that depends on the shapes only, and have weight's dtype; grad_bias
    and grad_initial_states are returned whether or not the forward had them
    (the latter is then the gradient with respect to the zero states)."""
    return torch.ops.fuseops.causal_conv1d_backward(
        grad_output, x, weight, bias, initial_states, grad_final_states, activation
    )


def causal_conv1d_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    activation: Optional[str] = None,
) -> torch.Tensor:
    """One decoding step, as the causal-conv1d package's
    ``causal_conv1d_update``: ``x`` ``(batch, dim)`` or ``(batch, dim,
    seqlen)`` continues the sequence whose last inputs ``conv_state``
    ``(batch, dim, state_len >= width-1)`` holds. Returns the outputs for
    ``x`` (x's shape) and shifts ``conv_state`` in place to the last
    ``state_len`` inputs. For inference: an error while autograd records
    (call under ``torch.no_grad()``/``torch.inference_mode()``); ``x``,
    ``weight`` and ``bias`` must not share memory with ``conv_state``."""
    return torch.ops.fuseops.causal_conv1d_update(x, conv_state, weight, bias, activation)


def _silu_if(y: torch.Tensor, activation: Optional[str]) -> torch.Tensor:
    return F.silu(y) if activation in ("silu", "swish") else y


def causal_conv1d_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    initial_states: Optional[torch.Tensor] = None,
    return_final_states: bool = False,
    activation: Optional[str] = None,
):
    # The standard reference (causal-conv1d's causal_conv1d_ref): F.conv1d
    # with groups=dim, padded by width-1 (or preceded by the initial states),
    # sliced to seqlen.
    dtype = x.dtype
    x = x.to(weight.dtype)
    seqlen, dim, width = x.shape[-1], weight.shape[0], weight.shape[1]
    if initial_states is None:
        out = F.conv1d(x, weight.unsqueeze(1), bias, padding=width - 1, groups=dim)
    else:
        x = torch.cat([initial_states.to(weight.dtype), x], dim=-1)
        out = F.conv1d(x, weight.unsqueeze(1), bias, padding=0, groups=dim)
    out = _silu_if(out[..., :seqlen], activation).to(dtype)
    if not return_final_states:
        return out
    pad = width - 1 - x.shape[-1]
    final_states = F.pad(x, (pad, 0)) if pad > 0 else x[..., x.shape[-1] - (width - 1) :]
    return out, final_states.to(dtype)


def causal_conv1d_forward_reference(x, weight, bias=None, initial_states=None, activation=None):
    return causal_conv1d_reference(x, weight, bias, initial_states, True, activation)


def causal_conv1d_update_reference(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    activation: Optional[str] = None,
) -> torch.Tensor:
    # causal-conv1d's causal_conv1d_update_ref: the convolution over
    # conv_state ++ x, and conv_state shifted in place.
    dtype = x.dtype
    unsqueeze = x.dim() == 2
    if unsqueeze:
        x = x.unsqueeze(-1)
    seqlen, dim, state_len = x.shape[-1], weight.shape[0], conv_state.shape[-1]
    joined = torch.cat([conv_state, x], dim=-1).to(weight.dtype)
    conv_state.copy_(joined[..., -state_len:])
    out = F.conv1d(joined, weight.unsqueeze(1), bias, padding=0, groups=dim)[..., -seqlen:]
    out = _silu_if(out, activation).to(dtype)
    return out.squeeze(-1) if unsqueeze else out


# --- export (fuseops/ops/_export.py) ---

NOT_EXPORTED = {
    ("causal_conv1d_update",): "still to come (the decode step's state update: it shifts its "
    "conv_state argument in place, which the exported graph would have to return as a new "
    "state instead)",
}


def onnx_translations() -> dict:
    """causal_conv1d as its sum of width shifted products."""
    from ._onnx import cast, dtype_of, ints, last_slice, op, opmath, scalar, silu_math, static_dim

    def causal_conv1d_onnx(x, weight, bias=None, initial_states=None, activation=None):
        """``fuseops::causal_conv1d``: the inputs preceded by the initial
        states (or zeros), then ``bias + sum_k weight[:, k] * x[t - (width -
        1) + k]`` in the op's precision, SiLU if asked, rounded to x's dtype."""
        dtype = dtype_of(x)
        ct = opmath(dtype)
        width = static_dim(weight, 1, "causal_conv1d's weight width")
        seqlen = static_dim(x, 2, "causal_conv1d's sequence length")
        xc = cast(x, ct)
        if initial_states is None:
            # Zeros of x's first two dimensions and width - 1 steps.
            shape = op.Concat(op.Shape(x, start=0, end=2), ints(width - 1), axis=0)
            head = op.Expand(scalar(0.0, ct), shape) if width > 1 else None
        else:
            head = cast(initial_states, ct)
        joined = xc if head is None else op.Concat(head, xc, axis=-1)
        w = cast(weight, ct)
        acc = None
        for k in range(width):
            term = op.Mul(
                op.Unsqueeze(last_slice(w, k, k + 1), op.Constant(value_ints=[0])),
                last_slice(joined, k, k + seqlen),
            )
            acc = term if acc is None else op.Add(acc, term)
        if bias is not None:
            acc = op.Add(op.Unsqueeze(cast(bias, ct), op.Constant(value_ints=[0, 2])), acc)
        if activation in ("silu", "swish"):
            acc = silu_math(acc)
        elif activation is not None:
            raise ValueError(f"fuseops.onnx: causal_conv1d's activation {activation!r}")
        return cast(acc, dtype)

    return {torch.ops.fuseops.causal_conv1d.default: causal_conv1d_onnx}


def executorch_decompositions() -> dict:
    """causal_conv1d as its sum of width shifted products."""
    from ._executorch import opmath, silu_math

    def causal_conv1d_decomposition(x, weight, bias=None, initial_states=None, activation=None):
        """``fuseops::causal_conv1d``: the inputs preceded by the initial
        states (or zeros), then ``bias + sum_k weight[:, k] * x[t - (width -
        1) + k]`` in the op's precision, SiLU if asked, rounded to x's dtype."""
        if activation not in (None, "silu", "swish"):
            raise ValueError(f"fuseops.executorch: causal_conv1d's activation {activation!r}")
        ct = opmath(x.dtype)
        width, seqlen = weight.shape[1], x.shape[-1]
        xc = x.to(ct)
        if initial_states is None:
            head = xc.new_zeros(xc.shape[0], xc.shape[1], width - 1)
        else:
            head = initial_states.to(ct)
        joined = torch.cat([head, xc], dim=-1)
        w = weight.to(ct)
        acc = torch.zeros_like(xc) if bias is None else bias.to(ct)[None, :, None].expand_as(xc)
        for k in range(width):
            acc = acc + w[None, :, k : k + 1] * joined[..., k : k + seqlen]
        if activation is not None:
            acc = silu_math(acc)
        return acc.to(x.dtype)

    return {torch.ops.fuseops.causal_conv1d.default: causal_conv1d_decomposition}


__all__ = [
    "causal_conv1d",
    "causal_conv1d_backward",
    "causal_conv1d_forward",
    "causal_conv1d_update",
]
