"""Runs sample calls of fuseops ops and collects what they computed, in the
test process and in the per-CPU-build child processes of test_conformance
(which import this file, so it needs nothing but torch and fuseops)."""

from __future__ import annotations

import torch


def as_tuple(result) -> tuple:
    if result is None:
        return ()
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def resolve(name: str, overload: str) -> torch._ops.OpOverload:
    return getattr(getattr(torch.ops.fuseops, name), overload)


def run(op, args: tuple, kwargs: dict, grad_outputs=None):
    """Calls ``op(*args, **kwargs)`` and, where outputs require grad,
    backpropagates `grad_outputs` (one per such output; random ones drawn
    here when None). Returns (results, grad_outputs): the outputs (the out=
    tensors for an out overload) followed by the gradients of the inputs
    that require grad."""
    result = op(*args, **kwargs)
    outputs = tuple(kwargs.values()) if kwargs else as_tuple(result)
    differentiable = [o for o in outputs if isinstance(o, torch.Tensor) and o.requires_grad]
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    grads = ()
    if differentiable and leaves:
        if grad_outputs is None:
            grad_outputs = [torch.randn_like(o) for o in differentiable]
        grads = torch.autograd.grad(differentiable, leaves, grad_outputs, allow_unused=True)
    results = tuple(
        t.detach() if isinstance(t, torch.Tensor) else t for t in outputs + tuple(grads)
    )
    return results, grad_outputs


def main(calls_path: str, results_path: str) -> None:
    """Runs every call saved in `calls_path` as (name, overload, args,
    kwargs, grad_outputs) and saves the results to `results_path`."""
    import fuseops  # noqa: F401  (registers torch.ops.fuseops)

    calls = torch.load(calls_path)
    torch.save(
        [
            run(resolve(name, overload), args, kwargs, grad_outputs)[0]
            for name, overload, args, kwargs, grad_outputs in calls
        ],
        results_path,
    )
