"""Regressions found by fuzzing (other than out= aliasing, in
test_aliasing.py): unclear errors for missing tensors, valid input refused
with hidden size 0, and gradients silently missing through the backward ops.
"""

from __future__ import annotations

import pytest
import torch

import fuseops
from fuseops import reference

from conftest import expect_error_mentions


def x34():
    return torch.randn(3, 4)


# (op as the dispatcher names it, argument, call) for every op with a tensor
# argument left as None, through the public wrapper and through torch.ops.
MISSING_TENSOR_CALLS = [
    ("fuseops::relu", "input", lambda: fuseops.relu(None)),
    ("fuseops::relu", "input", lambda: torch.ops.fuseops.relu(None)),
    ("fuseops::relu_backward", "result", lambda: fuseops.relu_backward(x34(), None)),
    ("fuseops::gelu", "input", lambda: fuseops.gelu(None)),
    ("fuseops::gelu_backward", "grad_output", lambda: fuseops.gelu_backward(None, x34())),
    ("fuseops::silu", "input", lambda: torch.ops.fuseops.silu(None)),
    ("fuseops::silu_backward", "input", lambda: fuseops.silu_backward(x34(), None)),
    ("fuseops::bias_gelu", "bias", lambda: fuseops.bias_gelu(x34(), None)),
    ("fuseops::bias_gelu", "input", lambda: fuseops.bias_gelu(None, torch.randn(4))),
    ("fuseops::bias_gelu_backward", "bias",
     lambda: fuseops.bias_gelu_backward(x34(), x34(), None)),
    ("fuseops::swiglu", "gate", lambda: torch.ops.fuseops.swiglu(None, x34())),
    ("fuseops::swiglu", "up", lambda: torch.ops.fuseops.swiglu(x34(), None)),
    ("fuseops::swiglu.packed", "input", lambda: fuseops.swiglu(None)),
    ("fuseops::swiglu_backward", "gate", lambda: fuseops.swiglu_backward(x34(), None, x34())),
    ("fuseops::swiglu_backward.packed", "input",
     lambda: fuseops.swiglu_backward(x34(), None)),
    ("fuseops::geglu", "up", lambda: torch.ops.fuseops.geglu(x34(), None)),
    ("fuseops::geglu.packed", "input", lambda: fuseops.geglu(None)),
    ("fuseops::geglu_backward", "up",
     lambda: torch.ops.fuseops.geglu_backward(x34(), x34(), None)),
    ("fuseops::rms_norm", "input", lambda: fuseops.rms_norm(None, torch.randn(4))),
    ("fuseops::rms_norm_forward", "input",
     lambda: fuseops.rms_norm_forward(None, torch.randn(4, requires_grad=True))),
    ("fuseops::rms_norm_backward", "rstd",
     lambda: fuseops.rms_norm_backward(x34(), x34(), None, None)),
    ("fuseops::fused_add_rms_norm", "residual",
     lambda: fuseops.fused_add_rms_norm(x34(), None)),
    ("fuseops::fused_add_rms_norm_backward", "new_residual",
     lambda: fuseops.fused_add_rms_norm_backward(x34(), None, None, None, torch.ones(3))),
    ("fuseops::layer_norm", "input", lambda: fuseops.layer_norm(None)),
]


@pytest.mark.parametrize("op,arg,call", MISSING_TENSOR_CALLS,
                         ids=[f"{op}-{arg}-{i}" for i, (op, arg, _) in enumerate(MISSING_TENSOR_CALLS)])
def test_missing_tensor_names_op_and_argument(op, arg, call):
    expect_error_mentions(call, [op, f"'{arg}'", "undefined"])


@pytest.mark.parametrize("fused", [False, True], ids=["rms_norm", "fused_add_rms_norm"])
def test_hidden_size_zero_with_weight_and_create_graph(fused):
    # Each row is empty: the result is empty, the weight gradient an empty sum.
    x = torch.randn(3, 0, dtype=torch.float64, requires_grad=True)
    w = torch.randn(0, dtype=torch.float64, requires_grad=True)
    if fused:
        r = torch.randn(3, 0, dtype=torch.float64, requires_grad=True)
        y = fuseops.fused_add_rms_norm(x, r, w)[0]
        wanted = reference.fused_add_rms_norm(x, r, w)[0]
    else:
        y = fuseops.rms_norm(x, w)
        wanted = reference.rms_norm(x, w)
    assert y.shape == wanted.shape == (3, 0)
    grad_x, grad_w = torch.autograd.grad(y.sum(), (x, w), create_graph=True)
    assert grad_x.shape == (3, 0) and grad_w.shape == (0,)


def rms_norm_backward_call(x, w, g):
    _, rstd = fuseops.rms_norm_forward(x.detach(), w.detach())
    return fuseops.rms_norm_backward(g, x, w, rstd)


def fused_backward_call(x, w, g):
    _, new_residual, rstd = fuseops.fused_add_rms_norm_forward(
        x.detach(), torch.zeros_like(x).detach(), w.detach())
    return fuseops.fused_add_rms_norm_backward(g, None, x, w, rstd)


def layer_norm_backward_call(x, w, g):
    mean = x.detach().mean(-1)
    rstd = (x.detach().var(-1, unbiased=False) + 1e-5).rsqrt()
    return fuseops.layer_norm_backward(g, x, w, mean, rstd)


BACKWARD_CALLS = {
    "fuseops::rms_norm_backward": rms_norm_backward_call,
    "fuseops::fused_add_rms_norm_backward": fused_backward_call,
    "fuseops::layer_norm_backward": layer_norm_backward_call,
    "fuseops::bias_gelu_backward": lambda x, w, g: fuseops.bias_gelu_backward(g, x, w),
    "fuseops::swiglu_backward": lambda x, w, g: fuseops.swiglu_backward(g, x, x * 2),
    "fuseops::swiglu_backward.packed":
        lambda x, w, g: fuseops.swiglu_backward(g[:, :2], x),
    "fuseops::geglu_backward": lambda x, w, g: fuseops.geglu_backward(g, x, x * 2),
    "fuseops::geglu_backward.packed":
        lambda x, w, g: fuseops.geglu_backward(g[:, :2], x),
}


@pytest.mark.parametrize("op", sorted(BACKWARD_CALLS))
def test_backward_op_without_derivative_refuses_recording(op):
    # One policy for every backward op without a derivative of its own:
    # refuse when a gradient would be recorded, instead of a None gradient.
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, dtype=torch.float64)
    g = torch.randn(3, 4, dtype=torch.float64)
    expect_error_mentions(lambda: BACKWARD_CALLS[op](x, w, g), [op, "not differentiable"])
    with torch.no_grad():
        BACKWARD_CALLS[op](x, w, g)
    BACKWARD_CALLS[op](x.detach(), w, g)


@pytest.mark.parametrize("op", ["relu", "gelu", "silu"])
def test_backward_op_with_derivative_is_differentiable(op):
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    g = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    backward = getattr(fuseops, op + "_backward")
    arg = fuseops.relu(x) if op == "relu" else x
    assert torch.autograd.gradcheck(lambda g, a: backward(g, a), (g, arg.detach().requires_grad_(op != "relu")))
