"""Backward kernels write the input gradient over the gradient autograd hands
them when nothing else refers to it (cpp/ops/autograd/reusable_gradient.h),
and leave any gradient someone else can see alone.

The upstream gradient comes from `Fresh`, whose backward returns a new tensor
and remembers only its address: when the op's gradient has that address, the
backward reused it. Values are checked against the same backward computed
into a fresh tensor (the out= overload with a new `out`), bit for bit.
"""

from __future__ import annotations

import pytest
import torch

import fuseops


class Fresh(torch.autograd.Function):
    """Identity whose backward hands on a new tensor, nothing else holding it."""

    address = None

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        fresh = grad * 1.0
        Fresh.address = fresh.data_ptr()
        return fresh


UP_SCALE = 0.75

# name -> (forward of x, expected input gradient given (x, upstream gradient))
OPS = {
    "relu": (fuseops.relu,
             lambda x, g: fuseops.relu_backward(g, fuseops.relu(x), out=torch.empty_like(x))),
    "gelu": (lambda x: fuseops.gelu(x, "tanh"),
             lambda x, g: fuseops.gelu_backward(g, x, "tanh", out=torch.empty_like(x))),
    "silu": (fuseops.silu,
             lambda x, g: fuseops.silu_backward(g, x, out=torch.empty_like(x))),
    # Gated: the gate's gradient reuses the buffer (up = a fixed function of x).
    # The norms: the input's gradient does (the weight's is a new tensor).
    "swiglu": (lambda x: fuseops.swiglu(x, UP_SCALE * x.detach()),
               lambda x, g: fuseops.swiglu_backward(g, x, UP_SCALE * x,
                                                    grad_gate=torch.empty_like(x),
                                                    grad_up=torch.empty_like(x))[0]),
    "geglu": (lambda x: fuseops.geglu(x, UP_SCALE * x.detach(), "tanh"),
              lambda x, g: fuseops.geglu_backward(g, x, UP_SCALE * x, "tanh",
                                                  grad_gate=torch.empty_like(x),
                                                  grad_up=torch.empty_like(x))[0]),
    "rms_norm": (lambda x: fuseops.rms_norm(x, norm_weight(x), 1e-6),
                 lambda x, g: fuseops.rms_norm_backward(
                     g, x, norm_weight(x), fuseops.rms_norm_forward(x, norm_weight(x), 1e-6)[1],
                     grad_input=torch.empty_like(x),
                     grad_weight=torch.empty(x.shape[-1], dtype=x.dtype))[0]),
    "layer_norm": (lambda x: fuseops.layer_norm(x, norm_weight(x), norm_weight(x), 1e-5),
                   lambda x, g: fuseops.layer_norm_backward(
                       g, x, norm_weight(x), *fuseops.layer_norm_forward(x, norm_weight(x),
                                                                          norm_weight(x), 1e-5)[1:],
                       grad_input=torch.empty_like(x),
                       grad_weight=torch.empty(x.shape[-1], dtype=x.dtype),
                       grad_bias=torch.empty(x.shape[-1], dtype=x.dtype))[0]),
}


def norm_weight(x):
    return torch.linspace(0.5, 1.5, x.shape[-1], dtype=x.dtype)


def inputs(dtype):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(67, 301, generator=gen).to(dtype).requires_grad_()
    upstream = torch.randn(67, 301, generator=gen).to(dtype)
    return x, upstream


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(OPS))
def test_sole_owner_gradient_is_reused(name, dtype):
    forward, expected = OPS[name]
    x, upstream = inputs(dtype)
    # d(sum(f(x) * u))/df = u, handed to the op's backward by Fresh as a new tensor.
    (grad,) = torch.autograd.grad((Fresh.apply(forward(x)) * upstream).sum(), x)
    assert grad.data_ptr() == Fresh.address, "the backward allocated a new gradient"
    assert torch.equal(grad, expected(x.detach(), upstream))


@pytest.mark.parametrize("name", sorted(OPS))
def test_gradient_someone_holds_is_left_alone(name):
    forward, expected = OPS[name]
    x, upstream = inputs(torch.float32)
    # A gradient the caller passes in (it holds a reference).
    kept = upstream.clone()
    (grad,) = torch.autograd.grad(forward(x), x, kept)
    assert torch.equal(kept, upstream)
    assert grad.data_ptr() != kept.data_ptr()
    assert torch.equal(grad, expected(x.detach(), upstream))
    # retain_grad() on the output keeps the gradient flowing into the op.
    y = forward(x)
    y.retain_grad()
    (y * upstream).sum().backward()
    assert torch.equal(y.grad, upstream)
    assert torch.equal(x.grad, expected(x.detach(), upstream))
    # A hook that stores the gradient.
    stored = []
    y = forward(x)
    y.register_hook(stored.append)
    (grad,) = torch.autograd.grad((y * upstream).sum(), x)
    assert torch.equal(stored[0], upstream)
    assert torch.equal(grad, expected(x.detach(), upstream))


@pytest.mark.parametrize("name", ["relu", "gelu", "silu"])  # those with a double backward
def test_no_reuse_when_the_gradient_is_recorded(name):
    # create_graph=True: the gradient is part of a graph (double backward).
    forward, expected = OPS[name]
    x, upstream = inputs(torch.float64)
    (grad,) = torch.autograd.grad((Fresh.apply(forward(x)) * upstream).sum(), x,
                                  create_graph=True)
    assert grad.data_ptr() != Fresh.address
    assert grad.requires_grad
    assert torch.equal(grad.detach(), expected(x.detach(), upstream))


def test_backward_out_may_be_grad_output_itself():
    x, upstream = inputs(torch.float32)
    x = x.detach()
    expected = fuseops.silu_backward(upstream, x)
    grad = upstream.clone()
    assert fuseops.silu_backward(grad, x, out=grad) is grad
    assert torch.equal(grad, expected)
