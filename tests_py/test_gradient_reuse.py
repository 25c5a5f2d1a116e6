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
    addresses = []  # every call's, for ops with two gradients

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        fresh = grad * 1.0
        Fresh.address = fresh.data_ptr()
        Fresh.addresses.append(Fresh.address)
        return fresh


UP_SCALE = 0.75

# name -> (forward of x, expected input gradient given (x, upstream gradient))
OPS = {
    "relu": (
        fuseops.relu,
        lambda x, g: fuseops.relu_backward(g, fuseops.relu(x), out=torch.empty_like(x)),
    ),
    "gelu": (
        lambda x: fuseops.gelu(x, "tanh"),
        lambda x, g: fuseops.gelu_backward(g, x, "tanh", out=torch.empty_like(x)),
    ),
    "silu": (fuseops.silu, lambda x, g: fuseops.silu_backward(g, x, out=torch.empty_like(x))),
    # bias_gelu: the input's gradient reuses the buffer (the bias's is a row sum).
    "bias_gelu": (
        lambda x: fuseops.bias_gelu(x, row_bias(x), "tanh"),
        lambda x, g: fuseops.bias_gelu_backward(
            g,
            x,
            row_bias(x),
            "tanh",
            grad_input=torch.empty_like(x),
            grad_bias=torch.empty(x.shape[-1], dtype=x.dtype),
        )[0],
    ),
    # Gated: the gate's gradient reuses the buffer (up = a fixed function of x).
    # The norms: the input's gradient does (the weight's is a new tensor).
    "swiglu": (
        lambda x: fuseops.swiglu(x, UP_SCALE * x.detach()),
        lambda x, g: fuseops.swiglu_backward(
            g, x, UP_SCALE * x, grad_gate=torch.empty_like(x), grad_up=torch.empty_like(x)
        )[0],
    ),
    "geglu": (
        lambda x: fuseops.geglu(x, UP_SCALE * x.detach(), "tanh"),
        lambda x, g: fuseops.geglu_backward(
            g, x, UP_SCALE * x, "tanh", grad_gate=torch.empty_like(x), grad_up=torch.empty_like(x)
        )[0],
    ),
    "rms_norm": (
        lambda x: fuseops.rms_norm(x, norm_weight(x), 1e-6),
        lambda x, g: fuseops.rms_norm_backward(
            g,
            x,
            norm_weight(x),
            fuseops.rms_norm_forward(x, norm_weight(x), 1e-6)[1],
            grad_input=torch.empty_like(x),
            grad_weight=torch.empty(x.shape[-1], dtype=x.dtype),
        )[0],
    ),
    "layer_norm": (
        lambda x: fuseops.layer_norm(x, norm_weight(x), norm_weight(x), 1e-5),
        lambda x, g: fuseops.layer_norm_backward(
            g,
            x,
            norm_weight(x),
            *fuseops.layer_norm_forward(x, norm_weight(x), norm_weight(x), 1e-5)[1:],
            grad_input=torch.empty_like(x),
            grad_weight=torch.empty(x.shape[-1], dtype=x.dtype),
            grad_bias=torch.empty(x.shape[-1], dtype=x.dtype),
        )[0],
    ),
    # The gradient of the sum new_residual = x + residual (here a fixed
    # function of x) reuses that of `out`; new_residual is unused.
    "fused_add_rms_norm": (
        lambda x: fuseops.fused_add_rms_norm(x, RESIDUAL_SCALE * x.detach(), norm_weight(x), 1e-6)[
            0
        ],
        lambda x, g: fused_add_rms_norm_expected(x, g, None),
    ),
}

RESIDUAL_SCALE = -0.5


def fused_add_rms_norm_expected(x, grad_out, grad_new_residual):
    _, new_residual, rstd = fuseops.fused_add_rms_norm_forward(
        x, RESIDUAL_SCALE * x, norm_weight(x), 1e-6
    )
    return fuseops.fused_add_rms_norm_backward(
        grad_out,
        grad_new_residual,
        new_residual,
        norm_weight(x),
        rstd,
        grad_input=torch.empty_like(x),
        grad_weight=torch.empty(x.shape[-1], dtype=x.dtype),
    )[0]


def row_bias(x):
    return torch.linspace(-1.0, 1.0, x.shape[-1], dtype=x.dtype)


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


# Those with a double backward. The activations' gradient under
# create_graph comes from the same kernels (the same bits); the norms' from a
# differentiable composite, which rounds differently (float64: 1e-12).
RECORDED_TOLERANCE = {
    "relu": 0.0,
    "gelu": 0.0,
    "silu": 0.0,
    "rms_norm": 1e-12,
    "fused_add_rms_norm": 1e-12,
}


@pytest.mark.parametrize("name", list(RECORDED_TOLERANCE))
def test_no_reuse_when_the_gradient_is_recorded(name):
    # create_graph=True: the gradient is part of a graph (double backward).
    forward, expected = OPS[name]
    x, upstream = inputs(torch.float64)
    (grad,) = torch.autograd.grad((Fresh.apply(forward(x)) * upstream).sum(), x, create_graph=True)
    assert grad.data_ptr() != Fresh.address
    assert grad.requires_grad
    tolerance = RECORDED_TOLERANCE[name]
    torch.testing.assert_close(
        grad.detach(), expected(x.detach(), upstream), rtol=tolerance, atol=tolerance
    )


def test_bias_gelu_under_create_graph_is_refused_not_reused():
    # bias_gelu has no double backward: create_graph=True raises before any
    # kernel would write over the upstream gradient.
    x, upstream = inputs(torch.float64)
    kept = upstream.clone()
    with pytest.raises(RuntimeError, match="bias_gelu_backward.*not differentiable"):
        torch.autograd.grad(OPS["bias_gelu"][0](x), x, kept, create_graph=True)
    assert torch.equal(kept, upstream)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bias_gelu_bias_gradient_with_reuse(dtype):
    x, upstream = inputs(dtype)
    bias = row_bias(x).requires_grad_()
    grad_x, grad_bias = torch.autograd.grad(
        (Fresh.apply(fuseops.bias_gelu(x, bias, "none")) * upstream).sum(), (x, bias)
    )
    assert grad_x.data_ptr() == Fresh.address
    expected_x, expected_bias = fuseops.bias_gelu_backward(upstream, x.detach(), bias.detach())
    assert torch.equal(grad_x, expected_x)
    assert torch.equal(grad_bias, expected_bias)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_add_rms_norm_with_both_gradients(dtype):
    # The output's gradient (a sole owner) takes the sum of both; the
    # residual's gradient, which the caller holds here, is left alone. One
    # tensor is the gradient of both x and residual.
    x, upstream = inputs(dtype)
    residual = (RESIDUAL_SCALE * x.detach()).requires_grad_()
    grad_new_residual = torch.randn(x.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    kept = grad_new_residual.clone()
    weight = norm_weight(x).requires_grad_()
    out, new_residual = fuseops.fused_add_rms_norm(x, residual, weight, 1e-6)
    grad_x, grad_residual, grad_weight = torch.autograd.grad(
        [(Fresh.apply(out) * upstream).sum(), new_residual],
        (x, residual, weight),
        [None, grad_new_residual],
    )
    assert grad_x.data_ptr() == Fresh.address
    assert torch.equal(grad_new_residual, kept)
    expected = fused_add_rms_norm_expected(x.detach(), upstream, kept)
    assert torch.equal(grad_x, expected)
    assert torch.equal(grad_residual, expected)
    _, nr, rstd = fuseops.fused_add_rms_norm_forward(
        x.detach(), residual.detach(), weight.detach(), 1e-6
    )
    _, expected_weight = fuseops.fused_add_rms_norm_backward(
        upstream, kept, nr, weight.detach(), rstd
    )
    assert torch.equal(grad_weight, expected_weight)


ROPE_TABLES = fuseops.rope_cache(48, 64)  # partial rotary of a head_dim of 64


def rope_inputs(dtype):
    gen = torch.Generator().manual_seed(2)
    positions = torch.randint(0, 64, (37,), generator=gen)
    q = torch.randn(37, 4, 64, generator=gen).to(dtype).requires_grad_()
    k = torch.randn(37, 2, 64, generator=gen).to(dtype).requires_grad_()
    gq = torch.randn(37, 4, 64, generator=gen).to(dtype)
    gk = torch.randn(37, 2, 64, generator=gen).to(dtype)
    return q, k, gq, gk, positions


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_gradients_are_reused(dtype, interleaved):
    q, k, gq, gk, positions = rope_inputs(dtype)
    cos, sin = ROPE_TABLES
    expected_q, expected_k = fuseops.rope_backward(gq, gk, cos, sin, positions, interleaved)
    # Both gradients sole owners: both rotated in place, in one call.
    Fresh.addresses = []
    out_q, out_k = fuseops.rope(q, k, cos, sin, positions, interleaved)
    loss = (Fresh.apply(out_q) * gq).sum() + (Fresh.apply(out_k) * gk).sum()
    grad_q, grad_k = torch.autograd.grad(loss, (q, k))
    assert sorted(Fresh.addresses) == sorted([grad_q.data_ptr(), grad_k.data_ptr()])
    assert torch.equal(grad_q, expected_q) and torch.equal(grad_k, expected_k)
    # The key's gradient held by a hook: the query's alone is reused.
    Fresh.addresses = []
    stored = []
    out_q, out_k = fuseops.rope(q, k, cos, sin, positions, interleaved)
    out_k.register_hook(stored.append)
    grad_q, grad_k = torch.autograd.grad(
        (Fresh.apply(out_q) * gq).sum() + (out_k * gk).sum(), (q, k)
    )
    assert Fresh.addresses == [grad_q.data_ptr()]
    assert grad_k.data_ptr() != stored[0].data_ptr()
    assert torch.equal(stored[0], gk)
    assert torch.equal(grad_q, expected_q) and torch.equal(grad_k, expected_k)
    # One tensor (rope.single), and a pair whose key is unused.
    for forward in (
        lambda: fuseops.rope(q, None, cos, sin, positions, interleaved),
        lambda: fuseops.rope(q, k, cos, sin, positions, interleaved)[0],
    ):
        (grad_q,) = torch.autograd.grad((Fresh.apply(forward()) * gq).sum(), q)
        assert grad_q.data_ptr() == Fresh.address
        assert torch.equal(grad_q, expected_q)


def test_rope_gradient_someone_holds_is_left_alone():
    q, k, gq, gk, positions = rope_inputs(torch.float32)
    cos, sin = ROPE_TABLES
    expected_q, expected_k = fuseops.rope_backward(gq, gk, cos, sin, positions)
    kept_q, kept_k = gq.clone(), gk.clone()
    grad_q, grad_k = torch.autograd.grad(
        fuseops.rope(q, k, cos, sin, positions), (q, k), (kept_q, kept_k)
    )
    assert torch.equal(kept_q, gq) and torch.equal(kept_k, gk)
    assert torch.equal(grad_q, expected_q) and torch.equal(grad_k, expected_k)
    y = fuseops.rope(q, None, cos, sin, positions)
    y.retain_grad()
    (y * gq).sum().backward()
    assert torch.equal(y.grad, gq)
    assert torch.equal(q.grad, expected_q)


def test_rope_no_reuse_when_the_gradient_is_recorded():
    q, k, gq, gk, positions = rope_inputs(torch.float64)
    cos, sin = ROPE_TABLES
    # rope's gradient is linear in the upstream one: recorded when that
    # requires grad.
    gq.requires_grad_()
    (grad_q,) = torch.autograd.grad(
        (Fresh.apply(fuseops.rope(q, None, cos, sin, positions)) * gq).sum(), q, create_graph=True
    )
    assert grad_q.data_ptr() != Fresh.address
    assert grad_q.requires_grad
    assert torch.equal(
        grad_q.detach(), fuseops.rope_backward(gq.detach(), None, cos, sin, positions)
    )


def test_backward_out_may_be_grad_output_itself():
    x, upstream = inputs(torch.float32)
    x = x.detach()
    expected = fuseops.silu_backward(upstream, x)
    grad = upstream.clone()
    assert fuseops.silu_backward(grad, x, out=grad) is grad
    assert torch.equal(grad, expected)
