"""What an op module's ``bench_cases()`` returns: ``Case`` (one row of
``python -m fuseops bench``), ``Traffic`` (the bytes it must move at the
least) and the input makers the cases share. Declarations only, in the op
layer, so that the op modules describe their bench rows without importing
the bench (``fuseops.bench.cases`` collects them and re-exports these).

Traffic is counted in "rows" (tensors of ``rows * hidden`` elements) and
"vectors" (``hidden`` elements), each read or written once. Per-row statistics
(mean, rstd) are ignored: they are ``hidden`` times smaller than a row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Protocol, Sequence, TypedDict

import torch
from torch.utils.weak import WeakTensorKeyDictionary

EPS = 1e-6

#: Builds the positional inputs for one shape: (rows, hidden, dtype, device, generator).
InputMaker = Callable[[int, int, torch.dtype, torch.device, torch.Generator], tuple]

TRAFFIC_METHOD = "each input read once and each output written once, at the least"


@dataclass(frozen=True)
class Traffic:
    """Least memory traffic, counted in row-sized and vector-sized tensors."""

    rows: int
    vectors: int = 0
    #: Bytes whose size does not follow the dtype (an int8 weight and its
    #: scales), as a function of (rows, hidden).
    extra: Optional[Callable[[int, int], int]] = None

    def bytes(self, rows: int, hidden: int, element_size: int) -> int:
        extra = self.extra(rows, hidden) if self.extra is not None else 0
        return element_size * (self.rows * rows * hidden + self.vectors * hidden) + extra


class TrafficModel(Protocol):
    """What a case's traffic provides: ``Traffic``, or an op's own count of
    the bytes (rope's q and k, whose sizes are not rows x hidden)."""

    def bytes(self, rows: int, hidden: int, element_size: int) -> int: ...


@dataclass(frozen=True)
class Case:
    name: str
    #: Attribute of `fuseops` (a string, looked up at run time) or a callable
    #: (tests inject deliberately wrong implementations this way).
    fuseops: str | Callable
    #: Attribute of `fuseops.reference`, or a callable.
    reference: str | Callable
    make_inputs: InputMaker
    forward_traffic: TrafficModel
    backward_traffic: TrafficModel
    #: PyTorch's own op, called like the fuseops function, or None.
    native: Optional[Callable] = None
    native_label: str = ""
    #: ATen's preallocated-output variant of the native op, `f(*inputs, **options, out=)`.
    native_out: Optional[Callable] = None
    has_out: bool = True
    #: Keyword arguments after the tensors (eps, approximate), passed to
    #: fuseops, the reference and the native op alike.
    options: dict = field(default_factory=dict)
    #: Which inputs are differentiable (indices into make_inputs' tuple);
    #: none (an inference op) leaves out the forward+backward rows.
    differentiable: Sequence[int] = (0,)
    #: The case's own (rows, hidden) shapes per shape preset ("quick",
    #: "standard", "full"), for ops that are not timed at the presets' row x
    #: hidden tensors (a linear layer: rows = tokens, hidden = its features);
    #: shapes given explicitly on the command line apply to every case.
    shapes: Optional[dict] = None
    #: Calls the fuseops function writing into preallocated outputs.
    call_out: Callable = field(
        default=lambda fn, args, options, outs: fn(*args, **options, out=outs[0])
    )
    description: str = ""
    #: Variants of an op already in the registry run only when asked for (by
    #: --ops or the full preset), keeping the other presets short.
    variant: bool = False
    #: The op module that registers the case (its family: the quick preset
    #: runs one case of each); the registry sets it.
    family: str = ""


class CaseFields(TypedDict, total=False):
    """Keyword arguments of ``Case`` that several of an op module's cases
    share, for ``common: CaseFields = dict(...)`` then ``Case(**common, ...)``
    (the type checker then checks each against ``Case``)."""

    fuseops: str
    reference: str
    make_inputs: InputMaker
    forward_traffic: Traffic
    backward_traffic: Traffic
    has_out: bool
    options: dict
    differentiable: Sequence[int]
    shapes: dict
    call_out: Callable


# Input makers the op modules' cases share.


def row(rows, hidden, dtype, device, gen):
    return torch.randn(rows, hidden, dtype=dtype, device=device, generator=gen)


def vector(hidden, dtype, device, gen, offset=1.0, scale=0.1):
    v = torch.randn(hidden, dtype=torch.float32, device=device, generator=gen)
    return (offset + scale * v).to(dtype)


def x(rows, hidden, dtype, device, gen):
    return (row(rows, hidden, dtype, device, gen),)


def x_weight(rows, hidden, dtype, device, gen):
    return (row(rows, hidden, dtype, device, gen), vector(hidden, dtype, device, gen))


def x_residual_weight(rows, hidden, dtype, device, gen):
    return (
        row(rows, hidden, dtype, device, gen),
        row(rows, hidden, dtype, device, gen),
        vector(hidden, dtype, device, gen),
    )


def x_weight_bias(rows, hidden, dtype, device, gen):
    return (
        row(rows, hidden, dtype, device, gen),
        vector(hidden, dtype, device, gen),
        vector(hidden, dtype, device, gen, offset=0.0),
    )


def x_bias(rows, hidden, dtype, device, gen):
    return (row(rows, hidden, dtype, device, gen), vector(hidden, dtype, device, gen, 0.0))


def gate_up(rows, hidden, dtype, device, gen):
    return (row(rows, hidden, dtype, device, gen), row(rows, hidden, dtype, device, gen))


def packed(rows, hidden, dtype, device, gen):
    return (row(rows, 2 * hidden, dtype, device, gen),)


# The peers' own forms of a bench input (a dequantized weight, another
# library's packing), made on a peer's first, untimed, correctness-checking
# call and reused by the timed ones. Keyed weakly on the input tensor itself:
# a form lives as long as its input, and a later input that happens to get a
# freed one's address does not find the freed one's form.
_PEER_FORMS: WeakTensorKeyDictionary = WeakTensorKeyDictionary()


def peer_form(source: torch.Tensor, key: tuple, make: Callable[[], object]):
    """The form `key` of `source` (made by ``make()`` on first use)."""
    forms = _PEER_FORMS.get(source)
    if forms is None:
        forms = _PEER_FORMS[source] = {}
    if key not in forms:
        forms[key] = make()
    return forms[key]
