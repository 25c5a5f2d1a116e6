"""How an op is called in each mode: its input sets, and the callables the
timer runs for fuseops, its peers and the copy that stands for the roofline."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from .cases import Case

ROOFLINE_METHOD = "a tensor copy moving the same number of bytes, timed in the same run"


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


def forward_call(fn: Callable, case: Case, inputs: InputSet) -> Callable[[], tuple]:
    return lambda: as_tuple(fn(*inputs.args, **case.options))


def backward_call(fn: Callable, case: Case, inputs: InputSet) -> Callable[[], tuple]:
    wrt = tuple(inputs.grad_args[i] for i in case.differentiable)

    def call():
        outputs = as_tuple(fn(*inputs.grad_args, **case.options))
        grads = torch.autograd.grad(outputs, wrt, inputs.grad_outputs)
        return tuple(o.detach() for o in outputs) + tuple(grads)

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


def rotating(make_call, fn: Callable, case: Case, sets: Sequence[InputSet]) -> Callable:
    """One call per input set, in turn: with sets that together exceed twice
    the cache, every call reads its inputs from memory."""
    calls = itertools.cycle([make_call(fn, case, inputs) for inputs in sets])
    return lambda: next(calls)()


def make_sets(case: Case, dtype, shape, device, count: int, seed: int) -> list[InputSet]:
    rows, hidden = shape
    sets = []
    for index in range(count):
        gen = torch.Generator(device=device).manual_seed(seed + index)
        args = case.make_inputs(rows, hidden, dtype, device, gen)
        grad_args = tuple(
            a.detach().clone().requires_grad_(i in case.differentiable)
            for i, a in enumerate(args)
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
