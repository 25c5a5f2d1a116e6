"""How an op is called in each mode: its input sets, and the callables the
timer runs for fuseops, its peers and the copy that stands for the roofline."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from .cases import Case

ROOFLINE_METHOD = "a tensor copy moving the same number of bytes, timed in the same run"
FRESH_GRAD_METHOD = (
    "fwd+bwd fresh grad rows: each output's upstream gradient is a copy of the row's gradient "
    "made before the call, outside the timed region, whose only reference a loss node moves "
    "into the graph, as a model's next layer hands over the gradient it returned; every "
    "implementation gets it the same way. fwd+bwd rows pass gradients the caller keeps "
    "referring to, which no backward may write over."
)


def as_tuple(result) -> tuple:
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def resolve(case: Case) -> tuple[Optional[Callable], Optional[Callable], str]:
    import fuseops
    import fuseops.reference

    fuseops_fn = case.fuseops if callable(case.fuseops) else getattr(fuseops, case.fuseops, None)
    reference_fn = (
        case.reference
        if callable(case.reference)
        else getattr(fuseops.reference, case.reference, None)
    )
    missing = []
    if fuseops_fn is None:
        missing.append(f"fuseops.{case.fuseops} is not in the installed fuseops")
    if reference_fn is None:
        missing.append(f"fuseops.reference.{case.reference} is missing")
    return fuseops_fn, reference_fn, "; ".join(missing)


@dataclass
class InputSet:
    args: tuple
    grad_args: tuple  # the same values, as leaves that require grad
    grad_outputs: tuple = ()
    outs: tuple = ()
    #: Copies of grad_outputs that only this set refers to, waiting to be
    #: handed over to a fresh-gradient call (None once handed over).
    fresh_grads: Optional[tuple] = None

    def refill_fresh_grads(self) -> None:
        self.fresh_grads = tuple(g.clone() for g in self.grad_outputs)


def forward_call(fn: Callable, case: Case, inputs: InputSet) -> Callable[[], tuple]:
    return lambda: as_tuple(fn(*inputs.args, **case.options))


def backward_call(fn: Callable, case: Case, inputs: InputSet) -> Callable[[], tuple]:
    wrt = tuple(inputs.grad_args[i] for i in case.differentiable)

    def call():
        outputs = as_tuple(fn(*inputs.grad_args, **case.options))
        grads = torch.autograd.grad(outputs, wrt, inputs.grad_outputs)
        return tuple(o.detach() for o in outputs) + tuple(grads)

    return call


class _HandOver(torch.autograd.Function):
    """The loss of a fresh-gradient call: a scalar computed from the op's
    outputs, whose backward hands each output the gradient waiting in the
    input set, taking the set's reference with it."""

    @staticmethod
    def forward(ctx, inputs: InputSet, *outputs):
        ctx.inputs = inputs
        return outputs[0].new_zeros(())

    @staticmethod
    def backward(ctx, _):
        grads, ctx.inputs.fresh_grads = ctx.inputs.fresh_grads, None
        if grads is None:
            raise RuntimeError("the fresh gradient was handed over already: refill first")
        # The returned tuple holds the only references once this frame is gone.
        return (None, *grads)


def fresh_grad_call(fn: Callable, case: Case, inputs: InputSet) -> Callable[[], tuple]:
    """Forward and backward with the upstream gradient as training makes it:
    a new tensor that autograd alone refers to (in a model, what the next
    layer's backward returned), which a backward may write its result over
    (python/README.md: "Gradients written over the incoming gradient").

    backward_call hands autograd the input set's own grad_outputs, which the
    set keeps referring to, so no backward may ever take it over. Here a
    copy of them waits in the set and the loss node _HandOver moves it into
    the graph. Every peer (fuseops, the eager reference, torch.compile of
    the reference, the native op) is called through the same function and
    gets the same tensors the same way; the copy is made by `refill` outside
    the timed region (timing.refill), so no peer pays for producing its
    upstream gradient, and each pays for whatever it allocates and frees
    itself. Timing `(op(x) * u).sum()` instead would make the gradient fresh
    too, but add a multiply to every call and let torch.compile fuse the
    multiply's backward into the op's, skipping the upstream gradient a real
    model's next layer (a matmul) does produce."""
    wrt = tuple(inputs.grad_args[i] for i in case.differentiable)

    def call():
        outputs = as_tuple(fn(*inputs.grad_args, **case.options))
        grads = torch.autograd.grad(_HandOver.apply(inputs, *outputs), wrt)
        return tuple(o.detach() for o in outputs) + tuple(grads)

    call.refill = inputs.refill_fresh_grads  # type: ignore[attr-defined]
    return call


def out_call(fn: Callable, case: Case, inputs: InputSet) -> Callable[[], tuple]:
    def call():
        case.call_out(fn, inputs.args, case.options, inputs.outs)
        return inputs.outs

    return call


def native_out_call(fn: Callable, case: Case, inputs: InputSet) -> Callable[[], tuple]:
    def call():
        fn(*inputs.args, **case.options, out=inputs.outs[0])
        return inputs.outs

    return call


class _Rotation:
    """One call per input set, in turn: with sets that together exceed twice
    the cache, every call reads its inputs from memory. When the calls
    consume a prepared input, `refill` prepares again that of the set called
    last; the next call of that set comes after all the others, so what was
    prepared is out of the cache by then, as the rest of its inputs are."""

    def __init__(self, calls: list[Callable]):
        self.calls = calls
        # Calls in one turn through the sets: the timer's least warm-up, so
        # that what a callable makes on its first call of a set (a peer's
        # own form of the weight) is made before any call is timed.
        self.cycle = len(calls)
        self.index = -1
        if all(hasattr(call, "refill") for call in calls):
            self.refill = lambda: self.calls[self.index].refill()  # type: ignore[attr-defined]

    def __call__(self):
        self.index = (self.index + 1) % len(self.calls)
        return self.calls[self.index]()


def rotating(make_call, fn: Callable, case: Case, sets: Sequence[InputSet]) -> Callable:
    return _Rotation([make_call(fn, case, inputs) for inputs in sets])


def make_sets(case: Case, dtype, shape, device, count: int, seed: int) -> list[InputSet]:
    rows, hidden = shape
    sets = []
    for index in range(count):
        gen = torch.Generator(device=device).manual_seed(seed + index)
        args = case.make_inputs(rows, hidden, dtype, device, gen)
        grad_args = tuple(
            a.detach().clone().requires_grad_(i in case.differentiable) for i, a in enumerate(args)
        )
        sets.append(InputSet(args=args, grad_args=grad_args))
    return sets


def copy_call(bytes_moved: int, set_count: int, device: torch.device) -> Callable[[], object]:
    """A copy reading and writing `bytes_moved` bytes in all, on `device`,
    rotating through as many buffers as the op's input sets."""
    numel = max(1, bytes_moved // 8)  # float32: 4 bytes read + 4 written
    pairs = [
        (torch.randn(numel, device=device), torch.empty(numel, device=device))
        for _ in range(set_count)
    ]
    for src, dst in pairs:
        dst.copy_(src)  # first touch of dst outside the timing
    calls = itertools.cycle([lambda s=s, d=d: d.copy_(s) for s, d in pairs])
    return lambda: next(calls)()
