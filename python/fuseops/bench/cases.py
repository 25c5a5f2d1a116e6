"""The benchmark's case registry: one small declarative entry per op.

An entry names the fuseops function and its reference by attribute (looked up
at run time, so an op that is not in the installed build is reported as "not
built" instead of disappearing), says how to make inputs for a
``(rows, hidden)`` shape, which native PyTorch op is its peer, and how many
bytes the op must move at the least.

Traffic is counted in "rows" (tensors of ``rows * hidden`` elements) and
"vectors" (``hidden`` elements), each read or written once. Per-row statistics
(mean, rstd) are ignored: they are ``hidden`` times smaller than a row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F

EPS = 1e-6

#: Builds the positional inputs for one shape: (rows, hidden, dtype, device, generator).
InputMaker = Callable[[int, int, torch.dtype, torch.device, torch.Generator], tuple]

TRAFFIC_METHOD = "each input read once and each output written once, at the least"


@dataclass(frozen=True)
class Traffic:
    """Least memory traffic, counted in row-sized and vector-sized tensors."""

    rows: int
    vectors: int = 0

    def bytes(self, rows: int, hidden: int, element_size: int) -> int:
        return element_size * (self.rows * rows * hidden + self.vectors * hidden)


@dataclass(frozen=True)
class Case:
    name: str
    #: Attribute of `fuseops` (a string, looked up at run time) or a callable
    #: (tests inject deliberately wrong implementations this way).
    fuseops: str | Callable
    #: Attribute of `fuseops.reference`, or a callable.
    reference: str | Callable
    make_inputs: InputMaker
    forward_traffic: Traffic
    backward_traffic: Traffic
    #: PyTorch's own op, called like the fuseops function, or None.
    native: Optional[Callable] = None
    native_label: str = ""
    #: ATen's preallocated-output variant of the native op, `f(*inputs, **options, out=)`.
    native_out: Optional[Callable] = None
    has_out: bool = True
    #: Keyword arguments after the tensors (eps, approximate), passed to
    #: fuseops, the reference and the native op alike.
    options: dict = field(default_factory=dict)
    #: Which inputs are differentiable (indices into make_inputs' tuple).
    differentiable: Sequence[int] = (0,)
    #: Calls the fuseops function writing into preallocated outputs.
    call_out: Callable = field(
        default=lambda fn, args, options, outs: fn(*args, **options, out=outs[0])
    )
    description: str = ""
    #: Variants of an op already in the registry run only when asked for (by
    #: --ops or --full), keeping the quick preset quick.
    variant: bool = False


def _row(rows, hidden, dtype, device, gen):
    return torch.randn(rows, hidden, dtype=dtype, device=device, generator=gen)


def _vector(hidden, dtype, device, gen, offset=1.0, scale=0.1):
    v = torch.randn(hidden, dtype=torch.float32, device=device, generator=gen)
    return (offset + scale * v).to(dtype)


def _x(rows, hidden, dtype, device, gen):
    return (_row(rows, hidden, dtype, device, gen),)


def _x_weight(rows, hidden, dtype, device, gen):
    return (_row(rows, hidden, dtype, device, gen), _vector(hidden, dtype, device, gen))


def _x_residual_weight(rows, hidden, dtype, device, gen):
    return (
        _row(rows, hidden, dtype, device, gen),
        _row(rows, hidden, dtype, device, gen),
        _vector(hidden, dtype, device, gen),
    )


def _x_weight_bias(rows, hidden, dtype, device, gen):
    return (
        _row(rows, hidden, dtype, device, gen),
        _vector(hidden, dtype, device, gen),
        _vector(hidden, dtype, device, gen, offset=0.0),
    )


def _x_bias(rows, hidden, dtype, device, gen):
    return (_row(rows, hidden, dtype, device, gen), _vector(hidden, dtype, device, gen, 0.0))


def _gate_up(rows, hidden, dtype, device, gen):
    return (_row(rows, hidden, dtype, device, gen), _row(rows, hidden, dtype, device, gen))


def _packed(rows, hidden, dtype, device, gen):
    return (_row(rows, 2 * hidden, dtype, device, gen),)


def _native_fused_add_rms_norm(x, residual, weight, *, eps):
    new_residual = x + residual
    return F.rms_norm(new_residual, (x.shape[-1],), weight, eps), new_residual


def _fused_add_rms_norm_out(fn, args, options, outs):
    fn(*args, **options, out=outs[0], residual_out=outs[1])


CASES: list[Case] = [
    Case(
        "relu", "relu", "relu", _x,
        forward_traffic=Traffic(rows=2),  # x in, y out
        backward_traffic=Traffic(rows=3),  # dy, y in; dx out
        native=torch.relu, native_label="torch.relu",
        native_out=lambda x, *, out: torch.clamp_min(x, 0, out=out),
        description="max(x, 0)",
    ),
    Case(
        "rms_norm", "rms_norm", "rms_norm", _x_weight, options={"eps": EPS},
        forward_traffic=Traffic(rows=2, vectors=1),  # x, w in; y out
        backward_traffic=Traffic(rows=3, vectors=2),  # dy, x, w in; dx, dw out
        native=lambda x, w, *, eps: F.rms_norm(x, (x.shape[-1],), w, eps),
        native_label="F.rms_norm",
        differentiable=(0, 1),
        description="RMSNorm over the last dimension, with weight",
    ),
    Case(
        "fused_add_rms_norm", "fused_add_rms_norm", "fused_add_rms_norm", _x_residual_weight,
        options={"eps": EPS},
        # x, residual, w in; out, new_residual out
        forward_traffic=Traffic(rows=4, vectors=1),
        # d_out, d_new_residual, new_residual, w in; one gradient for x and
        # residual (they are equal), dw out
        backward_traffic=Traffic(rows=4, vectors=2),
        native=_native_fused_add_rms_norm, native_label="x + residual, F.rms_norm",
        differentiable=(0, 1, 2),
        call_out=_fused_add_rms_norm_out,
        description="residual add then RMSNorm; returns (out, new residual)",
    ),
    Case(
        "layer_norm", "layer_norm", "layer_norm", _x_weight_bias, options={"eps": 1e-5},
        forward_traffic=Traffic(rows=2, vectors=2),  # x, w, b in; y out
        backward_traffic=Traffic(rows=3, vectors=3),  # dy, x, w in; dx, dw, db out
        native=lambda x, w, b, *, eps: F.layer_norm(x, (x.shape[-1],), w, b, eps),
        native_label="F.layer_norm",
        differentiable=(0, 1, 2),
        description="LayerNorm over the last dimension, with weight and bias",
    ),
    Case(
        "gelu", "gelu", "gelu", _x, options={"approximate": "none"},
        forward_traffic=Traffic(rows=2),
        backward_traffic=Traffic(rows=3),  # dy, x in; dx out
        native=lambda x, *, approximate: F.gelu(x, approximate=approximate),
        native_label="F.gelu",
        native_out=lambda x, *, approximate, out: torch.ops.aten.gelu.out(
            x, approximate=approximate, out=out
        ),
        description="exact (erf) GELU",
    ),
    Case(
        "gelu_tanh", "gelu", "gelu", _x, options={"approximate": "tanh"},
        forward_traffic=Traffic(rows=2),
        backward_traffic=Traffic(rows=3),
        native=lambda x, *, approximate: F.gelu(x, approximate=approximate),
        native_label="F.gelu(tanh)",
        native_out=lambda x, *, approximate, out: torch.ops.aten.gelu.out(
            x, approximate=approximate, out=out
        ),
        description="tanh-approximated GELU",
        variant=True,
    ),
    Case(
        "silu", "silu", "silu", _x,
        forward_traffic=Traffic(rows=2),
        backward_traffic=Traffic(rows=3),
        native=F.silu, native_label="F.silu",
        native_out=lambda x, *, out: torch.ops.aten.silu.out(x, out=out),
        description="x * sigmoid(x)",
    ),
    Case(
        "bias_gelu", "bias_gelu", "bias_gelu", _x_bias, options={"approximate": "none"},
        forward_traffic=Traffic(rows=2, vectors=1),  # x, bias in; y out
        backward_traffic=Traffic(rows=3, vectors=2),  # dy, x, bias in; dx, dbias out
        native=lambda x, b, *, approximate: F.gelu(x + b, approximate=approximate),
        native_label="F.gelu(x + bias)",
        differentiable=(0, 1),
        description="bias add then exact GELU",
    ),
    Case(
        "swiglu", "swiglu", "swiglu", _gate_up,
        forward_traffic=Traffic(rows=3),  # gate, up in; out
        backward_traffic=Traffic(rows=5),  # dy, gate, up in; dgate, dup out
        differentiable=(0, 1),
        description="silu(gate) * up (the reference is the native composite)",
    ),
    Case(
        "swiglu_packed", "swiglu", "swiglu", _packed,
        forward_traffic=Traffic(rows=3),  # both halves in; out
        backward_traffic=Traffic(rows=5),  # dy, both halves in; the packed gradient out
        description="silu(x[..., :H]) * x[..., H:] on one packed [..., 2H] tensor "
        "(hidden is H)",
        variant=True,
    ),
    Case(
        "geglu", "geglu", "geglu", _gate_up, options={"approximate": "none"},
        forward_traffic=Traffic(rows=3),
        backward_traffic=Traffic(rows=5),
        differentiable=(0, 1),
        description="gelu(gate) * up (the reference is the native composite)",
    ),
]


def by_name(names: Optional[Sequence[str]] = None, variants: bool = True) -> list[Case]:
    """The registered cases, in registry order, restricted to `names`; without
    names, all of them, or all but the variants."""
    if not names:
        return [case for case in CASES if variants or not case.variant]
    known = {case.name: case for case in CASES}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ValueError(
            f"unknown op(s) {', '.join(unknown)}; known: {', '.join(known)}"
        )
    return [known[name] for name in names]
