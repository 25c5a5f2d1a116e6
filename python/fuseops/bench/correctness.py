"""Correctness: fuseops' result against a high-precision reference computed
on the same inputs, within a tolerance per dtype."""

from __future__ import annotations

import argparse

import math
from typing import Callable

import torch

from .calls import InputSet, as_tuple
from .cases import Case
from .results import BACKWARD_MODES

# Allowed error of fuseops against the reference, per dtype (rtol, atol):
# |got - want| <= atol * max(1, max|want|) + rtol * |want| elementwise. atol
# scales with the tensor's largest value, so that elements near zero (which
# cancellation in a row reduction makes inexact in any float32 code) and
# weight gradients summed over thousands of rows are judged at their tensor's
# scale. float32 is compared with a float64 reference; bfloat16/float16 with a
# float32-computed reference rounded to the dtype, allowing about two units in
# the last place.
TOLERANCES = {
    torch.float64: (1e-9, 1e-12),
    torch.float32: (1e-4, 1e-5),
    torch.bfloat16: (2e-2, 1e-2),
    torch.float16: (4e-3, 1e-3),
}

TOLERANCE_METHOD = (
    "|got - want| <= atol * max(1, max|want|) + rtol * |want|; want is the reference computed "
    "in float64 (float32/float64 inputs) or in float32 and rounded to the dtype "
    "(bfloat16/float16 inputs)"
)


def expected(reference_fn: Callable, case: Case, inputs: InputSet, mode: str, dtype) -> tuple:
    """The reference result in high precision: float64 for float32/float64
    inputs, float32 rounded to the dtype for bfloat16/float16."""
    compute = torch.float64 if dtype in (torch.float32, torch.float64) else torch.float32
    args = tuple(a.detach().to(compute) for a in inputs.args)
    if mode in BACKWARD_MODES:
        args = tuple(a.requires_grad_() for a in args)
        outputs = as_tuple(reference_fn(*args, **case.options))
        grad_outputs = tuple(g.to(compute) for g in inputs.grad_outputs)
        wrt = tuple(args[i] for i in case.differentiable)
        grads = torch.autograd.grad(outputs, wrt, grad_outputs)
        result = tuple(o.detach() for o in outputs) + tuple(grads)
    else:
        with torch.no_grad():
            result = as_tuple(reference_fn(*args, **case.options))
    return tuple(r.to(dtype).to(compute) for r in result)


def compare(got: tuple, want: tuple, dtype) -> tuple[float, float]:
    """(max abs error, worst error / allowed error) over all result tensors."""
    if len(got) != len(want):
        raise AssertionError(f"returned {len(got)} tensors, the reference {len(want)}")
    rtol, atol = TOLERANCES[dtype]
    max_err = worst = 0.0
    for g, w in zip(got, want):
        if tuple(g.shape) != tuple(w.shape):
            raise AssertionError(f"shape {tuple(g.shape)}, the reference {tuple(w.shape)}")
        g = g.detach().to(w.dtype)
        w_nan = torch.isnan(w)
        if not torch.equal(torch.isnan(g), w_nan):
            return math.inf, math.inf
        if w.numel() == 0:
            continue
        w_abs = w.abs().nan_to_num_(nan=0.0)
        diff = (g - w).abs_().masked_fill_(w_nan, 0.0)
        scale = max(1.0, w_abs.max().item())
        allowed = w_abs.mul_(rtol).add_(atol * scale)
        max_err = max(max_err, diff.max().item())
        worst = max(worst, diff.div_(allowed).max().item())
    return max_err, worst


def parse_dtypes(text: str) -> list[torch.dtype]:
    dtypes = []
    for name in (item.strip() for item in text.split(",") if item.strip()):
        dtype = getattr(torch, name, None)
        if dtype not in TOLERANCES:
            raise argparse.ArgumentTypeError(
                f"unsupported dtype {name!r}: use float32, bfloat16, float16 or float64"
            )
        dtypes.append(dtype)
    return dtypes
